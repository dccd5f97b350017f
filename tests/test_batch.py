"""The batch-script reader (grace_policy/batch/): which commands a script
will run, with which environment, how certain, and what the verdict says.

Real parts: the real tree-sitter parser, real aarch64 and x86_64 programs
(built here), the real check. Hostile scripts end in a verdict, never an
exception or a hang (``no_hang`` guards against blocking; no timing asserts).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_hostile import no_hang

from grace_policy.batch.judge import decide_batch, read_script
from grace_policy.budget import Budget
from grace_policy.decide import StepRequest
from grace_policy.findings import Verdict
from grace_policy.node import detect
from grace_policy.policy import Limits, Policy

HOST = detect()
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    """A home with a foreign venv (aarch64 python, activate as venv writes
    it), a native venv, a conda root with a foreign env, foreign tools."""
    if shutil.which("aarch64-linux-gnu-gcc") is None:
        pytest.fail("aarch64-linux-gnu-gcc missing: bash packaging/install-deps.sh")
    root = tmp_path_factory.mktemp("batch")
    src = root / "p.c"
    src.write_text("int main(void) { return 0; }\n")
    foreign = root / "foreign"
    subprocess.run(["aarch64-linux-gnu-gcc", "-o", str(foreign), str(src)], check=True)
    home = root / "home"
    fv = home / "venvs" / "arm"
    (fv / "bin").mkdir(parents=True)
    shutil.copy2(foreign, fv / "bin" / "python")
    (fv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (fv / "bin" / "activate").write_text(
        f'deactivate () {{ :; }}\nVIRTUAL_ENV="{fv}"\nexport VIRTUAL_ENV\n')
    nv = home / "venvs" / "native"
    (nv / "bin").mkdir(parents=True)
    (nv / "bin" / "python").symlink_to(sys.executable)
    (nv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    # A newer venv: the prefix computed from the script's location.
    (nv / "bin" / "activate").write_text(
        'deactivate () { :; }\nVIRTUAL_ENV=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)\n')
    conda = root / "miniforge"
    for sub in ("bin", "etc/profile.d", "conda-meta"):
        (conda / sub).mkdir(parents=True)
    (conda / "bin" / "conda").write_text("#!/bin/sh\n")
    (conda / "bin" / "conda").chmod(0o755)
    (conda / "etc" / "profile.d" / "conda.sh").write_text("conda() { :; }\n")
    for envs_dir, name in ((conda / "envs", "fenv"), (home / ".conda" / "envs", "mine"),
                           (root / "shared-envs", "team")):
        (envs_dir / name / "bin").mkdir(parents=True)
        (envs_dir / name / "conda-meta").mkdir()
        shutil.copy2(foreign, envs_dir / name / "bin" / "python")
    (home / ".condarc").write_text("channels:\n  - conda-forge\n"
                                   f"envs_dirs:\n  - {root}/shared-envs\n")
    fbin = root / "fbin"
    fbin.mkdir()
    shutil.copy2(foreign, fbin / "tool")
    yield {"root": root, "home": home, "fv": fv, "nv": nv, "conda": conda, "fbin": fbin,
           "foreign": foreign}


def _env(world: dict[str, Path]) -> dict[str, str]:
    return {"HOME": str(world["home"]), "PATH": "/usr/local/bin:/usr/bin:/bin",
            "SLURM_SUBMIT_DIR": str(world["root"]), "SLURM_JOB_ID": "7"}


def _script(world: dict[str, Path], body: str, name: str = "job.sh",
            shebang: str = "#!/bin/bash") -> Path:
    path = world["root"] / name
    path.write_text(f"{shebang}\n{body}")
    path.chmod(0o755)
    return path


#: What these tests judge is the reading, not the time it takes: a loaded
#: machine must not turn a finding into check-limit (the limit test sets its own).
_ROOMY = Policy(limits=Limits(deadline_ms=60_000, max_files=200_000))


def _decide(world: dict[str, Path], body: str, *, policy: Policy | None = None,
            env: dict[str, str] | None = None, shebang: str = "#!/bin/bash",
            args: tuple[str, ...] = ()) -> Verdict:
    script = _script(world, body, shebang=shebang)
    with no_hang():
        return decide_batch(policy or _ROOMY,
                            StepRequest(partition=None, argv=[str(script), *args],
                                        env=env or _env(world), cwd=str(world["root"]), node=HOST))


def _lines(verdict: Verdict) -> list[tuple[str, str, str]]:
    """The commands' findings (not the note on where the script became uncertain)."""
    return [(f.severity, f.rule, f.path) for f in verdict.findings
            if f.path.startswith("line ") and f.rule != "batch-uncertain"]


def _uncertain_at(verdict: Verdict) -> list[str]:
    return [f.path for f in verdict.findings if f.rule == "batch-uncertain"]


def test_a_foreign_venv_python_on_the_main_path_is_an_error_naming_the_line(world) -> None:
    v = _decide(world, f"#SBATCH -p gb200\nsource {world['fv']}/bin/activate\n"
                       "python train.py --epochs 3\n")
    assert v.action == "reject"
    assert _lines(v) == [("error", "exe-arch-mismatch",
                          f"line 4: python train.py --epochs 3 -> {world['fv']}/bin/python")]


@pytest.mark.parametrize("body", [
    "if [ -n \"$SLURM_JOB_ID\" ]; then python x.py; fi\n",
    "for i in 1 2; do python x.py; done\n",
    "case $1 in *) python x.py ;; esac\n",
    "f() { python x.py; }\n",
    "( python x.py )\n",
    "true && python x.py\n",
    "false || python x.py\n",
    "module load cuda\npython x.py\n",
    "source ./setup.sh\npython x.py\n",
])
def test_off_the_main_path_the_same_command_only_warns(world, body: str) -> None:
    v = _decide(world, f"source {world['fv']}/bin/activate\n{body}")
    assert v.action == "warn", v
    assert [(s, r) for s, r, _p in _lines(v)] == [("warning", "exe-arch-mismatch")]


def test_pipelines_and_background_commands_are_on_the_main_path(world) -> None:
    v = _decide(world, f"source {world['fv']}/bin/activate\npython x.py 2>&1 | tee log &\n")
    assert v.action == "reject"


def test_export_path_then_a_tool(world) -> None:
    v = _decide(world, f"export PATH={world['fbin']}:$PATH\ntool --help\n")
    assert _lines(v) == [("error", "exe-arch-mismatch",
                          f"line 3: tool --help -> {world['fbin']}/tool")]


@pytest.mark.parametrize("shebang", ["#!/bin/bash", "#!/bin/sh", "#!/usr/bin/dash"])
def test_a_foreign_tool_line_is_worded_as_the_scripts_shell_words_it(world,
                                                                     shebang: str) -> None:
    """The predicted failure of a line whose program cannot be exec'd is the
    text the script's own shell prints: the real shells of this machine run
    the script (the aarch64 tool fails with ENOEXEC here) and their stderr
    must hold the prediction. /bin/sh is whatever this host has (dash on
    Debian and Ubuntu); the busybox wording is held to busybox in the
    two-architecture test (tests/test_two_arch.py, the guest's /bin/sh)."""
    interp = shebang[2:]
    if not os.path.exists(interp):
        pytest.skip(f"{interp} not on this machine")
    body = f"export PATH={world['fbin']}:$PATH\ntool --help\n"
    v = _decide(world, body, shebang=shebang)
    (finding,) = [f for f in v.findings if f.rule == "exe-arch-mismatch"]
    script = _script(world, body, shebang=shebang)
    real = subprocess.run([str(script)], capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin"}, check=False)
    assert real.returncode == 126, real
    assert f"{script}: {finding.predicted_error}" in real.stderr, (finding.predicted_error,
                                                                   real.stderr)


@pytest.mark.parametrize("activation,env_dir", [
    ("source {conda}/etc/profile.d/conda.sh\nconda activate fenv", "{conda}/envs/fenv"),
    ("source {conda}/etc/profile.d/conda.sh\nconda activate mine", "{home}/.conda/envs/mine"),
    ("source {conda}/etc/profile.d/conda.sh\nmamba activate team", "{root}/shared-envs/team"),
    ("source {conda}/etc/profile.d/conda.sh\nconda activate {conda}/envs/fenv",
     "{conda}/envs/fenv"),
    ("source {conda}/bin/activate fenv", "{conda}/envs/fenv"),
])
def test_conda_environments_resolve_as_conda_does(world, activation: str, env_dir: str) -> None:
    fmt = {k: str(v) for k, v in world.items()}
    v = _decide(world, activation.format(**fmt) + "\npython x.py\n")
    [(severity, rule, path)] = _lines(v)
    assert (severity, rule) == ("error", "exe-arch-mismatch")
    assert path.endswith(f"-> {env_dir.format(**fmt)}/bin/python")


def test_conda_hook_with_conda_exe_from_the_environment(world) -> None:
    env = {**_env(world), "PATH": f"{world['conda']}/bin:/usr/bin:/bin"}
    v = _decide(world, 'eval "$(conda shell.bash hook)"\nconda activate fenv\npython x.py\n',
                env=env)
    assert [r for _s, r, _p in _lines(v)] == ["exe-arch-mismatch"]
    assert v.action == "reject"


def test_an_unknown_conda_env_leaves_the_rest_uncertain(world) -> None:
    v = _decide(world, f"source {world['conda']}/etc/profile.d/conda.sh\nconda activate nope\n"
                       f"{world['foreign']}\n")
    assert [s for s, _r, _p in _lines(v)] == ["warning"]


def test_srun_lines_are_judged_as_their_steps(world) -> None:
    v = _decide(world, f"srun -n 4 --gpus-per-task 1 --export=ALL,X=1 {world['foreign']} a\n"
                       f"srun --unknown-option {world['foreign']}\n")
    assert _lines(v) == [("error", "exe-arch-mismatch",
                          f"line 2: srun -n 4 --gpus-per-task 1 --export=ALL,X=1 "
                          f"{world['foreign']} a -> {world['foreign']}")]


def test_a_launcher_s_script_is_judged_in_the_launcher_s_python(world) -> None:
    """``torchrun X.py``: X.py runs in torchrun's python, and what it imports
    (here a module built for aarch64 next to it) is judged there."""
    work = world["root"] / "launch"
    work.mkdir(exist_ok=True)
    src = work / "m.c"
    src.write_text("int x;\n")
    tag = f"cpython-{sys.version_info[0]}{sys.version_info[1]}-x86_64-linux-gnu"
    subprocess.run(["aarch64-linux-gnu-gcc", "-shared", "-fPIC", "-o",
                    str(work / f"foo.{tag}.so"), str(src)], check=True)
    (work / "train.py").write_text("import foo\n")
    launcher = work / "torchrun"
    launcher.write_text(f"#!{sys.executable}\nimport sys\n")
    launcher.chmod(0o755)
    v = _decide(world, f"export PATH={work}:$PATH\ncd {work}\n"
                       "torchrun --nproc_per_node=2 train.py --lr 1\n")
    assert [(s, r) for s, r, _p in _lines(v)] == [("error", "py-ext-arch")], v.findings
    assert _lines(v)[0][2] == (f"line 4: torchrun --nproc_per_node=2 train.py --lr 1 -> "
                               f"{work}/foo.{tag}.so")


def test_expansions_the_step_knows_are_expanded(world) -> None:
    env = {**_env(world), "ARCH_TOOLS": str(world["fbin"])}
    v = _decide(world, 'D="${NOPE:-$ARCH_TOOLS}"\n"$D/tool" "$@"\n', env=env, args=("a b",))
    assert [p for _s, _r, p in _lines(v)] == [f'line 3: "$D/tool" "$@" -> {world["fbin"]}/tool']
    v = _decide(world, "cd ~/venvs/arm/bin && true\ncd ~/venvs/arm/bin\n./python\n")
    assert [s for s, _r, _p in _lines(v)] == ["error"]


@pytest.mark.parametrize("body", [
    "$(echo {foreign}) x\n",
    "P=$(printf %s {foreign}); $P\n",
    "`echo {foreign}`\n",
    "$NOBODY_SET_THIS/tool\n",
    "{fbin}/t*l\n",
    "X=$RANDOM; {fbin}/tool$X\n",
    "${{TOOL:?}}\n",
])
def test_words_a_reader_cannot_know_are_never_judged(world, body: str) -> None:
    fmt = {k: str(v) for k, v in world.items()}
    v = _decide(world, body.format(**fmt))
    assert v.action == "allow", v
    assert not v.findings


def test_unset_at_the_top_makes_a_leak_harmless(world) -> None:
    leak = {**_env(world), "VIRTUAL_ENV": str(world["fv"]), "CONDA_PREFIX": str(world["fv"])}
    plain = _decide(world, "hostname\n", env=leak)
    assert {f.rule for f in plain.findings} == {"env-leak"}
    assert "VIRTUAL_ENV" in plain.env.unset
    cleaned = _decide(world, "unset CONDA_PREFIX VIRTUAL_ENV\nhostname\n", env=leak)
    assert cleaned.action == "allow" and not cleaned.findings and cleaned.env.empty
    # The leaked PATH is then the script's: judged line by line as it is.
    leak["PATH"] = f"{world['fv']}/bin:{leak['PATH']}"
    left = _decide(world, "unset CONDA_PREFIX VIRTUAL_ENV\npython x.py\n", env=leak)
    assert [r for _s, r, _p in _lines(left)] == ["exe-arch-mismatch"]


def test_exec_and_exit_end_the_main_path(world) -> None:
    assert _lines(_decide(world, f"exec > log 2>&1\n{world['foreign']}\n"))
    assert not _lines(_decide(world, f"exec hostname\n{world['foreign']}\n"))
    assert not _lines(_decide(world, f"exit 3\n{world['foreign']}\n"))
    [(severity, _r, _p)] = _lines(_decide(world, f"exec {world['foreign']}\n"))
    assert severity == "error"


def test_a_clean_script_with_a_native_venv_is_silent(world) -> None:
    v = _decide(world, f"source {world['nv']}/bin/activate\ncd \"$SLURM_SUBMIT_DIR\"\n"
                       "python -c 'import sys'\nsrun hostname | sort\nexit 0\n"
                       f"{world['foreign']}\n")
    assert (v.action, v.findings) == ("allow", ())


def test_activate_without_a_literal_prefix_is_derived_from_its_location(world) -> None:
    reading = read_script(str(_script(world, f"source {world['nv']}/bin/activate\npython x\n")),
                          [], _env(world), str(world["root"]), Budget())
    [cmd] = reading.commands
    assert cmd.env["VIRTUAL_ENV"] == str(world["nv"])
    assert cmd.env["PATH"].startswith(f"{world['nv']}/bin:")
    assert cmd.certain


def test_other_interpreters_are_judged_as_before(world) -> None:
    v = _decide(world, f"#SBATCH -p x\nimport os\nos.system('{world['foreign']}')\n",
                shebang="#!/usr/bin/env python3")
    assert not _lines(v)


def test_a_login_shell_makes_everything_uncertain(world) -> None:
    v = _decide(world, f"{world['foreign']}\n", shebang="#!/bin/bash -l")
    assert [s for s, _r, _p in _lines(v)] == ["warning"]
    assert _uncertain_at(v) == ["line 1"]


def test_exemptions_release_a_line_s_finding_by_its_file(world) -> None:
    from grace_policy.exempt import Who
    from grace_policy.policy import Exemption

    policy = Policy(exemptions=(Exemption(rule="exe-arch-mismatch", until="2999-12-31",
                                          reason="vendor tool", paths=(str(world["fbin"]) + "/*",),
                                          where="rules.exe-arch-mismatch.exempt[0]"),))
    script = _script(world, f"{world['fbin']}/tool\n{world['foreign']}\n")
    with no_hang():
        v = decide_batch(policy, StepRequest(partition=None, argv=[str(script)], env=_env(world),
                                             cwd=str(world["root"]), node=HOST,
                                             who=Who(uid=os.getuid())))
    assert [p for _s, _r, p in _lines(v)] == [f"line 3: {world['foreign']} -> {world['foreign']}"]
    assert [e.path for e in v.exempted] == [f"{world['fbin']}/tool"]


def test_where_the_script_becomes_uncertain_is_an_info_note(world) -> None:
    from grace_policy.messages import user_lines

    v = _decide(world, "hostname\nmodule load cuda/12\nhostname\n")
    assert v.action == "allow" and _uncertain_at(v) == ["line 3"]
    [note] = [f for f in v.findings if f.rule == "batch-uncertain"]
    assert note.severity == "info" and "module load cuda/12" in note.remediation
    assert user_lines(v) == []  # job output shows warnings and errors only


def test_user_text_in_messages_is_escaped(world) -> None:
    from grace_policy.messages import user_lines

    evil = world["fbin"] / "t\x1b[2Jx"
    shutil.copy2(world["foreign"], evil)
    v = _decide(world, f"'{evil}'\n")
    text = "\n".join(user_lines(v))
    assert "\x1b" not in text and "\\x1b[2J" in text


# -- hostile scripts ---------------------------------------------------------

@pytest.mark.parametrize("body", [
    "\x00\x01\x02\xff\xfe binary\n" * 100,
    "echo " + "a" * (1 << 20) + "\n",
    "if true; then " * 3000 + "x" + "; fi" * 3000 + "\n",
    "(" * 5000 + "x" + ")" * 5000 + "\n",
    "source \"$0\"\n. ./job.sh\n",
    "{ " * 2000 + "x; " + "} " * 2000 + "\n",
    "fi done esac ))) ]] }}} $((( ${ \"'\n",
    "cat <<EOF\n" + "x\n" * 10000,
    "echo " + "${X:-" * 3000 + "y" + "}" * 3000 + "\n",
    "a && " * 5000 + "b\n",
    "x | " * 5000 + "y\n",
])
def test_hostile_scripts_end_in_a_verdict(world, body: str) -> None:
    v = _decide(world, body)
    assert v.action in ("allow", "warn", "reject")
    assert not (v.error or "").startswith("batch script not read: internal error"), v.error


def test_a_symlinked_activate_to_a_fifo_or_a_device_is_no_venv(world) -> None:
    d = world["root"] / "evil" / "bin"
    d.mkdir(parents=True, exist_ok=True)
    fifo = world["root"] / "fifo"
    if not fifo.exists():
        os.mkfifo(fifo)
    for target in (fifo, Path("/dev/zero"), d / "activate"):
        link = d / "activate"
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(target)
        v = _decide(world, f"source {link}\n{world['foreign']}\n")
        assert [s for s, _r, _p in _lines(v)] == ["warning"]


def test_too_large_or_too_many_commands_is_a_check_limit(world) -> None:
    big = _decide(world, "# x\n" * 300_000)
    assert "check-limit" in [f.rule for f in big.findings]
    many = _decide(world, "".join(f"{world['fbin']}/tool {i}\n" for i in range(250)))
    rules = [f.rule for f in many.findings]
    assert "check-limit" in rules and "exe-arch-mismatch" in rules
    assert many.action == "reject"  # what was found before the cap still counts
    slow = _decide(world, f"{world['foreign']}\n" * 10,
                   policy=Policy(limits=Limits(deadline_ms=0.001)))
    assert "check-limit" in [f.rule for f in slow.findings]


# -- the CLI and the launch path --------------------------------------------

def test_check_batch_by_hand(world) -> None:
    script = _script(world, f"source {world['fv']}/bin/activate\npython train.py\n")
    done = subprocess.run([sys.executable, "-m", "grace_policy", "check", "--batch", str(script),
                           "--cwd", str(world["root"])], capture_output=True, text=True,
                          cwd=REPO, env={**_env(world), "PYTHONPATH": str(REPO)}, timeout=120)
    assert done.returncode == 2, done.stderr
    assert ("grace-policy: ERROR exe-arch-mismatch: line 3: python train.py -> "
            f"{world['fv']}/bin/python") in done.stdout


def test_a_step_that_is_no_batch_step_never_imports_the_reader() -> None:
    code = ("import sys; sys.path.insert(0, sys.argv[1]);"
            "from grace_policy.decide import StepRequest, decide;"
            "from grace_policy.policy import Policy;"
            "decide(Policy(), StepRequest(partition=None, argv=['/bin/sh', '-c', 'true'],"
            " env={'PATH': '/usr/bin'}, cwd='/', node=None));"
            "print(' '.join(m for m in sys.modules if 'batch' in m or 'tree_sitter' in m))")
    out = subprocess.run([sys.executable, "-S", "-E", "-c", code, str(REPO)],
                         capture_output=True, text=True, check=True, timeout=60).stdout
    assert out.split() == []


def test_the_reader_keeps_typing_off_a_batch_step(world) -> None:
    script = _script(world, "echo hi\n")
    code = ("import sys; sys.path[:0] = [sys.argv[1], *sys.argv[2].split(':')];"
            "from grace_policy.batch.judge import decide_batch;"
            "from grace_policy.decide import StepRequest;"
            "from grace_policy.policy import Policy;"
            f"decide_batch(Policy(), StepRequest(partition=None, argv=[{str(script)!r}],"
            " env={'PATH': '/usr/bin'}, cwd='/', node=None));"
            "print(' '.join(sorted(m for m in ('typing', 'importlib.resources', 'tree_sitter',"
            " 'tree_sitter._binding') if m in sys.modules)))")
    out = subprocess.run([sys.executable, "-S", "-E", "-c", code, str(REPO),
                          ":".join(p for p in sys.path if p)],
                         capture_output=True, text=True, check=True, timeout=60).stdout
    assert out.split() == ["tree_sitter._binding"]


@pytest.mark.parametrize("line,argv", [
    ('X="a b"; cat $X', ["cat", "a", "b"]),
    ('X="a b"; cat "$X"', ["cat", "a b"]),
    ("X=a; cat ${X}y '$X' \\$X", ["cat", "ay", "$X", "$X"]),
    ('cat "${HOME}/x" ~/y', ["cat", "{home}/x", "{home}/y"]),
    ('cat "$@" $1', ["cat", "one", "two words", "one"]),
    ("cat ${NOPE:-dflt} ${NOPE-d2} ${HOME:+set}", ["cat", "dflt", "d2", "set"]),
    ("cat ${Y:=made}; cat $Y", ["cat", "made"]),
    ("A=x; A+=y; cat $A", ["cat", "xy"]),
    ("E=; cat $E a", ["cat", "a"]),
    ('cat "a"b"c" "$#"', ["cat", "abc", "2"]),
    ("set -- p q; shift; cat $@", ["cat", "q"]),
])
def test_words_expand_as_bash_expands_them(world, line: str, argv: list[str]) -> None:
    script = _script(world, line + "\n")
    reading = read_script(str(script), ["one", "two words"], _env(world), str(world["root"]),
                          Budget())
    home = str(world["home"])
    assert list(reading.commands[-1].argv) == [a.format(home=home) for a in argv]


def test_only_exported_variables_reach_a_command(world) -> None:
    script = _script(world, "A=1\nexport B=2\nC=3 cat\nexport A\ncat\n")
    reading = read_script(str(script), [], _env(world), str(world["root"]), Budget())
    first, second = reading.commands
    assert ("A" not in first.env, first.env["B"], first.env["C"]) == (True, "2", "3")
    assert (second.env["A"], "C" in second.env) == ("1", False)


def test_nested_expansions_past_the_bound_leave_the_command_unjudged(world) -> None:
    """``${A:-${A:-...}}``: a few levels expand as bash would; past
    ``MAX_NESTING`` the word is unknown (no guess, and no deep recursion)."""
    from grace_policy.batch.words import MAX_NESTING

    def nested(depth: int) -> str:
        return "cat " + "${A:-" * depth + "end" + "}" * depth + "\n"

    shallow = read_script(str(_script(world, nested(3))), [], _env(world),
                          str(world["root"]), Budget())
    assert list(shallow.commands[-1].argv) == ["cat", "end"]
    deep = read_script(str(_script(world, nested(MAX_NESTING + 1))), [], _env(world),
                       str(world["root"]), Budget())
    assert all(list(c.argv) != ["cat", "end"] for c in deep.commands)
