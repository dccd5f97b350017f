"""Byte patches on copies of compiled ELF files, for the cases no toolchain
flag produces (one late PT_LOAD with another alignment, thousands of
distinct sonames). Each patch changes only the named field of a real build,
so the file stays what the loader accepts otherwise; tests that rely on
that check it with the real loader on a small instance.
"""

from __future__ import annotations

import struct
from pathlib import Path

PT_LOAD = 1


def _layout(data: bytes) -> tuple[str, int, int, int]:
    assert data[:4] == b"\x7fELF" and data[4] == 2, "64-bit ELF expected"
    end = "<" if data[5] == 1 else ">"
    e_phoff = struct.unpack_from(end + "Q", data, 0x20)[0]
    e_phentsize, e_phnum = struct.unpack_from(end + "HH", data, 0x36)
    return end, e_phoff, e_phentsize, e_phnum


def load_headers(path: Path) -> list[tuple[int, dict[str, int]]]:
    """(file offset of the entry, fields) for each PT_LOAD, in file order."""
    data = path.read_bytes()
    end, phoff, entsize, phnum = _layout(data)
    out = []
    for i in range(phnum):
        at = phoff + i * entsize
        p_type, p_flags, off, vaddr, _paddr, filesz, memsz, align = struct.unpack_from(
            end + "IIQQQQQQ", data, at)
        if p_type == PT_LOAD:
            out.append((at, {"flags": p_flags, "offset": off, "vaddr": vaddr,
                             "filesz": filesz, "memsz": memsz, "align": align}))
    return out


def set_load_align(path: Path, index: int, align: int) -> None:
    """Set p_align of the ``index``-th PT_LOAD (negative: from the end)."""
    data = bytearray(path.read_bytes())
    end = _layout(bytes(data))[0]
    at, _ = load_headers(path)[index]
    struct.pack_into(end + "Q", data, at + 48, align)
    path.write_bytes(bytes(data))


def replace_string(path: Path, old: bytes, new: bytes, *, count: int = 1) -> None:
    """Replace NUL-terminated ``old`` by ``new`` of the same length (dynamic
    strings: DT_NEEDED, DT_SONAME). Fails if it does not occur ``count`` times."""
    assert len(old) == len(new), "same length keeps every other offset valid"
    data = path.read_bytes()
    needle = old + b"\0"
    found = data.count(needle)
    assert found == count, f"{old!r} occurs {found} times in {path}, expected {count}"
    path.write_bytes(data.replace(needle, new + b"\0"))
