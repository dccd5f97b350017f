"""Fuzzing the image readers: the LZO decoder and the squashfs reader.

The contract (as for ``read_elf``, tests/test_elf_fuzz.py): bytes no longer
than the limit or an ``LzoError``; an :class:`ImageError` when an image
cannot be opened, ``OSError`` for any later read, ``BudgetExceeded`` (the
step's check-limit) where a bound of the reader is reached; never another
exception, never a hang. Seeds are real: LZO blocks and whole images ``mksquashfs``
wrote here. ``make fuzz`` raises the example count (GRACE_FUZZ_EXAMPLES).
"""

from __future__ import annotations

import os
import shutil
import struct
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grace_policy.budget import BudgetExceeded
from grace_policy.image import ImageError, native
from grace_policy.image.lzo import LzoError, decompress
from grace_policy.image.open import open_image
from grace_policy.image.squashfs import SquashFile, SquashView

from .budgets import roomy
from .roots import mksquashfs

EXAMPLES = int(os.environ.get("GRACE_FUZZ_EXAMPLES", "0") or 0)
FUZZ = settings(max_examples=EXAMPLES or 300, deadline=None, database=None,
                derandomize=not EXAMPLES,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])

pytestmark = pytest.mark.skipif(shutil.which("mksquashfs") is None,
                                reason="mksquashfs not installed (squashfs-tools)")


@pytest.fixture(scope="module")
def small_images(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """Images of a small tree (links, a loop, a script, an ELF file, a
    directory of many names) in each compression."""
    base = tmp_path_factory.mktemp("fuzz-img")
    root = base / "root"
    (root / "usr/bin").mkdir(parents=True)
    (root / "bin").symlink_to("usr/bin")
    shutil.copy2("/bin/true", root / "usr/bin/true")
    (root / "usr/bin/abs").symlink_to("/usr/bin/true")
    (root / "usr/bin/loop").symlink_to("loop")
    (root / "usr/bin/s").write_text("#!/bin/sh\n" + "echo x\n" * 2000)
    (root / "d").mkdir()
    for i in range(300):
        (root / "d" / f"n{i}").write_text(str(i))
    return {comp: mksquashfs(root, base / f"{comp}.sqsh", comp, "-b", "4096").read_bytes()
            for comp in ("lzo", "gzip", "xz")}


@pytest.fixture(scope="module")
def lzo_blocks(small_images: dict[str, bytes], tmp_path_factory: pytest.TempPathFactory
               ) -> list[tuple[bytes, bytes]]:
    """(compressed, decompressed) data blocks of the lzo image."""
    path = tmp_path_factory.mktemp("lzo") / "i.sqsh"
    path.write_bytes(small_images["lzo"])
    image = open_image(str(path), budget=roomy())
    view: SquashView = image.view  # type: ignore[assignment]
    out = []
    for name in ("/usr/bin/true", "/usr/bin/s"):
        node, _ = view._walk(name, True)
        listing = SquashFile(view, node)  # type: ignore[arg-type]
        for index in range(node.count):  # type: ignore[attr-defined]
            pos, word = listing._where(index)
            size = word & 0xFFFFFF
            if not word & (1 << 24):
                raw = view._raw(pos, size, "block")
                out.append((raw, view.block(pos, word, view.block_size, "block")))
    view.close()
    assert len(out) >= 3
    return out


def _liblzo2():  # type: ignore[no-untyped-def]
    """liblzo2's decoder; squashfs-tools depends on it, so it must be here."""
    inflate = native.lzo()
    assert inflate is not None, "liblzo2.so.2 not found"
    return inflate


def _agree(data: bytes, limit: int) -> None:
    """The pure-Python decoder and liblzo2's ``lzo1x_decompress_safe`` give
    the same bytes (never more than ``limit``) or both refuse the input."""
    try:
        ours: bytes | None = decompress(data, limit)
    except LzoError:
        ours = None
    try:
        theirs: bytes | None = _liblzo2()(data, limit)
    except native.NativeError:
        theirs = None
    assert ours == theirs
    assert ours is None or len(ours) <= limit


def test_lzo_blocks_decode(lzo_blocks: list[tuple[bytes, bytes]]) -> None:
    for raw, plain in lzo_blocks:
        for inflate, error in ((decompress, LzoError), (_liblzo2(), native.NativeError)):
            assert inflate(raw, 4096) == plain
            with pytest.raises(error):
                inflate(raw, len(plain) - 1)  # the limit holds
            with pytest.raises(error):
                inflate(raw[:-1], 4096)  # truncated
            with pytest.raises(error):
                inflate(raw + b"\0", 4096)  # trailing bytes


@FUZZ
@given(st.binary(max_size=2048))
def test_lzo_random_bytes(data: bytes) -> None:
    _agree(data, 4096)


@FUZZ
@given(st.data())
def test_lzo_mutated_blocks(lzo_blocks: list[tuple[bytes, bytes]], data: st.DataObject) -> None:
    raw, _plain = lzo_blocks[data.draw(st.integers(0, len(lzo_blocks) - 1))]
    buf = bytearray(raw)
    for _ in range(data.draw(st.integers(1, 8))):
        buf[data.draw(st.integers(0, len(buf) - 1))] = data.draw(st.integers(0, 255))
    _agree(bytes(buf), data.draw(st.sampled_from([4096, 1000, 64])))


def test_zstd_native_bounded() -> None:
    """libzstd's one-shot decoder: a real frame, its limit, hostile bytes."""
    inflate = native.zstd()
    if inflate is None:
        pytest.skip("libzstd.so.1 not installed")
    import subprocess

    plain = b"grace-policy " * 1000
    frame = subprocess.run(["zstd", "-q", "-c"], input=plain, capture_output=True,
                           check=True).stdout if shutil.which("zstd") else None
    if frame is not None:
        assert inflate(frame, len(plain)) == plain
        with pytest.raises(native.NativeError):
            inflate(frame, len(plain) - 1)
        with pytest.raises(native.NativeError):
            inflate(frame[:-3], len(plain))
    magic = b"\x28\xb5\x2f\xfd"
    for junk in (b"", magic, magic + b"\xff" * 64, bytes(range(256)) * 2):
        with pytest.raises(native.NativeError):
            inflate(junk, 4096)


def _exercise(path: Path) -> None:
    """Open, walk (bounded: a listing may point at an ancestor), stat, read."""
    try:
        image = open_image(str(path), budget=roomy())
    except (ImageError, BudgetExceeded):
        return
    view = image.view
    seen = 0
    todo = ["/"]
    while todo and seen < 2000:
        where = todo.pop()
        try:
            entries = view.scandir(where)  # type: ignore[attr-defined]
        except (OSError, BudgetExceeded):
            continue
        for entry in entries:
            seen += 1
            inner = entry.path
            try:
                st_ = view.stat(inner)  # type: ignore[attr-defined]
                view.realpath(inner)  # type: ignore[attr-defined]
                if entry.is_dir(follow_symlinks=False) and inner.count("/") < 12:
                    todo.append(inner)
                fh, st_ = view.open_regular(inner)  # type: ignore[attr-defined]
                try:
                    fh.pread(min(st_.st_size, 70_000), 0)
                    fh.pread(100, max(st_.st_size - 50, 0))
                finally:
                    fh.close()
            except (OSError, BudgetExceeded):
                continue
    view.close()  # type: ignore[attr-defined]


@FUZZ
@given(st.data())
def test_squashfs_mutated_images(small_images: dict[str, bytes], tmp_path: Path,
                                 data: st.DataObject) -> None:
    comp = data.draw(st.sampled_from(sorted(small_images)))
    raw = bytearray(small_images[comp])
    (used,) = struct.unpack_from("<Q", raw, 40)
    for _ in range(data.draw(st.integers(1, 6))):
        # Mostly the tables at the end (inodes, listings, fragments), some
        # anywhere (superblock, data blocks).
        lo = data.draw(st.sampled_from([0, 0, max(0, used - 4096)]))
        at = data.draw(st.integers(lo, used - 1))
        raw[at] = data.draw(st.integers(0, 255))
    path = tmp_path / "m.sqsh"
    path.write_bytes(bytes(raw))
    _exercise(path)


def test_squashfs_every_cut(small_images: dict[str, bytes], tmp_path: Path) -> None:
    raw = small_images["gzip"]
    (used,) = struct.unpack_from("<Q", raw, 40)
    path = tmp_path / "c.sqsh"
    for size in range(0, used, max(1, used // 200)):
        path.write_bytes(raw[:size])
        with pytest.raises(ImageError):
            open_image(str(path), budget=roomy())
    # Cut inside the tables but with the size field lowered to match: each
    # read past the end is an OSError, never anything else.
    for size in range(used // 2, used, max(1, used // 50)):
        forged = bytearray(raw[:size])
        struct.pack_into("<Q", forged, 40, size)
        path.write_bytes(bytes(forged))
        _exercise(path)
