"""The two-architecture cluster of issue 17: an x86_64 controller and login
node (this machine) with an aarch64 64 KiB-page compute node (the guest).

Host side, all inside a network namespace the test makes (:class:`Netns`):
``munged``, ``slurmctld`` and every ``srun``/``sbatch``, run as ``nobody``.
Guest side (``qemu-system-aarch64``, the 64 KiB kernel of :mod:`vm.images`,
the Debian 12 arm64 root of :mod:`vm.slurmnode`): ``munged`` with the same
key and ``slurmd`` with the plugin built for aarch64, partition ``gb200``,
config without any page size or architecture (the node detects itself).
Host side too: a second slurmd, the x86_64 node (:data:`X86_NODE`, partitions
``x86`` and ``x86warn``), with the login node's install of the plugin
(:meth:`TwoArchCluster.x86_slurmd_argv`).

The only link is ``tap0`` inside the namespace: qemu opens it there
(``-netdev tap,ifname=tap0``), the host end has :data:`HOST_IP`, the guest
:data:`NODE_IP`. The machine's own interfaces are never touched; the
namespace and everything in it go away in :meth:`TwoArchCluster.stop`.

The guest mounts one host directory, the *share*, over virtio-9p at the same
path (the way nodes mount an NFS home): the user's home, the slurm.conf both
sides read, and a root-only ``node/`` directory where the node writes its
audit log and slurmd log, so the host reads them while the node runs.
Same Slurm (Debian 12's 22.05.8) and munge on both sides.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from corpus import CorpusUnavailable
from slurm.cluster import (
    JobQueries,
    munged_argv,
    slurmctld_argv,
    spawn_daemon,
    stop_daemons,
    wait_while_running,
)

from . import images
from .qemu import QEMU, qemu_binary
from .slurmnode import CGROUP_CONF, REPO, build_plugin, slurm_root

NODE = "grace1"
PARTITION = "gb200"
#: The same node in warn mode (issue 17: "each also in warn mode").
WARN_PARTITION = "gb200warn"
HOSTNAME = socket.gethostname().split(".")[0]
#: The x86_64 node: a second slurmd on this machine (issue 28 item 4), with
#: the login node's own install of the plugin, as partition ``x86``. Named
#: as the machine, as a site names its nodes: the audit line's ``node`` is
#: the host's name.
X86_NODE = HOSTNAME
X86_PARTITION = "x86"
X86_WARN_PARTITION = "x86warn"
#: Which node each partition's steps run on.
NODE_OF = {PARTITION: NODE, WARN_PARTITION: NODE,
           X86_PARTITION: X86_NODE, X86_WARN_PARTITION: X86_NODE}
#: Each enforcing partition's warn-mode twin (the same node).
WARN_OF = {PARTITION: WARN_PARTITION, X86_PARTITION: X86_WARN_PARTITION}
HOST_IP, NODE_IP, PREFIX_LEN = "10.217.17.1", "10.217.17.2", 24
CTLD_PORT, SLURMD_PORT = 6817, 6818
#: The account the steps run as: present, with the same uid, on both sides
#: (Debian's ``nobody``); its HOME is the shared home.
USER, UID, GID = "nobody", 65534, 65534
BOOT_TIMEOUT = 600.0

def _node_config(machine: str, partitions: str) -> str:
    """A node's grace-policy config: the site policy, no [node] section and
    no partition facts, so the page size and architecture can only come
    from the node itself."""
    return (f"# grace-policy on the {machine} node of the two-architecture test cluster.\n"
            'mode = "enforce"\ncontact = "the test suite"\ndeadline_ms = 120000\n'
            + partitions)


#: The Grace node's (its partitions name the CUDA package index).
NODE_CONFIG = _node_config("aarch64", f"""
[partitions.{PARTITION}]
cuda_index = "cu130"

[partitions.{WARN_PARTITION}]
mode = "warn"
cuda_index = "cu130"
""")

#: The x86_64 node's.
X86_NODE_CONFIG = _node_config("x86_64", f"""
[partitions.{X86_WARN_PARTITION}]
mode = "warn"
""")

#: The login node's copy: the same policy plus what each partition's nodes
#: are, which `grace-policy check --partition P` on the login node needs.
LOGIN_CONFIG = f"""\
# grace-policy on the x86_64 login node: the node's policy + its partitions' facts.
mode = "enforce"
contact = "the test suite"
deadline_ms = 120000

[partitions.{PARTITION}]
cuda_index = "cu130"
arch = "aarch64"
page_size = 65536
glibc = "2.36"

[partitions.{WARN_PARTITION}]
mode = "warn"
cuda_index = "cu130"
arch = "aarch64"
page_size = 65536
glibc = "2.36"

[partitions.{X86_PARTITION}]
arch = "x86_64"
page_size = 4096
glibc = "2.36"

[partitions.{X86_WARN_PARTITION}]
mode = "warn"
arch = "x86_64"
page_size = 4096
glibc = "2.36"
"""

#: timeout_ms: under TCG the first check of a step (Python starting inside
#: slurmstepd) is slow; a real Grace core is not.
def _plugstack(audit: Path) -> str:
    return ("required /usr/local/lib/slurm/spank_grace_policy.so "
            f"config=/etc/slurm/grace-policy.toml audit={audit} timeout_ms=300000\n")


class ClusterError(RuntimeError):
    """The cluster did not come up; the message carries the logs' tails."""


def _run(argv: Sequence[str], **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), text=True, capture_output=True, check=False,
                          **kw)  # type: ignore[call-overload]


def unavailable() -> str | None:
    """Why this machine cannot run the cluster, or None."""
    if os.geteuid() != 0:
        return "the two-architecture cluster needs root (network namespace, tap, daemons)"
    if qemu_binary() is None:
        return f"{QEMU} not installed (make deps: qemu-system-arm)"
    if not Path("/dev/net/tun").exists():
        return "/dev/net/tun missing: no tap device for the guest"
    for tool in ("ip", "munged", "slurmctld", "srun", "sbatch", "runuser"):
        if shutil.which(tool) is None and not Path("/usr/sbin", tool).exists():
            return f"{tool} not installed (make deps)"
    return None


@dataclass
class Netns:
    """A network namespace with ``lo`` and ``tap0`` (:data:`HOST_IP`) in it."""

    name: str
    made: bool = False

    def create(self) -> None:
        steps = [
            ["ip", "netns", "add", self.name],
            ["ip", "-n", self.name, "link", "set", "lo", "up"],
            ["ip", "netns", "exec", self.name, "ip", "tuntap", "add", "dev", "tap0",
             "mode", "tap"],
            ["ip", "-n", self.name, "addr", "add", f"{HOST_IP}/{PREFIX_LEN}", "dev", "tap0"],
            ["ip", "-n", self.name, "link", "set", "tap0", "up"],
        ]
        for i, argv in enumerate(steps):
            res = _run(argv, timeout=30)
            if res.returncode != 0:
                if i > 0:
                    self.delete()
                raise CorpusUnavailable(f"{' '.join(argv)}: {res.stderr.strip()}")
            self.made = True

    def wrap(self, argv: Sequence[str]) -> list[str]:
        return ["ip", "netns", "exec", self.name, *argv]

    def delete(self) -> None:
        if self.made:
            _run(["ip", "netns", "delete", self.name], timeout=30)
            self.made = False


@dataclass(frozen=True)
class Submitted:
    rc: int
    stdout: str
    stderr: str
    seconds: float


@dataclass
class TwoArchCluster(JobQueries):
    #: Steps under TCG are slow; sbatch's jobs are waited for longer.
    JOB_POLL = 1.0
    JOB_TIMEOUT = 300.0

    root: Path
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    netns: Netns | None = None
    boot_seconds: float = 0.0

    # -- layout --------------------------------------------------------------
    @property
    def share(self) -> Path:
        """What the guest mounts over 9p, at the same path."""
        return self.root / "share"

    @property
    def home(self) -> Path:
        return self.share / "home" / "user"

    @property
    def node_dir(self) -> Path:
        return self.share / "node"

    @property
    def audit(self) -> Path:
        return self.node_dir / "audit.jsonl"

    @property
    def x86_audit(self) -> Path:
        """The x86_64 node's audit log (its own: the guest appends to the
        other over 9p)."""
        return self.ctl / "x86" / "audit.jsonl"

    @property
    def x86_dir(self) -> Path:
        """The x86_64 node's own files: config, plugstack, verdict cache,
        node checker's socket, slurmd log."""
        return self.ctl / "x86"

    @property
    def conf(self) -> Path:
        return self.share / "etc" / "slurm.conf"

    @property
    def ctl(self) -> Path:
        """Host-only state (the guest makes the same paths on its tmpfs)."""
        return self.root / "ctl"

    @property
    def munge_socket(self) -> Path:
        return self.ctl / "munge" / "munge.socket"

    @property
    def login_tool(self) -> Path:
        """``grace-policy`` as ``make install`` put it on the login node."""
        return self.ctl / "login" / "bin" / "grace-policy"

    @property
    def login_config(self) -> Path:
        return self.ctl / "grace-policy-login.toml"

    # -- config --------------------------------------------------------------
    def slurm_conf(self) -> str:
        c = self.ctl
        return "\n".join([
            "# Written by tests/vm/twoarch.py: x86_64 controller, aarch64 64 KiB node.",
            "ClusterName=twoarch",
            f"SlurmctldHost={HOSTNAME}({HOST_IP})",
            f"SlurmctldPort={CTLD_PORT}",
            f"SlurmdPort={SLURMD_PORT}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket}",
            f"StateSaveLocation={c / 'state'}",
            f"SlurmdSpoolDir={c / 'spool'}",
            f"SlurmctldPidFile={c / 'run/slurmctld.pid'}",
            f"SlurmdPidFile={c / 'run/slurmd.pid'}",
            f"SlurmctldLogFile={c / 'log/slurmctld.log'}",
            f"SlurmdLogFile={self.node_dir / 'slurmd.log'}",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "SchedulerType=sched/builtin",
            # cons_tres: --gpus needs it.
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "GresTypes=gpu",
            "MpiDefault=none",
            "MailProg=/bin/true",
            "ReturnToService=2",
            "InactiveLimit=0",
            "KillWait=5",
            "MessageTimeout=60",
            "BatchStartTimeout=120",
            "SlurmdTimeout=600",
            # Each side has its own plugstack at this path: the login node
            # runs no plugin, the node runs ours.
            f"PlugStackConfig={c / 'plugstack.conf'}",
            f"NodeName={NODE} NodeAddr={NODE_IP} CPUs=1 Gres=gpu:1 State=UNKNOWN",
            f"PartitionName={PARTITION} Nodes={NODE} Default=YES MaxTime=INFINITE State=UP",
            f"PartitionName={WARN_PARTITION} Nodes={NODE} Default=NO MaxTime=INFINITE State=UP",
            f"NodeName={X86_NODE} NodeAddr={HOST_IP} CPUs=1 State=UNKNOWN",
            *(f"PartitionName={p} Nodes={X86_NODE} Default=NO MaxTime=INFINITE State=UP"
              for p in (X86_PARTITION, X86_WARN_PARTITION)),
        ]) + "\n"

    def init_script(self) -> str:
        share, c = self.share, self.ctl
        return f"""#!/bin/busybox sh
B=/bin/busybox
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
out() {{ echo "$*" > /dev/hvc0; }}
$B mount -t proc proc /proc
$B mount -t sysfs sys /sys
$B mount -t cgroup2 cgroup2 /sys/fs/cgroup
$B mkdir -p /sys/fs/cgroup/system.slice
$B mount -t devtmpfs dev /dev
for d in /run /tmp /var/spool /var/log /var/lib/slurm; do
  $B mkdir -p $d; $B mount -t tmpfs t $d
done
$B chmod 1777 /tmp
$B hostname {NODE}
$B date -s @{int(time.time())} > /dev/null
$B ifconfig lo 127.0.0.1 up
$B ip link set eth0 up
$B ip addr add {NODE_IP}/{PREFIX_LEN} dev eth0
$B mkdir -p {share}
$B mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 share {share} || out "MOUNT-FAILED"
# The clock set above is the host's when this script was written, before the
# initrd was packed and the guest booted: on a loaded machine minutes behind,
# and munge then refuses every credential ("Rewound credential"). A file the
# host creates now carries the host's time: take it from there.
$B rm -f {share}/.clock && : > {share}/.clock && \
  $B date -s @$($B stat -c %Y {share}/.clock) > /dev/null
$B mkdir -p {c}/munge {c}/state {c}/spool {c}/run {c}/log /run/munge /var/lib/munge /var/log/munge
$B cp /etc/slurm/plugstack.conf {c}/plugstack.conf
$B mkdir -p {c}/dev && $B ln -s /dev/null {c}/dev/nvidia0
# The root is an extract of the Slurm packages, without coreutils: a real
# node has uname, busybox's stands in.
[ -e /usr/bin/uname ] || $B ln -s /bin/busybox /usr/bin/uname
out "BOOTED $($B cut -d' ' -f1 /proc/uptime) $($B ls /sys/class/net | $B tr '\\n' ' ')"
/usr/sbin/munged --force --socket={self.munge_socket} > /var/log/munged.stdio 2>&1
/usr/sbin/slurmd -f {self.conf} -N {NODE} > /var/log/slurmd.stdio 2>&1
out "SLURMD $?"
until [ -e {self.node_dir}/poweroff ]; do
  $B pidof slurmd-wlm slurmd > /dev/null || {{
    out "SLURMD-DIED"; $B cat /var/log/slurmd.stdio > /dev/hvc0; break; }}
  $B sleep 1
done
out "POWEROFF"
$B sync
$B poweroff -f
"""

    def _prepare(self) -> Path:
        """Everything on disk before any daemon: share, home, configs, initrd."""
        # The user must reach the munge socket and the home through every
        # parent (srun otherwise retries munge until its timeout, silently).
        for parent in self.root.resolve().parents:
            if not os.stat(parent).st_mode & 0o001:
                raise ClusterError(f"{parent} is not searchable by others: the user "
                                   f"{USER} could not reach the home or munge's socket "
                                   "(use a root under /tmp, e.g. tempfile.mkdtemp())")
        for d in (self.share / "etc", self.node_dir, self.home, self.ctl / "munge",
                  self.ctl / "state", self.ctl / "run", self.ctl / "log", self.ctl / "spool"):
            d.mkdir(parents=True, exist_ok=True)
        for p in (self.root, self.share, self.share / "etc", self.share / "home"):
            p.chmod(0o755)
        self.node_dir.chmod(0o700)
        os.chown(self.home, UID, GID)
        self.home.chmod(0o755)
        key = self.ctl / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        self.conf.write_text(self.slurm_conf())
        # slurmd reads cgroup.conf and gres.conf next to slurm.conf. The GPU
        # is device-less (the guest has none): a link to /dev/null that the
        # guest's /init makes, so --gpus steps are scheduled and get Slurm's
        # GPU variables; with TaskPlugin=task/none nothing opens it.
        (self.conf.parent / "cgroup.conf").write_text(CGROUP_CONF)
        (self.conf.parent / "gres.conf").write_text(
            f"NodeName={NODE} Name=gpu File={self.ctl / 'dev/nvidia0'}\n")
        (self.ctl / "plugstack.conf").write_text("# the login node runs no SPANK plugin\n")
        self.login_config.write_text(LOGIN_CONFIG)
        self.login_config.chmod(0o644)
        self._prepare_x86()

        # The login node's own install (x86_64), what users run `check` with.
        res = _run(["make", "-s", "-C", str(REPO), "install", f"PREFIX={self.ctl / 'login'}"],
                   timeout=900)
        if res.returncode != 0:
            raise ClusterError(f"make install (login node) failed:\n{res.stderr[-3000:]}")
        from .qemu import cpio_newc
        groot = slurm_root()
        stage = build_plugin(self.root / "build", groot)
        initrd = self.root / "initrd.cpio"
        passwd = ("root:x:0:0:root:/root:/bin/sh\n"
                  f"{USER}:x:{UID}:{GID}:nobody:{self.home}:/bin/sh\n")
        hosts = f"127.0.0.1 localhost\n{NODE_IP} {NODE}\n{HOST_IP} {HOSTNAME}\n"
        cpio_newc(initrd, [(groot, ""), (stage, "")], extra=[
            ("init", self.init_script().encode(), 0o755),
            ("etc/passwd", passwd.encode(), 0o644),
            ("etc/hosts", hosts.encode(), 0o644),
            ("etc/slurm/plugstack.conf", _plugstack(self.audit).encode(), 0o644),
            ("etc/slurm/grace-policy.toml", NODE_CONFIG.encode(), 0o644),
            ("etc/munge/munge.key", key.read_bytes(), 0o600),
        ])
        return initrd

    def _prepare_x86(self) -> None:
        """The x86_64 node's files. Its slurmd reads the same slurm.conf as
        the rest of the cluster, whose PlugStackConfig is the login node's
        empty one (srun and sbatch read it too): :meth:`x86_slurmd_argv`
        puts this node's plugstack (and an empty cgroup.conf: the machine's
        cgroups are not this test's) over those paths in a mount namespace
        of slurmd's own, which its slurmstepds inherit."""
        d = self.x86_dir
        (d / "cache").mkdir(parents=True, exist_ok=True)
        d.chmod(0o755)
        (d / "cache").chmod(0o700)
        (d / "grace-policy.toml").write_text(X86_NODE_CONFIG)
        (d / "grace-policy.toml").chmod(0o644)
        plugin = self.ctl / "login" / "lib" / "slurm" / "spank_grace_policy.so"
        (d / "plugstack.conf").write_text(
            f"required {plugin} config={d / 'grace-policy.toml'} audit={self.x86_audit} "
            f"cache_dir={d / 'cache'} checker_socket={d / 'checker' / 'socket'}\n")
        (d / "cgroup.conf").write_text("# the x86_64 test node: Slurm's defaults\n")

    def x86_slurmd_argv(self) -> list[str]:
        d = self.x86_dir
        binds = [(d / "plugstack.conf", self.ctl / "plugstack.conf"),
                 (d / "cgroup.conf", self.conf.parent / "cgroup.conf")]
        mounts = " && ".join(f"mount --bind {src} {dst}" for src, dst in binds)
        # nsenter, not `ip netns exec`: that one mounts a fresh /sys, without
        # the machine's /sys/fs/cgroup, which slurmd's cgroup plugin reads
        # (the same hierarchy as the tests/slurm clusters' slurmd).
        assert self.netns is not None
        return ["nsenter", f"--net=/run/netns/{self.netns.name}",
                "unshare", "--mount", "--propagation", "private", "sh", "-c",
                f"{mounts} && exec /usr/sbin/slurmd -D -f {self.conf} -N {X86_NODE} "
                f"-L {d / 'slurmd.log'}"]

    # -- start / stop --------------------------------------------------------
    def _spawn(self, name: str, argv: Sequence[str]) -> None:
        assert self.netns is not None
        self.procs[name] = spawn_daemon(
            self.netns.wrap(argv), self.ctl / "log" / f"{name}.stdio",
            {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "SLURM_CONF": str(self.conf)})

    def start(self) -> None:
        """Prepare, make the namespace, start munged, slurmctld and the guest;
        return once the node is idle."""
        initrd = self._prepare()
        kernel = images.kernel_64k()
        self.netns = Netns(f"gp17-{os.getpid()}")
        self.netns.create()
        t0 = time.monotonic()
        try:
            self._spawn("munged", munged_argv(self.ctl, self.munge_socket))
            self._wait(self.munge_socket.exists, 30, "munged socket")
            self._spawn("slurmctld", slurmctld_argv(self.conf))
            self.procs["slurmd-x86"] = spawn_daemon(
                self.x86_slurmd_argv(), self.ctl / "log" / "slurmd-x86.stdio",
                {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "SLURM_CONF": str(self.conf)})
            self._spawn("qemu", [
                qemu_binary() or QEMU, "-M", "virt", "-cpu", "max,pauth-impdef=on",
                "-m", "3072", "-smp", "1", "-accel", "tcg", "-nographic", "-no-reboot",
                "-nodefaults", "-kernel", str(kernel), "-initrd", str(initrd),
                "-append", "console=ttyAMA0 rdinit=/init panic=-1 loglevel=4",
                "-serial", f"file:{self.root / 'serial.txt'}",
                "-chardev", f"file,id=results,path={self.root / 'console.txt'}",
                "-device", "virtio-serial-pci", "-device", "virtconsole,chardev=results",
                "-netdev", "tap,id=n0,ifname=tap0,script=no,downscript=no",
                "-device", "virtio-net-pci,netdev=n0",
                "-fsdev", f"local,id=fs0,path={self.share},security_model=passthrough",
                "-device", "virtio-9p-pci,fsdev=fs0,mount_tag=share",
                "-monitor", "none"])
            self._wait(self.node_idle, BOOT_TIMEOUT, "node idle")
            self.boot_seconds = time.monotonic() - t0
        except BaseException:
            self.stop()
            raise

    def _wait(self, ready: object, timeout: float, what: str) -> None:
        why = wait_while_running(self.procs, ready, timeout, 1.0)
        if why is not None:
            shown = "timed out" if why == "timeout" else why
            raise ClusterError(f"{shown} while waiting for {what}\n{self.logs_tail()}")

    def node_idle(self) -> bool:
        """Both nodes up (one line per node and partition)."""
        res = self.client(["sinfo", "-h", "-N", "-n", f"{NODE},{X86_NODE}", "-o", "%N %T"],
                          timeout=30)
        up = {line.split()[0] for line in res.stdout.splitlines()
              if line.split()[1:] and line.split()[1] in ("idle", "mixed", "allocated")}
        return up == {NODE, X86_NODE}

    def logs_tail(self, n: int = 20) -> str:
        out = []
        for f in (*sorted((self.ctl / "log").glob("*")), self.root / "console.txt",
                  self.root / "serial.txt", self.node_dir / "slurmd.log",
                  self.x86_dir / "slurmd.log"):
            try:
                lines = f.read_text(errors="replace").splitlines()[-n:]
            except OSError:
                continue
            out.append(f"== {f.name}\n" + "\n".join(lines))
        return "\n".join(out)

    def stop(self) -> None:
        """Ask the guest to power off, then stop what we started, by pid."""
        try:
            (self.node_dir / "poweroff").touch()
        except OSError:
            pass
        qemu = self.procs.get("qemu")
        if qemu is not None:
            try:
                qemu.wait(timeout=30)
            except subprocess.TimeoutExpired:
                qemu.kill()
                qemu.wait(timeout=10)
        stop_daemons(self.procs, ("slurmd-x86", "slurmctld", "munged"))
        if self.netns is not None:
            self.netns.delete()

    # -- the user's side -----------------------------------------------------
    def user_env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """A login shell's environment for the user (then ``extra``)."""
        # PWD as a shell keeps it: on 22.05 the plugin learns the job's cwd
        # from it (docs/SPANK.md), and srun runs in the home.
        env = {"HOME": str(self.home), "PWD": str(self.home), "USER": USER, "LOGNAME": USER,
               "SHELL": "/bin/sh",
               "PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8",
               "SLURM_CONF": str(self.conf)}
        env.update(extra or {})
        return env

    def as_user(self, argv: Sequence[str], env: Mapping[str, str], *,
                timeout: float = 300, netns: bool = True) -> Submitted:
        """Run ``argv`` as the user with exactly ``env``, in the home."""
        cmd = [shutil.which("runuser") or "/usr/sbin/runuser", "-u", USER, "--",
               "env", "-i", *(f"{k}={v}" for k, v in env.items()), *argv]
        if netns:
            assert self.netns is not None
            cmd = self.netns.wrap(cmd)
        t0 = time.monotonic()
        res = _run(cmd, timeout=timeout, cwd=str(self.home))
        return Submitted(res.returncode, res.stdout, res.stderr, time.monotonic() - t0)

    def admin(self, argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        return self.client(argv)

    def client(self, argv: Sequence[str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """An admin's Slurm command (as root) inside the namespace."""
        assert self.netns is not None
        return _run(self.netns.wrap(argv), timeout=timeout,
                    env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                         "SLURM_CONF": str(self.conf)})

    def audit_lines(self, partition: str = PARTITION) -> list[str]:
        """The audit log of ``partition``'s node."""
        path = self.x86_audit if NODE_OF[partition] == X86_NODE else self.audit
        try:
            return [line for line in path.read_text().splitlines() if line.strip()]
        except OSError:
            return []
