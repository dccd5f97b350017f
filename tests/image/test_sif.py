"""SIF files Apptainer itself built, read without mounting.

``apptainer build IMG.sif DIR`` runs in a Debian sid root (tests/image/
sif_root.py; Apptainer is not packaged for Debian 12). ``apptainer sif
list``/``sif header`` are the oracle for the layout; the partition bytes at
the positions Apptainer lists, read by ``unsquashfs``, for the files; the
same tree unpacked for the verdicts.
"""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest
from corpus import CorpusUnavailable, _give_up

from grace_policy import fsprobe
from grace_policy.check import CheckInput, check, check_step
from grace_policy.image import ImageError
from grace_policy.image.open import open_image
from grace_policy.image.sif import DESCRIPTOR, HEADER
from grace_policy.node import NodeProfile, detect

from .budgets import roomy
from .roots import make_root
from .sif_root import build_sif, sif_list

HOST = detect()
GRACE64 = NodeProfile("aarch64", 65536, (2, 36))

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("mmdebstrap") is None,
                                reason="building SIFs needs root and mmdebstrap "
                                       "(an Apptainer root of Debian sid)")


@pytest.fixture(scope="module")
def sifs(tmp_path_factory: pytest.TempPathFactory, compile_cache: object
         ) -> dict[str, tuple[Path, Path]]:
    base = tmp_path_factory.mktemp("sif")
    out = {}
    arches = ["x86_64"] + (["aarch64"] if shutil.which("aarch64-linux-gnu-gcc") else [])
    for arch in arches:
        root = make_root(base / f"{arch}-root", arch, cache=compile_cache)
        # Apptainer refuses a link that climbs out of the tree (the reader's
        # handling of those is tested on squashfs files).
        (root / "usr/bin/up").unlink()
        try:
            out[arch] = (root, build_sif(root, base / f"{arch}.sif"))
        except CorpusUnavailable as exc:
            _give_up(f"no Apptainer root: {exc}")
    return out


def _listed_partition(listing: str) -> tuple[int, int, str]:
    """(start, end, arch) of the system partition in ``apptainer sif list``."""
    for line in listing.splitlines():
        m = re.search(r"\|(\d+)-(\d+)\s*\|FS \(Squashfs/\*System/(\w+)\)", line)
        if m:
            return int(m.group(1)), int(m.group(2)), m.group(3)
    raise AssertionError(f"no system partition in:\n{listing}")


def test_layout_matches_apptainer(sifs: dict[str, tuple[Path, Path]], tmp_path: Path) -> None:
    goarch = {"x86_64": "amd64", "aarch64": "arm64"}
    for arch, (_root, sif) in sifs.items():
        listing = sif_list(sif)
        start, end, listed_arch = _listed_partition(listing)
        assert listed_arch == goarch[arch]
        assert f"Primary Architecture: {goarch[arch]}" in listing
        image = open_image(str(sif), budget=roomy())
        assert (image.kind, image.arch) == ("sif", arch)
        view = image.view
        assert (view.base, view.length) == (start, end - start)  # type: ignore[attr-defined]
        # The files: unsquashfs on the partition bytes Apptainer lists.
        part = tmp_path / f"{arch}.sqsh"
        with open(sif, "rb") as f:
            f.seek(start)
            part.write_bytes(f.read(end - start))
        names = subprocess.run(["unsquashfs", "-ls", "-d", "", str(part)], check=True,
                               capture_output=True, text=True).stdout.split("\n")
        expected = {n for n in names if n.startswith("/")}
        assert {"/usr/bin/hello", "/.singularity.d/env", "/lib64"} & expected
        for inner in sorted(expected):
            view.lstat(inner)  # type: ignore[attr-defined]
        cat = subprocess.run(["unsquashfs", "-cat", str(part), "usr/bin/hello"], check=True,
                             capture_output=True).stdout
        fh, st = view.open_regular("/usr/bin/hello")  # type: ignore[attr-defined]
        assert fh.pread(st.st_size, 0) == cat
        fh.close()
        env = dict(image.env)
        assert env["PATH"].startswith("/usr/local/sbin")


def test_verdicts_in_a_sif(sifs: dict[str, tuple[Path, Path]]) -> None:
    for arch, (root, sif) in sifs.items():
        image = open_image(str(sif), budget=roomy())
        tree = open_image(str(root), budget=roomy())
        nodes = [GRACE64] if arch == "aarch64" else []
        nodes += [HOST]
        for node in nodes:
            for argv in (["/usr/bin/hello"], ["/opt/app/tool"], ["/bin/true"],
                         ["/opt/app/tool4k"], ["/usr/bin/script"]):
                got = check_step(argv, {"PATH": "/usr/bin:/bin"}, "/", node, image=image)
                ref = check_step(argv, {"PATH": "/usr/bin:/bin"}, "/", node, image=tree)
                assert [(i.rule, i.path.split(":", 1)[-1]) for i in got.issues
                        if i.rule != "image-arch-mismatch"] == \
                    [(i.rule, i.path.split(":", 1)[-1]) for i in ref.issues
                     if i.rule != "image-arch-mismatch"], (arch, node, argv)
                if arch != node.machine:
                    assert [i.rule for i in got.issues] == ["image-arch-mismatch"]
                    # The SIF header said it, before any file was read.
                    assert got.issues[0].fact("inner") == "the image's header"
                    assert got.issues[0].path == str(sif)
    if "aarch64" in sifs:
        sif = sifs["aarch64"][1]
        image = open_image(str(sif), budget=roomy())
        bad = check_step(["/opt/app/tool4k"], {}, "/", GRACE64, image=image)
        assert bad.issues and bad.issues[0].path == f"{sif}:/opt/app/tool4k"
        assert bad.issues[0].rule in ("page-align", "page-congruence")
        assert check_step(["/opt/app/tool"], {}, "/", GRACE64, image=image).issues == ()
    x86 = sifs["x86_64"][1]
    if HOST.machine == "x86_64":
        image = open_image(str(x86), budget=roomy())
        files = fsprobe.Files.recorded()
        assert check(CheckInput(["hello"], image.step_env({}), "/", HOST, image=image,
                                files=files)).issues == ()
        assert [r for r in files.records() if r[0] not in ("v", "i")] == \
            [("s", str(x86), fsprobe.signature(os.stat(x86)))]


def test_truncated_and_hostile_sifs(sifs: dict[str, tuple[Path, Path]], tmp_path: Path) -> None:
    data = sifs["x86_64"][1].read_bytes()
    bad = tmp_path / "bad.sif"
    for size in (40, 127, 128, 4096, 4096 + 585 * 2, 40000, len(data) // 2, len(data) - 1):
        bad.write_bytes(data[:size])
        with pytest.raises(ImageError):
            open_image(str(bad), budget=roomy())
    head = list(HEADER.unpack_from(data))
    for field, value in ((8, 1 << 40), (8, 0), (9, 1 << 50), (9, -5)):  # dtotal, descroff
        forged = list(head)
        forged[field] = value
        bad.write_bytes(HEADER.pack(*forged) + data[HEADER.size:])
        with pytest.raises(ImageError):
            open_image(str(bad), budget=roomy())
    # A system partition whose offset or size points past the end.
    descroff = head[9]
    for i in range(head[8]):
        at = descroff + i * DESCRIPTOR.size
        fields = list(DESCRIPTOR.unpack_from(data, at))
        if fields[0] == 0x4004 and fields[1]:
            for off, size in ((len(data), 4096), (1 << 62, 4096), (0, len(data) * 2), (0, -1)):
                forged = list(fields)
                forged[5], forged[6] = off, size
                raw = bytearray(data)
                raw[at:at + DESCRIPTOR.size] = DESCRIPTOR.pack(*forged)
                bad.write_bytes(bytes(raw))
                with pytest.raises(ImageError):
                    open_image(str(bad), budget=roomy())
            # Its squashfs zeroed: unreadable, named as such.
            raw = bytearray(data)
            raw[fields[5]:fields[5] + 96] = bytes(96)
            bad.write_bytes(bytes(raw))
            with pytest.raises(ImageError, match="squashfs"):
                open_image(str(bad), budget=roomy())
            break
    else:
        raise AssertionError("no partition descriptor found")
    assert struct.calcsize("<iBIIIqqqqqqq128s384s") == 585
