"""What a step runs: slurmstepd's ``_build_path`` and the kernel's ``#!`` rules.

Where the kernel can say it itself, it does: scripts are really executed in
a forked child (execve) and the errno or the exit status is compared with
what :mod:`grace_policy.launch` predicts.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
from pathlib import Path

import pytest
from fixtures.build import ElfBuilder, src

from grace_policy.budget import Budget, BudgetExceeded
from grace_policy.launch import (
    MAX_DEPTH,
    PATH_MAX,
    build_path,
    env_command,
    follow,
    parse_shebang,
)


def script(path: Path, text: str | bytes, mode: int = 0o755) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    path.chmod(mode)
    return path


def kernel_exec(path: str, argv: list[str] | None = None, env: dict[str, str] | None = None,
                cwd: str | None = None) -> tuple[int, int]:
    """execve ``path`` in a forked child: (errno of a failed execve or 0,
    exit status). The kernel is the oracle for #! parsing and depth."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: report execve's errno through the pipe
        try:
            os.close(r)
            if cwd:
                os.chdir(cwd)
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            os.dup2(devnull, 2)
            os.set_inheritable(w, False)
            os.execve(path, argv or [path], env or {"PATH": "/usr/bin:/bin"})
        except OSError as exc:
            os.write(w, str(exc.errno).encode())
        finally:
            os._exit(127)
    os.close(w)
    with os.fdopen(r, "rb") as fh:
        data = fh.read()
    _, status = os.waitpid(pid, 0)
    return (int(data) if data else 0), os.waitstatus_to_exitcode(status)


# --------------------------------------------------------------------------
# _build_path


def test_absolute_name_is_taken_as_is(tmp_path: Path) -> None:
    assert build_path("/no/such/prog", {"PATH": str(tmp_path)}, "/cwd") == "/no/such/prog"


def test_leading_dot_is_relative_to_cwd_not_searched(tmp_path: Path) -> None:
    script(tmp_path / "bin" / ".hidden", "#!/bin/sh\n")
    env = {"PATH": str(tmp_path / "bin")}
    assert build_path(".hidden", env, "/job") == "/job/.hidden"
    assert build_path("./x", env, "/job") == "/job/./x"
    assert build_path("../x", env, "/job/sub") == "/job/sub/../x"


def test_path_search_takes_first_non_directory_without_exec_bit(tmp_path: Path) -> None:
    """stat() + not-a-directory: a directory of that name is passed over, a
    file without the exec bit is taken (slurmstepd does not test it)."""
    (tmp_path / "a" / "prog").mkdir(parents=True)
    script(tmp_path / "b" / "prog", "data", mode=0o644)
    script(tmp_path / "c" / "prog", "#!/bin/sh\n")
    env = {"PATH": f"{tmp_path}/a:{tmp_path}/b:{tmp_path}/c"}
    assert build_path("prog", env, "/") == f"{tmp_path}/b/prog"


def test_empty_path_elements_are_skipped_not_cwd(tmp_path: Path) -> None:
    """strtok drops empty elements, so "" and "::" never mean the cwd (unlike
    execvp); the file in the cwd is still what execve runs at the end, by
    its relative name."""
    script(tmp_path / "cwd" / "prog", "#!/bin/sh\n")
    script(tmp_path / "bin" / "prog", "#!/bin/sh\n")
    cwd = str(tmp_path / "cwd")
    env = {"PATH": f"::{tmp_path}/bin:"}
    assert build_path("prog", env, cwd) == f"{tmp_path}/bin/prog"


def test_relative_path_entries_are_relative_to_cwd(tmp_path: Path) -> None:
    script(tmp_path / "rel" / "prog", "#!/bin/sh\n")
    assert build_path("prog", {"PATH": "rel"}, str(tmp_path)) == f"{tmp_path}/rel/prog"


def test_path_entry_that_is_a_file_is_passed_over(tmp_path: Path) -> None:
    script(tmp_path / "afile", "x")
    script(tmp_path / "bin" / "prog", "#!/bin/sh\n")
    env = {"PATH": f"{tmp_path}/afile:{tmp_path}/bin"}
    assert build_path("prog", env, "/") == f"{tmp_path}/bin/prog"


def test_not_found_goes_to_execve_relative_to_cwd(tmp_path: Path) -> None:
    """Not in PATH: slurmstepd hands the bare name to execve, which resolves
    it against the cwd, also without a "/" (the kernel does not search)."""
    cwd = tmp_path / "job"
    script(cwd / "prog", "#!/bin/sh\nexit 7\n")
    env = {"PATH": str(tmp_path / "empty")}
    assert build_path("prog", env, str(cwd)) == f"{cwd}/prog"
    assert build_path("sub/prog", env, str(cwd)) == f"{cwd}/sub/prog"
    assert build_path("prog", {}, str(cwd)) == f"{cwd}/prog"  # PATH unset: no search
    # The kernel agrees: execve("prog") in that cwd runs ./prog.
    assert kernel_exec("prog", cwd=str(cwd)) == (0, 7)


def test_empty_name_is_none() -> None:
    assert build_path("", {"PATH": "/usr/bin"}, "/") is None


def test_names_are_cut_to_path_max_like_slurmstepd(tmp_path: Path) -> None:
    """strlcpy into a PATH_MAX buffer: the kernel then runs the cut name, so
    judging the long name would judge a file that is never executed."""
    deep = tmp_path
    while len(os.fsencode(str(deep))) < PATH_MAX - 300:
        deep = deep / ("d" * 200)
    os.makedirs(deep, exist_ok=True)
    target = deep / "prog"
    script(target, "#!/bin/sh\n")
    name = str(target) + "/" + "x" * (PATH_MAX - len(os.fsencode(str(target))) + 50)
    cut = build_path(name, {}, "/")
    assert cut is not None and len(os.fsencode(cut)) == PATH_MAX - 1
    assert cut == name[:PATH_MAX - 1]


def test_path_search_looks_at_the_deadline() -> None:
    budget = Budget(deadline_ms=0)
    env = {"PATH": ":".join(f"/nonexistent/{i}" for i in range(1000))}
    with pytest.raises(BudgetExceeded, match="deadline"):
        build_path("prog", env, "/", budget)


# --------------------------------------------------------------------------
# #! parsing


@pytest.mark.parametrize(("line", "expected"), [
    (b"#!/bin/sh\n", ("/bin/sh", None)),
    (b"#! /bin/sh -e \n", ("/bin/sh", "-e")),
    (b"#!/usr/bin/env -S python3 -u\n", ("/usr/bin/env", "-S python3 -u")),
    (b"#!/bin/sh\r\n", ("/bin/sh\r", None)),            # CRLF: the \r is part of the name
    (b"#!/bin/sh\t-x  y\n", ("/bin/sh", "-x  y")),      # one argument, inner spaces kept
    (b"#!/bin/sh", ("/bin/sh", None)),                  # no newline, short file
    (b"#!   \n", None),
    (b"#!\n", None),
    (b"#!" + b"/x" * 200, None),                        # interpreter cut at 255 bytes
])
def test_parse_shebang_like_binfmt_script(line: bytes, expected: object) -> None:
    assert parse_shebang(line) == expected


def test_crlf_script_fails_like_the_kernel_says(tmp_path: Path) -> None:
    s = script(tmp_path / "crlf.sh", b"#!/bin/sh\r\necho hi\r\n")
    hops = follow(str(s), {"PATH": "/usr/bin:/bin"}, str(tmp_path))
    assert [h.kind for h in hops] == ["script", "missing"]
    assert hops[-1].path == "/bin/sh\r"
    assert kernel_exec(str(s))[0] == errno.ENOENT


def test_long_shebang_without_newline_is_exec_format(tmp_path: Path) -> None:
    s = script(tmp_path / "long", b"#!" + b"/x" * 300)
    assert [h.kind for h in follow(str(s), {}, "/")] == ["format"]
    assert kernel_exec(str(s))[0] == errno.ENOEXEC


def test_long_argument_is_cut_but_runs(tmp_path: Path) -> None:
    s = script(tmp_path / "longarg", b"#!/bin/echo " + b"a" * 400 + b"\n")
    hops = follow(str(s), {}, "/")
    assert hops[0].interp == "/bin/echo" and hops[-1].kind == "elf"
    assert len(os.fsencode(hops[0].interp_arg or "")) == 255 - len(b"#!/bin/echo ")
    assert kernel_exec(str(s)) == (0, 0)


# --------------------------------------------------------------------------
# #! chains


def _chain(tmp_path: Path, n: int, end: str = "/bin/true") -> Path:
    prev = end
    for i in range(n):
        prev = str(script(tmp_path / f"s{i}", f"#!{prev}\n"))
    return Path(prev)


def test_depth_limit_matches_the_kernel(tmp_path: Path) -> None:
    ok = _chain(tmp_path / "ok", MAX_DEPTH)
    hops = follow(str(ok), {}, "/")
    assert [h.kind for h in hops] == ["script"] * MAX_DEPTH + ["elf"]
    assert kernel_exec(str(ok)) == (0, 0)

    deep = _chain(tmp_path / "deep", MAX_DEPTH + 1)
    assert follow(str(deep), {}, "/")[-1].kind == "loop"
    assert kernel_exec(str(deep))[0] == errno.ELOOP


def test_shebang_loop_ends(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    script(a, f"#!{b}\n")
    script(b, f"#!{a}\n")
    hops = follow(str(a), {}, "/")
    assert hops[-1].kind == "loop" and len(hops) <= MAX_DEPTH + 2
    assert kernel_exec(str(a))[0] == errno.ELOOP


def test_missing_interpreter(tmp_path: Path) -> None:
    s = script(tmp_path / "s", "#!/no/such/python\n")
    hops = follow(str(s), {}, "/")
    assert [(h.kind, h.path) for h in hops] == [("script", str(s)),
                                                ("missing", "/no/such/python")]


def test_relative_interpreter_is_relative_to_cwd(tmp_path: Path) -> None:
    shutil.copy("/bin/true", tmp_path / "mytrue")
    s = script(tmp_path / "s", "#!mytrue\n")
    hops = follow(str(s), {}, str(tmp_path))
    assert hops[-1].kind == "elf" and hops[-1].path == f"{tmp_path}/mytrue"


def test_env_name_is_searched_in_the_job_path(tmp_path: Path) -> None:
    shutil.copy("/bin/true", tmp_path / "python3")
    s = script(tmp_path / "s", "#!/usr/bin/env python3\n")
    hops = follow(str(s), {"PATH": f"/nonexistent:{tmp_path}"}, "/")
    assert [h.kind for h in hops] == ["script", "env", "elf"]
    assert hops[1].path == "/usr/bin/env"  # env itself must run: it is a hop
    assert hops[-1].path == f"{tmp_path}/python3"


def test_env_skips_files_without_exec_bit(tmp_path: Path) -> None:
    """execvp passes over EACCES (unlike slurmstepd's own search)."""
    script(tmp_path / "a" / "tool", "#!/bin/sh\n", mode=0o644)
    (tmp_path / "b").mkdir()
    shutil.copy("/bin/true", tmp_path / "b" / "tool")
    s = script(tmp_path / "s", "#!/usr/bin/env tool\n")
    hops = follow(str(s), {"PATH": f"{tmp_path}/a:{tmp_path}/b"}, "/")
    assert hops[-1].path == f"{tmp_path}/b/tool"


def test_env_dash_s_splits_and_finds_the_program(tmp_path: Path) -> None:
    shutil.copy("/bin/true", tmp_path / "python3")
    s = script(tmp_path / "s", "#!/usr/bin/env -S python3 -u\n")
    hops = follow(str(s), {"PATH": str(tmp_path)}, "/")
    assert hops[-1].path == f"{tmp_path}/python3"
    assert env_command('-S "python3 -u"', "/s", {})[0] == "python3 -u"  # quoted: one word


def test_env_assignments_and_options(tmp_path: Path) -> None:
    assert env_command("-S VAR=1 prog -x", "/s", {"PATH": "/p"}) == ("prog", "/p")
    assert env_command("-S PATH=/q prog", "/s", {"PATH": "/p"}) == ("prog", "/q")
    assert env_command("-S -i prog", "/s", {"PATH": "/p"}) == ("prog", None)
    assert env_command("-S -u PATH prog", "/s", {"PATH": "/p"}) == ("prog", None)
    assert env_command("-S -- prog", "/s", {"PATH": "/p"}) == ("prog", "/p")


def test_env_without_dash_s_gets_one_word(tmp_path: Path) -> None:
    """``#!/usr/bin/env VAR=1 prog``: the kernel passes "VAR=1 prog" as one
    word, env takes it as an assignment and runs the script again, forever.
    The chain must end (as a loop), not follow "prog"."""
    shutil.copy("/bin/true", tmp_path / "prog")
    s = script(tmp_path / "s", "#!/usr/bin/env VAR=1 prog\n")
    assert env_command("VAR=1 prog", str(s), {}) == (str(s), None)
    hops = follow(str(s), {"PATH": str(tmp_path)}, "/")
    assert hops[-1].kind == "loop"


def test_env_program_missing(tmp_path: Path) -> None:
    s = script(tmp_path / "s", "#!/usr/bin/env nosuchprog\n")
    hops = follow(str(s), {"PATH": str(tmp_path)}, "/")
    assert (hops[-1].kind, hops[-1].path) == ("missing", "nosuchprog")


def test_env_path_unset_uses_execvp_default(tmp_path: Path) -> None:
    s = script(tmp_path / "s", "#!/usr/bin/env -S -i true\n")
    hops = follow(str(s), {"PATH": str(tmp_path)}, "/")
    assert hops[-1].kind == "elf" and hops[-1].path in ("/bin/true", "/usr/bin/true")


def test_non_elf_non_script_is_format(tmp_path: Path) -> None:
    s = script(tmp_path / "data", "just text\n")
    assert [h.kind for h in follow(str(s), {}, "/")] == ["format"]
    assert kernel_exec(str(s))[0] == errno.ENOEXEC


def test_no_exec_bit_is_not_executable(tmp_path: Path) -> None:
    s = script(tmp_path / "s", "#!/bin/sh\n", mode=0o644)
    assert [h.kind for h in follow(str(s), {}, "/")] == ["not-executable"]
    assert not os.stat(s).st_mode & stat.S_IXUSR


def test_follow_reaches_the_compiled_program(elf_builder: ElfBuilder, tmp_path: Path) -> None:
    exe = elf_builder.compile(src("hello.c"), "bin/hello")
    s = script(tmp_path / "run.sh", f"#!{exe}\n")
    hops = follow(str(s), {}, "/")
    assert [(h.kind, h.path) for h in hops] == [("script", str(s)), ("elf", str(exe))]


def test_follow_looks_at_the_deadline(tmp_path: Path) -> None:
    s = script(tmp_path / "s", "#!/bin/sh\n")
    with pytest.raises(BudgetExceeded):
        follow(str(s), {}, "/", Budget(deadline_ms=0))
