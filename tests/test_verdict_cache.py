"""The verdict cache's promise: an entry matches only while every input and
every recorded filesystem answer is unchanged, so a hit means the full check
would have given the same clean verdict.

These tests use the Python twin of the C lookup (``verdict_cache.lookup``);
tests/slurm checks the C side in slurmstepd against the same entries.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from fixtures.build import ElfBuilder, src

from grace_policy import fsprobe, verdict_cache
from grace_policy.decide import StepRequest, decide
from grace_policy.policy import Policy

ENV_NAMES = ("PATH", "LD_LIBRARY_PATH", "VIRTUAL_ENV", "CONDA_PREFIX")


def _entry(argv0: str, env: dict[str, str], cwd: str = "/") -> tuple[str, list]:
    probes: list[tuple[str, str, str]] = []
    verdict = decide(Policy(), StepRequest(partition="p", argv=[argv0], env=env, cwd=cwd),
                     probes=probes)
    assert verdict_cache.cacheable(verdict), verdict
    ins = verdict_cache.inputs(argv0=argv0, cwd=cwd, partition="p", user_mode=None, env=env,
                               env_names=ENV_NAMES)
    text = verdict_cache.entry(ins, verdict.mode, probes)
    assert text is not None
    return text, ins


def test_same_step_hits(tmp_path: Path) -> None:
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin"}
    text, ins = _entry("true", env)
    assert verdict_cache.lookup(text, ins) == "enforce"


def test_new_file_earlier_in_path_misses(tmp_path: Path) -> None:
    """The search passed over tmp_path/true (absent): a file appearing there
    changes what runs, so the entry must stop matching."""
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin"}
    text, ins = _entry("true", env)
    shutil.copy("/usr/bin/true", tmp_path / "true")
    assert verdict_cache.lookup(text, ins) is None


def test_other_inputs_miss(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin"}
    text, _ins = _entry("true", env)
    for changed in (
        verdict_cache.inputs(argv0="false", cwd="/", partition="p", user_mode=None, env=env,
                             env_names=ENV_NAMES),
        verdict_cache.inputs(argv0="true", cwd="/", partition="q", user_mode=None, env=env,
                             env_names=ENV_NAMES),
        verdict_cache.inputs(argv0="true", cwd="/", partition="p", user_mode=None,
                             env={**env, "VIRTUAL_ENV": "/x"}, env_names=ENV_NAMES),
        verdict_cache.inputs(argv0="true", cwd="/", partition="p", user_mode=None,
                             env={**env, "LD_LIBRARY_PATH": str(tmp_path)},
                             env_names=ENV_NAMES),
    ):
        assert verdict_cache.lookup(text, changed) is None


def test_rewritten_library_misses(elf_builder: ElfBuilder, tmp_path: Path) -> None:
    lib = elf_builder.library("lib/libgreet.so.1")
    exe = elf_builder.compile(src("use_greet.c"), "bin/app", needed_libs=("greet",),
                              lib_dirs=(lib.parent,), runpath="$ORIGIN/../lib")
    env = {"PATH": "/usr/bin:/bin"}
    text, ins = _entry(str(exe), env)
    assert verdict_cache.lookup(text, ins) == "enforce"
    data = lib.read_bytes()
    lib.unlink()
    lib.write_bytes(data)  # same bytes, new inode: the loader may see another file
    assert verdict_cache.lookup(text, ins) is None


def test_torn_and_foreign_blocks_are_skipped(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin"}
    text, ins = _entry("true", env)
    torn = text[: len(text) // 2]
    assert verdict_cache.lookup(torn, ins) is None
    junk = "GPC1\nX nonsense\n.\n"
    assert verdict_cache.lookup(junk + torn + text, ins) == "enforce"


def test_odd_bytes_round_trip(tmp_path: Path) -> None:
    odd = tmp_path / "a b\nc%\udcff"
    os.mkdir(odd)
    shutil.copy("/usr/bin/true", odd / "prog")
    text, ins = _entry(str(odd / "prog"), {"PATH": "/usr/bin"})
    assert all(line.count(" ") <= 3 for line in text.splitlines())
    assert verdict_cache.lookup(text, ins) == "enforce"


def test_relative_probe_is_not_cached() -> None:
    assert verdict_cache.entry([], "enforce", [("s", "rel/path", "n")]) is None


def test_signature_follows_content_and_mode(tmp_path: Path) -> None:
    f = tmp_path / "f"
    f.write_bytes(b"x")
    first = fsprobe.answer("s", str(f))
    os.chmod(f, 0o700)
    assert fsprobe.answer("s", str(f)) != first
    assert fsprobe.answer("s", str(tmp_path / "missing")) == "n"
    assert fsprobe.answer("s", str(f / "below")) == "n"  # ENOTDIR counts as absent
    assert fsprobe.answer("s", str(tmp_path)) == "d"


def test_variables_read_by_env_split_string_are_inputs(tmp_path: Path) -> None:
    """``#!/usr/bin/env -S ${TOOL}`` runs whatever TOOL names: an entry made
    with TOOL=true must not match a step where TOOL names something else."""
    script = tmp_path / "s"
    script.write_text("#!/usr/bin/env -S ${TOOL}\n")
    script.chmod(0o755)
    env = {"PATH": "/usr/bin:/bin", "TOOL": "true"}
    text, ins = _entry(str(script), env)
    assert "I env:TOOL =true" in text
    assert verdict_cache.lookup(text, ins, env) == "enforce"
    assert verdict_cache.lookup(text, ins, {**env, "TOOL": "false"}) is None


def test_a_file_swapped_between_stat_and_open_is_never_cached(tmp_path: Path,
                                                              monkeypatch) -> None:
    """The record keeps the stat() answer; if another file is read after
    it (a swap won in the race), no replay may ever match that record."""
    target = tmp_path / "prog"
    shutil.copy("/usr/bin/true", target)
    other = tmp_path / "other"
    shutil.copy("/usr/bin/false", other)
    real_stat = fsprobe.Files.stat

    def stat_then_swap(self: fsprobe.Files, path: str):
        st = real_stat(self, path)
        if path == str(target) and other.exists():
            os.replace(other, target)  # the file the open will see
        return st

    monkeypatch.setattr(fsprobe.Files, "stat", stat_then_swap)
    files = fsprobe.Files.recorded()
    from grace_policy.elf import read_elf

    read_elf(str(target), files=files)
    records = files.records()
    assert ("s", str(target), fsprobe.CHANGED) in records
    assert not fsprobe.still_true(records)


def test_a_listed_directory_is_replayed_by_identity_and_times(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Python steps list site-packages: an entry added, removed or renamed
    # after the verdict must make the recorded answer false (op "D").
    from grace_policy import fsprobe

    site = tmp_path / "site-packages"
    site.mkdir()
    (site / "a.py").write_text("")
    files = fsprobe.Files.recorded()
    names = files.listdir(str(site))
    entries = files.scandir(str(site))
    with pytest.raises(OSError):
        files.listdir(str(tmp_path / "missing"))
    records = files.records()
    assert names == ["a.py"] and [e.name for e in entries] == ["a.py"]
    assert [op for op, _p, _a in records] == ["D", "D"]
    assert fsprobe.still_true(records)
    (site / "b.py").write_text("")  # pip installing a package
    assert not fsprobe.still_true(records)
    fresh = [("D", str(site), fsprobe.answer("D", str(site)))]
    (site / "b.py").rename(site / "c.py")
    assert not fsprobe.still_true(fresh)
    assert fsprobe.answer("D", str(tmp_path / "missing")) == "n"


def test_a_python_step_records_its_own_arguments_as_c_reads_them(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # C compares "argv:N" with the step's S_JOB_ARGV. A console script's
    # interpreter sees other arguments (its #! line adds the script path):
    # the entry must name the step's, or it could never be replayed.
    venv = tmp_path / "venv"
    import subprocess
    import sys

    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    tool = venv / "bin" / "tool"
    tool.write_text(f"#!{venv}/bin/python\nimport json\n")
    tool.chmod(0o755)
    records: list[tuple[str, str, str]] = []
    verdict = decide(Policy(), StepRequest(partition=None, argv=[str(tool), "--epochs", "3"],
                                           env={"PATH": "/usr/bin", "HOME": str(tmp_path)},
                                           cwd=str(tmp_path), node=None), probes=records)
    assert verdict.action == "allow", verdict.findings
    inputs = [(name, value) for op, name, value in records if op == "i"]
    # The #! line names the script: none of the step's own words decides
    # what the interpreter imports (the tool's identity is recorded).
    assert inputs == [("argmin", "=1")]
    assert ("s", str(tool), fsprobe.answer("s", str(tool))) in records


def test_a_shell_step_records_no_arguments(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # 'srun bash -c ...' loops: what bash's environment holds does not depend
    # on the command string, so one cache entry serves them all.
    records: list[tuple[str, str, str]] = []
    verdict = decide(Policy(), StepRequest(partition=None, argv=["/bin/bash", "-c", "echo 1"],
                                           env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
                                           cwd=str(tmp_path), node=None), probes=records)
    assert verdict.action == "allow", verdict.findings
    assert not [r for r in records if r[0] == "i"], records
    assert ("v", "PYTHONPATH", "-") in records  # but the variables its python would read


# --------------------------------------------------------------------------
# Python steps: the key holds what decides the imports, not the script's own
# arguments (issue 18 item 1). Entries are made as the bridge makes them and
# looked up as C looks them up (argv compared word by word, argmin).

STEP_ENV_NAMES = ("PATH", "LD_LIBRARY_PATH")


def _venv(tmp_path: Path) -> Path:
    import subprocess
    import sys

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next((venv / "lib").glob("python3*/site-packages"))
    (site / "mylib.py").write_text("")
    (site / "otherlib.py").write_text("")
    return venv / "bin" / "python"


def _py_entry(argv: list[str], env: dict[str, str], cwd: str) -> str:
    probes: list[tuple[str, str, str]] = []
    verdict = decide(Policy(), StepRequest(partition="p", argv=argv, env=env, cwd=cwd),
                     probes=probes)
    assert verdict_cache.cacheable(verdict), verdict.findings
    ins = verdict_cache.inputs(argv0=argv[0], cwd=cwd, partition="p", user_mode=None, env=env,
                               env_names=STEP_ENV_NAMES)
    text = verdict_cache.entry(ins, verdict.mode, probes)
    assert text is not None
    return text


def _py_lookup(text: str, argv: list[str], env: dict[str, str], cwd: str) -> str | None:
    ins = verdict_cache.inputs(argv0=argv[0], cwd=cwd, partition="p", user_mode=None, env=env,
                               env_names=STEP_ENV_NAMES)
    return verdict_cache.lookup(text, ins, env, argv=argv)


def test_a_sweep_over_script_arguments_is_one_entry(tmp_path: Path) -> None:
    python = str(_venv(tmp_path))
    train = tmp_path / "train.py"
    train.write_text("import mylib\n")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    cwd = str(tmp_path)
    text = _py_entry([python, "-u", str(train), "--seed", "1"], env, cwd)
    assert "I argmin =3" in text and "I argv:2 " in text and "argv:3" not in text
    for seed in range(2, 6):
        argv = [python, "-u", str(train), "--seed", str(seed)]
        assert _py_lookup(text, argv, env, cwd) == "enforce", seed
    # more or fewer of the script's own arguments: still the same imports
    assert _py_lookup(text, [python, "-u", str(train)], env, cwd) == "enforce"
    assert _py_lookup(text, [python, "-u", str(train), "a", "-c", "b"], env, cwd) == "enforce"
    for code_step in ([python, "-c", "import mylib", "x"], [python, "-m", "mylib", "--y"]):
        code_text = _py_entry(code_step, env, cwd)
        assert _py_lookup(code_text, [*code_step[:3], "other", "args"], env, cwd) == "enforce"


def test_what_decides_the_imports_is_still_a_miss(tmp_path: Path) -> None:
    python = str(_venv(tmp_path))
    train = tmp_path / "train.py"
    train.write_text("import mylib\n")
    other = tmp_path / "other.py"
    other.write_text("import mylib\n")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    cwd = str(tmp_path)
    script = _py_entry([python, str(train), "--seed", "1"], env, cwd)
    code = _py_entry([python, "-c", "import mylib", "1"], env, cwd)
    module = _py_entry([python, "-m", "mylib", "1"], env, cwd)
    stdin = _py_entry([python, "-E"], env, cwd)
    assert _py_lookup(script, [python, str(train), "--seed", "2"], env, cwd) == "enforce"
    misses = {
        "another script": (script, [python, str(other), "--seed", "1"], env),
        "-I before the script": (script, [python, "-I", str(train), "--seed", "1"], env),
        "-E before the script": (script, [python, "-E", str(train), "--seed", "1"], env),
        "-s before the script": (script, [python, "-s", str(train), "--seed", "1"], env),
        "other -c text": (code, [python, "-c", "import otherlib", "1"], env),
        "-c becomes -m": (code, [python, "-m", "import mylib", "1"], env),
        "other -m module": (module, [python, "-m", "otherlib", "1"], env),
        "-m with -I": (module, [python, "-I", "-m", "mylib", "1"], env),
        "PYTHONPATH set": (script, [python, str(train), "--seed", "1"],
                           {**env, "PYTHONPATH": str(tmp_path)}),
        "PYTHONNOUSERSITE set": (script, [python, str(train), "--seed", "1"],
                                 {**env, "PYTHONNOUSERSITE": "1"}),
        "stdin, then a script": (stdin, [python, "-E", str(train)], env),
        "stdin, then another option": (stdin, [python, "-E", "-s"], env),
    }
    for why, (text, argv, step_env) in misses.items():
        assert _py_lookup(text, argv, step_env, cwd) is None, why
    assert _py_lookup(stdin, [python, "-E"], env, cwd) == "enforce"
    # the script's content: a new import is a new verdict
    train.write_text("import mylib\nimport otherlib\n")
    assert _py_lookup(script, [python, str(train), "--seed", "2"], env, cwd) is None


def test_an_entry_names_the_node_it_was_made_for() -> None:
    """Page size, kernel release, glibc and machine are one input: an entry
    made on 4 KiB pages is a miss on the same node booted with 64 KiB."""
    machine, page, release, libc = verdict_cache.host_profile().split(" ", 3)
    assert int(page) == os.sysconf("SC_PAGE_SIZE") and machine == os.uname().machine
    assert release == os.uname().release and libc.startswith("glibc ")
    env = {"PATH": "/usr/bin:/bin"}
    text, ins = _entry("true", env)
    here = [*ins, ("host", "=" + fsprobe.encode(verdict_cache.host_profile()))]
    text = verdict_cache.entry(here, "enforce", [])
    assert text is not None and verdict_cache.lookup(text, here) == "enforce"
    for other in (f"{machine} 65536 {release} {libc}", f"aarch64 {page} {release} {libc}",
                  f"{machine} {page} {release}+64k {libc}",
                  f"{machine} {page} {release} glibc 2.41"):
        there = [*ins, ("host", "=" + fsprobe.encode(other))]
        assert verdict_cache.lookup(text, there) is None, other


# --------------------------------------------------------------------------
# Node-wide entries (issue 18 item 2): only when no user can change any
# recorded answer.

def _probes_of(argv: list[str], env: dict[str, str], cwd: str) -> list[tuple[str, str, str]]:
    probes: list[tuple[str, str, str]] = []
    verdict = decide(Policy(), StepRequest(partition="p", argv=argv, env=env, cwd=cwd),
                     probes=probes)
    assert verdict_cache.cacheable(verdict), verdict.findings
    return probes


def _base_inputs(argv0: str, cwd: str, env: dict[str, str]) -> list[tuple[str, str]]:
    ins = verdict_cache.inputs(argv0=argv0, cwd=cwd, partition="p", user_mode=None, env=env,
                               env_names=STEP_ENV_NAMES)
    # what the bridge adds (slurm_bridge._cache_entry)
    return [*ins, ("config", "=/etc/grace.toml"), ("code", "=/plugin|-"), ("node", "=n1"),
            ("creds", "=1000:1000"),
            ("host", "=" + fsprobe.encode(verdict_cache.host_profile()))]


@pytest.fixture
def open_tmp() -> Iterator[Path]:
    """A root directory every user can search (pytest's tmp_path is 0700),
    holding ``home``, a directory of the user nobody (a home or project)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to make a directory of another user")
    root = Path(tempfile.mkdtemp(prefix="grace-vc-", dir="/tmp"))
    try:
        root.chmod(0o755)
        (root / "home").mkdir()
        os.chown(root / "home", 65534, 65534)
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_a_node_program_is_node_wide_without_the_users_groups_or_cwd() -> None:
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin"}
    probes = _probes_of(["hostname"], env, "/home/someone")
    ins = _base_inputs("hostname", "/home/someone", env)
    shared = verdict_cache.node_wide(ins, probes, "/home/someone")
    assert shared is not None
    names = [name for name, _v in shared]
    assert "creds" not in names and "cwd" not in names and "host" in names
    text = verdict_cache.entry(shared, "enforce", probes, scope=verdict_cache.SCOPE_NODE)
    assert text is not None and "\nO scope node\n" in text
    other_user = [(n, v) for n, v in _base_inputs("hostname", "/home/other", env)
                  if n not in ("creds", "cwd")]
    assert verdict_cache.lookup(text, other_user, scope=verdict_cache.SCOPE_NODE) == "enforce"
    # a node-wide entry is never read from a user's file, nor the reverse
    assert verdict_cache.lookup(text, other_user) is None
    mine = verdict_cache.entry(ins, "enforce", probes)
    assert mine is not None
    assert verdict_cache.lookup(mine, ins, scope=verdict_cache.SCOPE_NODE) is None


def test_a_relative_name_keeps_the_cwd(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin"}
    probes = _probes_of(["./hostname"], env, "/usr/bin")
    shared = verdict_cache.node_wide(_base_inputs("./hostname", "/usr/bin", env), probes,
                                     "/usr/bin")
    assert shared is not None and "cwd" in dict(shared)


def test_a_step_that_reads_a_users_file_stays_the_users(open_tmp: Path) -> None:
    tmp_path = open_tmp
    home = open_tmp / "home"
    env = {"PATH": "/usr/bin:/bin"}
    prog = home / "prog"
    shutil.copy("/usr/bin/true", prog)
    os.chown(prog, 0, 0)  # root's file, in a user's directory: replaceable
    cases = {"a program in a user's directory": ([str(prog)], env)}
    # a PATH entry of the user's before the node's: a file may appear there
    cases["a user's PATH entry searched first"] = (["true"], {"PATH": f"{home}:/usr/bin:/bin"})
    # a root symlink in a root directory, to a file in the user's
    links = tmp_path / "links"
    links.mkdir()
    (links / "tool").symlink_to(prog)
    cases["a symlink into a user's directory"] = ([str(links / "tool")], env)
    # /tmp is sticky and writable by all: a file absent there can appear
    cases["a PATH entry in /tmp"] = (["true"], {"PATH": "/tmp:/usr/bin:/bin"})
    for why, (argv, step_env) in cases.items():
        probes = _probes_of(argv, step_env, "/")
        assert verdict_cache.node_wide(_base_inputs(argv[0], "/", step_env), probes, "/") \
            is None, why


def test_a_python_step_in_a_home_stays_the_users(open_tmp: Path) -> None:
    """/usr/bin/python3 -c ... reads the user site under HOME: per user."""
    home = open_tmp / "home"
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home)}
    argv = ["/usr/bin/python3", "-c", "import json"]
    probes = _probes_of(argv, env, "/")
    assert ("v", "HOME", "=" + str(home)) in probes
    assert verdict_cache.node_wide(_base_inputs(argv[0], "/", env), probes, "/") is None


def test_node_owned_answers(open_tmp: Path) -> None:
    tmp_path = open_tmp
    from grace_policy.nodeowned import NodeOwned

    owned = NodeOwned()
    assert owned.owned("s", "/usr/bin/env", fsprobe.answer("s", "/usr/bin/env"))
    assert owned.owned("s", "/usr/bin/no-such-program", "n")
    assert owned.owned("r", "/bin/sh", fsprobe.answer("r", "/bin/sh"))
    assert not owned.owned("s", "/tmp/no-such-file", "n")  # anyone may create it
    assert not owned.owned("s", "/usr/bin/env", "e13")     # depends on who asks
    assert not owned.owned("s", "relative", "n")
    mine = tmp_path / "root-file"
    mine.write_text("")
    mine.chmod(0o644)
    assert owned.owned("s", str(mine), fsprobe.answer("s", str(mine)))
    secret = tmp_path / "secret"
    secret.mkdir(mode=0o700)  # root's, but not searchable by users
    (secret / "f").write_text("")
    assert not owned.owned("s", str(secret / "f"), fsprobe.answer("s", str(secret / "f")))
    group_only = tmp_path / "group-only"
    group_only.write_text("")
    group_only.chmod(0o640)  # readable by one group: groups would matter
    assert not owned.owned("s", str(group_only), fsprobe.answer("s", str(group_only)))
    writable = tmp_path / "shared-dir"
    writable.mkdir()
    writable.chmod(0o775)  # a group may add files
    assert not owned.owned("s", str(writable / "x"), "n")
    users = tmp_path / "home" / "f"
    users.write_text("")
    os.chown(users, 0, 0)
    assert not owned.owned("s", str(users), fsprobe.answer("s", str(users)))
    # a root symlink whose target is a user's directory
    (tmp_path / "to-home").symlink_to(tmp_path / "home")
    assert not owned.owned("s", str(tmp_path / "to-home" / "f"),
                           fsprobe.answer("s", str(users)))
    assert owned.owned("l", str(tmp_path / "to-home"), "L")  # the link itself is root's


def test_node_owned_answers_do_not_depend_on_what_was_asked_before(open_tmp: Path) -> None:
    # One NodeOwned resolves each directory once for all the paths below it
    # (an entry asks about hundreds): the answers must be those of a fresh
    # instance per path, through symlinked directories and ".." too.
    from grace_policy.nodeowned import NodeOwned

    (open_tmp / "lib" / "sub").mkdir(parents=True)
    (open_tmp / "lib" / "sub" / "f").write_text("")
    (open_tmp / "to-lib").symlink_to(open_tmp / "lib")
    (open_tmp / "rel-lib").symlink_to("lib/sub/..")
    (open_tmp / "to-home").symlink_to("home")
    (open_tmp / "loop").symlink_to("loop")
    (open_tmp / "home" / "g").write_text("")
    paths = [str(open_tmp / p) for p in (
        "lib/sub/f", "to-lib/sub/f", "rel-lib/sub/f", "to-lib/../lib/sub/f",
        "to-home/g", "home/g", "lib/sub/f/x", "lib/none/f", "loop/f", "to-lib/./sub",
        "to-lib", "rel-lib")] + ["/usr/bin/env", "/bin/sh", "/usr/lib/../bin/env"]
    asked = [(op, path, fsprobe.answer(op, path)) for path in paths for op in ("s", "l", "r")]
    alone = [NodeOwned().owned(*q) for q in asked]
    assert any(alone) and not all(alone)
    for order in (asked, asked[::-1]):
        shared = NodeOwned()
        got = {q: shared.owned(*q) for q in order}
        assert [got[q] for q in asked] == alone


def test_encode_is_the_per_byte_rule() -> None:
    # The fast path (nothing to escape) must give what the byte loop gives,
    # which is what grace_cache.c writes and compares.
    def by_bytes(text: str) -> str:
        return "".join(chr(b) if 0x21 <= b <= 0x7E and b != 0x25 else f"%{b:02X}"
                       for b in os.fsencode(text))

    texts = [chr(i) for i in range(0x250)] + ["\udc80", "\udcff", "a b", "50%", "/usr/bin/env",
                                             "x\ty", "\u2028", "é/ü", ""]
    texts += [f"/lib/{t}/x" for t in texts]
    for text in texts:
        assert fsprobe.encode(text) == by_bytes(text), repr(text)


@pytest.mark.parametrize(("step_args", "prefix", "decisive"), [
    (["train.py", "--seed", "1"], [], 1),
    (["-u", "-X", "importtime", "-W", "ignore", "train.py", "-c", "x"], [], 6),
    (["-Esc", "import json", "-m", "x"], [], 2),
    (["-cimport json", "arg"], [], 1),
    (["-m", "torch.distributed.run", "--nproc", "4", "train.py"], [], 2),
    (["-", "--seed", "1"], [], 1),
    (["--", "train.py", "--seed"], [], 2),
    (["-E"], [], None),            # stdin without an operand: every word counts
    ([], [], None),
    (["-V", "x.py"], [], None),     # prints the version: nothing runs
    (["--seed", "1"], ["/venv/bin/tool"], 0),  # a console script's #! names the script
    (["--seed", "1"], ["-s", "/venv/bin/tool"], 0),
])
def test_the_words_that_decide_a_python_step(step_args: list[str], prefix: list[str],
                                             decisive: int | None) -> None:
    from grace_policy.python.interp import parse_python_argv
    from grace_policy.python.step import decisive_args

    args = [*prefix, *step_args]
    _flags, command = parse_python_argv(args, (3, 11))
    assert decisive_args(args, len(step_args), command) == decisive
