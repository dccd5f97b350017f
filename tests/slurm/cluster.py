"""A real one-node Slurm cluster on this machine, for the tests and the demo.

Starts its own ``munged`` (own key and socket), ``slurmctld`` and ``slurmd``
(field notes §5), everything under one directory, on free ports, so it can run
beside a system Slurm or another engineer's test cluster. Daemons run in the
foreground as our children: we know their pids and stop exactly those.

This module imports nothing from the rest of the test package so that the demo
can run it as ``python3 -m tests.slurm.cluster demo``.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

#: The node is this machine, under the name Slurm itself would pick.
NODE = socket.gethostname().split(".")[0]

#: Partitions of the test cluster: name -> the mode the plugin config gives it.
#: ``gb200sim`` is enforce mode on a simulated 64 KiB-page Grace node.
PARTITIONS: dict[str, str] = {
    "enforce": "enforce",
    "warnp": "warn",
    "offp": "off",
    "gb200sim": "enforce",
}
DEFAULT_PARTITION = "enforce"

#: GPUs the test node announces by default: a ``gpu`` gres whose "devices"
#: are links to /dev/null and /dev/zero, so ``--gpus`` and ``--gres=gpu``
#: steps are scheduled and get Slurm's GPU variables without any real GPU.
#: Steps that ask for none see no difference. ``GRACE_TEST_GPUS=0`` turns the
#: gres off (e.g. for a Slurm release that refuses these stand-in devices).
GPUS = int(os.environ.get("GRACE_TEST_GPUS", "2") or "0")

#: Daemons we need; a missing one is a visible skip, not a silent pass.
REQUIRED_BINARIES = ("munged", "slurmctld", "slurmd", "srun", "sbatch", "sinfo", "scontrol")


def missing_binaries() -> list[str]:
    return [b for b in REQUIRED_BINARIES if shutil.which(b) is None
            and not Path("/usr/sbin", b).exists()]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _sbin(name: str) -> str:
    found = shutil.which(name)
    if found:
        return found
    return str(Path("/usr/sbin", name))


def _terminate(proc: subprocess.Popen[bytes] | None) -> None:
    """TERM (the daemon's own shutdown), then KILL after a grace time."""
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)
def stop_daemons(procs: dict[str, subprocess.Popen[bytes]], names: Iterable[str]) -> None:
    """Stop the daemons ``names`` of ``procs`` (ours: we hold their Popen),
    in that order, by pid: TERM, then KILL after a grace time; then forget
    every entry of ``procs``. Shared with tests/vm/twoarch.py."""
    for name in names:
        _terminate(procs.get(name))
    procs.clear()


def wait_while_running(procs: Mapping[str, subprocess.Popen[bytes]], ready: object,
                       timeout: float, poll: float) -> str | None:
    """Poll ``ready()`` until it is true (None), a daemon of ``procs`` exits
    (its description) or ``timeout`` passes ("timeout")."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for name, proc in procs.items():
            if proc.poll() is not None:
                return f"{name} exited with {proc.returncode}"
        if ready():  # type: ignore[operator]
            return None
        time.sleep(poll)
    return "timeout"


def spawn_daemon(argv: Sequence[str], log: Path, env: Mapping[str, str]
                 ) -> subprocess.Popen[bytes]:
    """``argv`` in a session of its own (a ^C of the test run does not reach
    it; :func:`stop_daemons` ends it by pid), stdout and stderr appended to
    ``log``. Shared with tests/vm/twoarch.py."""
    with open(log, "ab") as out:
        return subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                env=dict(env), start_new_session=True)


def munged_argv(base: Path, socket: Path) -> list[str]:
    """munged in the foreground with its own key, pid, log and seed files
    under ``base`` (``munge/``, ``run/``, ``log/``), so it never meets the
    host's munged. Shared with tests/vm/twoarch.py."""
    return [_sbin("munged"), "-F", "--force", f"--socket={socket}",
            f"--key-file={base / 'munge' / 'munge.key'}",
            f"--pid-file={base / 'run' / 'munged.pid'}",
            f"--log-file={base / 'log' / 'munged.log'}",
            f"--seed-file={base / 'munge' / 'munged.seed'}"]


def slurmctld_argv(conf: Path) -> list[str]:
    """slurmctld in the foreground, its state ignored (``-i``: a new cluster)."""
    return [_sbin("slurmctld"), "-D", "-i", "-f", str(conf)]


class JobQueries:
    """``job_state``/``wait_job`` over :meth:`admin` (scontrol as root against
    this cluster): the same for the one-node cluster and the two-architecture
    one (tests/vm/twoarch.py), which differ in how a client command runs."""

    #: How often wait_job asks, and how long by default.
    JOB_POLL = 0.3
    JOB_TIMEOUT = 60.0

    def admin(self, argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        raise NotImplementedError

    def job_state(self, job_id: int) -> str:
        res = self.admin(["scontrol", "-o", "show", "job", str(job_id)])
        for word in res.stdout.split():
            if word.startswith("JobState="):
                return word.split("=", 1)[1]
        return "UNKNOWN"

    def wait_job(self, job_id: int, timeout: float | None = None) -> str:
        timeout = self.JOB_TIMEOUT if timeout is None else timeout
        deadline = time.monotonic() + timeout
        state = "UNKNOWN"
        while time.monotonic() < deadline:
            state = self.job_state(job_id)
            if state not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "UNKNOWN"):
                return state
            time.sleep(self.JOB_POLL)
        raise TimeoutError(f"job {job_id} still {state} after {timeout:.0f} s")


@dataclass
class Cluster(JobQueries):
    """A local Slurm; ``start()`` brings it up, ``stop()`` ends what it started."""

    root: Path
    partitions: Mapping[str, str] = field(default_factory=lambda: dict(PARTITIONS))
    #: How many (device-less) GPUs the node announces; 0: no gres at all.
    gpus: int = GPUS
    #: ``JobContainerType=job_container/tmpfs`` with this BasePath (a private
    #: /tmp and /dev/shm per job, field notes §13), or None: no job container.
    #: Such a cluster, its plugin and its programs must live outside /tmp.
    job_container: Path | None = None
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    # -- layout -------------------------------------------------------------
    @property
    def conf(self) -> Path:
        return self.root / "etc" / "slurm.conf"

    @property
    def plugstack(self) -> Path:
        return self.root / "etc" / "plugstack.conf"

    @property
    def slurmd_log(self) -> Path:
        return self.root / "log" / "slurmd.log"

    @property
    def slurmctld_log(self) -> Path:
        return self.root / "log" / "slurmctld.log"

    @property
    def munge_socket(self) -> Path:
        return self.root / "munge" / "munge.socket"

    @property
    def shared(self) -> Path:
        """A world-writable directory for job files (steps may run as ``nobody``)."""
        return self.root / "shared"

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """The environment for client commands: our slurm.conf, nothing else
        from the caller's Slurm settings (SLURM_* of an outer job would leak in)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_",
                                                                         "SRUN_", "SALLOC_"))}
        env["SLURM_CONF"] = str(self.conf)
        if extra:
            env.update(extra)
        return env

    # -- start / stop -------------------------------------------------------
    def write_config(self) -> None:
        for sub in ("etc", "state", "spool", "log", "munge", "run"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        self.root.chmod(0o755)
        self.shared.mkdir(exist_ok=True)
        self.shared.chmod(0o1777)
        (self.root / "munge").chmod(0o755)
        key = self.root / "munge" / "munge.key"
        if not key.exists():
            key.write_bytes(os.urandom(1024))
            key.chmod(0o600)
        ctld_port, slurmd_port = _free_port(), _free_port()
        lines = [
            "# Written by tests/slurm/cluster.py: a throwaway one-node cluster.",
            f"ClusterName=gp{os.getpid()}",
            f"SlurmctldHost={NODE}(127.0.0.1)",
            f"SlurmctldPort={ctld_port}",
            f"SlurmdPort={slurmd_port}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket}",
            f"StateSaveLocation={self.root / 'state'}",
            f"SlurmdSpoolDir={self.root / 'spool'}",
            f"SlurmctldPidFile={self.root / 'run' / 'slurmctld.pid'}",
            f"SlurmdPidFile={self.root / 'run' / 'slurmd.pid'}",
            f"SlurmctldLogFile={self.slurmctld_log}",
            f"SlurmdLogFile={self.slurmd_log}",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "SchedulerType=sched/backfill",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "MpiDefault=none",
            "MailProg=/bin/true",
            "ReturnToService=2",
            "InactiveLimit=0",
            "KillWait=5",
            "MessageTimeout=20",
            f"PlugStackConfig={self.plugstack}",
            *self._release_lines(),
            *self._job_container_lines(),
        ]
        node = f"NodeName={NODE} NodeAddr=127.0.0.1 CPUs={os.cpu_count() or 1} State=UNKNOWN"
        gres = self.conf.parent / "gres.conf"
        if self.gpus > 0:
            # slurmd reads gres.conf next to slurm.conf and drops a GPU without
            # File= ("Ignoring file-less GPU"), and File= must be a character
            # or block device: links to /dev/null and /dev/zero stand in. With
            # TaskPlugin=task/none nothing ever constrains or opens them.
            dev = self.root / "dev"
            dev.mkdir(exist_ok=True)
            targets = ("/dev/null", "/dev/zero")
            for i in range(self.gpus):
                link = dev / f"nvidia{i}"
                if not link.is_symlink():
                    link.symlink_to(targets[i % len(targets)])
            lines.append("GresTypes=gpu")
            node += f" Gres=gpu:{self.gpus}"
            gres.write_text("# Written by tests/slurm/cluster.py: device-less test GPUs.\n"
                            f"NodeName={NODE} Name=gpu File={dev}/nvidia[0-{self.gpus - 1}]\n")
        elif gres.exists():
            gres.unlink()
        lines.append(node)
        for name in self.partitions:
            default = "YES" if name == DEFAULT_PARTITION else "NO"
            lines.append(f"PartitionName={name} Nodes={NODE} Default={default} "
                         "MaxTime=INFINITE State=UP OverSubscribe=FORCE:4")
        self.conf.write_text("\n".join(lines) + "\n")
        if not self.plugstack.exists():
            self.plugstack.write_text("# no plugins yet\n")

    @staticmethod
    def _release_lines() -> list[str]:
        """Settings only some Slurm releases know, asked for by the release
        matrix (tests/slurm/test_matrix.py): ``GRACE_SLURMD_PARAMETERS``
        (e.g. ``contain_spank``, 24.05+) becomes ``SlurmdParameters=``."""
        params = os.environ.get("GRACE_SLURMD_PARAMETERS", "").strip()
        return [f"SlurmdParameters={params}"] if params else []

    def _job_container_lines(self) -> list[str]:
        """job_container/tmpfs on 22.05 (field notes §13): it needs
        PrologFlags=contain and job_container.conf beside slurm.conf; slurmd
        refuses a BasePath of /tmp or /dev/shm, and every step (and srun in
        it) sees the job's own /tmp, so nothing of the cluster may be there."""
        conf = self.conf.parent / "job_container.conf"
        if self.job_container is None:
            if conf.exists():
                conf.unlink()
            return []
        if Path(tempfile.gettempdir()) in (self.root, *self.root.parents):
            raise ValueError(f"a job-container cluster cannot live under /tmp: {self.root}")
        self.job_container.mkdir(parents=True, exist_ok=True)
        conf.write_text("# Written by tests/slurm/cluster.py: a private /tmp per job.\n"
                        f"AutoBasePath=true\nBasePath={self.job_container}\n")
        return ["JobContainerType=job_container/tmpfs", "PrologFlags=contain"]

    def unmount_job_containers(self) -> None:
        """Undo what job_container/tmpfs mounted under BasePath (the job
        namespaces' nsfs holders ``BASE/NODE/JOB/.ns``, then BasePath's own
        bind mounts), deepest first, so the tree can be removed. Only mounts
        under our BasePath are touched."""
        if self.job_container is None:
            return
        base = str(self.job_container)
        for _ in range(20):  # BasePath may be mounted on itself more than once
            mounts = []
            with open("/proc/self/mountinfo") as fh:
                for line in fh:
                    point = line.split()[4].replace("\\040", " ")
                    if point == base or point.startswith(base + "/"):
                        mounts.append(point)
            if not mounts:
                return
            for point in sorted(set(mounts), key=len, reverse=True):
                subprocess.run(["umount", "-l", point], capture_output=True, check=False)

    @property
    def bin_dir(self) -> Path:
        """First on the daemons' PATH (empty unless a test links tools in):
        pyxis runs ``enroot`` with slurmstepd's own PATH, not the job's."""
        return self.root / "bin"

    def _spawn(self, name: str, argv: Sequence[str]) -> None:
        env = self.env()
        self.bin_dir.mkdir(exist_ok=True)
        env["PATH"] = f"{self.bin_dir}:{env.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}"
        self.procs[name] = spawn_daemon(argv, self.root / "log" / f"{name}.stdio", env)

    def start(self, timeout: float = 60.0) -> None:
        self.write_config()
        try:
            self._spawn("munged", munged_argv(self.root, self.munge_socket))
            self._wait(lambda: self.munge_socket.exists(), timeout, "munged socket")
            self._spawn("slurmctld", slurmctld_argv(self.conf))
            self._spawn("slurmd", [_sbin("slurmd"), "-D", "-f", str(self.conf), "-N", NODE])
            self._wait(self.node_ready, timeout, "node idle")
        except BaseException:
            self.stop()
            raise

    def restart_slurmd(self, timeout: float = 60.0, wrap: Sequence[str] = ()) -> None:
        """Stop slurmd (TERM, as at a shutdown) and start it again: what it
        does once at its own start (slurm_spank_init in slurmd's context)
        runs again with today's plugstack.conf. ``wrap``: a command that
        execs slurmd's argv (its last arguments), e.g. to give it a mount
        namespace of its own; the next restart without it drops it."""
        # A step that has just ended may still be completing: a slurmd
        # stopped in the middle of that leaves the node busy for a while.
        self.settled_node_state()
        seen = len(self.slurmd_log_text())
        _terminate(self.procs.pop("slurmd", None))
        self._spawn("slurmd", [*wrap, _sbin("slurmd"), "-D", "-f", str(self.conf), "-N", NODE])
        try:
            self._wait(lambda: " started on " in self.slurmd_log_text()[seen:]
                       and self.node_ready(), timeout, "node idle after a slurmd restart")
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}\nnode state: {self.node_state()!r} "
                               f"({self.node_reason()!r})") from None

    def _wait(self, ready: object, timeout: float, what: str) -> None:
        why = wait_while_running(self.procs, ready, timeout, 0.2)
        if why == "timeout":
            raise TimeoutError(f"timed out waiting for {what}; see {self.root / 'log'}\n"
                               f"{self.logs_tail()}")
        if why is not None:
            raise RuntimeError(f"{why} while waiting for {what}; see {self.root / 'log'}\n"
                               f"{self.logs_tail()}")

    def logs_tail(self, n: int = 15) -> str:
        out = []
        for f in sorted((self.root / "log").glob("*")):
            lines = f.read_text(errors="replace").splitlines()[-n:]
            out.append(f"== {f.name}\n" + "\n".join(lines))
        return "\n".join(out)

    def stop(self) -> None:
        """Stop the daemons we started, by pid: TERM, then KILL after a grace time.

        Jobs still in the queue are cancelled first (bounded wait), so no
        slurmstepd of ours outlives slurmd waiting to report to it."""
        ctld = self.procs.get("slurmctld")
        if ctld is not None and ctld.poll() is None:
            try:
                self.run(["scancel", "--full", "--quiet", "--user", "root"], timeout=15)
                self.run(["scancel", "--full", "--quiet", "--user", "nobody"], timeout=15)
                for _ in range(50):
                    if not self.run(["squeue", "-h"], timeout=15).stdout.strip():
                        break
                    time.sleep(0.2)
            except (OSError, subprocess.SubprocessError):
                pass  # stopping must go on whatever the client says
        stop_daemons(self.procs, ("slurmd", "slurmctld", "munged"))
        self.unmount_job_containers()

    # -- client commands ----------------------------------------------------
    def run(self, argv: Sequence[str], *, user: str | None = None,
            env: Mapping[str, str] | None = None, timeout: float = 60.0,
            cwd: str | os.PathLike[str] | None = None,
            input: str | None = None) -> subprocess.CompletedProcess[str]:
        """Run a client command (srun, sbatch, ...) against this cluster, as
        ``user`` when given (through runuser, with our SLURM_CONF)."""
        full_env = self.env(env)
        # Resolved with *our* PATH: a scenario may hand the step a PATH of its own.
        cmd = [shutil.which(argv[0]) or argv[0], *argv[1:]]
        if user is not None and user != "root":
            keep = ",".join(sorted(full_env))
            cmd = [shutil.which("runuser") or _sbin("runuser"), "-u", user,
                   f"--whitelist-environment={keep}", "--", *cmd]
        return subprocess.run(cmd, env=full_env, text=True, capture_output=True,
                              timeout=timeout, cwd=cwd or str(self.shared), input=input,
                              check=False)

    def srun(self, args: Sequence[str], **kw: object) -> subprocess.CompletedProcess[str]:
        return self.run(["srun", "-N1", "-n1", *args], **kw)  # type: ignore[arg-type]

    def sbatch(self, script: str, args: Sequence[str] = (), *, user: str | None = None,
               env: Mapping[str, str] | None = None) -> int:
        path = Path(tempfile.mkstemp(dir=self.shared, suffix=".sh")[1])
        path.write_text(script)
        path.chmod(0o755)
        res = self.run(["sbatch", "--parsable", *args, str(path)], user=user, env=env)
        if res.returncode != 0:
            raise RuntimeError(f"sbatch failed: {res.stderr}")
        return int(res.stdout.strip().split(";")[0])

    def admin(self, argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        return self.run(argv)

    def node_state(self) -> str:
        """The node's state once a finished job's clean-up is over: "completing"
        is transient (it lasts longer on a loaded machine), a drain is not."""
        deadline = time.monotonic() + 15
        while True:
            res = self.run(["sinfo", "-h", "-N", "-n", NODE, "-o", "%T"], timeout=20)
            state = ",".join(sorted(set(res.stdout.split())))
            if state != "completing" or time.monotonic() > deadline:
                return state
            time.sleep(0.2)

    def settled_node_state(self, timeout: float = 30.0) -> str:
        """The node state once a finished job's "completing" has passed (a
        bounded wait): 24.11 and later report it for a while after srun
        returns, and it says nothing about drains (the release matrix saw it)."""
        deadline = time.monotonic() + timeout
        state = self.node_state()
        while "completing" in state and time.monotonic() < deadline:
            time.sleep(0.3)
            state = self.node_state()
        return state

    def node_ready(self) -> bool:
        try:
            state = self.node_state()
        except subprocess.TimeoutExpired:
            return False
        return state in ("idle", "mixed", "allocated")

    def node_reason(self) -> str:
        res = self.run(["scontrol", "-o", "show", "node", NODE], timeout=20)
        for word in res.stdout.split(" "):
            if word.startswith("Reason="):
                return word
        return ""

    def set_plugstack(self, lines: Iterable[str]) -> None:
        """plugstack.conf is re-read at every launch: no restart needed."""
        self.plugstack.write_text("\n".join(lines) + "\n")

    def slurmd_log_text(self) -> str:
        try:
            return self.slurmd_log.read_text(errors="replace")
        except FileNotFoundError:
            return ""


def main(argv: Sequence[str]) -> int:
    """``python3 -m tests.slurm.cluster up DIR``: start a cluster and wait for
    Ctrl-C (for poking at it by hand); ``demo`` is in ``tests.slurm.demo``."""
    if len(argv) >= 2 and argv[0] == "up":
        cluster = Cluster(Path(argv[1]))
        cluster.start()
        print(f"export SLURM_CONF={cluster.conf}", flush=True)
        try:
            signal.pause()
        except KeyboardInterrupt:
            pass
        finally:
            cluster.stop()
        return 0
    print("usage: python3 -m tests.slurm.cluster up DIR", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
