"""Fuzzing ``read_elf``: mutated real ELF files and random bytes.

The reader runs inside slurmstepd on files users control, so the contract is
narrow: an :class:`ElfInfo` or an :class:`ElfError` (``OSError`` only for open
problems), never another exception, never a hang, never more bytes read than
``max_bytes``. Seeds are real builds (x86_64 PIE with RUNPATH, aarch64 64 KiB
library, i386, big-endian aarch64), so mutations land in realistic structures.

``make fuzz`` raises the example count (env ``GRACE_FUZZ_EXAMPLES``) and keeps
hypothesis' example database under ``~/.cache/grace-policy-tests``; the normal
suite runs a short pass with no database (nothing written into the repo).
Crashing inputs found so far are kept below as byte literals.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from unittest import mock

import pytest
from corpus import cache_root
from fixtures.build import ElfBuilder, compiler_for, src
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.database import DirectoryBasedExampleDatabase

from grace_policy import elf as E
from grace_policy.elf import ElfError, ElfInfo, read_elf

EXAMPLES = int(os.environ.get("GRACE_FUZZ_EXAMPLES", "0") or 0)
LONG = EXAMPLES > 0
FUZZ_SETTINGS = settings(
    max_examples=EXAMPLES if LONG else 1000,
    # No per-example time limit (that would be a timing assert on a loaded CI
    # box); a read that could block is refused by open_regular, and the byte
    # cap is checked by the contract below.
    deadline=None,
    database=(DirectoryBasedExampleDatabase(str(cache_root() / "hypothesis"))
              if LONG else None),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=not LONG,  # the normal suite is reproducible; long runs explore
)
MAX_BYTES = 64 * 1024


@pytest.fixture(scope="module")
def seeds(tmp_path_factory: pytest.TempPathFactory, compile_cache: object) -> list[bytes]:
    b = ElfBuilder(tmp_path_factory.mktemp("fuzz-seeds"), compile_cache)  # type: ignore[arg-type]
    lib = b.library("lib/libgreet.so.1")
    files = [
        b.compile(src("use_greet.c"), "bin/app", needed_libs=("greet",),
                  lib_dirs=(lib.parent,), runpath="$ORIGIN/../lib", nodeflib=True),
        b.library("lib32/libf32.so.1", source=src("freestanding.c"),
                  extra_flags=("-m32", "-nostdlib"), rpath="/r32"),
    ]
    if compiler_for("aarch64"):
        files.append(b.library("a64/libgreet.so.1", arch="aarch64", page_size=65536))
        files.append(b.library("be/libbe.so.1", source=src("freestanding.c"), arch="aarch64",
                               extra_flags=("-mbig-endian", "-nostdlib"), runpath="/be"))
    return [f.read_bytes() for f in files]


@contextmanager
def counting_reads() -> Iterator[list[int]]:
    """Count bytes requested through ``os.pread`` while the reader runs."""
    sizes: list[int] = []
    real = os.pread

    def pread(fd: int, length: int, offset: int) -> bytes:
        sizes.append(length)
        return real(fd, length, offset)

    with mock.patch.object(E.os, "pread", pread):
        yield sizes


def check_contract(path: Path, data: bytes) -> ElfInfo | None:
    path.write_bytes(data)
    with counting_reads() as sizes:
        try:
            info = read_elf(str(path), max_bytes=MAX_BYTES)
        except ElfError as exc:
            assert exc.reason
            info = None
    assert sum(sizes) <= MAX_BYTES, f"read {sum(sizes)} bytes, limit {MAX_BYTES}"
    if info is not None:
        # What callers use must be plain, usable values.
        assert info.machine_name and info.bits in (32, 64)
        for name in (*info.needed, info.soname, info.rpath, info.runpath, info.interp):
            if name is not None:
                name.encode("utf-8", "surrogateescape")
                assert "\0" not in name
    return info


# ----------------------------------------------------------------------
# Mutations of real files
# ----------------------------------------------------------------------

#: Field sizes that, written at a header or phdr offset, hit real fields.
_WIDTHS = {1: "B", 2: "H", 4: "I", 8: "Q"}
_INTERESTING = st.sampled_from(
    [0, 1, 2, 0x7F, 0x80, 0xFF, 0xFFFF, 0x7FFFFFFF, 0xFFFFFFFF, 2**63 - 1, 2**64 - 1, 56, 64])


@st.composite
def mutated(draw: st.DrawFn, seeds: list[bytes]) -> bytes:
    data = bytearray(draw(st.sampled_from(seeds)))
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["flip", "field", "truncate", "splice", "dyn"]))
        if not data:
            break
        if kind == "flip":
            pos = draw(st.integers(0, len(data) - 1))
            data[pos] ^= draw(st.integers(1, 255))
        elif kind == "field":
            width = draw(st.sampled_from(sorted(_WIDTHS)))
            # Mostly the ELF header and the program headers, where the parser looks.
            limit = min(len(data), 64 + 56 * 16) - width
            if limit <= 0:
                continue
            pos = draw(st.integers(0, limit))
            value = draw(st.one_of(_INTERESTING, st.integers(0, 2 ** (8 * width) - 1)))
            value &= 2 ** (8 * width) - 1
            struct.pack_into("<" + _WIDTHS[width], data, pos, value)
        elif kind == "truncate":
            del data[draw(st.integers(0, len(data))):]
        elif kind == "splice":
            pos = draw(st.integers(0, len(data)))
            data[pos:pos] = draw(st.binary(max_size=64))
        else:
            _mutate_dynamic(draw, data)
    return bytes(data)


def _mutate_dynamic(draw: st.DrawFn, data: bytearray) -> None:
    """Overwrite one dynamic entry's value (string offsets, DT_STRTAB, ...)."""
    try:
        info = read_elf_bytes(bytes(data))
    except (ElfError, OSError):
        return
    if info is None or info.elf_class != E.ELFCLASS64 or info.data != E.ELFDATA2LSB:
        return
    phoff, = struct.unpack_from("<Q", data, 32)
    phnum, = struct.unpack_from("<H", data, 56)
    for i in range(phnum):
        p_type, _f, p_offset, _v, _p, p_filesz = struct.unpack_from("<IIQQQQ", data,
                                                                    phoff + 56 * i)
        if p_type == E.PT_DYNAMIC and p_filesz >= 16:
            n = draw(st.integers(0, p_filesz // 16 - 1))
            pos = p_offset + 16 * n + draw(st.sampled_from([0, 8]))
            if pos + 8 <= len(data):
                struct.pack_into("<Q", data, pos,
                                 draw(st.one_of(_INTERESTING, st.integers(0, 2**64 - 1))))
            return


_scratch: dict[str, Path] = {}


def read_elf_bytes(data: bytes) -> ElfInfo | None:
    path = _scratch["helper"]
    path.write_bytes(data)
    return read_elf(str(path), max_bytes=MAX_BYTES)


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("fuzz")
    _scratch["helper"] = d / "helper"
    return d / "case"


def test_seeds_parse(seeds: list[bytes], scratch: Path) -> None:
    """The seeds themselves are good files, so mutations start from real structure."""
    assert len(seeds) >= 2
    for data in seeds:
        assert check_contract(scratch, data) is not None


def test_mutated_real_files(seeds: list[bytes], scratch: Path) -> None:
    @FUZZ_SETTINGS
    @given(st.data())
    def run(data: st.DataObject) -> None:
        check_contract(scratch, data.draw(mutated(seeds)))

    run()


@st.composite
def random_elfish(draw: st.DrawFn) -> bytes:
    """Random bytes, usually behind a valid ident so the parser gets past the magic."""
    body = draw(st.binary(max_size=1024))
    if draw(st.booleans()):
        ident = b"\x7fELF" + bytes([draw(st.sampled_from([1, 2, 0, 3])),
                                    draw(st.sampled_from([1, 2, 0])), 1]) + bytes(9)
        return ident + body
    return body


def test_random_bytes(scratch: Path) -> None:
    @FUZZ_SETTINGS
    @given(random_elfish())
    def run(data: bytes) -> None:
        check_contract(scratch, data)

    run()


def test_contract_checker_catches_overreads(seeds: list[bytes], scratch: Path) -> None:
    """The read counter is live: a reader told it may read more is caught."""
    scratch.write_bytes(seeds[0])
    with counting_reads() as sizes:
        read_elf(str(scratch))
    assert 0 < sum(sizes) < len(seeds[0])
