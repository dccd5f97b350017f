"""The check's helper under ``ProctrackType=proctrack/cgroup`` (issue: an
abandoned helper at the step's end), on a real Slurm 22.05.

With proctrack/cgroup slurmstepd puts itself into the step's freezer cgroup
before ``user_init`` forks the helper, so the helper is in the step's
container; at the step's end ``proctrack_p_wait`` SIGKILLs that container
until only slurmstepd is left, for up to ``UnkillableStepTimeout``, and an
unkillable process then drains the node ("Kill task failed"). A helper
abandoned in an uninterruptible wait (a FUSE mount whose daemon never
answers, tests/slurm/hungfs.py) is such a process. This module runs the
session cluster with proctrack/cgroup (this machine's cgroup v1 freezer
hierarchy; restored to linuxproc afterwards) and records what becomes of the
step and the node.

One such cluster at a time on the machine (:func:`_freezer_to_ourselves`):
Slurm names its cgroups ``/slurm_NODE/uid_U/job_J/step_S`` from the node
name, which every test cluster here shares, and every cluster's job ids
start at 1. Two of them at once (``make test`` runs this module on the
host's 22.05 and in the 24.11 and 26.05 roots side by side) share those
directories: one removed the other's new, still empty ``step_0`` before
slurmstepd put the task in it, and that launch failed
("_cgroup_procs_check: failed on path .../job_2/step_0/cgroup.procs: No such
file or directory", "proctrack_g_add: ...", then in the task
"_exec_wait_child_wait_for_parent: failed", srun "Slurmd could not execve
job").
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from corpus import cache_root

from .cluster import NODE
from .harness import SlurmEnv
from .test_hungfs import HungMount, _helpers, _provide

pytestmark = pytest.mark.slurm

PREFIX = "grace-policy: "
TIMEOUT_MS = 2000
#: Short, so a drain shows within the test (Slurm's default is 60 s).
UNKILLABLE_S = 20
FREEZER = Path("/sys/fs/cgroup/freezer")
#: How long a cluster waits for another's turn with the freezer hierarchy
#: (one takes about 70 s; three modules may queue).
TURN_S = 900


def _cgroup_reason() -> str | None:
    if not FREEZER.is_dir():
        return "no cgroup v1 freezer hierarchy at /sys/fs/cgroup/freezer"
    if not os.access(FREEZER, os.W_OK):
        return "/sys/fs/cgroup/freezer not writable"
    return None


def freezer_lock() -> Path:
    """The file every proctrack/cgroup test cluster on this machine locks."""
    return cache_root() / "locks" / f"freezer-slurm_{NODE}.lock"


@contextlib.contextmanager
def _freezer_to_ourselves() -> Iterator[None]:
    """Hold the machine's lock on ``FREEZER/slurm_NODE`` (see the module's
    docstring): a file in the tests' cache, which the release roots see at
    the same path (tests/slurm/roots.py binds it in), so the host's run and
    the roots' runs take turns. Bounded: TURN_S, then the test fails."""
    lock = freezer_lock()
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a") as fh:
        deadline = time.monotonic() + TURN_S
        while True:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    pytest.fail(f"{lock}: another cluster has used {FREEZER}/slurm_{NODE} "
                                f"for more than {TURN_S} s")
                time.sleep(1)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


@pytest.fixture(scope="module")
def cgroup_slurm(slurm: SlurmEnv) -> Iterator[SlurmEnv]:
    """The session cluster restarted with proctrack/cgroup, then back."""
    reason = _cgroup_reason() or _provide()
    if reason:
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    with _freezer_to_ourselves():
        yield from _with_cgroup(slurm)


def _with_cgroup(slurm: SlurmEnv) -> Iterator[SlurmEnv]:
    cluster = slurm.cluster
    plain = cluster.write_config

    def with_cgroup() -> None:
        plain()
        text = cluster.conf.read_text().replace("ProctrackType=proctrack/linuxproc",
                                                "ProctrackType=proctrack/cgroup")
        cluster.conf.write_text(text + f"UnkillableStepTimeout={UNKILLABLE_S}\n"
                                "DebugFlags=CGroup\n")
        cgroup_conf.write_text("CgroupPlugin=cgroup/v1\nCgroupMountpoint=/sys/fs/cgroup\n")

    cgroup_conf = cluster.conf.parent / "cgroup.conf"

    cluster.stop()
    cluster.write_config = with_cgroup  # type: ignore[method-assign]
    slurm.use("base")  # slurmd starts its node checker from this line
    try:
        cluster.start()
        yield slurm
    finally:
        cluster.stop()
        cluster.write_config = plain  # type: ignore[method-assign]
        cgroup_conf.unlink(missing_ok=True)
        _remove_empty(FREEZER / f"slurm_{NODE}")
        slurm.use("base")
        cluster.start()


def _remove_empty(top: Path) -> None:
    """The cgroups this cluster left (Slurm cannot rmdir a job's cgroup while
    an abandoned helper is in it, and does not try again once it has gone):
    empty ones only, deepest first (rmdir refuses a cgroup with tasks)."""
    if not top.is_dir():
        return
    for path in sorted((p for p in top.rglob("*") if p.is_dir()),
                       key=lambda p: len(p.parts), reverse=True):
        try:
            path.rmdir()
        except OSError:
            pass
    try:
        top.rmdir()
    except OSError:
        pass


def _checks_with_cgroups() -> list[tuple[str, str]]:
    """(pid, freezer cgroup) of every live process named grace-check on the
    machine: /proc/PID/comm, stat and cgroup are readable whatever the
    process's dumpable flag."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if (entry / "comm").read_text().strip() != "grace-check":
                continue
            if (entry / "stat").read_text().rpartition(")")[2].split()[0] == "Z":
                continue
        except OSError:
            continue
        out.append((entry.name, _cgroup_of(int(entry.name))))
    return out


def _cgroup_of(pid: int) -> str:
    try:
        for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
            if ":freezer:" in line:
                return line.split(":", 2)[2]
    except OSError:
        pass
    return ""


@pytest.mark.parametrize("checker", ["step", "node"])
def test_a_hung_helper_under_proctrack_cgroup(cgroup_slurm: SlurmEnv, checker: str) -> None:
    """A step whose check hangs on the mount (a leaked CONDA_PREFIX there;
    /bin/echo never looks): on_error=allow runs it after timeout_ms. Then:
    does the step end, does the node stay up? checker=step: the helper is
    slurmstepd's, in the job's cgroup; checker=node (the default): the
    check is a child of the node checker, outside every job's cgroup."""
    env = cgroup_slurm
    scope = env.cluster.root.parent  # this cluster's processes only
    hung = HungMount(env.cluster.root.parent / f"hung-mount-cgroup-{checker}")
    try:
        # checker=node: no cache, so no lookup child of slurmstepd's
        # (which would meet the mount first): the node checker's child does.
        cache = ("cache_dir=none",) if checker == "node" else ()
        env.use("base", f"timeout_ms={TIMEOUT_MS}", "on_error=allow", f"checker={checker}",
                *cache)
        log_before = env.cluster.slurmd_log_text()
        # The checks running before this step's (any cluster's): not its.
        before_any = {pid for pid, _c in _checks_with_cgroups()}
        assert "proctrack/cgroup" in env.cluster.conf.read_text()
        res = env.cluster.srun(["/bin/echo", "ran"], user="nobody",
                               env={"CONDA_PREFIX": f"{hung.path}/env"}, timeout=120)
        assert res.returncode == 0 and res.stdout.strip() == "ran", res
        job = int(re.findall(r"grace-policy: error: job (\d+) step",
                             env.cluster.slurmd_log_text()[len(log_before):])[0])
        # The helper is still in its wait, in the job's freezer cgroup (22.05
        # v1: slurmstepd is in the job's, the tasks in the step's), so the
        # step's end does not wait for it.
        # (Only this cluster uses proctrack/cgroup: other helpers are in "/".)
        ended = time.monotonic()
        if checker == "step":
            # By cgroup, not by the census: only this cluster runs jobs in
            # /slurm_NODE/, and a confined helper (not dumpable) may show its
            # descriptors and environment to nobody but a ptrace-capable
            # root, which a release root's run need not be.
            cgroups = [c for pid, c in _checks_with_cgroups()
                       if pid not in before_any and c.startswith(f"/slurm_{NODE}/")]
            assert cgroups and all(c.endswith(f"/job_{job}") for c in cgroups), cgroups
        else:
            ours = [h for h in _helpers(scope) if f"--socket {env.checker_socket} " in h]
            cgroups = [_cgroup_of(int(h.split()[0])) for h in ours]
            assert ours and not any(c.startswith(f"/slurm_{NODE}/") for c in cgroups), (
                ours, cgroups)
        # The job ends without waiting for it ...
        for _ in range(60):
            if str(job) not in env.cluster.run(["squeue", "-h", "-j", str(job)]).stdout:
                break
            time.sleep(1)
        # ... and past UnkillableStepTimeout nothing counts it as unkillable.
        time.sleep(max(0.0, ended + UNKILLABLE_S + 5 - time.monotonic()))
        squeue = env.cluster.run(["squeue", "-h", "-j", str(job)]).stdout
        state, reason = env.cluster.node_state(), env.cluster.node_reason()
        new_log = env.cluster.slurmd_log_text()[len(log_before):]
        kill_failed = [line for line in new_log.splitlines()
                       if "Kill task failed" in line or "unkillable" in line.lower()]
        assert str(job) not in squeue, (squeue, state, reason, kill_failed)
        assert env.cluster.wait_job(job) == "COMPLETED"
        assert "drain" not in state and not kill_failed, (state, reason, kill_failed)
        assert state == "idle", (state, reason)
    finally:
        hung.release()
        for _ in range(100):
            if not _helpers(scope):
                break
            time.sleep(0.2)
        env.use("base")
    assert _helpers(scope) == []
    # The node takes jobs again (whatever the drain above, once resumed).
    state = env.cluster.settled_node_state()
    if "drain" in state:
        env.cluster.run(["scontrol", "update", f"NodeName={NODE}", "State=RESUME"])
