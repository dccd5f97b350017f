"""The batch reader against the shell itself (issue 28, part 3): for each
script, the real bash (or dash) on this machine runs it and says what it
started; the reader must agree. A command the shell never starts must not
be an error (a false error rejects a good job in enforce mode); one it
starts on the main path must be found.

The foreign program is an aarch64 build: started here it fails with
"Exec format error" (the shell's own words), which is how the oracle knows
it ran. Nothing here is mocked: real shells, real programs, the real check.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from roomy import ROOMY
from test_hostile import no_hang

from grace_policy.batch.judge import decide_batch, read_script
from grace_policy.budget import Budget
from grace_policy.decide import StepRequest
from grace_policy.findings import Verdict
from grace_policy.node import detect

HOST = detect()
#: What the foreign program's start leaves on stderr: the shell's own words,
#: or (started by execvp: nohup, env) the sh fallback's complaint about it.
FOREIGN_RAN = ("Exec format error", "Syntax error", "syntax error")


@pytest.fixture(scope="module")
def shw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    """A foreign ``tool`` on its own PATH directory, a foreign ``which`` on
    another; a native program linked to a library only LD_LIBRARY_PATH
    finds; directories a and b (a foreign ``tool`` in a, a native one in b),
    p/b with a symlink to it; a conda root with a foreign env."""
    if shutil.which("aarch64-linux-gnu-gcc") is None:
        pytest.fail("aarch64-linux-gnu-gcc missing: bash packaging/install-deps.sh")
    root = tmp_path_factory.mktemp("shell")
    src = root / "p.c"
    src.write_text("int main(void) { return 0; }\n")
    foreign = root / "foreign"
    subprocess.run(["aarch64-linux-gnu-gcc", "-o", str(foreign), str(src)], check=True)
    fbin = root / "fbin"
    fbin.mkdir()
    shutil.copy2(foreign, fbin / "tool")
    wbin = root / "wbin"
    wbin.mkdir()
    shutil.copy2(foreign, wbin / "which")
    lib = root / "lib"
    lib.mkdir()
    (root / "gp.c").write_text("int gp_answer(void) { return 0; }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(lib / "libgpanswer.so"),
                    str(root / "gp.c")], check=True)
    (root / "m.c").write_text("int gp_answer(void);\nint main(void) { return gp_answer(); }\n")
    subprocess.run(["gcc", "-o", str(root / "prog"), str(root / "m.c"), f"-L{lib}",
                    "-lgpanswer"], check=True)
    for d in ("a", "b", "p/b"):
        (root / d).mkdir(parents=True)
    shutil.copy2(foreign, root / "a" / "tool")
    shutil.copy2("/bin/true", root / "b" / "tool")
    shutil.copy2("/bin/true", root / "p" / "b" / "tool")
    shutil.copy2(foreign, root / "p" / "tool")
    shutil.copy2("/bin/true", root / "tool")
    (root / "blink").symlink_to(root / "p" / "b")
    conda = root / "conda"
    for sub in ("bin", "etc/profile.d", "conda-meta", "envs/fenv/bin", "envs/fenv/conda-meta"):
        (conda / sub).mkdir(parents=True)
    (conda / "bin" / "conda").write_text("#!/bin/sh\n")
    (conda / "bin" / "conda").chmod(0o755)
    (conda / "etc" / "profile.d" / "conda.sh").write_text("conda() { :; }\n")
    shutil.copy2(foreign, conda / "envs" / "fenv" / "bin" / "python")
    yield {"root": root, "foreign": foreign, "fbin": fbin, "wbin": wbin, "lib": lib,
           "conda": conda}


def _env(shw: dict[str, Path], **extra: str) -> dict[str, str]:
    return {"HOME": str(shw["root"]), "PATH": "/usr/local/bin:/usr/bin:/bin",
            "SLURM_JOB_ID": "7", "LC_ALL": "C.UTF-8", **extra}


def _script(shw: dict[str, Path], body: str, shebang: str = "#!/bin/bash") -> Path:
    """The job script: ``{name}`` stands for the fixture's path of that name."""
    for name, path in shw.items():
        body = body.replace("{" + name + "}", str(path))
    path = shw["root"] / "job.sh"
    path.write_text(f"{shebang}\n{body}", encoding="utf-8")
    path.chmod(0o755)
    return path


def _real(script: Path, env: dict[str, str], cwd: Path, args: tuple[str, ...] = ()
          ) -> subprocess.CompletedProcess[str]:
    """The script run by the interpreter its #! line names, as slurmd runs it."""
    return subprocess.run([str(script), *args], capture_output=True, text=True, timeout=60,
                          env=env, cwd=cwd, check=False)


def _judged(script: Path, env: dict[str, str], cwd: Path, args: tuple[str, ...] = ()
            ) -> Verdict:
    with no_hang(60):
        v = decide_batch(ROOMY, StepRequest(partition=None, argv=[str(script), *args], env=env,
                                            cwd=str(cwd), node=HOST))
    assert v.error is None, v.error  # no internal error: the script was judged
    return v


def _found(v: Verdict, rule: str = "exe-arch-mismatch") -> list[str]:
    return [f.severity for f in v.findings if f.rule == rule and f.path.startswith("line ")]


def _agrees(shw: dict[str, Path], body: str, *, env: dict[str, str] | None = None,
            cwd: Path | None = None, shebang: str = "#!/bin/bash",
            args: tuple[str, ...] = ()) -> tuple[bool, list[str]]:
    """(did the shell start a foreign program, the reader's severities for
    it), held to the rule: an error only where the shell started one, and a
    finding (error or warning) wherever it did."""
    script = _script(shw, body, shebang)
    env = env or _env(shw)
    cwd = cwd or shw["root"]
    stderr = _real(script, env, cwd, args).stderr
    ran = any(words in stderr for words in FOREIGN_RAN)
    found = _found(_judged(script, env, cwd, args))
    if not ran:
        assert "error" not in found, f"false error: the shell never started it\n{body}"
    else:
        assert found, f"the shell started a foreign program the reader missed\n{body}"
    return ran, found


# -- 1. command, type, hash, which: naming a program is not running it -------

_PATH = "export PATH={fbin}:$PATH\n"


@pytest.mark.parametrize("body,runs", [
    ("command -v tool || exit 1\n", False),
    ("command -V tool\n", False),
    ("command -pv tool\n", False),
    ("command -v -p tool\n", False),
    ("if ! command -v tool >/dev/null; then exit 1; fi\n", False),
    ("type tool\n", False),
    ("type -P tool\n", False),
    ("type -a tool\n", False),
    ("hash tool\n", False),
    ("which tool\n", False),
    ("builtin tool\n", False),          # not a shell builtin: nothing runs
    ("command -x tool\n", False),       # an invalid option: usage, nothing runs
    ("command -p tool\n", False),       # looked up in /bin:/usr/bin only: not there
    ("command tool\n", True),
    ("command -- tool a\n", True),
    ("tool() { :; }\ncommand tool\n", True),  # command bypasses the function
    ("builtin command tool\n", True),
    ("command command -v tool\n", False),
    ("time -p tool\n", True),
    ("nohup tool\n", True),
    ("exec -a name tool\n", True),
    ("exec -c -l tool\n", True),        # found with the shell's PATH, run with no env
])
def test_command_runs_only_what_bash_runs(shw, body: str, runs: bool) -> None:
    ran, found = _agrees(shw, _PATH + body)
    assert ran == runs, "the oracle disagrees with the case's expectation"
    assert found == (["error"] if runs else [])


def test_which_the_program_runs_and_is_judged(shw) -> None:
    ran, found = _agrees(shw, "export PATH={wbin}:$PATH\nwhich ls\n")
    assert ran and found == ["error"]


def test_command_p_finds_with_the_default_path(shw) -> None:
    """``command -p ls`` with a PATH that has no ls: bash looks in
    ``getconf PATH`` (/bin:/usr/bin) and runs that ls, with the script's env."""
    script = _script(shw, "export PATH={fbin}\ncommand -p ls /\n")
    assert _real(script, _env(shw), shw["root"]).returncode == 0
    reading = read_script(str(script), [], _env(shw), str(shw["root"]), Budget())
    [cmd] = reading.commands
    assert cmd.argv[0] in ("/bin/ls", "/usr/bin/ls") and cmd.argv[1:] == ("/",)
    assert cmd.env["PATH"] == str(shw["fbin"])


def test_hash_p_names_the_file_a_later_word_runs(shw) -> None:
    """``hash -p FILE NAME``: NAME then runs FILE, until PATH is assigned
    (bash empties its table) or ``hash -r`` / ``hash -d NAME``."""
    ran, found = _agrees(shw, "hash -p {foreign} ls\nls\n")
    assert ran and found == ["error"]
    for forget in ("PATH=$PATH", "hash -r", "hash -d ls"):
        ran, found = _agrees(shw, f"hash -p {{foreign}} ls\n{forget}\nls\n")
        assert (ran, found) == (False, []), forget


# -- 2. set -a / set -o allexport ---------------------------------------------

_SET_FORMS = [
    "set -a", "set -ea", "set -ua", "set -o allexport", "set -o errexit -o allexport",
    "set -eo allexport", "set -oe allexport", "set -ao errexit", "set -o allexport +o allexport",
    "set -a; set +o allexport", "set -a; set +a", "set -a x y", "set -a -- -b", "set +a",
    "set -o", "set -o allexport -o", "set -o -a", "set -", "set - x", "set -- -a",
    "set -o pipefail,allexport", "set -o alle", "set -a -o alle", "set -o alle -a",
    "set -aq", "set -a -q", "set -h -a",
]


@pytest.mark.parametrize("shebang", ["#!/bin/bash", "#!/bin/sh", "#!/usr/bin/dash"])
@pytest.mark.parametrize("form", _SET_FORMS)
def test_set_exports_and_arguments_as_the_shell_sets_them(shw, form: str, shebang: str) -> None:
    """After each ``set`` form the script assigns a variable and starts
    printenv: the reader's printenv step has the variable in its
    environment exactly when the shell exported it, the same arguments,
    and exists exactly when the shell got that far."""
    interp = shebang[2:]
    if not os.path.exists(interp):
        pytest.skip(f"{interp} not on this machine")
    body = f'{form} >/dev/null 2>&1\nX_SET=1\necho "ARGS<$*>"\nprintenv X_SET "$@"\n'
    script = _script(shw, body, shebang)
    real = _real(script, _env(shw), shw["root"], ("p1", "p2"))
    lines = real.stdout.splitlines()
    reading = read_script(str(script), ["p1", "p2"], _env(shw), str(shw["root"]), Budget(),
                          shell=(os.path.basename(os.path.realpath(interp)), False))
    printed = [c for c in reading.commands if c.argv[0] == "printenv"]
    if not any(line.startswith("ARGS<") for line in lines):
        # The shell ended the script at the set line (sh: a special builtin's error).
        assert printed == [] or reading.uncertain is not None, (lines, real.stderr)
        return
    [args_line] = [line for line in lines if line.startswith("ARGS<")]
    [cmd] = printed
    assert ("X_SET" in cmd.env) == ("1" in lines), (lines, cmd.env.get("X_SET"))
    assert " ".join(cmd.argv[2:]) == args_line[5:-1]


def test_allexport_exports_a_library_path_the_program_needs(shw) -> None:
    """The false error of issue 28: ``set -o allexport`` then
    ``LD_LIBRARY_PATH=...``: the program finds its library and runs."""
    for form, loads in (("set -o allexport", True), ("set -ea", True),
                        ("set -o errexit -o allexport", True),
                        ("set -o allexport; set +o allexport", False), ("", False)):
        script = _script(shw, form + "\nLD_LIBRARY_PATH={lib}\n./prog\n")
        real = _real(script, _env(shw), shw["root"])
        assert (real.returncode == 0) == loads, (form, real.stderr)
        found = _found(_judged(script, _env(shw), shw["root"]), "lib-not-found")
        assert found == ([] if loads else ["error"]), form


def test_shellopts_in_the_environment_turns_allexport_on_in_bash(shw) -> None:
    script = _script(shw, "LD_LIBRARY_PATH={lib}\n./prog\n")
    env = _env(shw, SHELLOPTS="allexport")
    assert _real(script, env, shw["root"]).returncode == 0
    assert _found(_judged(script, env, shw["root"]), "lib-not-found") == []


# -- 3. PWD as the shell sets it at start-up ----------------------------------

@pytest.mark.parametrize("pwd,cwd", [
    ("a", "b"),        # sbatch --chdir=b from a: PWD names another directory
    ("b", "b"),
    (None, "b"),
    ("rel/x", "b"),    # not absolute
    ("a/../b", "b"),   # names b: kept as written
    ("blink", "blink"),
    ("a", "blink"),    # reset to the physical path
    ("p/b", "blink"),  # names the same directory: kept
])
def test_pwd_is_what_the_shell_sets_at_start_up(shw, pwd: str | None, cwd: str) -> None:
    root = shw["root"]
    env = _env(shw)
    if pwd is not None:
        env["PWD"] = pwd if pwd.startswith("rel") else f"{root}/{pwd}"
    body = "printenv PWD\ncd \"$PWD\"\n./tool\ncd ..\nprintenv PWD OLDPWD\n./tool\n"
    script = _script(shw, body)
    real = _real(script, env, root / cwd)
    reading = read_script(str(script), [], env, str(root / cwd), Budget())
    shown = [c for c in reading.commands if c.argv[0] == "printenv"]
    said = real.stdout.splitlines()
    assert [shown[0].env.get("PWD")] == said[:1], (said, real.stderr)
    assert [shown[1].env.get("PWD"), shown[1].env.get("OLDPWD")] == said[1:], said
    _agrees(shw, body, env=env, cwd=root / cwd)


def test_a_chdir_job_runs_the_tool_of_its_own_directory(shw) -> None:
    """The false error of issue 28: submitted from a (PWD=a) with
    ``--chdir=b``: ``cd "$PWD"`` stays in b, whose tool is native."""
    env = _env(shw, PWD=str(shw["root"] / "a"))
    ran, found = _agrees(shw, 'cd "$PWD"\n./tool\n', env=env, cwd=shw["root"] / "b")
    assert (ran, found) == (False, [])
    env = _env(shw, PWD=str(shw["root"] / "b"))
    ran, found = _agrees(shw, 'cd "$PWD"/../a\n./tool\n', env=env, cwd=shw["root"] / "b")
    assert (ran, found) == (True, ["error"])


# -- 4. digits bash does not read as digits -----------------------------------

_BIG = "9" * 5000
_DIGITS = [
    'set -- ² ٣ ４\nshift ²\ntool "$1"\n',
    "set -- a b c\nshift ٣\ntool\n",
    "set -- a b c\nshift ４\ntool\n",
    "set -- a b c\nshift ३\ntool\n",
    f"set -- a b c\nshift {_BIG}\ntool\n",
    "set -- a b\nshift 3\ntool\n",
    "set -- a b\nshift -- 1\ntool $1\n",
    "echo $²\ntool\n",
    'echo "$²" "$٣x" "$ b"\ntool\n',
    "echo ${²}\ntool\n",
    "X=${١}\ntool\n",
    'echo "${٣:-x}"\ntool\n',
    "echo ${" + "0" * 5000 + "1}\ntool\n",
    "cat ３>&1 </dev/null\ntool\n",
    "cat </dev/null 2>&３\ntool\n",
    "exec ２>/dev/null\ntool\n",
    "read x² y </dev/null\ntool\n",
    "tool ${1}x $10 ²>/dev/null\n",
]


@pytest.mark.parametrize("body", _DIGITS, ids=[f"d{i}" for i in range(len(_DIGITS))])
@pytest.mark.parametrize("shebang", ["#!/bin/bash", "#!/usr/bin/dash"])
def test_unicode_digits_leave_the_script_judged(shw, body: str, shebang: str) -> None:
    if not os.path.exists(shebang[2:]):
        pytest.skip(f"{shebang[2:]} not on this machine")
    _agrees(shw, _PATH + body, shebang=shebang, args=("one",))


@pytest.mark.parametrize("level", ["3", "²", "٣", "３", _BIG, "-1", "x"],
                         ids=["ascii3", "sup2", "arabic3", "full3", "big", "minus1", "x"])
def test_a_strange_conda_shlvl_leaves_the_activation_judged(shw, level: str) -> None:
    """conda's own ``int(CONDA_SHLVL)`` refuses some of these and takes
    others (``٣`` is 3 to Python): the reader judges the env's python after
    an ASCII level and leaves the rest unjudged (the level it would export
    is unknown), never an internal error."""
    script = _script(shw, "source {conda}/etc/profile.d/conda.sh\nconda activate fenv\n"
                          "python x.py\n")
    v = _judged(script, _env(shw, CONDA_SHLVL=level), shw["root"])
    assert _found(v) == (["error"] if level == "3" else [])


def test_positional_parameters_past_nine_need_braces(shw) -> None:
    """``$10`` is ``${1}0`` (bash reads one digit); ``${010}`` is ``${10}``."""
    script = _script(shw, 'cat $10 "${10}" ${010} "$1"0 "$٣"\n')
    args = tuple("abcdefghij")
    real = subprocess.run(["bash", "-c", 'printf "%s\\n" $10 "${10}" ${010} "$1"0 "$٣"', "s",
                           *args], capture_output=True, text=True, check=True)
    reading = read_script(str(script), list(args), _env(shw), str(shw["root"]), Budget())
    [cmd] = reading.commands
    assert list(cmd.argv[1:]) == real.stdout.splitlines()


def test_an_unreadable_name_never_reaches_int(shw) -> None:
    """Every digit test in the reader is ASCII: a script of only such words
    ends in a verdict (no internal error), with its commands found."""
    body = "".join(f"set -- {d}\nshift {d}\nX=${{{d}}}\necho ${d}\n"
                   for d in ("²", "٣", "３", "߁", "𝟘"))
    script = _script(shw, _PATH + body + "tool\n")
    v = _judged(script, _env(shw), shw["root"])
    assert _found(v)

