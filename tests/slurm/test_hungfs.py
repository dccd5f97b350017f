"""A hung file system must not hang slurmstepd (issue 20 item 1), on a real
Slurm 22.05 (and inside each release root, test_matrix).

The mount is a FUSE file system whose daemon never answers (tests/slurm/
hungfs.py: libfuse2 + fusepy, as root, allow_other): a ``stat()`` below it
waits in the kernel and no signal ends the wait, as on a dead hard NFS mount.
Before issue 20 the check ran in a thread of slurmstepd; a thread in such a
wait blocks glibc's SIGSETXID broadcast, so slurmstepd's next seteuid never
returned: the task never started, the step could not be cancelled and the
node stayed allocated until the daemon was killed. Now the check runs in a
helper process (spank/grace_helper.c) that is killed and abandoned on
timeout.

Each step here reaches the mount only through what the *check* reads: its
PATH, its PYTHONPATH, a leaked CONDA_PREFIX, or a file the verdict cache
recorded. The steps that would touch the mount themselves if they ran
(PATH, PYTHONPATH, the cached program) use on_error=deny: refused in
task_init, they never exec, so the job never hangs on its own; the
CONDA_PREFIX step (``/bin/echo`` never looks there) uses on_error=allow and
runs. For each: srun returns (bounded by timeout_ms plus MARGIN_S; not a
timing assertion, a hang detector), our one slurmd.log line and audit line
say "timeout", the step's slurmstepd exits, the node is idle; at the end the
daemon is killed (kill -9, umount -l) and no process of ours is left.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from . import procs
from .harness import SlurmEnv

pytestmark = pytest.mark.slurm

PREFIX = "grace-policy: "
TIMEOUT_MS = 2000
#: What a step may take beyond timeout_ms: srun's own start-up and step
#: set-up, job completion, on a busy 2-core machine. A step held by a hung
#: slurmstepd never returns at all, so any bound catches it.
MARGIN_S = 20
HUNGFS = Path(__file__).resolve().parent / "hungfs.py"


#: fusepy, pinned (also in packaging/install-deps.sh): the sdist's sha256.
FUSEPY = "fusepy==3.0.1"
FUSEPY_SHA256 = "72ff783ec2f43de3ab394e3f7457605bf04c8cf288a2f4068b4cde141d4ee6bd"
#: Set when the daemon needs a fusepy installed by :func:`_provide` (roots).
_DAEMON_PATH: list[str] = []


def _in_release_root() -> bool:
    """Inside tests/slurm/roots.py's chroot (it copies the CA bundle there)."""
    return os.path.exists("/etc/grace-test-ca.crt")


def _provide() -> str | None:
    """fusepy and libfuse2, or why not. On the host they come from
    packaging/install-deps.sh; inside a release root (a throw-away overlay)
    they are installed here: libfuse2 from the root's own Debian release with
    apt (``libfuse2t64`` on trixie and later), fusepy pinned by hash into the
    tests' cache."""
    import ctypes.util

    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse"
    if ctypes.util.find_library("fuse") is None and _in_release_root():
        subprocess.run("apt-get update -qq && (apt-get install -y -qq libfuse2t64 || "
                       "apt-get install -y -qq libfuse2)", shell=True, capture_output=True,
                       check=False, timeout=600,
                       env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
    if ctypes.util.find_library("fuse") is None:
        return "libfuse2 not installed (bash packaging/install-deps.sh)"
    try:
        import fuse  # noqa: F401  (fusepy)
        return None
    except ImportError:
        if not _in_release_root():
            return "fusepy not installed (bash packaging/install-deps.sh)"
    cache = Path(os.environ.get("GRACE_TEST_CACHE") or
                 Path.home() / ".cache" / "grace-policy-tests") / "fusepy-3.0.1"
    if not (cache / "fuse.py").exists():
        reqs = cache.with_suffix(".txt")
        cache.parent.mkdir(parents=True, exist_ok=True)
        reqs.write_text(f"{FUSEPY} --hash=sha256:{FUSEPY_SHA256}\n")
        done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                               "--require-hashes", "--target", str(cache), "-r", str(reqs)],
                              capture_output=True, text=True, check=False, timeout=600)
        if done.returncode != 0:
            return f"cannot install {FUSEPY}: {done.stderr.strip()[-500:]}"
    _DAEMON_PATH[:] = [str(cache)]
    return None


class HungMount:
    """One hung FUSE mount; :meth:`release` kills the daemon and unmounts."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        path.chmod(0o755)
        env = dict(os.environ)
        if _DAEMON_PATH:
            env["PYTHONPATH"] = ":".join(_DAEMON_PATH)
        self.proc = subprocess.Popen([sys.executable, str(HUNGFS), str(path)], env=env,
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        for _ in range(100):
            if self.mounted():
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        out = self.proc.stdout.read() if self.proc.poll() is not None and self.proc.stdout \
            else b""
        self.release()
        raise RuntimeError(f"hungfs did not mount {path}: {out!r}")

    def mounted(self) -> bool:
        with open("/proc/self/mountinfo") as fh:
            return any(line.split()[4] == str(self.path) for line in fh)

    def release(self) -> None:
        """kill -9 the daemon, then umount -l: every waiter gets ENOTCONN."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)
        if self.mounted():
            subprocess.run(["umount", "-l", str(self.path)], check=False, capture_output=True)


def _helpers(scope: Path) -> list[str]:
    """Processes of the cluster under ``scope`` that run a check, as ``pid
    state comm args``: comm grace-check, which names both a helper of
    slurmstepd (grace_helper.c) and a node checker's child once it has taken
    a step (checker.server._name; not the server, nor its idle spare,
    grace-spare). Other clusters' are not counted (tests/slurm/procs.py)."""
    return procs.live("grace-check", scope)


def _slurmstepd_of(job: int, scope: Path) -> list[str]:
    """slurmstepd proper of ``job`` (not its helpers, whose args look the
    same) in the cluster under ``scope`` (job ids repeat across clusters)."""
    return [row for row in procs.live("slurmstepd", scope) if f"[{job}." in row]


@pytest.fixture(scope="module")
def hung(slurm: SlurmEnv) -> Iterator[HungMount]:
    reason = _provide()
    if reason:
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    mount = HungMount(slurm.cluster.root.parent / "hung-mount")
    try:
        yield mount
    finally:
        mount.release()
    # Nothing left behind once the file system answers again (ENOTCONN):
    # every helper abandoned in its wait is gone, the mount too.
    for _ in range(100):
        if not _helpers(slurm.cluster.root.parent):
            break
        time.sleep(0.2)
    assert _helpers(slurm.cluster.root.parent) == []
    assert not mount.mounted()


@pytest.fixture
def env(slurm: SlurmEnv, hung: HungMount) -> Iterator[SlurmEnv]:
    yield slurm
    slurm.use("base")
    state = slurm.cluster.settled_node_state()
    assert state == "idle", (state, slurm.cluster.node_reason())


def _job(text: str) -> int | None:
    match = re.search(r"JOBID=(\d+)|job (\d+)", text)
    return int(match.group(1) or match.group(2)) if match else None


def _jobs_of(env: SlurmEnv, since: str) -> list[int]:
    """The job ids slurmd.log names after ``since`` (the log text before)."""
    new = env.cluster.slurmd_log_text()[len(since):]
    return sorted({int(j) for j in re.findall(r"grace-policy: error: job (\d+) step", new)})


def _ends_by_on_error(env: SlurmEnv, argv: list[str], name: str, value: str, on_error: str
                      ) -> tuple[subprocess.CompletedProcess[str], int]:
    """One step, with ``name=value`` in its environment, whose check hangs:
    srun returns, one log line and one audit line say timeout, its slurmstepd
    exits. Returns srun's result and the job. (The variable is srun's own:
    ``--export=ALL,PATH=...`` does not replace PATH on 22.05.)"""
    env.use("base", f"timeout_ms={TIMEOUT_MS}", f"on_error={on_error}")
    log_before = env.cluster.slurmd_log_text()
    audit_before = len(env.audit_lines())
    res = env.cluster.srun(argv, user="nobody", env={name: value},
                           timeout=TIMEOUT_MS / 1000 + MARGIN_S)
    jobs = _jobs_of(env, log_before)
    assert len(jobs) == 1, (jobs, res, env.cluster.slurmd_log_text()[len(log_before):][-3000:])
    [job] = jobs
    lines = [line for line in env.cluster.slurmd_log_text()[len(log_before):].splitlines()
             if f"{PREFIX}error: job {job} step 0:" in line]
    assert len(lines) == 1, lines
    assert f"no verdict within timeout_ms={TIMEOUT_MS}" in lines[0], lines
    verdict = "refused" if on_error == "deny" else "allowed unchecked"
    assert f"on_error={on_error}: step {verdict}" in lines[0], lines
    records = [json.loads(line) for line in env.audit_lines()[audit_before:]]
    assert [(r["failure"], r["action"], r["job_id"]) for r in records] == [
        ("timeout", "reject" if on_error == "deny" else "allow", str(job))], records
    assert "Traceback" not in res.stderr + res.stdout
    # slurmstepd proper exits although its helper is still stuck.
    for _ in range(100):
        if not _slurmstepd_of(job, env.cluster.root.parent):
            break
        time.sleep(0.2)
    assert _slurmstepd_of(job, env.cluster.root.parent) == []
    return res, job


def _refused(res: subprocess.CompletedProcess[str]) -> None:
    assert res.returncode != 0, res.stdout
    assert f"{PREFIX}this step was refused: the site's launch check could not run" \
        in res.stderr, res.stderr


def test_step_path_on_a_hung_mount(env: SlurmEnv, hung: HungMount) -> None:
    """``hostname`` resolved through a PATH whose first entry is on the mount.
    (slurmstepd itself would stat that entry after task_init, so on_error
    allow would leave the job hanging on its own PATH: deny.)"""
    res, _ = _ends_by_on_error(env, ["hostname"], "PATH", f"{hung.path}/bin:/usr/bin:/bin",
                               "deny")
    _refused(res)
    assert res.stdout.strip() == ""


def test_step_pythonpath_on_a_hung_mount(env: SlurmEnv, hung: HungMount) -> None:
    """A Python step whose PYTHONPATH is on the mount (the interpreter would
    read it too: deny)."""
    out = env.side_file("hung-pythonpath.out")
    res, _ = _ends_by_on_error(
        env, ["/usr/bin/python3", "-c", f"open({str(out)!r}, 'w').write('ran')"],
        "PYTHONPATH", f"{hung.path}/lib", "deny")
    _refused(res)
    assert not out.exists()


def test_leaked_conda_prefix_on_a_hung_mount_allows(env: SlurmEnv, hung: HungMount) -> None:
    """A leaked CONDA_PREFIX on the mount: the check looks there, the job
    (/bin/echo) never does. on_error=allow: the step runs, unchecked."""
    res, _ = _ends_by_on_error(env, ["/bin/echo", "ran"], "CONDA_PREFIX", f"{hung.path}/env",
                               "allow")
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "ran"
    assert PREFIX not in res.stderr


def test_cached_verdicts_recorded_file_on_a_hung_mount(env: SlurmEnv,
                                                       hung: HungMount) -> None:
    """A clean verdict is cached for a program; then its directory becomes a
    hung mount. The C lookup stats the recorded file: that wait happens in the
    helper, and the step ends by on_error (deny: the program never runs)."""
    prog_dir = env.cluster.root.parent / "hung-cached-prog"
    shutil.rmtree(prog_dir, ignore_errors=True)
    prog_dir.mkdir()
    prog_dir.chmod(0o755)
    prog = prog_dir / "prog"
    shutil.copy2(env.files / "native", prog)
    out = env.side_file("hung-cached.out")
    env.use("base", f"timeout_ms={TIMEOUT_MS}", "on_error=deny")
    for expect_hit in (False, True):
        before = len(env.audit_lines())
        res = env.cluster.srun([str(prog), str(out)], user="nobody")
        assert res.returncode == 0, res.stderr
        [record] = [json.loads(line) for line in env.audit_lines()[before:]]
        assert (record.get("cache") == "hit") is expect_hit, record
    out.unlink()
    second = HungMount(prog_dir)  # over the directory the entry recorded
    try:
        res, _ = _ends_by_on_error(env, [str(prog), str(out)], "GRACE_UNUSED", "1", "deny")
        _refused(res)
        assert not out.exists()
    finally:
        second.release()


def test_scancel_ends_a_job_whose_check_hangs(env: SlurmEnv, hung: HungMount) -> None:
    """While the check of a batch job's script waits on the mount (its
    leaked CONDA_PREFIX), scancel ends the job: slurmstepd is not held (before issue
    20 it stayed until the daemon was killed). Bounded by timeout_ms: the
    step's user_init waits that long at most."""
    env.use("base", "timeout_ms=5000", "on_error=deny")
    out = env.side_file("hung-batch.out")
    job = env.cluster.sbatch(f"#!/bin/sh\necho ran > {out}\n", ["-o", "/dev/null"],
                             user="nobody", env={"CONDA_PREFIX": f"{hung.path}/env"})
    for _ in range(100):
        if env.cluster.job_state(job) == "RUNNING":
            break
        time.sleep(0.1)
    assert env.cluster.job_state(job) == "RUNNING"
    time.sleep(1)  # the check's helper is in its wait now
    assert env.cluster.run(["scancel", str(job)]).returncode == 0
    state = env.cluster.wait_job(job, timeout=5 + MARGIN_S)
    assert state in ("CANCELLED", "FAILED"), state
    for _ in range(100):
        if not _slurmstepd_of(job, env.cluster.root.parent):
            break
        time.sleep(0.2)
    assert _slurmstepd_of(job, env.cluster.root.parent) == []
    assert not out.exists()


def test_the_step_helper_is_confined_while_it_judges(env: SlurmEnv, hung: HungMount) -> None:
    """checker=step: the helper slurmstepd forked, caught while its check
    waits on the mount (the batch job's leaked CONDA_PREFIX): it runs under
    the seccomp filter, with no new privileges, not dumpable (its /proc
    files are root's), a data limit of max_memory, and at OOM standing 0
    although slurmd - and so slurmstepd - stands at 500 here (a site's -1000
    needs CAP_SYS_RESOURCE, which this machine's container does not grant;
    any value the helper inherits shows the reset the same way), and holding
    neither the audit log nor the verdict caches."""
    slurmd = env.cluster.procs["slurmd"].pid
    adj = Path(f"/proc/{slurmd}/oom_score_adj")
    adj.write_text("500\n")
    try:
        env.use("base", "checker=step", "timeout_ms=8000", "on_error=deny", "max_memory=48")
        job = env.cluster.sbatch("#!/bin/sh\ntrue\n", ["-o", "/dev/null"], user="nobody",
                                 env={"CONDA_PREFIX": f"{hung.path}/env"})
        status: dict[str, str] = {}
        for _ in range(100):
            rows = _helpers(env.cluster.root.parent)
            if rows:
                time.sleep(2)  # Python started, the check is in its wait now
                pid = rows[0].split()[0]
                text = Path(f"/proc/{pid}/status").read_text()
                status = dict(line.split(":\t", 1) for line in text.splitlines()
                              if ":\t" in line)
                status["oom_score_adj"] = Path(f"/proc/{pid}/oom_score_adj").read_text()
                status["limits"] = Path(f"/proc/{pid}/limits").read_text()
                status["owner"] = str(os.stat(f"/proc/{pid}/status").st_uid)
                status["fds"] = " ".join(os.readlink(f"/proc/{pid}/fd/{fd}")
                                         for fd in os.listdir(f"/proc/{pid}/fd"))
                status["slurmstepd"] = "".join(_slurmstepd_of(job, env.cluster.root.parent))
                break
            time.sleep(0.1)
        assert status, "no helper waited on the mount"
        assert status["Seccomp"].strip() == "2", status
        assert status["NoNewPrivs"].strip() == "1", status
        assert status["owner"] == "0", status  # not dumpable: root's, though euid is nobody's
        nobody = str(pwd.getpwnam("nobody").pw_uid)
        assert status["Uid"].split()[:3] == ["0", nobody, "0"], status  # as slurmstepd's
        assert status["oom_score_adj"].strip() == "0", status
        # It holds neither the audit log nor a verdict-cache file (the
        # lookup missed and is over): slurmstepd writes both.
        assert str(env.audit_log) not in status["fds"], status["fds"]
        assert str(env.cache_dir) not in status["fds"], status["fds"]
        [data] = [line for line in status["limits"].splitlines()
                  if line.startswith("Max data size")]
        limit = int(data.split()[3])
        assert 48 << 20 < limit < (48 << 20) + (1 << 30), data
        assert env.cluster.run(["scancel", str(job)]).returncode == 0
        env.cluster.wait_job(job, timeout=8 + MARGIN_S)
    finally:
        adj.write_text("0\n")
