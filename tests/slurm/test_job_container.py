"""A private /tmp per job (``JobContainerType=job_container/tmpfs``): the step
is judged in the job's view of files, on the real 22.05 cluster.

Why these tests: the node checker descends from slurmd, and slurmstepd at
user_init is in slurmd's mount namespace too; only the tasks join the job's
(field notes §13, grace_policy/checker/mntns.py). A program an earlier step
of the job copied into its private /tmp must be judged as that program, not
as whatever the host's /tmp holds under the same name. The host's /tmp here
holds the *other* architecture's program under each name, so a check made in
the wrong view gives the opposite verdict: a foreign program runs (and fails
with Exec format error), a native one is refused.

The cluster is its own, outside /tmp (field notes §13: every step, and srun
in a batch script, sees the job's /tmp), with its job namespaces unmounted
before its tree is removed (Cluster.stop).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from grace_policy.checker import mntns

from .harness import SetupError, SlurmEnv, prepare, skip_reason

pytestmark = pytest.mark.slurm

PREFIX = "grace-policy: "
#: Where the cluster lives: not /tmp, and not a tree a job's /tmp hides.
BASE = Path(os.environ.get("GRACE_JC_DIR", "/var/tmp"))


@pytest.fixture(scope="module")
def jc() -> Iterator[SlurmEnv]:
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    root = Path(tempfile.mkdtemp(prefix="grace-jc-", dir=BASE))
    env = None
    try:
        try:
            env = prepare(root)
        except SetupError as exc:
            pytest.fail(str(exc))
        # job_container/tmpfs from slurmd's start on (it reads
        # job_container.conf then): the same cluster, restarted with it.
        env.cluster.stop()
        env.cluster.job_container = root / "jc-base"
        env.cluster.start()
        yield env
    finally:
        if env is not None:
            env.cluster.stop()
        if os.environ.get("GRACE_KEEP_CLUSTER"):
            print(f"\nkept {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def host_tmp() -> Iterator[str]:
    """A name prefix for files in the host's /tmp, removed afterwards."""
    stem = f"/tmp/grace-jc-{uuid.uuid4().hex[:10]}"
    yield stem
    for path in Path("/tmp").glob(Path(stem).name + "*"):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def _host_copy(src: Path, dest: str) -> None:
    shutil.copy2(src, dest)
    os.chmod(dest, 0o755)


def _job(env: SlurmEnv, body: str, name: str, during: Callable[[int], object] | None = None
         ) -> tuple[int, str, list[dict[str, object]]]:
    """A batch job of ``nobody`` running ``body``: its id, its output and its
    audit records. ``during(job)`` runs once the job has written the file
    ``$GO.wait`` and before it ends (the job waits for ``$GO``, bounded)."""
    out = env.side_file(f"{name}.out")
    go = env.side_file(f"{name}.go")
    env.side_file(f"{name}.go.wait")
    before = len(env.audit_lines())
    job = env.cluster.sbatch(f"#!/bin/sh\nGO={go}\n{body}\n", ["-o", str(out), "-e", str(out)],
                             user="nobody")
    if during is not None:
        deadline = time.monotonic() + 120
        while not Path(f"{go}.wait").exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        try:
            during(job)
        finally:
            go.touch()
    env.cluster.wait_job(job, timeout=120)
    text = out.read_text(errors="replace") if out.exists() else ""
    assert "Traceback" not in text
    records = [json.loads(line) for line in env.audit_lines()[before:]]
    return job, text, [r for r in records if str(r.get("job_id")) == str(job)]


#: A job's last line when the test looks at it while it runs (``during``).
WAIT = ('touch "$GO.wait"; i=0; '
        'while [ ! -e "$GO" ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done')


def _step(records: list[dict[str, object]], program: str) -> dict[str, object]:
    """The one audit record of the step that ran ``program``."""
    found = [r for r in records if r.get("program") == program]
    assert len(found) == 1, (program, records)
    return found[0]


@pytest.mark.parametrize("checker", ["node"])
def test_step_is_judged_in_the_jobs_tmp(jc: SlurmEnv, host_tmp: str, checker: str) -> None:
    """A first step copies an aarch64 program to the job's /tmp under name A
    and a native one under name B (the host's /tmp has them the other way
    round); the next steps run them: A is refused with our message and never
    runs, B is allowed and runs. The task's namespace is the one the job
    container holds, and not the host's."""
    jc.use("base", "cache_dir=none", f"checker={checker}")
    a, b = f"{host_tmp}-a", f"{host_tmp}-b"
    _host_copy(jc.files / "native", a)
    _host_copy(jc.files / "foreign", b)
    ran_a, ran_b = jc.side_file(f"ran-a-{checker}"), jc.side_file(f"ran-b-{checker}")
    ns = jc.side_file(f"ns-{checker}")
    held: dict[str, str] = {}
    job, text, records = _job(jc, "\n".join([
        f"srun -n1 sh -c 'cp {jc.files}/foreign {a} && cp {jc.files}/native {b}'",
        f"srun -n1 {a} {ran_a}; echo rc-a=$?",
        f"srun -n1 {b} {ran_b}; echo rc-b=$?",
        f"srun -n1 readlink /proc/self/ns/mnt > {ns}",
        WAIT,
    ]), f"tmp-{checker}", during=lambda job: held.update(mntns.holders(job)))
    assert ran_b.exists() and "side-effect program ran" in text, text
    assert not ran_a.exists(), text
    assert "rc-a=0" not in text and "rc-b=0" in text, text
    assert PREFIX in text and a in text, text  # our message names the job's file
    assert _step(records, a)["action"] == "reject", records
    assert _step(records, b)["action"] == "allow", records
    # The task ran in the job's namespace, the one its holder keeps, not ours.
    task_ns = ns.read_text().strip()
    assert task_ns.startswith("mnt:[") and task_ns != os.readlink("/proc/self/ns/mnt")
    assert set(held.values()) == {task_ns}, (held, task_ns)
    assert all(Path(p).name == mntns.HOLDER and Path(p).parent.name == str(job) for p in held)


def test_the_steps_own_helper_does_not_judge_the_hosts_tmp(jc: SlurmEnv, host_tmp: str) -> None:
    """checker=step: slurmstepd's own helper is in slurmd's mount namespace at
    user_init (22.05 to 25.x), so it cannot see the job's /tmp. The job's
    foreign program there (a native one under that name in the host's /tmp)
    must not be allowed on the host's word: the check fails, says why, and
    on_error=deny refuses the step, which never runs."""
    jc.use("base", "cache_dir=none", "checker=step", "on_error=deny")
    a = f"{host_tmp}-s"
    _host_copy(jc.files / "native", a)
    ran = jc.side_file("ran-step-helper")
    _, text, records = _job(jc, "\n".join([
        f"srun -n1 cp {jc.files}/foreign {a}",
        f"srun -n1 {a} {ran}; echo rc=$?",
    ]), "step-helper")
    assert not ran.exists() and "rc=0" not in text, text
    assert "this step was refused: the site's launch check could not run" in text, text
    # A failed check's audit line is C's (no program: Python never judged it).
    [record] = [r for r in records if r.get("failure")]
    assert record["action"] == "reject" and record["failure"] == "check", record
    assert "own view of files" in str(record["error"]), record


def test_cached_verdict_is_not_replayed_for_another_jobs_tmp(jc: SlurmEnv,
                                                            host_tmp: str) -> None:
    """Job 1 runs ``true`` with the job's /tmp first on PATH and nothing
    there: a clean allow (of /usr/bin/true). Job 2 puts an aarch64 ``true``
    in its own /tmp first on PATH and runs ``true`` again: the verdict of
    job 1 must not be replayed (slurmstepd looks the cache up in the host's
    view, where that /tmp is still empty), the step is judged again and
    refused. The host's /tmp holds nothing under that name."""
    jc.use("base")  # the verdict cache on, as sites run it
    bindir = f"{host_tmp}-bin"
    path = f"{bindir}:/usr/bin:/bin"
    _, text1, records1 = _job(jc, f"PATH={path} srun -n1 true; echo rc1=$?", "cache-1")
    assert "rc1=0" in text1 and PREFIX not in text1, text1
    assert _step(records1, "true")["action"] == "allow", records1
    assert not Path(bindir).exists()
    _, text2, records2 = _job(jc, "\n".join([
        f"srun -n1 sh -c 'mkdir {bindir} && cp {jc.files}/foreign {bindir}/true'",
        f"PATH={path} srun -n1 true; echo rc2=$?",
    ]), "cache-2")
    assert "rc2=0" not in text2 and PREFIX in text2, text2
    assert _step(records2, "true")["action"] == "reject", records2


def test_unenterable_namespace_is_a_failure_not_the_hosts_view(jc: SlurmEnv,
                                                              host_tmp: str) -> None:
    """A second namespace held for the same job (here by the test, as a
    broken or foreign holder would be): the child cannot tell which is the
    job's, so it judges neither view. The check fails with the reason in
    slurmd's log and the audit line, and on_error=deny refuses the step: the
    program, native and in both views, never runs."""
    jc.use("base", "cache_dir=none", "on_error=deny")
    prog = f"{host_tmp}-c"
    _host_copy(jc.files / "native", prog)
    ran = jc.side_file("ran-unenterable")
    other = jc.cluster.root.parent / "jc-other"
    made: list[tuple[subprocess.Popen[bytes], Path]] = []

    def second_holder(job: int) -> None:
        proc = subprocess.Popen(["unshare", "--mount", "--propagation", "private",
                                 "sleep", "300"])
        holder = other / "node" / str(job) / mntns.HOLDER
        holder.parent.mkdir(parents=True, exist_ok=True)
        holder.touch()
        made.append((proc, holder))
        deadline = time.monotonic() + 10
        while os.readlink(f"/proc/{proc.pid}/ns/mnt") == os.readlink("/proc/self/ns/mnt"):
            assert time.monotonic() < deadline, "unshare did not start"
            time.sleep(0.05)
        subprocess.run(["mount", "--bind", f"/proc/{proc.pid}/ns/mnt", str(holder)], check=True)
        assert len(set(mntns.holders(job).values())) == 2

    since = len(jc.cluster.slurmd_log_text())
    try:
        _, text, records = _job(jc, "\n".join([
            f"srun -n1 cp {jc.files}/native {prog}",
            WAIT,
            f"srun -n1 {prog} {ran}; echo rc=$?",
        ]), "unenterable", during=second_holder)
    finally:
        for proc, holder in made:
            subprocess.run(["umount", str(holder)], capture_output=True, check=False)
            proc.kill()
            proc.wait()
    assert not ran.exists() and "rc=0" not in text, text
    assert "this step was refused: the site's launch check could not run" in text, text
    record = _step(records, prog)
    assert record["action"] == "reject" and record["failure"] == "check", record
    said = "in its own mount namespace"
    assert said in str(record["error"]), record
    assert said in jc.cluster.slurmd_log_text()[since:]
