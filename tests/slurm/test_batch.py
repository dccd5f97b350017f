"""Batch scripts on a real Slurm (issue 21): what the script's lines will run
is judged before its first line runs.

The node is this x86_64 machine; ``foreign`` is an aarch64 build of the
side-effect program (harness.py), the interpreter of ``venv-foreign``. Each
failing script's line 2 leaves a file behind if the script ever starts: a
rejected job must not leave it, a warned one must.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from .harness import SlurmEnv

pytestmark = pytest.mark.slurm

PREFIX = "grace-policy: "


@pytest.fixture(scope="module")
def envs(slurm: SlurmEnv) -> dict[str, Path]:
    """Activate scripts for the harness' venvs (as ``python -m venv`` writes
    them: the prefix literally), a directory of foreign tools, and a conda
    installation whose ``fenv`` was built on an aarch64 machine."""
    files = slurm.files
    for name in ("venv-foreign", "venv-native"):
        (files / name / "bin" / "activate").write_text(
            "deactivate () {\n    unset VIRTUAL_ENV\n}\n"
            f'VIRTUAL_ENV="{files / name}"\nexport VIRTUAL_ENV\n'
            '_OLD_VIRTUAL_PATH="$PATH"\nPATH="$VIRTUAL_ENV/bin:$PATH"\nexport PATH\n')
    fbin = files / "foreign-bin"
    fbin.mkdir(exist_ok=True)
    shutil.copy2(files / "foreign", fbin / "tool")
    conda = files / "conda"
    for sub in ("bin", "etc/profile.d", "envs/fenv/bin", "envs/fenv/conda-meta", "conda-meta"):
        (conda / sub).mkdir(parents=True, exist_ok=True)
    (conda / "bin" / "conda").write_text("#!/bin/sh\nexit 0\n")
    (conda / "bin" / "conda").chmod(0o755)
    (conda / "etc" / "profile.d" / "conda.sh").write_text("conda() { :; }\n")
    shutil.copy2(files / "foreign", conda / "envs" / "fenv" / "bin" / "python")
    for path in (fbin, conda):
        for root, _dirs, _names in os.walk(path):
            os.chmod(root, 0o755)
    return {"foreign": files / "venv-foreign", "native": files / "venv-native",
            "fbin": fbin, "conda": conda}


def _run(grace: SlurmEnv, name: str, body: str, *, env: dict[str, str] | None = None,
         args: tuple[str, ...] = (), head: str = "") -> tuple[str, str, Path]:
    """sbatch ``body`` (after ``#!/bin/bash``, ``head`` and a line that
    leaves ``NAME.side``) as nobody; (final state, output text, side file)."""
    out = grace.cluster.shared / f"{name}.out"
    if out.exists():
        out.unlink()
    side = grace.side_file(f"{name}.side")
    script = f"#!/bin/bash\n{head}touch {side}\n{body}"
    job = grace.cluster.sbatch(script, ["-o", str(out), *args], user="nobody", env=env)
    state = grace.cluster.wait_job(job)
    text = out.read_text() if out.exists() else ""
    assert "Traceback" not in text
    return state, text, side


def _assert_ran_in_silence(state: str, text: str, side: Path, printed: str) -> None:
    """The job completed, the plugin said nothing, the script ran to the
    line that printed ``printed``."""
    assert state == "COMPLETED", text
    assert PREFIX not in text, text
    assert printed in text and side.exists(), text


def _assert_rejected_before_first_line(grace: SlurmEnv, state: str, text: str,
                                       side: Path, expected: str) -> None:
    assert state == "FAILED", text
    assert expected in text, text
    assert f"{PREFIX}step not started" in text, text
    assert not side.exists(), "the script's line 2 ran although the job was rejected"
    assert grace.cluster.settled_node_state() in ("idle", "mixed"), grace.cluster.node_reason()


def test_foreign_venv_on_the_main_path_fails_before_line_one(grace: SlurmEnv,
                                                             envs: dict[str, Path]) -> None:
    before = len(grace.audit_lines())
    state, text, side = _run(grace, "b-venv",
                             f"source {envs['foreign']}/bin/activate\npython train.py --epochs 3\n")
    _assert_rejected_before_first_line(
        grace, state, text, side,
        f"{PREFIX}ERROR exe-arch-mismatch: line 4: python train.py --epochs 3 -> "
        f"{envs['foreign']}/bin/python")
    records = [json.loads(line) for line in grace.audit_lines()[before:]]
    assert [r["action"] for r in records] == ["reject"]
    assert "exe-arch-mismatch" in json.dumps(records[0])


def test_the_same_line_inside_an_if_only_warns(grace: SlurmEnv, envs: dict[str, Path]) -> None:
    state, text, side = _run(grace, "b-if",
                             f"source {envs['foreign']}/bin/activate\n"
                             'if [ -n "$SLURM_JOB_ID" ]; then\n    python train.py\nfi\n'
                             "echo script-ran\n")
    assert state == "COMPLETED", text
    assert f"{PREFIX}WARNING exe-arch-mismatch: line 5: python train.py -> " in text, text
    assert "ERROR" not in text
    assert side.exists() and "script-ran" in text


def test_foreign_tool_on_an_exported_path(grace: SlurmEnv, envs: dict[str, Path]) -> None:
    state, text, side = _run(grace, "b-path", f"export PATH={envs['fbin']}:$PATH; tool --help\n")
    _assert_rejected_before_first_line(
        grace, state, text, side,
        f"{PREFIX}ERROR exe-arch-mismatch: line 3: tool --help -> {envs['fbin']}/tool")


def test_conda_activate_of_a_foreign_env(grace: SlurmEnv, envs: dict[str, Path]) -> None:
    conda = envs["conda"]
    state, text, side = _run(grace, "b-conda",
                             f"source {conda}/etc/profile.d/conda.sh\nconda activate fenv\n"
                             "python -c 'import sys'\n")
    _assert_rejected_before_first_line(
        grace, state, text, side,
        f"{PREFIX}ERROR exe-arch-mismatch: line 5: python -c 'import sys' -> "
        f"{conda}/envs/fenv/bin/python")


def test_srun_of_a_foreign_program(grace: SlurmEnv, envs: dict[str, Path]) -> None:
    foreign = grace.files / "foreign"
    state, text, side = _run(grace, "b-srun", f"srun -n 1 --export=ALL {foreign} out\n")
    _assert_rejected_before_first_line(
        grace, state, text, side,
        f"{PREFIX}ERROR exe-arch-mismatch: line 3: srun -n 1 --export=ALL {foreign} out -> "
        f"{foreign}")


def test_unset_before_the_first_command_makes_a_leak_harmless(grace: SlurmEnv,
                                                               envs: dict[str, Path]) -> None:
    leak = {"VIRTUAL_ENV": str(envs["foreign"]), "CONDA_PREFIX": str(envs["foreign"])}
    # Without the unset: the plugin strips the leak and says so.
    state, text, side = _run(grace, "b-leak", "echo VENV=${VIRTUAL_ENV:-unset}\n", env=leak)
    assert state == "COMPLETED" and f"{PREFIX}WARNING env-leak" in text, text
    # With it: nothing to say, and the script does its own cleaning.
    state, text, side = _run(grace, "b-unset", "hostname\necho VENV=${VIRTUAL_ENV:-unset}\n",
                             env=leak, head="unset CONDA_PREFIX VIRTUAL_ENV\n")
    _assert_ran_in_silence(state, text, side, "VENV=unset")


def test_clean_script_with_a_native_venv_runs_in_silence(grace: SlurmEnv,
                                                          envs: dict[str, Path]) -> None:
    state, text, side = _run(grace, "b-clean",
                             f"source {envs['native']}/bin/activate\ncd \"$SLURM_SUBMIT_DIR\"\n"
                             "python -c 'print(\"native-ran\")'\nsrun -n1 hostname\n")
    _assert_ran_in_silence(state, text, side, "native-ran")


def test_commands_built_by_command_substitution_are_not_judged(grace: SlurmEnv,
                                                               envs: dict[str, Path]) -> None:
    foreign = grace.files / "foreign"
    state, text, side = _run(grace, "b-subst",
                             f"$(echo {foreign}) x || true\nP=$(printf %s {foreign}); $P || true\n"
                             "echo script-ran\n")
    _assert_ran_in_silence(state, text, side, "script-ran")


def test_command_v_of_a_foreign_tool_runs_in_silence(grace: SlurmEnv,
                                                      envs: dict[str, Path]) -> None:
    """Issue 28: ``command -v tool`` only looks the name up; the job must not
    be rejected for a program it never starts."""
    state, text, side = _run(grace, "b-cmdv",
                             f"export PATH={envs['fbin']}:$PATH\n"
                             "command -v tool >/dev/null || exit 1\ntype -P tool\n"
                             "echo looked-up\n")
    _assert_ran_in_silence(state, text, side, "looked-up")


def test_chdir_resets_pwd_as_bash_does(grace: SlurmEnv, envs: dict[str, Path]) -> None:
    """Issue 28: submitted from a (the job's PWD says a) with ``--chdir=b``:
    bash resets PWD to b, so ``cd "$PWD"; ./tool`` runs b's native tool,
    not a's foreign one."""
    a, b = grace.files / "chdir-a", grace.files / "chdir-b"
    for d, tool in ((a, grace.files / "foreign"), (b, Path("/bin/true"))):
        d.mkdir(exist_ok=True)
        shutil.copy2(tool, d / "tool")
        d.chmod(0o755)
    state, text, side = _run(grace, "b-chdir", 'echo "PWD=$PWD"\ncd "$PWD"\n./tool\n'
                             "echo tool-ran\n", env={"PWD": str(a)},
                             args=("--chdir", str(b)))
    _assert_ran_in_silence(state, text, side, "tool-ran")
    assert f"PWD={b}" in text, text


# -- at submit time: cli_filter/lua with the shipped cli_filter.lua ----------

@pytest.fixture(scope="module")
def submit_conf(slurm: SlurmEnv) -> Path:
    """A slurm.conf for client commands with ``CliFilterPlugins=cli_filter/lua``
    and, beside it, a site cli_filter.lua that calls the installed file; the
    grace-policy config makes gb200sim refuse at submit time."""
    shipped = slurm.prefix / "share" / "grace-policy" / "cli_filter.lua"
    assert shipped.is_file(), "make install did not install cli_filter.lua"
    etc = slurm.cluster.root.parent / "etc-submit"
    etc.mkdir(exist_ok=True)
    etc.chmod(0o755)
    config = etc / "grace-policy.toml"
    config.write_text(slurm.configs["base"].read_text().replace(
        "[partitions.gb200sim]\n", '[partitions.gb200sim]\nsubmit = "enforce"\n'))
    config.chmod(0o644)
    import subprocess

    done = subprocess.run([str(slurm.prefix / "bin" / "grace-policy"), "config", "check",
                           "--compile", "--plugstack", "none", str(config)],
                          env={}, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    conf = etc / "slurm.conf"
    conf.write_text(slurm.cluster.conf.read_text() + "CliFilterPlugins=cli_filter/lua\n")
    conf.chmod(0o644)
    site = etc / "cli_filter.lua"
    site.write_text(f'local grace = dofile("{shipped}")\ngrace.config = "{config}"\n')
    site.chmod(0o644)
    return conf


def _submit(grace: SlurmEnv, conf: Path, command: str) -> tuple[int, str]:
    """Run a client command line as nobody with the cli_filter slurm.conf;
    (exit code, stdout and stderr merged in the order they were written)."""
    res = grace.cluster.run(["sh", "-c", f"{command} 2>&1"], user="nobody",
                            env={"SLURM_CONF": str(conf)}, timeout=120)
    assert "Traceback" not in res.stdout
    return res.returncode, res.stdout


def _script_file(grace: SlurmEnv, name: str, body: str) -> Path:
    path = grace.cluster.shared / name
    path.write_text(f"#!/bin/bash\n{body}")
    path.chmod(0o755)
    return path


def _sbatch(grace: SlurmEnv, conf: Path, name: str, body: str, options: str = ""
            ) -> tuple[int, str, Path]:
    """sbatch of the script ``body`` (as :func:`_submit`) with its output to
    a file of the shared dir: (exit code, what sbatch printed, that file)."""
    script = _script_file(grace, f"{name}.sh", body)
    out = grace.cluster.shared / f"{name}.out"
    rc, text = _submit(grace, conf, f"sbatch {options} -o {out} {script}")
    return rc, text, out


def test_sbatch_prints_findings_before_the_job_id(grace: SlurmEnv, envs: dict[str, Path],
                                                  submit_conf: Path) -> None:
    rc, text, _ = _sbatch(grace, submit_conf, "s-warn",
                          f"source {envs['foreign']}/bin/activate\npython train.py\n")
    assert rc == 0, text
    finding = (f"{PREFIX}ERROR exe-arch-mismatch: line 3: python train.py -> "
               f"{envs['foreign']}/bin/python")
    assert finding in text, text
    assert f"{PREFIX}sbatch: submitted anyway" in text
    assert text.index(finding) < text.index("Submitted batch job"), text
    job = int(text.split("Submitted batch job")[1].split()[0])
    assert grace.cluster.wait_job(job) == "FAILED"  # and the plugin stopped it on the node


def test_sbatch_is_refused_where_the_partition_enforces(grace: SlurmEnv, envs: dict[str, Path],
                                                        submit_conf: Path) -> None:
    # The partition from the script's own #SBATCH line: sbatch has read them
    # when cli_filter runs.
    script = _script_file(grace, "s-enf.sh", "#SBATCH -p gb200sim -J grace-refused\n"
                                              f"source {envs['foreign']}/bin/activate\n"
                                              "python train.py\n")
    rc, text = _submit(grace, submit_conf, f"sbatch {script}")
    assert rc != 0, text
    assert f"{PREFIX}ERROR exe-arch-mismatch: line 4: python train.py" in text, text
    assert f"{PREFIX}sbatch: job not submitted" in text
    assert "Submitted batch job" not in text
    queued = grace.cluster.run(["squeue", "-h", "-n", "grace-refused", "-o", "%i"])
    assert queued.returncode == 0 and queued.stdout.strip() == ""


def test_a_clean_sbatch_prints_nothing(grace: SlurmEnv, envs: dict[str, Path],
                                      submit_conf: Path) -> None:
    rc, text, out = _sbatch(grace, submit_conf, "s-clean",
                            f"source {envs['native']}/bin/activate\n"
                            "python -c pass\nsrun hostname\n", "-p gb200sim")
    assert rc == 0, text
    assert text.startswith("Submitted batch job") and PREFIX not in text, text
    job = int(text.split()[3])
    assert grace.cluster.wait_job(job) == "COMPLETED"
    assert PREFIX not in out.read_text()


def test_wrap_and_srun_are_judged_at_submit_time(grace: SlurmEnv, envs: dict[str, Path],
                                                 submit_conf: Path) -> None:
    foreign = grace.files / "foreign"
    rc, text = _submit(grace, submit_conf, f"sbatch -p gb200sim --wrap '{foreign} x'")
    assert rc != 0 and f"{PREFIX}sbatch: job not submitted" in text, text
    assert f"line 4: {foreign} x -> {foreign}" in text
    rc, text = _submit(grace, submit_conf, f"srun -p gb200sim -n1 {foreign}")
    assert rc != 0 and f"{PREFIX}srun: job not submitted" in text, text
    # --export rules apply to the submitting shell's environment.
    rc, text = _submit(grace, submit_conf,
                       f"PATH={envs['fbin']}:$PATH srun -p gb200sim -n1 --export=ALL tool")
    assert rc != 0 and f"{PREFIX}ERROR exe-arch-mismatch: {envs['fbin']}/tool" in text, text


def test_srun_inside_an_allocation_is_left_to_the_plugin(grace: SlurmEnv, submit_conf: Path
                                                         ) -> None:
    foreign = grace.files / "foreign"
    # slurmd gives the job its own SLURM_CONF: point srun at the filtering one.
    script = _script_file(grace, "s-inner.sh", f"export SLURM_CONF={submit_conf}\n"
                                                f"S=srun; $(echo $S) -n1 {foreign}\necho after\n")
    out = grace.cluster.shared / "s-inner.out"
    rc, text = _submit(grace, submit_conf, f"sbatch -p gb200sim -o {out} {script}")
    assert rc == 0 and PREFIX not in text, text  # the reader cannot know '$(echo $S)'
    job = int(text.split()[3])
    grace.cluster.wait_job(job)
    inner = out.read_text()
    assert "after" in inner
    assert f"{PREFIX}step not started" in inner, inner  # the plugin, on the node
    # The submit filter stayed out of it: none of its closing lines, and the
    # finding is printed once (by the plugin), not twice.
    assert f"{PREFIX}srun:" not in inner, inner
    assert inner.count(f"{PREFIX}ERROR exe-arch-mismatch: {foreign}") == 1, inner
