"""Image roots the tests make: real compiled programs, the real glibc of the
architecture (this host's, or Debian's aarch64 cross glibc), and the links a
distribution's root has (``/bin -> usr/bin``, an absolute
``/lib64/ld-linux-x86-64.so.2``), plus hostile ones (a loop, links that try
to leave the root).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import squash
from fixtures.build import AARCH64_SYSROOT, compile_c, src

TRIPLET = {"x86_64": "x86_64-linux-gnu", "aarch64": "aarch64-linux-gnu"}
LOADER = {"x86_64": "ld-linux-x86-64.so.2", "aarch64": "ld-linux-aarch64.so.1"}
HOST_LIBS = {"x86_64": "/lib/x86_64-linux-gnu", "aarch64": f"{AARCH64_SYSROOT}/lib"}


def make_root(root: Path, arch: str, *, cache=None) -> Path:
    """A minimal root of ``arch`` under ``root``; returns ``root``."""
    trip = TRIPLET[arch]
    libdir = root / "lib" / trip
    libdir.mkdir(parents=True)
    for name in ("libc.so.6", LOADER[arch]):
        shutil.copy2(os.path.realpath(f"{HOST_LIBS[arch]}/{name}"), libdir / name)
    (root / "usr" / "bin").mkdir(parents=True)
    (root / "bin").symlink_to("usr/bin")  # relative, as merged-/usr roots have it
    if arch == "x86_64":
        (root / "lib64").mkdir()
        # Absolute, as Debian ships it: must resolve inside the image.
        (root / "lib64" / LOADER[arch]).symlink_to(f"/lib/{trip}/{LOADER[arch]}")
    else:
        (root / "lib" / LOADER[arch]).symlink_to(f"{trip}/{LOADER[arch]}")
    compile_c(src("hello.c"), root / "usr/bin/hello", arch=arch, cache=cache)  # type: ignore[arg-type]
    shutil.copy2(root / "usr/bin/hello", root / "usr/bin/sh")
    page = 65536 if arch == "aarch64" else None
    compile_c(src("hello.c"), root / "opt/app/tool", arch=arch, page_size=page, cache=cache)  # type: ignore[arg-type]
    if arch == "aarch64":
        compile_c(src("hello.c"), root / "opt/app/tool4k", arch=arch, page_size=4096,
                  cache=cache)  # type: ignore[arg-type]
    (root / "etc").mkdir()
    (root / "etc/environment").write_text(
        'PATH="/opt/app:/usr/local/bin:/usr/bin:/bin"\nexport IMAGE_VAR=from-image\n# x\n')
    bin_ = root / "usr/bin"
    (bin_ / "abs").symlink_to("/usr/bin/hello")
    (bin_ / "up").symlink_to("../../../../../../usr/bin/hello")
    (bin_ / "loop1").symlink_to("loop2")
    (bin_ / "loop2").symlink_to("loop1")
    (bin_ / "escape").symlink_to("/etc/hostname")  # exists on the host, not in the image
    (bin_ / "script").write_text("#!/bin/sh\necho hi\n")
    (bin_ / "script").chmod(0o755)
    return root


def mksquashfs(root: Path, out: Path, comp: str, *extra: str) -> Path:
    """``mksquashfs`` of ``root`` (squashfs-tools; real, never vendored)."""
    return squash.mksquashfs(root, out, "-comp", comp, *extra)
