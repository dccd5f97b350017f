"""The fat binary reader on hostile and broken files: a problem, never an
exception (only the check's own BudgetExceeded), and bounded work.

The files are synthetic ELF objects written here (a section table, a name
table and the sections), so every size can be chosen, plus byte flips of a
real nvcc-built library."""

from __future__ import annotations

import random
import struct
import time
from pathlib import Path

import pytest

from grace_policy import fsprobe
from grace_policy.budget import Budget, BudgetExceeded
from grace_policy.cuda import fatbin as fb
from grace_policy.cuda.fatbin import read_fatbins


def entry(kind: int = 2, sm: int = 90, payload: bytes = b"x" * 8, flags: int = 0x11,
          header_size: int = 64, size: int | None = None) -> bytes:
    head = struct.pack("<HHIQ", kind, 0x101, header_size, len(payload) if size is None else size)
    head += bytes(8) + struct.pack("<II", 0x10008, sm) + bytes(8) + struct.pack("<Q", flags)
    head = head.ljust(header_size, b"\0")
    return head + payload


def fatbin(*entries: bytes, size: int | None = None) -> bytes:
    body = b"".join(entries)
    return struct.pack("<IHHQ", fb.FATBIN_MAGIC, 1, 16, len(body) if size is None else size) \
        + body


def elf(sections: list[tuple[str, bytes, int]]) -> bytes:
    """A 64-bit LE ELF with ``(name, data, address)`` sections."""
    names = b"\0" + b"".join(n.encode() + b"\0" for n, _, _ in sections) + b".shstrtab\0"
    out = bytearray(64)
    placed = []
    for name, data, addr in sections:
        off = (len(out) + 15) & ~15
        out += bytes(off - len(out)) + data
        placed.append((name, off, len(data), addr))
    stroff = len(out)
    out += names
    shoff = (len(out) + 7) & ~7
    out += bytes(shoff - len(out))
    out += bytes(64)  # section 0
    pos = 1
    for name, off, size, addr in placed:
        out += struct.pack("<IIQQQQIIQQ", pos, 1, 2, addr, off, size, 0, 0, 8, 0)
        pos += len(name) + 1
    out += struct.pack("<IIQQQQIIQQ", pos, 3, 0, 0, stroff, len(names), 0, 0, 1, 0)
    struct.pack_into("<4sBBBB", out, 0, b"\x7fELF", 2, 1, 1, 0)
    struct.pack_into("<HHIQQQIHHHHHH", out, 16, 3, 62, 1, 0, 0, shoff, 0, 64, 56, 0, 64,
                     len(placed) + 2, len(placed) + 1)
    return bytes(out)


def read(tmp_path: Path, data: bytes, budget: Budget | None = None):  # type: ignore[no-untyped-def]
    path = tmp_path / "lib.so"
    path.write_bytes(data)
    return read_fatbins(str(path), fsprobe.HOST, budget)


def test_a_well_formed_synthetic_file(tmp_path: Path) -> None:
    info = read(tmp_path, elf([(".nv_fatbin", fatbin(entry(sm=80), entry(1, 90)), 0x1000)]))
    assert info.problems == () and info.holds() == "sm_80 compute_90"


@pytest.mark.parametrize(("data", "words"), [
    (fatbin(entry(), size=1 << 62), "past the end of its section"),
    (fatbin(entry(size=(1 << 64) - 1)), "past the end of its fat binary"),
    (fatbin(entry(header_size=8, payload=bytes(64))), "header size 8"),
    (fatbin(entry(header_size=1 << 20)), "header size"),
    (b"\x01" * 64, "not a fat binary header"),
    (struct.pack("<IHHQ", fb.FATBIN_MAGIC, 7, 16, 0), "version 7"),
], ids=["fatbin-size", "payload-size", "small-header", "huge-header", "no-magic", "version"])
def test_bad_sizes_are_problems(tmp_path: Path, data: bytes, words: str) -> None:
    info = read(tmp_path, elf([(".nv_fatbin", data, 0x1000)]))
    assert any(words in p for p in info.problems), info.problems


def test_sections_past_the_end_and_truncation(tmp_path: Path) -> None:
    data = bytearray(elf([(".nv_fatbin", fatbin(entry(), entry()), 0x1000)]))
    good = read(tmp_path, bytes(data))
    assert len(good.entries) == 2
    shoff = struct.unpack_from("<Q", data, 40)[0]
    struct.pack_into("<Q", data, shoff + 64 + 32, 1 << 40)  # section 1's size
    assert "runs past the end" in read(tmp_path, bytes(data)).problems[0]
    cut = elf([(".nv_fatbin", fatbin(entry(), entry()), 0x1000)])
    info = read(tmp_path, cut[:200])
    assert info.entries == () and info.problems  # the section table is gone


def test_a_million_entries_stop_at_the_cap(tmp_path: Path) -> None:
    one = entry(payload=b"")
    data = elf([(".nv_fatbin", fatbin(*([one] * 1_000_000)), 0x1000)])
    start = time.monotonic()
    info = read(tmp_path, data, Budget(deadline_ms=60_000))
    assert len(info.entries) == fb.MAX_ENTRIES
    assert any("kernel images; the rest were not read" in p for p in info.problems)
    assert time.monotonic() - start < 30  # bounded, not a timing claim


def test_many_fatbins_and_zero_padding(tmp_path: Path) -> None:
    pad = fatbin(entry()) + bytes(24)
    info = read(tmp_path, elf([(".nv_fatbin", pad * 1000, 0x1000)]))
    assert info.fatbins == 1000 and info.problems == ()
    endless = read(tmp_path, elf([(".nv_fatbin", fatbin(entry()) + bytes(fb.MAX_PADDING * 2)
                                   + fatbin(entry()), 0x1000)]))
    assert any("zero bytes between" in p for p in endless.problems)


def test_wrappers_reach_fatbins_elsewhere_once(tmp_path: Path) -> None:
    """A fat binary outside the fat binary sections is found through its
    wrapper; a thousand wrappers to it read it once; a wrapper into the
    middle of a fat binary section is a problem, not a second reading."""
    rodata = b"\0" * 16 + fatbin(entry(sm=100, flags=0x100011))
    nv = fatbin(entry(sm=80))
    wrap = struct.pack("<IIQQ", fb.WRAPPER_MAGIC, 1, 0x5010, 0) * 1000
    wrap += struct.pack("<IIQQ", fb.WRAPPER_MAGIC, 1, 0x1008, 0)
    wrap += struct.pack("<IIQQ", fb.WRAPPER_MAGIC, 1, 0, 0)  # left to a relocation
    wrap += struct.pack("<IIQQ", 0xDEAD, 1, 0x5010, 0)  # not a wrapper
    info = read(tmp_path, elf([(".nv_fatbin", nv, 0x1000), (".rodata", rodata, 0x5000),
                               (".nvFatBinSegment", wrap, 0x9000)]))
    assert [e.arch for e in info.entries] == ["sm_80", "sm_100a"]
    assert info.fatbins == 2 and info.unresolved_wrappers == 1
    assert any("middle of a fat binary section" in p for p in info.problems)


def test_not_elf_or_not_64_bit_le_has_no_entries(tmp_path: Path) -> None:
    assert read(tmp_path, b"#!/bin/sh\n" + bytes(100)).entries == ()
    data = bytearray(elf([(".nv_fatbin", fatbin(entry()), 0x1000)]))
    data[5] = 2  # big-endian
    assert read(tmp_path, bytes(data)).entries == ()
    missing = read_fatbins(str(tmp_path / "nope.so"), fsprobe.HOST)
    assert missing.problems and "cannot open" in missing.problems[0]
    assert read_fatbins(str(tmp_path), fsprobe.HOST).problems  # a directory


def test_budget_is_charged_and_propagates(tmp_path: Path) -> None:
    data = elf([(".nv_fatbin", fatbin(*[entry(payload=bytes(4096))] * 64), 0x1000)])
    budget = Budget(max_bytes=1 << 20)
    read(tmp_path, data, budget)
    assert 0 < budget.bytes_read < 64 * 1024  # headers only, payloads skipped
    with pytest.raises(BudgetExceeded):
        read(tmp_path, data, Budget(max_bytes=2000))


@pytest.mark.network
def test_byte_flips_of_a_real_library_never_raise(tmp_path: Path) -> None:
    """300 mutants of an nvcc-built library (flips inside the ELF header,
    the section table and the fat binaries)."""
    from .fixtures import build_fixtures
    from .toolchain import toolchain

    [fx] = [f for f in build_fixtures(toolchain()) if f.name == "x86_64/libzip_sm80_ptx90.so"]
    original = fx.path.read_bytes()
    shoff = struct.unpack_from("<Q", original, 40)[0]
    info = read_fatbins(str(fx.path), fsprobe.HOST)
    hot = [(0, 64), (shoff, len(original)), (info.entries[0].offset - 16,
                                              info.entries[-1].offset + 128)]
    rng = random.Random(26)
    for _ in range(300):
        data = bytearray(original)
        for _ in range(rng.randint(1, 8)):
            lo, hi = rng.choice(hot)
            data[rng.randrange(lo, min(hi, len(data)))] = rng.randrange(256)
        got = read(tmp_path, bytes(data))
        assert len(got.entries) <= fb.MAX_ENTRIES and len(got.problems) <= fb.MAX_PROBLEMS


class _NoFd:
    """A file object as an image view gives one: pread only, no descriptor."""

    def __init__(self, path: str) -> None:
        self.f = open(path, "rb")

    def pread(self, length: int, offset: int) -> bytes:
        self.f.seek(offset)
        return self.f.read(length)

    def close(self) -> None:
        self.f.close()


class _Files:
    @staticmethod
    def open_regular(path: str):  # type: ignore[no-untyped-def]
        import os

        return _NoFd(path), os.stat(path)


@pytest.mark.network
def test_cold_page_cache_and_plain_files_read_the_same() -> None:
    """The read-ahead path (page cache dropped for the file, so reads
    answer EAGAIN and are hinted) and a view's file object without a
    descriptor give what a warm read gives."""
    import os

    from .toolchain import curand_lib

    path = str(curand_lib("aarch64"))
    warm = read_fatbins(path, fsprobe.HOST)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    cold = read_fatbins(path, fsprobe.HOST, Budget())
    assert cold == warm and len(warm.entries) > 100
    assert read_fatbins(path, _Files) == warm
