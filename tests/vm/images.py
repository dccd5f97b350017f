"""What the VM boots, built from Debian's packages and cached: the setup as code.

* a 64 KiB-page arm64 kernel, built here from Debian 13's ``linux-source-6.12``
  (allnoconfig plus :data:`KERNEL_CONFIG`) with ``aarch64-linux-gnu-gcc``;
* Debian 13's prebuilt 16 KiB kernel (``linux-image-*-arm64-16k-unsigned``);
* two arm64 userlands from Debian's packages, one per side of glibc's 2.35
  change of the p_align check: Debian 11 (glibc 2.31) and Debian 12 (2.36),
  each libc6 + libgcc-s1 + a static busybox;
* a sysroot of Debian 11's libc6-dev, so programs built here run under both.

Every package is pinned by version and sha256 (:data:`PINS`) and downloaded
with apt-get (private state directories, the host's Debian mirror, the
host's archive keyring: apt checks the signed index, we check the pin).
Everything lands under ``~/.cache/grace-policy-tests/vm`` through
:func:`corpus._cached_tree` (a lock, then a stamp of what was built), so a
rerun is offline and a concurrent session waits instead of racing.

A pinned version that the archive dropped fails with the package name: bump
the pin (``apt-cache policy`` with the same options shows the new one).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from corpus import NET_TIMEOUT, CorpusUnavailable, _cached_tree, _run, cache_root, sha256_file

#: suite -> ((package, version, sha256), ...)
PINS: dict[str, tuple[tuple[str, str, str], ...]] = {
    "trixie": (
        ("linux-source-6.12", "6.12.117-1",
         "9141325315c7f1eca682113d185a8c77c82814aa6e32f7e127e61d6106403835"),
        ("linux-image-6.12.117+deb13-arm64-16k-unsigned", "6.12.117-1",
         "3126c5f52761d25cf6e34bf89a79780f55a86f9e37613dd39ff21a8cf73926d6"),
    ),
    "bullseye": (
        ("libc6", "2.31-13+deb11u11",
         "baaa9aa184e2f21738c5819055e6740cc5b22f198e3f416e33f82b40ff6933d8"),
        ("libc6-dev", "2.31-13+deb11u11",
         "28d478134722dcd4b0bd2045a199301d18713bf95947b9fce66634e7aeacab2e"),
        ("linux-libc-dev", "5.10.223-1",
         "8b6374a64412d33eac61d74f77b8f932da4b8a707ea8a614791e2a35b8917618"),
        ("libgcc-s1", "10.2.1-6",
         "e2fcdb378d3c1ad1bcb64d4fb6b37aab44011152beca12a4944f435a2582df1f"),
        ("busybox-static", "1:1.30.1-6+b3",
         "2b27ce9bb8e88f5e30a884397b193420f633dcba1c263e820a0e8f8865bd576c"),
    ),
    "bookworm": (
        ("libc6", "2.36-9+deb12u14",
         "01f4330719fd4f65580e16ea5a0527f372fca750e8f588d26deaf09f2d3b1cf4"),
        ("libgcc-s1", "12.2.0-14+deb12u1",
         "576926b283613db80168ddf76380a3bd877602778cf0d226caa7bfbfa71eacf3"),
        ("busybox-static", "1:1.35.0-4+deb12u1+b1",
         "732c9135564fc71337e0e05fb4da4d11e6c28c1834bce3e405e575afef2a52f5"),
    ),
}

#: The userlands: name -> (suite, glibc version, packages in the root).
USERLANDS: dict[str, tuple[str, tuple[int, int], tuple[str, ...]]] = {
    "glibc231": ("bullseye", (2, 31), ("libc6", "libgcc-s1", "busybox-static")),
    "glibc236": ("bookworm", (2, 36), ("libc6", "libgcc-s1", "busybox-static")),
}

#: What allnoconfig lacks for a 64 KiB guest under ``qemu -M virt``: the page
#: size, PCI virtio (console; the same transport Debian's 16 KiB kernel has
#: built in), the PL011 serial for kernel messages, an initramfs, ELF and #!,
#: the filesystems and syscalls glibc, busybox and Slurm's daemons use,
#: loopback networking for the in-VM Slurm, and for the two-architecture
#: cluster (issue 17) a virtio NIC and a 9p home over virtio; seccomp filters,
#: so that the plugin's filter runs on a real aarch64 kernel (issue 27). One config for
#: every guest: with no ``-netdev``/``-fsdev`` given, the page oracle's guest
#: still sees only ``lo`` and nothing mounted.
KERNEL_CONFIG = """\
CONFIG_ARM64_64K_PAGES=y
CONFIG_PRINTK=y
CONFIG_TTY=y
CONFIG_SERIAL_AMBA_PL011=y
CONFIG_SERIAL_AMBA_PL011_CONSOLE=y
CONFIG_PCI=y
CONFIG_PCI_HOST_GENERIC=y
CONFIG_VIRTIO_MENU=y
CONFIG_VIRTIO=y
CONFIG_VIRTIO_PCI=y
CONFIG_VIRTIO_MMIO=y
CONFIG_VIRTIO_CONSOLE=y
CONFIG_HVC_DRIVER=y
CONFIG_BLK_DEV_INITRD=y
CONFIG_RD_GZIP=y
CONFIG_BINFMT_ELF=y
CONFIG_BINFMT_SCRIPT=y
CONFIG_PROC_FS=y
CONFIG_PROC_SYSCTL=y
CONFIG_SYSFS=y
CONFIG_DEVTMPFS=y
CONFIG_DEVTMPFS_MOUNT=y
CONFIG_TMPFS=y
CONFIG_SHMEM=y
CONFIG_MULTIUSER=y
CONFIG_FUTEX=y
CONFIG_EPOLL=y
CONFIG_SIGNALFD=y
CONFIG_TIMERFD=y
CONFIG_EVENTFD=y
CONFIG_AIO=y
CONFIG_POSIX_TIMERS=y
CONFIG_FILE_LOCKING=y
CONFIG_INOTIFY_USER=y
CONFIG_FHANDLE=y
CONFIG_SYSVIPC=y
CONFIG_UNIX98_PTYS=y
CONFIG_NET=y
CONFIG_INET=y
CONFIG_UNIX=y
CONFIG_CGROUPS=y
CONFIG_PACKET=y
CONFIG_NETDEVICES=y
CONFIG_NET_CORE=y
CONFIG_VIRTIO_NET=y
CONFIG_NET_9P=y
CONFIG_NET_9P_VIRTIO=y
CONFIG_NETWORK_FILESYSTEMS=y
CONFIG_9P_FS=y
CONFIG_SECCOMP=y
CONFIG_SECCOMP_FILTER=y
"""

KERNEL_BUILD_TIMEOUT = 3600
CROSS = "aarch64-linux-gnu-"


def vm_cache() -> Path:
    return cache_root() / "vm"


def _mirror() -> str:
    """The Debian mirror this host's apt already uses (never a name of ours)."""
    for path in ("/etc/apt/sources.list.d/debian.sources", "/etc/apt/sources.list"):
        try:
            text = Path(path).read_text()
        except OSError:
            continue
        for line in text.splitlines():
            words = line.split()
            if words[:1] == ["URIs:"] and len(words) > 1:
                return words[1]
            if words[:1] == ["deb"]:
                uri = next((w for w in words[1:] if not w.startswith("[")
                            and not w.endswith("]")), None)
                if uri and "security" not in uri:
                    return uri
    raise CorpusUnavailable("no Debian mirror in /etc/apt/sources.list*: cannot fetch debs")


def _apt(state: Path, suite: str) -> list[str]:
    sources = state / "sources.list"
    if not sources.exists():
        for d in ("lists/partial", "cache/archives/partial"):
            (state / d).mkdir(parents=True, exist_ok=True)
        sources.write_text(f"deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] "
                           f"{_mirror()} {suite} main\n")
    return [
        "apt-get", "-q",
        "-oAPT::Architecture=arm64", "-oAPT::Architectures=arm64",
        f"-oDir::State::Lists={state / 'lists'}", f"-oDir::Cache={state / 'cache'}",
        "-oDir::State::status=/dev/null",
        f"-oDir::Etc::SourceList={sources}", "-oDir::Etc::SourceParts=/nonexistent",
        "-oAcquire::Retries=1", f"-oAcquire::http::Timeout={NET_TIMEOUT}",
        "-oAPT::Sandbox::User=root",
    ]



def fetch_pinned_debs(state: Path, suite: str, pins: tuple[tuple[str, str, str], ...],
                      debs: Path) -> list[Path]:
    """Download ``pins`` ((package, version, sha256)) of ``suite`` arm64 into
    ``debs`` with a private apt state in ``state``, each checked against its
    sha256; one more try for any the mirror dropped on the way."""
    apt = _apt(state, suite)
    _run([*apt, "update"])
    debs.mkdir(parents=True, exist_ok=True)
    out = []
    for attempt in (1, 2):
        want = [p for p in pins if not list(debs.glob(f"{p[0]}_*.deb"))]
        if want:
            try:
                _run([*apt, "download", *(f"{name}={version}" for name, version, _ in want)],
                     cwd=debs, timeout=900)
            except CorpusUnavailable:
                if attempt == 2:
                    raise
    for name, version, digest in pins:
        found = list(debs.glob(f"{name}_*.deb"))
        if len(found) != 1:
            raise CorpusUnavailable(f"{suite}: {name}={version} not downloaded "
                                    "(dropped from the archive? bump the pins)")
        got = sha256_file(found[0])
        if got != digest:
            raise CorpusUnavailable(f"{suite}: {found[0].name} has sha256 {got}, "
                                    f"pinned {digest}")
        out.append(found[0])
    return out


def fetch_debs(suite: str) -> Path:
    """The pinned .deb files of ``suite``, verified; returns their directory."""
    pins = PINS[suite]

    def build(work: Path) -> Path:
        fetch_pinned_debs(work / "apt", suite, pins, work / "debs")
        return work / "debs"

    return _cached_tree(f"vm/debs-{suite}", {"pins": [list(p) for p in pins]}, build)


def deb_file(suite: str, package: str) -> Path:
    found = sorted(fetch_debs(suite).glob(f"{package}_*.deb"))
    if len(found) != 1:
        raise CorpusUnavailable(f"{suite}: no single {package} deb in the cache")
    return found[0]


def _unpack(debs: list[Path], dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for deb in debs:
        _run(["dpkg-deb", "-x", str(deb), str(dest)])


def userland(name: str) -> Path:
    """An unpacked arm64 root (libc, libgcc_s, busybox and its applet links)."""
    suite, _glibc, packages = USERLANDS[name]

    def build(work: Path) -> Path:
        root = work / "root"
        _unpack([deb_file(suite, p) for p in packages], root)
        # busybox-static ships /bin/busybox only; the init script calls it by
        # name, and the cases run with PATH=/usr/bin:/bin.
        for d in ("proc", "sys", "dev", "tmp", "cases"):
            (root / d).mkdir(exist_ok=True)
        return root

    pins = [p for p in PINS[suite] if p[0] in packages]
    return _cached_tree(f"vm/userland-{name}", {"pins": [list(p) for p in pins]}, build)


def sysroot_231() -> Path:
    """Debian 11's libc6 + libc6-dev + linux-libc-dev, for linking programs
    that run on glibc 2.31 and later (see :func:`sysroot_flags`)."""
    pkgs = ("libc6", "libc6-dev", "linux-libc-dev", "libgcc-s1")

    def build(work: Path) -> Path:
        root = work / "root"
        _unpack([deb_file("bullseye", p) for p in pkgs], root)
        # libdl.so -> /lib/aarch64-linux-gnu/libdl.so.2 and the like point out
        # of the sysroot; ld would then settle for the static archive.
        for link in root.rglob("*"):
            target = os.readlink(link) if link.is_symlink() else ""
            if target.startswith("/"):
                link.unlink()
                link.symlink_to(os.path.relpath(root / target.lstrip("/"), link.parent))
        return root

    pins = [p for p in PINS["bullseye"] if p[0] in pkgs]
    return _cached_tree("vm/sysroot-glibc231", {"pins": [list(p) for p in pins],
                                                "links": "relative"}, build)


def sysroot_flags(sysroot: Path) -> tuple[str, ...]:
    """gcc flags that make Debian's cross gcc use ``sysroot``'s glibc: its
    own ``/usr/aarch64-linux-gnu`` (glibc 2.36) comes first in the default
    search lists, so the start files, libraries and headers are named first."""
    lib = sysroot / "usr/lib/aarch64-linux-gnu"
    return (f"--sysroot={sysroot}", f"-B{lib}/", f"-L{lib}",
            f"-L{sysroot / 'lib/aarch64-linux-gnu'}",
            "-isystem", str(sysroot / "usr/include/aarch64-linux-gnu"),
            "-isystem", str(sysroot / "usr/include"))


def kernel_16k() -> Path:
    """Debian 13's prebuilt 16 KiB-page kernel image (gzip'd arm64 Image,
    which qemu's ``-kernel`` unpacks)."""

    def build(work: Path) -> Path:
        unpack = work / "unpack"
        _unpack([deb_file("trixie", PINS["trixie"][1][0])], unpack)
        images = sorted((unpack / "boot").glob("vmlinuz-*"))
        if len(images) != 1:
            raise CorpusUnavailable(f"16k kernel package has {len(images)} vmlinuz files")
        root = work / "root"
        root.mkdir()
        shutil.copy2(images[0], root / "Image")
        configs = sorted((unpack / "boot").glob("config-*"))
        if configs:
            shutil.copy2(configs[0], root / "config")
        return root

    return _cached_tree("vm/kernel-16k", {"pin": list(PINS["trixie"][1])}, build) / "Image"


def kernel_64k() -> Path:
    """A 64 KiB-page kernel built from Debian's source package (cold: a few
    minutes on 2 cores; then cached until the pin or the config changes)."""

    def build(work: Path) -> Path:
        if shutil.which(CROSS + "gcc") is None:
            raise CorpusUnavailable("aarch64-linux-gnu-gcc not installed")
        for tool in ("flex", "bison", "bc"):
            if shutil.which(tool) is None:
                raise CorpusUnavailable(f"{tool} not installed (make deps)")
        unpack = work / "unpack"
        _unpack([deb_file("trixie", PINS["trixie"][0][0])], unpack)
        tarballs = sorted((unpack / "usr/src").glob("linux-source-*.tar.xz"))
        if len(tarballs) != 1:
            raise CorpusUnavailable("linux-source package holds no single tarball")
        (work / "src").mkdir()
        _run(["tar", "-xf", str(tarballs[0]), "-C", str(work / "src")], timeout=900)
        src = next((work / "src").iterdir())
        tarballs[0].unlink()
        frag = work / "fragment.config"
        frag.write_text(KERNEL_CONFIG)
        out = work / "out"
        make = ["make", "-s", "ARCH=arm64", f"CROSS_COMPILE={CROSS}", f"O={out}"]
        _run([*make, f"KCONFIG_ALLCONFIG={frag}", "allnoconfig"], cwd=src)
        config = (out / ".config").read_text().splitlines()
        for line in KERNEL_CONFIG.splitlines():
            if line not in config:
                raise CorpusUnavailable(f"kernel config lost {line} (a dependency unmet)")
        jobs = str(max(1, (os.cpu_count() or 1) + 1))
        _run([*make, f"-j{jobs}", "Image"], cwd=src, timeout=KERNEL_BUILD_TIMEOUT)
        root = work / "root"
        root.mkdir()
        shutil.copy2(out / "arch/arm64/boot/Image", root / "Image")
        shutil.copy2(out / ".config", root / "config")
        return root

    want = {"pin": list(PINS["trixie"][0]), "config": KERNEL_CONFIG,
            "cc": subprocess.run([CROSS + "gcc", "-dumpfullversion"], capture_output=True,
                                 text=True, check=False).stdout.strip()
            if shutil.which(CROSS + "gcc") else "missing"}
    # A name of its own since the network/9p options, and again since seccomp
    # (the plugin's system call filter, grace_policy/checker/confine.py, on
    # a real aarch64 kernel): a tree built from an older config (other
    # checkouts) is not rebuilt back and forth with this.
    return _cached_tree("vm/kernel-64k-seccomp", want, build) / "Image"
