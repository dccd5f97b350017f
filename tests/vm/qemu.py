"""Boot an arm64 kernel under ``qemu-system-aarch64`` (TCG) and collect what
the guest wrote to its virtio console.

The guest is ``-M virt -cpu max,pauth-impdef=on`` (QEMU's default Cortex-A57
model has no 16/64 KiB translation granule; the imp-def pointer
authentication is much faster to emulate than QARMA), no network device, no
disk: everything it runs comes in the initramfs (:func:`cpio_newc`), its
results go out over ``/dev/hvc0`` into a file, and kernel messages over the
PL011 serial into another. Every boot is bounded by a timeout and the qemu
process is killed by its pid when it runs over.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path

from corpus import CorpusUnavailable

QEMU = "qemu-system-aarch64"


class BootError(RuntimeError):
    """The guest did not finish: the message carries the console tail."""


def qemu_binary() -> str | None:
    return shutil.which(QEMU)


def _newc_header(ino: int, mode: int, nlink: int, mtime: int, size: int,
                 rdev: tuple[int, int], name: bytes) -> bytes:
    fields = (ino, mode, 0, 0, nlink, mtime, size, 0, 0, rdev[0], rdev[1], len(name) + 1, 0)
    head = b"070701" + b"".join(b"%08x" % f for f in fields) + name + b"\0"
    return head + b"\0" * (-len(head) % 4)


def cpio_newc(out: Path, trees: Iterable[tuple[Path, str]], *,
              extra: Iterable[tuple[str, bytes, int]] = ()) -> None:
    """Write an uncompressed newc archive (what the kernel unpacks into its
    rootfs) of each ``(host_dir, prefix)`` tree plus ``extra`` files
    ``(path, data, mode)``. Symlinks are kept as links, hard links as copies;
    owners become root. Uncompressed: gunzip under TCG costs more than the
    copy it saves."""
    ino = 1
    seen_dirs: set[str] = set()
    with open(out, "wb") as fh:
        def entry(name: str, mode: int, data: bytes = b"") -> None:
            nonlocal ino
            fh.write(_newc_header(ino, mode, 2 if stat.S_ISDIR(mode) else 1, 0, len(data),
                                  (0, 0), name.encode("utf-8", "surrogateescape")))
            fh.write(data + b"\0" * (-len(data) % 4))
            ino += 1

        def parents(name: str) -> None:
            parts = name.split("/")[:-1]
            for i in range(1, len(parts) + 1):
                d = "/".join(parts[:i])
                if d and d not in seen_dirs:
                    seen_dirs.add(d)
                    entry(d, stat.S_IFDIR | 0o755)

        for top, prefix in trees:
            prefix = prefix.strip("/")
            for dirpath, dirnames, filenames in os.walk(top):
                dirnames.sort()
                rel = os.path.relpath(dirpath, top)
                base = prefix if rel == "." else "/".join(p for p in (prefix, rel) if p)
                if base:
                    parents(base + "/x")
                    if base not in seen_dirs:
                        seen_dirs.add(base)
                        entry(base, stat.S_IFDIR | (os.lstat(dirpath).st_mode & 0o7777))
                for name in sorted(filenames) + sorted(d for d in dirnames
                                                       if os.path.islink(os.path.join(dirpath, d))):
                    path = os.path.join(dirpath, name)
                    arc = f"{base}/{name}" if base else name
                    st = os.lstat(path)
                    if stat.S_ISLNK(st.st_mode):
                        entry(arc, stat.S_IFLNK | 0o777, os.fsencode(os.readlink(path)))
                    elif stat.S_ISREG(st.st_mode):
                        entry(arc, stat.S_IFREG | (st.st_mode & 0o7777),
                              Path(path).read_bytes())
        for name, data, mode in extra:
            name = name.strip("/")
            parents(name)
            entry(name, stat.S_IFREG | mode, data)
        fh.write(_newc_header(0, 0, 1, 0, 0, (0, 0), b"TRAILER!!!"))
        fh.write(b"\0" * (-fh.tell() % 512))


def boot(kernel: Path, initrd: Path, workdir: Path, *, timeout: float,
         memory_mib: int = 1024, cmdline: str = "") -> tuple[str, str, float]:
    """Boot ``kernel`` with ``initrd`` until the guest powers off.

    Returns ``(console, kernel_log, seconds)``: what the guest wrote to
    ``/dev/hvc0`` and to the serial port. Raises :class:`BootError` when qemu
    fails or runs past ``timeout`` (then it is killed by pid)."""
    qemu = qemu_binary()
    if qemu is None:
        raise CorpusUnavailable(f"{QEMU} not installed (apt-get install qemu-system-arm)")
    results, serial = workdir / "hvc0.txt", workdir / "serial.txt"
    for f in (results, serial):
        f.unlink(missing_ok=True)
    cmd = [
        qemu, "-M", "virt", "-cpu", "max,pauth-impdef=on", "-m", str(memory_mib),
        "-smp", "1", "-accel", "tcg", "-nographic", "-no-reboot", "-nodefaults",
        "-kernel", str(kernel), "-initrd", str(initrd),
        "-append", f"console=ttyAMA0 rdinit=/init panic=-1 loglevel=4 {cmdline}".strip(),
        "-serial", f"file:{serial}",
        "-chardev", f"file,id=results,path={results}",
        "-device", "virtio-serial-pci", "-device", "virtconsole,chardev=results",
        "-monitor", "none",
    ]
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()  # this pid only: the qemu we started
        proc.communicate()
        raise BootError(f"qemu ran past {timeout:.0f} s; serial tail:\n"
                        + _tail(serial)) from None
    seconds = time.monotonic() - start
    console = results.read_text(errors="replace") if results.exists() else ""
    log = serial.read_text(errors="replace") if serial.exists() else ""
    if proc.returncode != 0:
        raise BootError(f"qemu exited {proc.returncode}: {out.decode(errors='replace')[-500:]}"
                        f"\nserial tail:\n{_tail(serial)}")
    return console, log, seconds


def _tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no serial output)"
