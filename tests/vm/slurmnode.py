"""A one-node Slurm inside the 64 KiB guest, with the plugin built for aarch64.

The guest root is Debian 12 arm64 (Slurm 22.05, munge, python3) unpacked by
``mmdebstrap --variant=extract`` (no maintainer scripts run: the few things
they would do, alternatives links, users, are done here); the plugin is
cross-built with ``make plugin CC=aarch64-linux-gnu-gcc`` against that root's
Slurm headers and libpython, and installed with ``make install`` next to
aarch64 wheels of the same dependency versions as the host build. The config
has no ``[node]`` section: the plugin detects the node it runs on.

Inside, ``/init`` starts munged, slurmctld and slurmd on loopback (the guest
has no network device), runs :data:`SCENARIOS` with ``srun`` as ``nobody``,
and prints each result over ``/dev/hvc0`` (base64, so any output survives),
then the audit log, then powers off. Nothing leaves the machine.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

from corpus import CorpusUnavailable, _cached_tree, _run
from fixtures.build import compile_c, src

from . import images
from .qemu import boot, cpio_newc

REPO = Path(__file__).resolve().parents[2]
SUITE = "bookworm"
#: What the guest root holds (mmdebstrap resolves their dependencies).
ROOT_PACKAGES = ("slurmd", "slurmctld", "slurm-client", "munge", "python3",
                 "busybox-static", "libslurm-dev", "libpython3.11-dev")
NODE = "grace1"
PARTITION = "gb200"
BOOT_TIMEOUT = 900

@dataclass(frozen=True)
class Scenario:
    """One step of the guest's run: what is run, with which extra environment,
    and what it shows (the demo's heading, so tests and demo cannot drift)."""

    argv: tuple[str, ...]
    env: dict[str, str]
    what: str


#: What a user on an x86 login node submits, each with ``srun`` as nobody.
SCENARIOS: dict[str, Scenario] = {
    "native": Scenario(("/cases/bin/hello-64k",), {},
                       "a clean aarch64 program built for 64 KiB pages"),
    "native-again": Scenario(("/cases/bin/hello-64k",), {},
                             "the same step again (answered by the verdict cache, no Python)"),
    "x86-program": Scenario(("/cases/bin/tool-x86",), {},
                            "a program built on the x86_64 login node"),
    "x86-venv-leak": Scenario(("/cases/bin/hello-64k",),
                              {"VIRTUAL_ENV": "/cases/venv-x86",
                               "PATH": "/cases/venv-x86/bin:/usr/bin:/bin"},
                              "a clean program, with VIRTUAL_ENV leaked from an x86_64 venv"),
    "4k-build": Scenario(("/cases/bin/hello-4k",), {},
                         "an aarch64 program linked for 4 KiB pages"),
    # Python steps in a venv of the node's own python3: a package whose
    # extension module was linked for 4 KiB pages, imported or not.
    "python-4k-ext": Scenario(("/cases/venv-py/bin/python", "-c", "import ext4k"), {},
                              "a Python step importing a package whose extension module "
                              "was linked for 4 KiB pages"),
    "python-unused": Scenario(("/cases/venv-py/bin/python", "-c", "print('ran')"), {},
                              "a Python step in the same venv that does not import it"),
    # Issue 16: environments a user filled on the x86_64 login node with its
    # distribution's python (a real `python3.11 -m venv`, real PyPI wheels);
    # here the node's own /usr/bin/python3.11 runs them. The login node's
    # prediction for each must be the verdict the plugin gives here.
    "login-venv-x86": Scenario(("/cases/venv-sys/bin/python", "-c", "import bcrypt"), {},
                               "a venv of the login node's python3.11 importing an "
                               "x86_64 wheel"),
    "login-venv-unused": Scenario(("/cases/venv-sys/bin/python", "-c",
                                   "import markupsafe._speedups; print('ran')"), {},
                                  "the same venv, the x86_64 package not imported"),
    "login-user-site": Scenario(("/usr/bin/python3.11", "-c", "import bcrypt"),
                                {"PYTHONUSERBASE": "/cases/userbase-x86"},
                                "python3.11 importing an x86_64 wheel from a PYTHONUSERBASE"),
    "login-pythonpath": Scenario(("/usr/bin/python3.11", "-c", "import bcrypt"),
                                 {"PYTHONPATH": "/cases/pp-x86"},
                                 "python3.11 importing an x86_64 wheel from PYTHONPATH"),
    "login-console-script": Scenario(("/cases/venv-sys/bin/hash-tool",), {},
                                     "a console script of that venv importing the x86_64 "
                                     "wheel"),
    "login-clean": Scenario(("/cases/venv-arm/bin/python", "-c",
                             "import bcrypt, markupsafe._speedups; print('ran')"), {},
                            "a venv of python3.11 holding aarch64 wheels only"),
}

#: The scenarios above whose environments come from the login node.
LOGIN_SCENARIOS = tuple(name for name in SCENARIOS if name.startswith("login-"))

#: Run as nobody without Slurm: what really happens on this node.
DIRECT: dict[str, Scenario] = {
    "python-4k-ext-direct": Scenario(("/cases/venv-py/bin/python", "-c", "import ext4k"), {},
                                     "the same import without Slurm: what the node's "
                                     "python really does"),
    "login-venv-x86-direct": Scenario(("/cases/venv-sys/bin/python", "-c", "import bcrypt"),
                                      {}, "the login node's venv importing the x86_64 wheel "
                                      "without Slurm: what the node's python really does"),
}

#: The tests' own contact text; the demo shows a site's (run_node's ``contact``).
TEST_CONTACT = "the test suite"

CONFIG = """\
# grace-policy in the 64 KiB guest: no [node] section, the node is detected.
mode = "enforce"
contact = {contact}
deadline_ms = 60000

[audit]
path = "/var/log/grace-policy.jsonl"
"""

SLURM_CONF = f"""\
ClusterName=grace
SlurmctldHost={NODE}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=/var/lib/slurm/state
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=/var/log/slurmctld.log
SlurmdLogFile=/var/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/builtin
SelectType=select/linear
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
MessageTimeout=60
BatchStartTimeout=120
PlugStackConfig=/etc/slurm/plugstack.conf
NodeName={NODE} NodeAddr=127.0.0.1 CPUs=1 State=UNKNOWN
PartitionName={PARTITION} Nodes={NODE} Default=YES MaxTime=INFINITE State=UP
"""

#: No systemd (nor dbus) in the guest: slurmd's cgroup/v2 plugin would ask
#: systemd for its scope and fail ("slurmd initialization failed").
CGROUP_CONF = "CgroupPlugin=cgroup/v2\nIgnoreSystemd=yes\n"

#: timeout_ms: under TCG the first check of a step (Python starting inside
#: slurmstepd) takes longer than the default 10 s; a real Grace core does not.
PLUGSTACK = ("required /usr/local/lib/slurm/spank_grace_policy.so "
             "config=/etc/slurm/grace-policy.toml audit=/var/log/grace-policy.jsonl "
             "timeout_ms=300000\n")

INIT_HEAD = f"""#!/bin/busybox sh
B=/bin/busybox
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
out() {{ echo "$*" > /dev/hvc0; }}
up() {{ $B cut -d' ' -f1 /proc/uptime; }}
$B mount -t proc proc /proc
$B mount -t sysfs sys /sys
$B mount -t cgroup2 cgroup2 /sys/fs/cgroup
$B mkdir -p /sys/fs/cgroup/system.slice  # what systemd would have made
$B mount -t devtmpfs dev /dev
for d in /run /tmp /var/spool /var/log /var/lib/slurm; do
  $B mkdir -p $d; $B mount -t tmpfs t $d
done
$B chmod 1777 /tmp
$B hostname {NODE}
# No RTC driver in the small kernel: without the host's time the clock starts
# at 1970 and munge refuses its own credentials ("Rewound credential").
$B date -s @{{epoch}} > /dev/null
$B ifconfig lo 127.0.0.1 up
# glibc's getaddrinfo(AI_ADDRCONFIG), which Slurm uses, counts no address but
# 127.0.0.1 as loopback-only: a second loopback address makes IPv4 "configured".
$B ip addr add 127.0.0.2/8 dev lo
$B mkdir -p /run/munge /var/lib/munge /var/log/munge /var/lib/slurm/state /var/spool/slurmd
out "BOOTED $(up)"
out "NETDEVS $($B ls /sys/class/net | $B tr '\n' ' ')"
/usr/sbin/munged --force > /var/log/munged.stdio 2>&1
/usr/sbin/slurmctld > /var/log/slurmctld.stdio 2>&1
/usr/sbin/slurmd > /var/log/slurmd.stdio 2>&1
# What an admin does after each edit of the config (README): the compiled form.
/usr/local/bin/grace-policy config check --compile /etc/slurm/grace-policy.toml \
  > /var/log/config-check.txt 2>&1
out "CONFIG $? $(up)"
out "DAEMONS $(up)"
out "MUNGE $(munge -n 2>&1 | unmunge 2>&1 | $B grep -E 'STATUS|rror' | $B tr '\n' ' ')"
out "PS $($B ps -o comm | $B tr '\n' ' ')"
n=0
until [ "$(sinfo -h -o %T 2>/dev/null)" = idle ]; do
  n=$((n+1)); [ $((n % 10)) = 0 ] && out "WAIT $(up) $(sinfo -h -o %T 2>&1)"
  [ $n -gt 120 ] && break
  $B pidof slurmd-wlm slurmd > /dev/null || {{ out "SLURMD-DIED $(up)"; break; }}
  $B sleep 1
done
out "SLURM-UP $(up) $(sinfo -h -o %T 2>&1)"
for f in munged.stdio slurmctld.stdio slurmd.stdio slurmctld.log slurmd.log; do
  out "LOG $f $($B tail -n 15 /var/log/$f 2>&1 | $B base64 -w0)"
done
step() {{
  name=$1; shift
  t0=$(up)
  $B env "$@" > /tmp/o 2> /tmp/e </dev/null
  rc=$?
  out "STEP	$name	$rc	$t0	$(up)	$($B base64 -w0 /tmp/o)	$($B base64 -w0 /tmp/e)"
}}
"""

INIT_TAIL = """
out "AUDIT	$($B base64 -w0 /var/log/grace-policy.jsonl)"
out "SLURMDLOG	$($B grep -i grace /var/log/slurmd.log | $B base64 -w0)"
out "ALLDONE $(up)"
$B poweroff -f
"""


def _shell_quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def init_script(epoch: int | None = None) -> str:
    lines = [INIT_HEAD.replace("{epoch}", str(int(epoch if epoch is not None else time.time())))]
    for name, scenario in SCENARIOS.items():
        assigns = " ".join(_shell_quote(f"{k}={v}") for k, v in scenario.env.items())
        # su keeps the environment out: the variables go in on srun's side of it.
        cmd = " ".join(_shell_quote(a) for a in scenario.argv)
        inner = f"env {assigns} srun -p {PARTITION} -N1 -n1 {cmd}"
        lines.append(f"step {name} su -s /bin/sh nobody -c {_shell_quote(inner)}")
    for name, scenario in DIRECT.items():
        cmd = " ".join(_shell_quote(a) for a in scenario.argv)
        lines.append(f"step {name} su -s /bin/sh nobody -c {_shell_quote(cmd)}")
    lines.append(INIT_TAIL)
    return "\n".join(lines)


def slurm_root() -> Path:
    """Debian 12 arm64 with Slurm, munge and python3, unpacked (cached)."""

    def build(work: Path) -> Path:
        if shutil.which("mmdebstrap") is None:
            raise CorpusUnavailable("mmdebstrap not installed (make deps)")
        root = work / "root"
        _run(["mmdebstrap", "--quiet", "--variant=extract", "--architectures=arm64",
              f"--include={','.join(ROOT_PACKAGES)}", SUITE, str(root),
              f"{_mirror_line()}"], timeout=1200)
        # What the packages' maintainer scripts would have done.
        for name in ("slurmd", "slurmctld", "slurmstepd"):
            link = root / "usr/sbin" / name
            if not link.exists():
                link.symlink_to(f"{name}-wlm")
        for name in ("sh", "su", "env"):
            link = root / "bin" / name
            if not link.exists():
                link.symlink_to("busybox")
        (root / "etc/passwd").write_text(
            "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/sh\n")
        (root / "etc/group").write_text("root:x:0:\nnogroup:x:65534:\n")
        (root / "etc/hosts").write_text(f"127.0.0.1 {NODE} localhost\n")
        (root / "etc/shells").write_text("/bin/sh\n")
        (root / "etc/mtab").unlink(missing_ok=True)
        for d in ("proc", "sys", "dev", "run", "tmp", "var/log", "var/spool", "var/lib/slurm"):
            (root / d).mkdir(parents=True, exist_ok=True)
        versions = subprocess.run(
            ["dpkg-query", f"--admindir={root}/var/lib/dpkg", "-W", "-f",
             "${Package}=${Version}\n"], capture_output=True, text=True, check=False).stdout
        (work.parent / "versions.txt").write_text(versions)
        return root

    return _cached_tree(f"vm/slurm-root-{SUITE}", {"suite": SUITE,
                                                    "packages": list(ROOT_PACKAGES)}, build)


def _mirror_line() -> str:
    return f"deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] " \
           f"{images._mirror()} {SUITE} main"


def _host_pydeps_freeze(pydeps: Path) -> list[str]:
    out = subprocess.run([sys.executable, "-m", "pip", "freeze", "--path", str(pydeps)],
                         capture_output=True, text=True, check=False).stdout
    return sorted(line.strip() for line in out.splitlines() if "==" in line)


def guest_pydeps(pins: list[str]) -> Path:
    """aarch64 wheels of exactly the versions the host build used (the cffi
    glue must match its _cffi_backend), for the guest's Python 3.11."""

    def build(work: Path) -> Path:
        target = work / "pydeps"
        _run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--only-binary=:all:",
              "--platform", "manylinux2014_aarch64", "--python-version", "3.11",
              "--implementation", "cp", "--target", str(target), *pins], timeout=600)
        return target

    return _cached_tree("vm/pydeps-aarch64", {"pins": pins}, build)


def build_plugin(work: Path, root: Path) -> Path:
    """Cross-build and install the plugin into ``work/stage`` (a DESTDIR for
    PREFIX=/usr/local); returns the stage."""
    build = work / "build-aarch64"
    stage = work / "stage"
    make = ["make", "-s", "-C", str(REPO), f"BUILD={build}", "PLUGIN_PYTHON=/usr/bin/python3",
            "CC=aarch64-linux-gnu-gcc",
            f"PLUGIN_CFLAGS=-O2 -g -isystem {root}/usr/include",
            f"PLUGIN_PY_INCLUDE={root}/usr/include/python3.11",
            f"PLUGIN_PY_LIB={root}/usr/lib/aarch64-linux-gnu/libpython3.11.so.1.0"]
    _run([*make, "plugin"], timeout=900)
    pydeps = guest_pydeps(_host_pydeps_freeze(build / "pydeps"))
    # make install copies PYDEPS into the prefix: give it the aarch64 one,
    # stamped no newer than the requirements so make does not rebuild it.
    guest = work / "pydeps-aarch64"
    shutil.copytree(pydeps, guest, symlinks=True)
    stamp = guest / ".stamp"
    stamp.touch()
    req = REPO / "packaging/plugin-requirements.txt"
    # Nanoseconds: a float mtime can land a few ns before the file's, and
    # make then rebuilds PYDEPS with the host's (x86_64) wheels.
    os.utime(stamp, ns=(req.stat().st_atime_ns, req.stat().st_mtime_ns))
    _run([*make, f"PYDEPS={guest}", f"DESTDIR={stage}", "PREFIX=/usr/local", "install"],
         timeout=900)
    return stage


def build_cases(work: Path, cache: object) -> Path:
    """The programs the scenarios run, as /cases."""
    cases = work / "cases"
    (cases / "bin").mkdir(parents=True)
    kw = {"cache": cache}
    compile_c(src("hello.c"), cases / "bin/hello-64k", arch="aarch64", page_size=65536, **kw)
    compile_c(src("hello.c"), cases / "bin/hello-4k", arch="aarch64", page_size=4096, **kw)
    compile_c(src("hello.c"), cases / "bin/tool-x86", arch="x86_64", **kw)
    venv = cases / "venv-x86"
    (venv / "bin").mkdir(parents=True)
    compile_c(src("hello.c"), venv / "bin/python3", arch="x86_64", **kw)
    (venv / "bin/python").symlink_to("python3")
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\nversion = 3.11.2\n")
    _python_venv(cases / "venv-py", cache)
    _login_envs(cases)
    for path in cases.rglob("*"):
        if not path.is_symlink():
            path.chmod(0o755)
    return cases


def _python_venv(venv: Path, cache: object) -> None:
    """A venv of the guest's /usr/bin/python3 (3.11) holding ``ext4k``, a
    package installed as pip lays it out (RECORD included) whose extension
    module is an aarch64 build linked for 4 KiB pages."""
    site = venv / "lib/python3.11/site-packages"
    (site / "ext4k").mkdir(parents=True)
    (venv / "bin").mkdir()
    (venv / "bin/python3").symlink_to("/usr/bin/python3.11")
    (venv / "bin/python").symlink_to("python3")
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\ninclude-system-site-packages = false\n"
                                     "version = 3.11.2\n")
    (site / "ext4k/__init__.py").write_text("from . import _core\n")
    compile_c("int PyInit__core(void) { return 0; }\n", site / "ext4k/_core.abi3.so",
              arch="aarch64", page_size=4096, shared=True, cache=cache)
    meta = site / "ext4k-1.0.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: ext4k\nVersion: 1.0\n")
    (meta / "RECORD").write_text("ext4k/__init__.py,,\next4k/_core.abi3.so,,\n"
                                 "ext4k-1.0.dist-info/METADATA,,\next4k-1.0.dist-info/RECORD,,\n")


#: The login node's distribution python, which makes the venvs of
#: :func:`_login_envs`: Debian 12's, the same CPython 3.11 as the guest's.
LOGIN_PYTHON = "/usr/bin/python3.11"


def _login_envs(cases: Path) -> None:
    """What a user makes on the x86_64 login node (issue 16): venvs of the
    distribution's python (``bin/python -> /usr/bin/python3.11``) filled
    with pinned PyPI wheels of both machines, a console script, a user base
    and a PYTHONPATH directory of x86_64 wheels."""
    from python.wheels import copy_site

    if not os.access(LOGIN_PYTHON, os.X_OK):
        raise CorpusUnavailable(f"{LOGIN_PYTHON} missing: the login-node venvs need it")
    site = "lib/python3.11/site-packages"
    for name, keys in (("venv-sys", ("bcrypt-4.1.2-abi3-x86_64", "markupsafe-2.1.5-aarch64")),
                       ("venv-arm", ("bcrypt-4.1.2-abi3-aarch64", "markupsafe-2.1.5-aarch64"))):
        subprocess.run([LOGIN_PYTHON, "-m", "venv", "--without-pip", str(cases / name)],
                       check=True, capture_output=True, timeout=120)
        for key in keys:
            copy_site(key, cases / name / site)
    tool = cases / "venv-sys/bin/hash-tool"
    tool.write_text("#!/cases/venv-sys/bin/python\nfrom bcrypt import gensalt\n"
                    "print('tool ran')\n")
    copy_site("bcrypt-4.1.2-abi3-x86_64", cases / "userbase-x86" / site)
    copy_site("bcrypt-4.1.2-abi3-x86_64", cases / "pp-x86")


@dataclass(frozen=True)
class StepResult:
    rc: int
    seconds: float
    stdout: str
    stderr: str


@dataclass(frozen=True)
class NodeRun:
    steps: dict[str, StepResult]
    audit: list[str]
    slurmd_log: str
    netdevs: tuple[str, ...]
    boot_seconds: float     # qemu start to slurm idle, guest clock
    total_seconds: float    # the whole qemu run, host clock
    console: str
    #: This host's copy of the guest's /cases.
    cases: Path | None = None


def _b64(text: str) -> str:
    return base64.b64decode(text.encode()).decode(errors="replace") if text else ""


def parse(console: str, total: float) -> NodeRun:
    steps: dict[str, StepResult] = {}
    audit: list[str] = []
    log = ""
    up = 0.0
    netdevs: tuple[str, ...] = ()
    for line in console.splitlines():
        parts = line.split("\t")
        if parts[0] == "STEP" and len(parts) == 7:
            steps[parts[1]] = StepResult(int(parts[2]), float(parts[4]) - float(parts[3]),
                                         _b64(parts[5]), _b64(parts[6]))
        elif parts[0] == "AUDIT" and len(parts) == 2:
            audit = [a for a in _b64(parts[1]).splitlines() if a.strip()]
        elif parts[0] == "SLURMDLOG" and len(parts) == 2:
            log = _b64(parts[1])
        elif line.startswith("NETDEVS "):
            netdevs = tuple(line.split()[1:])
        elif line.startswith("SLURM-UP "):
            up = float(line.split()[1])
    return NodeRun(steps, audit, log, netdevs, up, total, console)


def run_node(work: Path, cache: object, *, contact: str = TEST_CONTACT) -> NodeRun:
    """One boot of the guest running every scenario; ``contact`` is the
    config's ``contact`` (whom the plugin's messages tell users to ask)."""
    root = slurm_root()
    stage = build_plugin(work, root)
    cases = build_cases(work, cache)
    key = os.urandom(1024)
    initrd = work / "slurm-initrd.cpio"
    cpio_newc(initrd, [(root, ""), (stage, ""), (cases, "cases")], extra=[
        ("init", init_script().encode(), 0o755),
        ("etc/slurm/slurm.conf", SLURM_CONF.encode(), 0o644),
        ("etc/slurm/plugstack.conf", PLUGSTACK.encode(), 0o644),
        ("etc/slurm/cgroup.conf", CGROUP_CONF.encode(), 0o644),
        ("etc/slurm/grace-policy.toml",
         CONFIG.format(contact=json.dumps(contact)).encode(), 0o644),
        ("etc/munge/munge.key", key, 0o600),
    ])
    console, log, seconds = boot(images.kernel_64k(), initrd, work, timeout=BOOT_TIMEOUT,
                                 memory_mib=3072)
    (work / "console.txt").write_text(console)
    (work / "serial.txt").write_text(log)
    (work / "qemu-seconds.txt").write_text(f"{seconds}\n")
    return load_run(work)


def load_run(work: Path) -> NodeRun:
    """The run :func:`run_node` left in ``work`` (``make demo-node`` with
    ``GRACE_DEMO_NODE_DIR``: tests/conftest.py's ``demo_node`` reads the
    demo's own boot instead of booting the same scenarios again)."""
    console = (work / "console.txt").read_text()
    if "ALLDONE" not in console:
        log = (work / "serial.txt").read_text()
        raise AssertionError(f"the guest did not finish: {console[-1500:]!r}\n{log[-1500:]}")
    seconds = float((work / "qemu-seconds.txt").read_text())
    return replace(parse(console, seconds), cases=work / "cases")
