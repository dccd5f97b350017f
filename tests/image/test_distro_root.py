"""A real distribution root as an image: Debian sid (``mmdebstrap
--variant=essential`` plus Apptainer, tests/image/sif_root.py), its own
glibc 2.4x and ld.so.cache, different from this host's.

Oracle: the image's own loader, run in the root (``chroot``,
``LD_TRACE_LOADED_OBJECTS=1``), says which file each library of each
program resolves to; the check must resolve the same files inside the image
(unpacked, and as an lzo squashfs, enroot's default), with no finding."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from corpus import CorpusUnavailable, _give_up

from grace_policy.check import check_step
from grace_policy.elf import ElfError, read_elf
from grace_policy.image.open import open_image
from grace_policy.node import detect

from .budgets import roomy
from .roots import mksquashfs
from .sif_root import apptainer_root

HOST = detect()

pytestmark = [
    pytest.mark.network,
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("mmdebstrap") is None
                       or HOST.machine != "x86_64",
                       reason="needs root, mmdebstrap and an x86_64 host (the root is amd64)"),
]

_LINE = re.compile(r"^\s*(\S+) => (\S+) \(0x[0-9a-f]+\)$")


@pytest.fixture(scope="module")
def root() -> Path:
    try:
        return apptainer_root()
    except CorpusUnavailable as exc:
        _give_up(f"no Debian sid root: {exc}")
        raise


def _programs(root: Path, limit: int = 40) -> list[str]:
    out = []
    for name in sorted(os.listdir(root / "usr/bin")):
        path = root / "usr/bin" / name
        if path.is_symlink() or not path.is_file():
            continue
        try:
            info = read_elf(str(path))
        except (ElfError, OSError):
            continue
        if info.interp and info.needed:
            out.append(f"/usr/bin/{name}")
        if len(out) >= limit:
            break
    return out


def _real_loader(root: Path, program: str) -> dict[str, str]:
    done = subprocess.run(["chroot", str(root), "/usr/bin/env", "-i",
                           "LD_TRACE_LOADED_OBJECTS=1", program],
                          capture_output=True, text=True, timeout=60, check=False)
    found = {}
    for line in done.stdout.splitlines():
        m = _LINE.match(line)
        if m:
            found[m.group(1)] = m.group(2)
    return found


def test_real_root_resolves_as_its_own_loader(root: Path, tmp_path: Path) -> None:
    programs = _programs(root)
    assert len(programs) >= 10
    tree = open_image(str(root), budget=roomy())
    sqsh = open_image(str(mksquashfs(root, tmp_path / "sid.sqsh", "lzo", "-e", "usr/share",
                                     "var/cache", "var/lib/apt")), budget=roomy())
    env = {"PATH": "/usr/bin:/bin"}
    compared = 0
    for program in programs:
        expected = _real_loader(root, program)
        a = check_step([program], env, "/", HOST, image=tree)
        b = check_step([program], env, "/", HOST, image=sqsh)
        assert a.issues == () and a.limit is None, (program, a.issues)
        assert b.issues == () and b.limit is None, (program, b.issues)
        for report in (a, b):
            got = {o.name: o.path for o in report.tree.objects  # type: ignore[union-attr]
                   if o.found_via not in ("exe", "interp")}
            assert got == expected, (program, got, expected)
        compared += len(expected)
    assert compared >= 30
    # The image's glibc, not the host's, is what the check judged with.
    said = subprocess.run(["chroot", str(root), "/lib64/ld-linux-x86-64.so.2", "--version"],
                          capture_output=True, text=True, check=True).stdout
    m = re.search(r"release version (\d+)\.(\d+)", said)
    assert m
    from grace_policy import fsprobe
    from grace_policy.image.step import image_glibc

    inside = fsprobe.Files().inside(sqsh.view)
    assert image_glibc(HOST, None, inside) == (int(m.group(1)), int(m.group(2)))
