"""Debian roots holding other Slurm releases, for the release matrix (issue 9).

Slurm 22.05 is the host's (Debian 12). 24.11 (Debian 13) and 26.05 (Debian
sid) come from Debian's own packages: ``mmdebstrap`` makes a root of that
suite with slurmd, slurmctld, munge, the compilers and python3, once, cached
under ``~/.cache/grace-policy-tests/slurm-root-<suite>`` with the same lock
and stamp as the test corpora (``tests/corpus.py``). A Debian 12 root is made
the same way for the package test of the host's release, so installing a
.deb never touches the machine itself.

Each use mounts an overlay on the cached root (the cache stays pristine: what
a run builds, installs or purges lands in a throwaway upper directory, which
is also how the purge test sees what was left behind), plus ``/proc`` and
recursive, slave-propagation binds of ``/sys`` (slurmd wants the host's cgroup
mounts, field notes §6) and ``/dev``. :meth:`Root.close` kills every process
whose root is the overlay (by pid, from ``/proc/PID/root`` or, for a root
entered by ``pivot_root``, the overlay's marker file seen through it: daemons
a crashed test left behind included), unmounts everything under it, deepest
first, and deletes the upper directory only when no mount is left. Commands
enter with ``chroot``; ``Root.run(pivot=True)`` enters by ``pivot_root`` in a
mount namespace of its own, which container runtimes need (enroot, pyxis).

``GRACE_SLURM_RELEASES`` (comma-separated, default ``host,24.11,26.05``) says
which releases the matrix runs; ``host`` alone is the quick local run (the
host's scenarios, plus its package tests in a Debian 12 root); ``none`` makes
no root at all.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

TESTS_DIR = Path(__file__).resolve().parent.parent
if str(TESTS_DIR) not in sys.path:
    sys.path.insert(0, str(TESTS_DIR))

from corpus import CorpusUnavailable, _cached_tree  # noqa: E402

REPO = TESTS_DIR.parent
MIRROR = "http://deb.debian.org/debian"
#: What a root holds: Slurm and munge, what the plugin build and the test
#: programs need (gcc, the aarch64 cross compiler, python3-dev, pip), pytest to
#: run tests/slurm inside, and Debian's packaging tools for ``make deb``.
PACKAGES: tuple[str, ...] = (
    "slurmd", "slurmctld", "slurm-client", "libslurm-dev", "munge",
    "gcc", "make", "binutils", "build-essential", "gcc-aarch64-linux-gnu",
    "libc6-dev-arm64-cross",
    "python3-dev", "python3-venv", "python3-pip", "python3-pytest",
    "ca-certificates", "procps", "mount", "debhelper", "dpkg-dev",
)
#: Bumped when a root must be rebuilt for a reason the package list does not show.
ROOT_LAYOUT = 1


@dataclass(frozen=True)
class Release:
    """A Slurm release the matrix covers and the Debian suite that ships it."""

    slurm: str   # major.minor, as plugin_version and the package pin see it
    suite: str
    debian: str

    @property
    def cache_name(self) -> str:
        return f"slurm-root-{self.suite}"


HOST = "host"
RELEASES: dict[str, Release] = {
    "22.05": Release("22.05", "bookworm", "Debian 12"),
    "24.11": Release("24.11", "trixie", "Debian 13"),
    "26.05": Release("26.05", "sid", "Debian sid"),
}
DEFAULT_SELECTION = "host,24.11,26.05"


def selected() -> list[str]:
    """The releases ``GRACE_SLURM_RELEASES`` asks for (``host`` = 22.05 on the
    machine itself). Unknown names are an error, not a silent narrower run."""
    raw = os.environ.get("GRACE_SLURM_RELEASES", DEFAULT_SELECTION)
    if raw.strip() == "none":  # no release root at all (the host's scenarios still run)
        return []
    names = [n.strip() for n in raw.split(",") if n.strip()]
    unknown = [n for n in names if n != HOST and n not in RELEASES]
    if unknown:
        raise ValueError(f"GRACE_SLURM_RELEASES: unknown release(s) {unknown}; "
                         f"known: {HOST}, {', '.join(RELEASES)}")
    return names


def _run(cmd: Sequence[str], timeout: float = 900) -> subprocess.CompletedProcess[str]:
    try:
        done = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout,
                              check=False)
    except FileNotFoundError as exc:
        raise CorpusUnavailable(f"{cmd[0]} not installed (bash packaging/install-deps.sh)") \
            from exc
    except subprocess.TimeoutExpired as exc:
        raise CorpusUnavailable(f"{' '.join(cmd[:3])}... timed out") from exc
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
        raise CorpusUnavailable(f"{' '.join(cmd[:2])}... failed: {' | '.join(tail)}")
    return done


def cached_root(release: Release) -> Path:
    """The release's root, made once with mmdebstrap (about 1.5 min and 800 MB)."""

    def build(work: Path) -> Path:
        target = work / "root"
        _run(["mmdebstrap", "--mode=root", "--variant=apt", "--quiet",
              f"--include={','.join(PACKAGES)}",
              # sid's Release file on the mirror may be past its Valid-Until
              # (field notes §6); kept in the root's apt config for later apt runs.
              '--aptopt=Acquire::Check-Valid-Until "false"',
              release.suite, str(target), MIRROR])
        return target

    want = {"suite": release.suite, "packages": list(PACKAGES), "mirror": MIRROR,
            "layout": ROOT_LAYOUT}
    return _cached_tree(release.cache_name, want, build)


def _test_cache() -> Path:
    """tests/corpus.py's cache_root(), without importing the test package."""
    env = os.environ.get("GRACE_TEST_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "grace-policy-tests"


def _mounts_under(path: Path) -> list[str]:
    """Mount points at or below ``path``, deepest first (from mountinfo)."""
    prefix = str(path)
    found = []
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            point = line.split()[4].replace("\\040", " ")
            if point == prefix or point.startswith(prefix + "/"):
                found.append(point)
    return sorted(set(found), key=lambda p: p.count("/"), reverse=True)


#: NS_GET_MNTNS_ID (linux/nsfs.h; Linux 6.9+): a mount namespace's id.
_NS_GET_MNTNS_ID = 0x8008B705
#: Printed (stderr) when a new namespace's id is not below what every CPU
#: hands out next: Root.run makes another.
_MNTNS_RETRY = "grace-roots: mount namespace id not the lowest, made again"
#: Run by the host's python3 (``sys.executable -c``). ``probe CPU...``: the id
#: a mount namespace made now on each CPU gets (a child pinned there
#: unshares and reports it), one per line. ``below CPU...``: in the
#: namespace Root.run(pivot=True) just made: exit 75 unless its own id is
#: below every CPU's, then give the parent shell all CPUs back. A kernel
#: without the ioctl prints nothing and exits 0 (ids did not come in
#: per-CPU batches before it, see :meth:`Root.run`).
_MNTNS_PROBE = f"""
import ctypes, fcntl, os, struct, sys
def ns_id(path="/proc/self/ns/mnt"):
    fd = os.open(path, os.O_RDONLY)
    try:
        return struct.unpack("Q", fcntl.ioctl(fd, {_NS_GET_MNTNS_ID}, bytes(8)))[0]
    finally:
        os.close(fd)
def made_on(cpu):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.sched_setaffinity(0, {{cpu}})
            if ctypes.CDLL(None, use_errno=True).unshare(0x00020000) == 0:
                os.write(w, str(ns_id()).encode())
        finally:
            os._exit(0)
    os.close(w)
    data = os.read(r, 64)
    os.close(r)
    os.waitpid(pid, 0)
    return int(data) if data else None
try:
    own = ns_id()
except OSError:
    sys.exit(0)
cpus = [int(c) for c in sys.argv[2:]]
ids = [made_on(c) for c in cpus]
if sys.argv[1] == "probe":
    print(*(f"{{c}} {{i}}" for c, i in zip(cpus, ids) if i is not None), sep="\\n")
    sys.exit(0)
if any(i is not None and i <= own for i in ids):
    print({_MNTNS_RETRY!r}, own, ids, file=sys.stderr)
    sys.exit(75)
try:
    os.sched_setaffinity(os.getppid(), cpus)
except OSError:
    pass  # the run keeps the one CPU: slower, never wrong
"""


def mntns_next_ids(cpus: Sequence[int]) -> dict[int, int]:
    """CPU -> the id a mount namespace made there now gets; empty if the
    kernel does not say (no NS_GET_MNTNS_ID)."""
    done = subprocess.run([sys.executable, "-c", _MNTNS_PROBE, "probe", *map(str, cpus)],
                          capture_output=True, text=True, timeout=60, check=False)
    pairs = (line.split() for line in done.stdout.splitlines())
    return {int(cpu): int(ns) for cpu, ns in pairs}


#: A file at the top of every overlay: a process whose root holds this very
#: file (same device and inode) is inside, also when it entered by
#: pivot_root in a mount namespace of its own, where ``/proc/PID/root``
#: reads as ``/`` from the host.
MARKER = ".grace-test-root"


def pids_inside(path: Path) -> list[int]:
    """Processes whose root directory is ``path``: chroot'ed into it, or
    pivot_root'ed into it in their own mount namespace (:meth:`Root.run`)."""
    want = str(path)
    try:
        mark = os.stat(path / MARKER)
        key: tuple[int, int] | None = (mark.st_dev, mark.st_ino)
    except OSError:
        key = None
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            if os.readlink(f"/proc/{entry}/root") == want:
                found.append(int(entry))
                continue
            if key is not None:
                st = os.stat(f"/proc/{entry}/root/{MARKER}")
                if (st.st_dev, st.st_ino) == key:
                    found.append(int(entry))
        except OSError:
            continue
    return found


@dataclass
class Root:
    """An overlay on a cached release root, with /proc, /sys and /dev."""

    release: Release
    lower: Path
    base: Path

    @property
    def path(self) -> Path:
        return self.base / "merged"

    @property
    def upper(self) -> Path:
        return self.base / "upper"

    def open(self) -> None:
        for sub in ("upper", "work", "merged"):
            (self.base / sub).mkdir(parents=True, exist_ok=True)
        try:
            self._mount("-t", "overlay", "overlay", "-o",
                        f"lowerdir={self.lower},upperdir={self.upper},"
                        f"workdir={self.base / 'work'}", str(self.path))
            (self.path / MARKER).write_text(f"{self.base}\n")
            self._mount("-t", "proc", "proc", str(self.path / "proc"))
            for sub in ("sys", "dev"):
                self._mount("--rbind", f"/{sub}", str(self.path / sub))
                # Unmounting our copy must never reach the host's mounts.
                self._mount("--make-rslave", str(self.path / sub))
            # The tests' download cache at the same path: what the host
            # fetched once (a wheel that lies only on this disk, a Debian
            # package of the host's release) is there for the inner run too,
            # which must skip nothing.
            cache = _test_cache()
            cache.mkdir(parents=True, exist_ok=True)
            inside = self.path / str(cache).lstrip("/")
            inside.mkdir(parents=True, exist_ok=True)
            self._mount("--bind", str(cache), str(inside))
            # What the root needs from the host to reach PyPI and Debian:
            # the resolver and the CA bundle (pip in a fresh root fails with
            # CERTIFICATE_VERIFY_FAILED otherwise, field notes §6).
            for src, dest in (("/etc/resolv.conf", "etc/resolv.conf"),
                              ("/etc/ssl/certs/ca-certificates.crt", "etc/grace-test-ca.crt")):
                target = self.path / dest
                if target.is_symlink() or target.exists():
                    target.unlink()
                shutil.copyfile(src, target)
        except BaseException:
            self.close()
            raise

    def _mount(self, *args: str) -> None:
        done = subprocess.run(["mount", *args], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"mount {' '.join(args)}: {done.stderr.strip()}")

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """A clean environment for commands in the root (nothing of the host's
        Python or pip settings leaks in; CI is passed on so skips stay failures)."""
        env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
               "HOME": "/root", "LANG": "C.UTF-8", "PIP_CERT": "/etc/grace-test-ca.crt",
               "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_DEFAULT_TIMEOUT": "120",
               "DEBIAN_FRONTEND": "noninteractive"}
        for key in ("CI", "GRACE_TEST_CACHE"):
            if key in os.environ:
                env[key] = os.environ[key]
        if extra:
            env.update(extra)
        return env

    def run(self, script: str, *, timeout: float = 900, cwd: str = "/",
            env: Mapping[str, str] | None = None, pivot: bool = False,
            cpus: Sequence[int] | None = None) -> subprocess.CompletedProcess[str]:
        """``sh -ec script`` inside the root. On a timeout the whole session
        and everything else inside the root is killed, by pid.

        ``pivot``: enter by ``pivot_root`` in a mount namespace of its own
        instead of ``chroot``. In a chroot the kernel refuses a user
        namespace (enroot's unprivileged start) and ``setns`` into a
        container's mount namespace resets the root to the namespace's, the
        machine's real ``/`` (a task pyxis moves into its container sees the
        host's files). After pivot_root the overlay is the namespace's root.
        Mounts made inside stay in that namespace and end with its last
        process (close() still kills those, found by :data:`MARKER`).

        That namespace's id is made lower than any made later (see
        :meth:`_pivot_argv`): job_container/tmpfs binds a job's new
        namespace to a file, which the kernel refuses (EINVAL) for a
        namespace whose id is not above the binder's own. ``cpus``: where
        what runs inside may run (default: where this process may)."""
        if not pivot:
            return self._run(["chroot", str(self.path), "/bin/sh", "-ec", f"cd {cwd}\n{script}"],
                             timeout, env)
        (self.path / ".oldroot").mkdir(exist_ok=True)
        allowed = sorted(cpus if cpus is not None else os.sched_getaffinity(0))
        done = self._run(self._pivot_argv(script, cwd, allowed), timeout, env)
        for _ in range(4):
            if done.returncode != 75 or _MNTNS_RETRY not in done.stderr.partition("\n")[0]:
                break
            done = self._run(self._pivot_argv(script, cwd, allowed), timeout, env)
        return done

    def _pivot_argv(self, script: str, cwd: str, cpus: Sequence[int]) -> list[str]:
        """unshare + pivot_root + chroot, with the new mount namespace's id
        below any a later namespace gets.

        Why: mount(2) refuses to bind a mount namespace's file (what
        job_container/tmpfs does with every job's namespace, BasePath/NODE/
        JOB/.ns, and tests with their own holders) unless that namespace's
        id is above the caller's (fs/namespace.c, mnt_ns_loop: a bind that
        could make a loop). Ids used to be one global sequence, so a newer
        namespace always qualified; on this machine's kernel (6.18) they
        come in per-CPU batches (seen: a namespace made on CPU 1 after one
        made on CPU 0 got a lower id). slurmd in a namespace made here then
        failed the job namespace of any job whose extern step ran on the
        other CPU ("_create_ns: ns base mount failed: Invalid argument"; the
        job requeued and pending). The host's initial namespace, where the
        chroot runs and the host's own tests live, has the lowest id of all.
        So: make it on the CPU that hands out the lowest id now (every CPU's
        later ids are above what it hands out now), check that it is lower
        than what each CPU hands out next (exit 75, made again, if another
        process took the batch in between), then give it ``cpus``. (On one
        CPU all ids are in order: nothing to choose.)"""
        inner = shlex.join(["/bin/sh", "-ec", f"umount -l /.oldroot\ncd {cwd}\n{script}"])
        ids = mntns_next_ids(cpus) if len(cpus) > 1 else {}
        pin: list[str] = []
        check = ""
        if ids:
            pin = ["taskset", "-c", str(min(ids, key=ids.__getitem__))]
            check = shlex.join([sys.executable, "-c", _MNTNS_PROBE, "below",
                                *map(str, cpus)]) + "\n"
        return [*pin, "unshare", "--mount", "--propagation", "private", "/bin/sh", "-ec",
                f"{check}cd {shlex.quote(str(self.path))}\npivot_root . .oldroot\n"
                f"exec /usr/sbin/chroot . {inner}"]

    def _run(self, argv: list[str], timeout: float,
             env: Mapping[str, str] | None) -> subprocess.CompletedProcess[str]:
        proc = subprocess.Popen(
            argv,
            env=self.env(env), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            self.kill_inside()
            out, err = proc.communicate()
            err += f"\n[killed after {timeout}s]"
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    def copy_source(self, dest: str = "/src/grace-policy") -> str:
        """The repository's sources (no build/, no .git) at ``dest`` in the root:
        the plugin is built there against the root's Slurm and python3."""
        target = self.path / dest.lstrip("/")
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(REPO, target, symlinks=True, ignore=shutil.ignore_patterns(
            ".git", "build", "__pycache__", ".pytest_cache", ".coverage", "*.pyc",
            ".ruff_cache", ".hypothesis"))
        return dest

    def kill_inside(self) -> None:
        """SIGKILL every process chroot'ed into the root, until none is left."""
        for _ in range(50):
            pids = pids_inside(self.path)
            if not pids:
                return
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.1)

    def close(self) -> None:
        """Kill what runs inside, unmount everything under the root, and delete
        the upper layer only if nothing is mounted there any more."""
        if self.path.exists():
            self.kill_inside()
        for _ in range(3):
            points = _mounts_under(self.path)
            if not points:
                break
            for point in points:
                if subprocess.run(["umount", point], capture_output=True,
                                  check=False).returncode != 0:
                    subprocess.run(["umount", "-l", point], capture_output=True, check=False)
        left = _mounts_under(self.path)
        if left:
            raise RuntimeError(f"still mounted, {self.base} kept: {left}")
        shutil.rmtree(self.base, ignore_errors=True)


def open_root(release: Release, tmp: Path | None = None) -> Root:
    """A fresh overlay on ``release``'s cached root (built if needed)."""
    lower = cached_root(release)
    base = Path(tempfile.mkdtemp(prefix=f"grace-root-{release.suite}-", dir=tmp))
    base.chmod(0o755)
    root = Root(release=release, lower=lower, base=base)
    root.open()
    return root


def main(argv: Sequence[str]) -> int:
    """``python3 -m tests.slurm.roots build [RELEASE...]``: make the cached
    roots ahead of a test run (e.g. in a CI image); ``shell RELEASE``: an
    interactive shell in a throwaway overlay of one."""
    if argv and argv[0] == "build":
        for name in argv[1:] or list(RELEASES):
            print(name, cached_root(RELEASES[name]), flush=True)
        return 0
    if len(argv) == 2 and argv[0] == "shell":
        root = open_root(RELEASES[argv[1]])
        try:
            subprocess.run(["chroot", str(root.path), "/bin/bash", "-l"], env=root.env(),
                           check=False)
        finally:
            root.close()
        return 0
    print("usage: python3 -m tests.slurm.roots build [RELEASE...] | shell RELEASE",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
