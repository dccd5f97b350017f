"""The plugin in a real Slurm 22.05: what users and admins see.

Each scenario would fail without the protection it names: without the plugin
the foreign executable is exec'd (slurmstepd logs "Exec format error"), the
leaked venv reaches the task, the 4 KiB-aligned program runs and leaves its
side-effect file, and the batch job fails with exec errors instead of our
message.
"""

from __future__ import annotations

import json
import re
import shutil

import pytest

from .harness import SlurmEnv

pytestmark = pytest.mark.slurm

PREFIX = "grace-policy: "
#: slurmstepd's own execve() error (to srun: "slurmstepd-NODE: error: execve(): ...", in
#: slurmd.log: "[JOB.STEP] error: execve(): ..."): proof an exec was attempted. Our own
#: message quotes the same error after "without this check:", so match the line start.
#: 26.05 prints "[2026-12-01T08:14:04.295] error: execve(): ..." to srun (field notes §6).
EXEC_ATTEMPT = re.compile(r"^(slurmstepd\S*: |(\[[0-9.a-zA-Z:-]+\] )+)error: execve\(\)", re.M)


def _exec_attempts(text: str) -> int:
    return len(EXEC_ATTEMPT.findall(text))


def _no_traceback(*texts: str) -> None:
    for text in texts:
        assert "Traceback" not in text


def _job_id_from_output(stdout: str) -> int:
    match = re.search(r"JOBID=(\d+)", stdout)
    assert match, stdout
    return int(match.group(1))


def _new_records(grace: SlurmEnv, before: int) -> list[dict[str, object]]:
    return [json.loads(line) for line in grace.audit_lines()[before:]]


def test_native_step_runs_silently(grace: SlurmEnv) -> None:
    out = grace.side_file("native.out")
    before = len(grace.audit_lines())
    res = grace.cluster.srun([str(grace.files / "native"), str(out)])
    assert res.returncode == 0, res.stderr
    assert "side-effect program ran" in res.stdout
    assert PREFIX not in res.stderr
    assert out.read_text() == "executed\n"
    # It was checked (not skipped): one clean decision in the audit log.
    [record] = _new_records(grace, before)
    assert (record["action"], record["mode"], record["skipped"]) == ("allow", "enforce", None)


def test_native_step_as_ordinary_user(grace: SlurmEnv) -> None:
    """Python runs as the job's user (nobody here): the installed package and
    the standard library must be usable without root's environment."""
    out = grace.side_file("nobody.out")
    before = len(grace.audit_lines())
    failed_before = grace.cluster.slurmd_log_text().count("check failed")
    res = grace.cluster.srun([str(grace.files / "native"), str(out)], user="nobody")
    assert res.returncode == 0, res.stderr
    assert PREFIX not in res.stderr
    assert out.exists()
    [record] = _new_records(grace, before)
    assert (record["uid"], record["action"], record["error"]) == (65534, "allow", None)
    # (earlier fault tests in the session leave their own lines)
    assert grace.cluster.slurmd_log_text().count("check failed") == failed_before


def test_foreign_executable_rejected_in_enforce(grace: SlurmEnv) -> None:
    before = _exec_attempts(grace.cluster.slurmd_log_text())
    res = grace.cluster.srun([str(grace.files / "foreign")], user="nobody")
    assert res.returncode != 0
    assert f"{PREFIX}ERROR exe-arch-mismatch: {grace.files / 'foreign'}" in res.stderr
    assert "step not started" in res.stderr
    # Told once per step, not once per task or twice.
    assert res.stderr.count(f"{PREFIX}ERROR exe-arch-mismatch") == 1
    # No exec was attempted: slurmstepd never reached execve().
    assert _exec_attempts(res.stderr) == 0
    assert _exec_attempts(grace.cluster.slurmd_log_text()) == before
    _no_traceback(res.stderr, res.stdout)


def test_foreign_executable_warned_in_warn_mode(grace: SlurmEnv) -> None:
    res = grace.cluster.srun(["-p", "warnp", str(grace.files / "foreign")])
    assert f"{PREFIX}ERROR exe-arch-mismatch" in res.stderr
    assert "the step runs anyway" in res.stderr
    assert "step not started" not in res.stderr
    # It did run: the kernel refused the exec, as it would without us.
    assert _exec_attempts(res.stderr) == 1


def test_foreign_executable_silent_in_off_mode(grace: SlurmEnv) -> None:
    before = len(grace.audit_lines())
    res = grace.cluster.srun(["-p", "offp", str(grace.files / "foreign")])
    assert PREFIX not in res.stderr
    assert _exec_attempts(res.stderr) == 1
    # Silent because the partition is off, not because nothing ran.
    [record] = _new_records(grace, before)
    assert (record["partition"], record["mode"], record["skipped"]) == ("offp", "off", "mode off")


def test_env_cannot_lower_the_mode(grace: SlurmEnv) -> None:
    """Exported SLURM_JOB_PARTITION and the option variable do not reach the
    decision: srun overwrites the partition, and the partition does not allow
    lowering."""
    # Slurm maps every non-alphanumeric character of plugin and option name to
    # '_': this is the variable Slurm really reads as "--grace-policy=off".
    option_var = "SLURM_SPANK__SLURM_SPANK_OPTION_grace_policy_grace_policy"
    res = grace.cluster.srun(
        [str(grace.files / "foreign")],
        env={"SLURM_JOB_PARTITION": "offp", option_var: "off"})
    assert res.returncode != 0
    assert "step not started" in res.stderr
    # Control: the same variable does act, as the option would, where the
    # partition allows lowering; so the name above is the one Slurm reads.
    res = grace.cluster.srun(["-p", "gb200sim", str(grace.files / "foreign")],
                             env={option_var: "warn"})
    assert "the step runs anyway" in res.stderr
    res = grace.cluster.srun(["--grace-policy=off", str(grace.files / "foreign")])
    assert res.returncode != 0
    assert "step not started" in res.stderr


def test_user_option_lowers_only_where_the_partition_allows(grace: SlurmEnv) -> None:
    help_text = grace.cluster.run(["srun", "--help"]).stdout
    assert "--grace-policy" in help_text
    res = grace.cluster.srun(["-p", "gb200sim", "--grace-policy=warn",
                              str(grace.files / "foreign")])
    assert "the step runs anyway" in res.stderr
    assert _exec_attempts(res.stderr) == 1
    # A value that is not a mode is refused by srun itself, before any launch.
    res = grace.cluster.srun(["--grace-policy=lax", "/bin/true"])
    assert res.returncode != 0
    assert f"{PREFIX}--grace-policy takes warn, off or enforce" in res.stderr


def test_leaked_foreign_venv_is_stripped_native_venv_stays(grace: SlurmEnv) -> None:
    foreign, native = grace.files / "venv-foreign", grace.files / "venv-native"
    path = f"{foreign}/bin:/usr/local/bin:/usr/bin:/bin"
    res = grace.cluster.srun(["/usr/bin/env"], env={"VIRTUAL_ENV": str(foreign), "PATH": path})
    assert res.returncode == 0, res.stderr
    task_env = dict(line.split("=", 1) for line in res.stdout.splitlines() if "=" in line)
    assert "VIRTUAL_ENV" not in task_env
    assert f"{foreign}/bin" not in task_env["PATH"].split(":")
    assert "/usr/bin" in task_env["PATH"].split(":")
    told = " ".join(line.removeprefix(PREFIX).strip() for line in res.stderr.splitlines())
    assert "env-leak" in told
    assert "removed from the step's environment: VIRTUAL_ENV" in told

    path = f"{native}/bin:/usr/local/bin:/usr/bin:/bin"
    res = grace.cluster.srun(["/usr/bin/env"], env={"VIRTUAL_ENV": str(native), "PATH": path})
    assert res.returncode == 0, res.stderr
    task_env = dict(line.split("=", 1) for line in res.stdout.splitlines() if "=" in line)
    assert task_env.get("VIRTUAL_ENV") == str(native)
    assert task_env["PATH"].split(":")[0] == f"{native}/bin"
    assert PREFIX not in res.stderr


def test_batch_script_with_foreign_interpreter_fails_with_message(grace: SlurmEnv) -> None:
    out = grace.cluster.shared / "batch-foreign.out"
    script = (grace.files / "foreign-interp.sh").read_text()
    job = grace.cluster.sbatch(script, ["-o", str(out)], user="nobody")
    state = grace.cluster.wait_job(job)
    assert state == "FAILED"
    text = out.read_text()
    assert PREFIX in text
    assert "exe-arch-mismatch" in text or "interp" in text
    assert "should not run" not in text
    _no_traceback(text)


def test_batch_step_env_is_cleaned(grace: SlurmEnv) -> None:
    """sbatch exports the login shell's environment; the batch step is cleaned."""
    out = grace.cluster.shared / "batch-env.out"
    foreign = grace.files / "venv-foreign"
    job = grace.cluster.sbatch("#!/bin/sh\necho VENV=${VIRTUAL_ENV:-unset}\n", ["-o", str(out)],
                               env={"VIRTUAL_ENV": str(foreign)})
    assert grace.cluster.wait_job(job) == "COMPLETED"
    text = out.read_text()
    assert "VENV=unset" in text
    assert PREFIX in text  # the user is told what was removed, in the output file


def test_4k_aligned_program_rejected_on_simulated_grace_node(slurm: SlurmEnv) -> None:
    slurm.use("grace64k")
    out = slurm.side_file("aligned.out")
    res = slurm.cluster.srun(["-p", "gb200sim", str(slurm.files / "native-4k"), str(out)])
    assert res.returncode != 0
    assert PREFIX in res.stderr
    assert f"{PREFIX}ERROR page-congruence: {slurm.files / 'native-4k'}" in res.stderr
    assert "64 KiB" in res.stderr  # the page size the program does not fit
    assert not out.exists(), "the program ran although it was rejected"
    # Same program, same node, a 4 KiB config: runs (the rejection was the page size).
    slurm.use("base")
    res = slurm.cluster.srun([str(slurm.files / "native-4k"), str(out)])
    assert res.returncode == 0, res.stderr
    assert out.exists()


def test_broken_config_lets_steps_run_and_logs_once(slurm: SlurmEnv) -> None:
    slurm.use("broken")
    res = slurm.cluster.srun(["sh", "-c", "echo JOBID=$SLURM_JOB_ID"], user="nobody")
    assert res.returncode == 0, res.stderr
    assert PREFIX not in res.stderr
    _no_traceback(res.stderr, res.stdout)
    job = _job_id_from_output(res.stdout)
    lines = [line for line in slurm.cluster.slurmd_log_text().splitlines()
             if f"grace-policy: error: job {job} step 0: check failed" in line]
    assert len(lines) == 1, lines
    assert str(slurm.configs["broken"]) in lines[0]
    assert "on_error=allow: step allowed unchecked" in lines[0]


def test_broken_config_with_on_error_deny_refuses(slurm: SlurmEnv) -> None:
    slurm.use("broken", "on_error=deny")
    out = slurm.side_file("deny.out")
    res = slurm.cluster.srun([str(slurm.files / "native"), str(out)])
    assert res.returncode != 0
    assert f"{PREFIX}this step was refused" in res.stderr
    assert not out.exists()
    _no_traceback(res.stderr)


def test_plugstack_typo_is_logged_and_follows_on_error(slurm: SlurmEnv) -> None:
    slurm.use(None, f"confg={slurm.configs['base']}")
    res = slurm.cluster.srun(["sh", "-c", "echo JOBID=$SLURM_JOB_ID"])
    assert res.returncode == 0, res.stderr
    job = _job_id_from_output(res.stdout)
    log = slurm.cluster.slurmd_log_text()
    assert re.search(rf"grace-policy: error: job {job} step 0: check failed: unknown plugstack "
                     r"argument 'confg=", log)


def test_audit_log_records_decisions(grace: SlurmEnv) -> None:
    grace.cluster.srun([str(grace.files / "foreign")])
    records = [json.loads(line) for line in grace.audit_lines()]
    actions = {r["action"] for r in records}
    assert {"allow", "reject", "warn"} <= actions
    reject = [r for r in records if r["action"] == "reject"][-1]
    assert reject["rules"] == ["exe-arch-mismatch"]
    assert reject["node"]
    assert reject["job_id"] and reject["step_id"] == "0"
    assert any(r["env_unset"] == ["VIRTUAL_ENV"] for r in records)
    assert any(r["step_id"] == "batch" for r in records)


def test_zz_node_never_drained(slurm: SlurmEnv) -> None:
    """After every rejection and failure above, the node still takes jobs."""
    state = slurm.cluster.settled_node_state()
    assert state in ("idle", "mixed", "allocated"), (state, slurm.cluster.node_reason())
    assert "drain" not in state and "down" not in state
    assert slurm.cluster.node_reason() in ("", "Reason=(null)")


def test_relative_program_is_judged_in_the_steps_directory(grace: SlurmEnv) -> None:
    """``srun --chdir=DIR ./tool`` runs DIR/tool: the check judges that
    file, not ./tool in the submitting shell's directory (PWD, which srun
    passes on unchanged). Both ways round: a foreign tool there is refused
    although the one here is native, and a native one there runs although
    the one here is foreign."""
    here = grace.cluster.shared / "chdir-submit"
    there = grace.cluster.shared / "chdir-step"
    for d in (here, there):
        d.mkdir(exist_ok=True)
        d.chmod(0o755)
    env = {"PATH": "/usr/bin:/bin", "PWD": str(here)}
    for native_at, foreign_at in ((here, there), (there, here)):
        shutil.copy2(grace.files / "native", native_at / "tool")
        shutil.copy2(grace.files / "foreign", foreign_at / "tool")
        out = grace.side_file("chdir.out")
        before = len(grace.audit_lines())
        res = grace.cluster.srun([f"--chdir={there}", "./tool", str(out)], user="nobody",
                                 env=env, cwd=here)
        _no_traceback(res.stderr, res.stdout)
        [record] = _new_records(grace, before)
        if foreign_at == there:
            assert res.returncode != 0 and f"{PREFIX}ERROR exe-arch-mismatch" in res.stderr
            assert str(there) in res.stderr and record["action"] == "reject", record
        else:
            assert res.returncode == 0 and PREFIX not in res.stderr, res.stderr
            assert "side-effect program ran" in res.stdout and record["action"] == "allow"
