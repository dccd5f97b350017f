"""prestart=on: the checker forked in slurm_spank_init (grace_helper.c).

On the real one-node Slurm: a pre-started helper judges cold steps like the
helper forked in user_init does; one that died before user_init is replaced
by today's path (same verdict, no failure); one hung in its interpreter
start costs the step timeout_ms and on_error decides; none is left beside a
running task, whether the cache answered or Python did. The faults are
injected by the test build's hooks (test_prestart=die|hang, make
plugin-testhooks); everything around them is the real code.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from .harness import SlurmEnv

pytestmark = pytest.mark.slurm

PREFIX = "grace-policy: "
REFUSED = f"{PREFIX}this step was refused: the site's launch check could not run"
# The task counts the live grace-check children of its own slurmstepd
# ($PPID): a helper left beside the task would be one of them.
COUNT_HELPERS = (
    'n=0; for s in /proc/[0-9]*/stat; do read -r line < "$s" 2>/dev/null || continue; '
    'case "$line" in *"(grace-check) "[!Z]" $PPID "*) n=$((n+1));; esac; done; '
    'echo JOBID=$SLURM_JOB_ID HELPERS=$n'
)


@pytest.fixture
def pre(slurm: SlurmEnv) -> Iterator[SlurmEnv]:
    yield slurm
    slurm.restore_and_check_node()


@pytest.fixture(scope="module")
def hooks_plugin(slurm: SlurmEnv) -> Path:
    """The test build of the stub in a copy of the install."""
    prefix = slurm.testhooks_prefix("prefix-prestart-hooks")
    return prefix / "lib" / "slurm" / "spank_grace_policy.so"


def _use(env: SlurmEnv, plugin: Path | str, *extra: str) -> None:
    env.set_plugin_line(plugin, f"config={env.configs['base']}", f"audit={env.audit_log}",
                        "prestart=on", "checker=step", *extra)


def _run(env: SlurmEnv, cmd: str = COUNT_HELPERS) -> tuple[subprocess.CompletedProcess[str],
                                                           dict[str, str]]:
    res = env.cluster.srun(["sh", "-c", cmd], user="nobody", timeout=60)
    assert "Traceback" not in res.stderr + res.stdout
    return res, dict(re.findall(r"(\w+)=(\d+)", res.stdout))


def _records(env: SlurmEnv, job: str) -> list[dict[str, object]]:
    return [r for r in map(json.loads, env.audit_lines()) if r.get("job_id") == job]


def _refuses_foreign(env: SlurmEnv) -> None:
    """A binary for the wrong architecture: the check really ran."""
    out = env.side_file("prestart-foreign.out")
    res = env.cluster.srun([str(env.files / "foreign"), str(out)], user="nobody", timeout=60)
    assert res.returncode != 0, res.stderr
    assert PREFIX in res.stderr and REFUSED not in res.stderr, res.stderr
    assert not out.exists()


@pytest.mark.parametrize("cache", ["cold", "warm"])
def test_prestarted_helper_judges_and_is_gone_beside_the_task(pre: SlurmEnv,
                                                               cache: str) -> None:
    _use(pre, pre.plugin, *(["cache_dir=none"] if cache == "cold" else []))
    if cache == "warm":
        _run(pre)  # stores the entry
    res, seen = _run(pre)
    assert res.returncode == 0, res.stderr
    assert PREFIX not in res.stderr, res.stderr
    assert seen["HELPERS"] == "0", res.stdout
    [record] = _records(pre, seen["JOBID"])
    assert record["action"] == "allow" and record.get("failure") is None, record
    assert (record.get("cache") == "hit") == (cache == "warm"), record
    if cache == "cold":
        _refuses_foreign(pre)


def test_helper_dead_before_user_init_falls_back(pre: SlurmEnv, hooks_plugin: Path) -> None:
    """It exited in slurm_spank_init: user_init runs today's helper, which
    judges the step as always - no failure recorded, the verdict is real."""
    _use(pre, hooks_plugin, "cache_dir=none", "test_prestart=die")
    res, seen = _run(pre)
    assert res.returncode == 0 and PREFIX not in res.stderr, res.stderr
    assert seen["HELPERS"] == "0", res.stdout
    [record] = _records(pre, seen["JOBID"])
    assert record["action"] == "allow" and record.get("failure") is None, record
    _refuses_foreign(pre)


@pytest.mark.parametrize("on_error", ["allow", "deny"])
def test_helper_hung_in_interpreter_start_follows_on_error(pre: SlurmEnv, hooks_plugin: Path,
                                                           on_error: str) -> None:
    """It never gets past its start: the miss waits timeout_ms, the helper
    is killed, on_error decides, and no helper is left beside the task."""
    _use(pre, hooks_plugin, "cache_dir=none", "test_prestart=hang", "timeout_ms=1000",
         f"on_error={on_error}")
    res, seen = _run(pre)
    if on_error == "deny":
        assert res.returncode != 0 and REFUSED in res.stderr, res.stderr
        return
    assert res.returncode == 0, res.stderr
    assert seen["HELPERS"] == "0", res.stdout
    [record] = _records(pre, seen["JOBID"])
    assert (record["failure"], record["action"]) == ("timeout", "allow"), record
    log = [line for line in pre.cluster.slurmd_log_text().splitlines()
           if f"{PREFIX}error: job {seen['JOBID']} step 0:" in line]
    assert len(log) == 1 and "no verdict within timeout_ms=1000" in log[0], log


def test_prestart_takes_on_or_off(pre: SlurmEnv) -> None:
    pre.set_plugin_line(pre.plugin, f"config={pre.configs['base']}",
                        f"audit={pre.audit_log}", "prestart=yes", "checker=step")
    res, seen = _run(pre)
    assert res.returncode == 0, res.stderr
    log = [line for line in pre.cluster.slurmd_log_text().splitlines()
           if f"{PREFIX}error: job {seen['JOBID']} step 0:" in line]
    assert len(log) == 1 and "prestart must be on or off, not 'yes'" in log[0], log


def test_prestarted_helper_gets_the_steps_env_and_argv(pre: SlurmEnv) -> None:
    """The step crosses the socket whole: a foreign VIRTUAL_ENV in the env is
    removed (the check saw the env) and the argv's own words come back in
    the audit line (it saw the argv)."""
    _use(pre, pre.plugin, "cache_dir=none")
    foreign = pre.files / "venv-foreign"
    res = pre.cluster.srun(["sh", "-c", "echo JOBID=$SLURM_JOB_ID; echo VENV=$VIRTUAL_ENV"],
                           user="nobody", env={"VIRTUAL_ENV": str(foreign)}, timeout=60)
    assert res.returncode == 0, res.stderr
    assert "VENV=\n" in res.stdout + "\n", res.stdout
    assert "removed from the step's environment" in res.stderr, res.stderr
    job = re.search(r"JOBID=(\d+)", res.stdout)
    assert job, res.stdout
    [record] = _records(pre, job.group(1))
    assert record["env_unset"] == ["VIRTUAL_ENV"] and record["program"] == "sh", record
