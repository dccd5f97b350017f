"""A lean ELF reader: only the facts the loader model and the page rules need.

pyelftools is the reference (tests compare both on every corpus file), but it
costs 2-4 ms a file and ~60 ms to import; this reader uses plain ``struct``
reads at fixed offsets so a clean step stays near the interpreter's floor.

Every read is bounded and every offset is checked against the file size, so a
hostile or truncated file raises :class:`ElfError` (which callers turn into a
finding), never another exception, and never reads more than ``max_bytes``.
"""

from __future__ import annotations

import os
import struct

from . import fsprobe
from ._record import dataclass

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs ~4 ms to import; annotations are strings anyway
    from .budget import Budget as Charge

ELFCLASS32 = 1
ELFCLASS64 = 2
ELFDATA2LSB = 1
ELFDATA2MSB = 2

ET_EXEC = 2

EM_386 = 3
ET_DYN = 3

PT_LOAD = 1
PT_DYNAMIC = 2
PT_INTERP = 3
PT_GNU_RELRO = 0x6474E552

PF_X = 1
PF_W = 2
PF_R = 4

DT_NULL = 0
DT_NEEDED = 1
DT_STRTAB = 5
DT_STRSZ = 10
DT_SONAME = 14
DT_RPATH = 15
DT_RUNPATH = 29
DT_FLAGS_1 = 0x6FFFFFFB
DF_1_NOW = 0x1
DF_1_NODEFLIB = 0x800
DT_VERDEF = 0x6FFFFFFC
DT_VERNEED = 0x6FFFFFFE
#: vna_flags bit: the need is weak, a missing version is not fatal (elf.h).
VER_FLG_WEAK = 0x2

#: e_machine values we name; anything else is shown as ``em-<number>``.
MACHINE_NAMES: dict[int, str] = {
    3: "i386",
    8: "mips",
    20: "ppc",
    21: "ppc64",
    22: "s390x",
    40: "arm",
    43: "sparc64",
    62: "x86_64",
    183: "aarch64",
    243: "riscv64",
    258: "loongarch64",
}
MACHINE_NUMBERS: dict[str, int] = {v: k for k, v in MACHINE_NAMES.items()}

#: Upper bounds that keep a hostile header from making us read or loop forever.
MAX_PHNUM = 4096
MAX_DYN_ENTRIES = 65536
MAX_STRING = 4096
#: Dynamic strings (DT_RPATH/DT_RUNPATH of Spack-style trees run to tens of
#: KiB) have no limit in glibc; ours only keeps a hostile table bounded.
MAX_DYN_STRING = 1024 * 1024
#: Version entries glibc walks by their next-offsets; real files have tens.
MAX_VERSION_ENTRIES = 4096
DEFAULT_MAX_BYTES = 16 * 1024 * 1024


class ElfError(Exception):
    """The file is not an ELF object we can read; ``reason`` is for people."""

    def __init__(self, reason: str, *, not_elf: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.not_elf = not_elf


@dataclass(frozen=True)
class LoadSegment:
    offset: int
    vaddr: int
    filesz: int
    memsz: int
    flags: int
    align: int

    @property
    def perms(self) -> str:
        return (
            ("R" if self.flags & PF_R else "-")
            + ("W" if self.flags & PF_W else "-")
            + ("X" if self.flags & PF_X else "-")
        )


@dataclass(frozen=True)
class ElfInfo:
    """What one ELF file tells the loader. Strings are decoded with
    ``surrogateescape`` so non-UTF-8 names survive a round trip to bytes."""

    path: str
    elf_class: int
    data: int
    machine: int
    e_type: int
    osabi: int
    phentsize: int
    interp: str | None
    load_segments: tuple[LoadSegment, ...]
    relro: tuple[int, int] | None
    has_dynamic: bool
    needed: tuple[str, ...]
    soname: str | None
    rpath: str | None
    runpath: str | None
    flags_1: int
    #: DT_VERNEED: ``((file name, ((version, ELF hash, weak), ...)), ...)``.
    verneed: tuple[tuple[str, tuple[tuple[str, int, bool], ...]], ...] = ()
    #: DT_VERDEF as ``{(ELF hash, name)}``; None when the object has none
    #: (glibc then accepts every need on it).
    verdef: frozenset[tuple[int, str]] | None = None

    @property
    def machine_name(self) -> str:
        return machine_name(self.machine)

    @property
    def bits(self) -> int:
        return 64 if self.elf_class == ELFCLASS64 else 32

    @property
    def nodeflib(self) -> bool:
        return bool(self.flags_1 & DF_1_NODEFLIB)

    @property
    def min_load_align(self) -> int | None:
        if not self.load_segments:
            return None
        return min(seg.align for seg in self.load_segments)


#: (is 64-bit, byte order) -> (ELF header after e_ident, one program header),
#: compiled once: the formats are parsed per file otherwise.
_STRUCTS = {
    (True, "<"): (struct.Struct("<HHIQQQIHHH"), struct.Struct("<IIQQQQQQ")),
    (True, ">"): (struct.Struct(">HHIQQQIHHH"), struct.Struct(">IIQQQQQQ")),
    (False, "<"): (struct.Struct("<HHIIIIIHHH"), struct.Struct("<IIIIIIII")),
    (False, ">"): (struct.Struct(">HHIIIIIHHH"), struct.Struct(">IIIIIIII")),
}


def machine_name(machine: int) -> str:
    return MACHINE_NAMES.get(machine, f"em-{machine}")


#: The first read takes this much: the ELF header, the program headers and,
#: in most libraries, .dynstr sit in it, so one pread serves most lookups.
HEAD_BYTES = 4096


class _Reader:
    """Bounded positional reads on an open fd."""

    def __init__(self, fh: fsprobe.HostFile, size: int, max_bytes: int,
                 charge: Charge | None = None) -> None:
        self.fh = fh
        self.size = size
        self.budget = max_bytes
        self.charge = charge
        self.head: bytes | None = None

    def read(self, offset: int, length: int, what: str) -> bytes:
        if offset < 0 or length < 0 or offset + length > self.size:
            raise ElfError(f"{what} lies beyond the end of the file")
        if self.head is None:
            self.head = self._pread(0, min(self.size, HEAD_BYTES, max(self.budget, 0)), what)
        if offset + length <= len(self.head):
            return self.head[offset:offset + length]
        return self._pread(offset, length, what)

    def _pread(self, offset: int, length: int, what: str) -> bytes:
        if length > self.budget:
            raise ElfError(f"{what} is larger than the read limit")
        self.budget -= length
        if self.charge is not None:
            # The check's budget: may raise (deadline, byte cap) before the read.
            self.charge.spend_bytes(length)
        data = self.fh.pread(length, offset)
        if len(data) != length:
            raise ElfError(f"{what} could not be read in full (file changed while read?)")
        return data


def open_regular(path: str, files: fsprobe.Files = fsprobe.HOST
                 ) -> tuple[fsprobe.HostFile, os.stat_result]:
    """Open a regular file without blocking and without touching devices:
    ``(file, stat)`` with ``file.pread(length, offset)`` and ``file.close()``,
    in the check's ``files`` (:meth:`grace_policy.fsprobe.Files.open_regular`).
    Anything but a regular file is an :class:`ElfError` (``not_elf``); open
    errors stay ``OSError``."""
    try:
        return files.open_regular(path)  # type: ignore[no-any-return]
    except fsprobe.NotRegular:
        raise ElfError("not a regular file", not_elf=True) from None


def read_head(path: str, length: int = 256, files: fsprobe.Files = fsprobe.HOST) -> bytes:
    """First bytes of a regular file (for ``#!`` and magic checks)."""
    fh, _ = open_regular(path, files)
    try:
        return fh.pread(length, 0)
    finally:
        fh.close()


def read_elf(path: str, *, max_bytes: int = DEFAULT_MAX_BYTES,
             budget: Charge | None = None, files: fsprobe.Files = fsprobe.HOST) -> ElfInfo:
    """Read the loader-relevant facts of ``path``.

    Raises :class:`ElfError` for anything that is not a readable ELF object,
    and ``OSError`` when the file cannot be opened. ``budget`` (a
    :class:`grace_policy.budget.Budget`) is charged every byte read, so a
    whole check stays under its byte cap and deadline; whatever it raises
    (``BudgetExceeded``) propagates. ``files``: where ``path`` is (the
    check's host or image files).
    """
    fh, st = open_regular(path, files)
    try:
        return _parse(_Reader(fh, st.st_size, max_bytes, budget), path)
    finally:
        fh.close()


def _parse(r: _Reader, path: str) -> ElfInfo:
    if r.size < 16:
        raise ElfError("file too short", not_elf=True)
    ident = r.read(0, 16, "ELF identification")
    if ident[:4] != b"\x7fELF":
        raise ElfError("not an ELF file", not_elf=True)
    elf_class, data, osabi = ident[4], ident[5], ident[7]
    if elf_class not in (ELFCLASS32, ELFCLASS64):
        raise ElfError(f"invalid ELF class {elf_class}")
    if data not in (ELFDATA2LSB, ELFDATA2MSB):
        raise ElfError(f"invalid ELF data encoding {data}")
    end = "<" if data == ELFDATA2LSB else ">"
    is64 = elf_class == ELFCLASS64
    ehdr_struct, ph_struct = _STRUCTS[(is64, end)]
    ehdr = r.read(16, 48 if is64 else 36, "ELF header")
    (e_type, e_machine, _ver, _entry, e_phoff, _shoff, _flags, _ehsize, e_phentsize,
     e_phnum) = ehdr_struct.unpack_from(ehdr)
    ph_size = ph_struct.size
    if e_phnum > MAX_PHNUM:
        raise ElfError(f"too many program headers ({e_phnum})")
    if e_phnum and e_phentsize < ph_size:
        raise ElfError(f"program header entry size {e_phentsize} is too small")

    loads: list[LoadSegment] = []
    interp_off = interp_len = None
    dyn_off = dyn_len = None
    dyn_vaddr = 0
    relro: tuple[int, int] | None = None
    if e_phnum:
        table = r.read(e_phoff, e_phnum * e_phentsize, "program header table")
        unpack = ph_struct.unpack_from
        for i in range(e_phnum):
            if is64:
                p_type, p_flags, p_offset, p_vaddr, _pa, p_filesz, p_memsz, p_align = (
                    unpack(table, i * e_phentsize))
            else:
                p_type, p_offset, p_vaddr, _pa, p_filesz, p_memsz, p_flags, p_align = (
                    unpack(table, i * e_phentsize))
            if p_type == PT_LOAD:
                loads.append(LoadSegment(p_offset, p_vaddr, p_filesz, p_memsz, p_flags, p_align))
            elif p_type == PT_INTERP and interp_off is None:
                # The kernel honours the first PT_INTERP and ignores the rest.
                interp_off, interp_len = p_offset, p_filesz
            elif p_type == PT_DYNAMIC:
                # glibc keeps the last PT_DYNAMIC and reads it at its address.
                dyn_off, dyn_len, dyn_vaddr = p_offset, p_filesz, p_vaddr
            elif p_type == PT_GNU_RELRO:
                relro = (p_vaddr, p_memsz)  # last one wins in glibc too

    interp = None
    if interp_off is not None:
        if not 0 < interp_len <= MAX_STRING:
            raise ElfError("PT_INTERP has an implausible size")
        interp = _cstr(r.read(interp_off, interp_len, "PT_INTERP"))

    if dyn_off is not None:
        # What the loader parses is the memory at p_vaddr, not the bytes at
        # p_offset; they differ only in crafted files, and then glibc wins.
        mapped = _vaddr_to_offset(loads, dyn_vaddr)
        if mapped is not None:
            dyn_off = mapped

    needed: list[str] = []
    soname = rpath = runpath = None
    flags_1 = 0
    verneed: tuple[tuple[str, tuple[tuple[str, int, bool], ...]], ...] = ()
    verdef: frozenset[tuple[int, str]] | None = None
    if dyn_off is not None and dyn_len:
        ent_fmt, ent_size = (end + "qQ", 16) if is64 else (end + "iI", 8)
        count = min(dyn_len // ent_size, MAX_DYN_ENTRIES)
        dyn = r.read(dyn_off, count * ent_size, "dynamic section")
        strtab = strsz = None
        needed_offs: list[int] = []
        soname_off = rpath_off = runpath_off = verneed_at = verdef_at = None
        for tag, val in struct.iter_unpack(ent_fmt, dyn):
            if tag == DT_NULL:
                break
            if tag == DT_NEEDED:
                needed_offs.append(val)
            elif tag == DT_STRTAB:
                strtab = val
            elif tag == DT_STRSZ:
                strsz = val
            elif tag == DT_SONAME:
                soname_off = val
            elif tag == DT_RPATH:
                rpath_off = val
            elif tag == DT_RUNPATH:
                runpath_off = val
            elif tag == DT_FLAGS_1:
                flags_1 = val
            elif tag == DT_VERNEED:
                verneed_at = val
            elif tag == DT_VERDEF:
                verdef_at = val
        wanted = needed_offs or soname_off is not None or rpath_off is not None
        wanted = wanted or runpath_off is not None
        versioned = strtab is not None and (verneed_at is not None or verdef_at is not None)
        if wanted or versioned:
            if strtab is None:
                raise ElfError("dynamic section has strings but no DT_STRTAB")
            table_off = _vaddr_to_offset(loads, strtab)
            if table_off is None:
                raise ElfError("DT_STRTAB points outside every PT_LOAD")
            limit = min(strsz if strsz is not None else r.size, r.size - table_off)
            reader = _Strings(r, table_off, max(limit, 0))
            needed = [reader.get(o) for o in needed_offs]
            soname = reader.get(soname_off) if soname_off is not None else None
            rpath = reader.get(rpath_off) if rpath_off is not None else None
            runpath = reader.get(runpath_off) if runpath_off is not None else None
            # glibc skips the version check of an object without DT_STRTAB
            # (dl-version.c), so the tables count only with one.
            if verneed_at is not None:
                verneed = _read_verneed(_Block(r, loads, verneed_at, "DT_VERNEED"), reader, end)
            if verdef_at is not None:
                verdef = _read_verdef(_Block(r, loads, verdef_at, "DT_VERDEF"), reader, end)

    return ElfInfo(
        path=path,
        elf_class=elf_class,
        data=data,
        machine=e_machine,
        e_type=e_type,
        osabi=osabi,
        phentsize=e_phentsize,
        interp=interp,
        load_segments=tuple(loads),
        relro=relro,
        has_dynamic=dyn_off is not None,
        needed=tuple(needed),
        soname=soname,
        rpath=rpath,
        runpath=runpath,
        flags_1=flags_1,
        verneed=verneed,
        verdef=verdef,
    )


def _vaddr_to_offset(loads: list[LoadSegment], vaddr: int) -> int | None:
    for seg in loads:
        if seg.vaddr <= vaddr < seg.vaddr + seg.filesz:
            return vaddr - seg.vaddr + seg.offset
    return None


def _cstr(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")


class _Strings:
    """The dynamic string table, read one bounded window per string.

    Reading the whole table is wrong both ways: a window cut at a fixed size
    misses names stored past it (GNU ld may put DT_NEEDED names after a
    multi-megabyte symbol-name blob), and reading it all can exceed the read
    budget on big libraries whose few names sit at the start."""

    def __init__(self, r: _Reader, offset: int, size: int) -> None:
        self.r = r
        self.offset = offset
        self.size = size
        self.win = b""
        self.win_start = 0

    def near(self, index: int) -> str:
        """Like :meth:`get`, from one cached 4 KiB window: version names sit
        together (GNU ld puts them at the end of .dynstr), so one read serves
        a file's tens of them."""
        rel = index - self.win_start
        if 0 <= rel < len(self.win):
            end = self.win.find(b"\0", rel)
            if end >= 0:
                return self.win[rel:end].decode("utf-8", "surrogateescape")
        if 0 <= index < self.size:
            self.win = self.r.read(self.offset + index, min(self.size - index, HEAD_BYTES),
                                   "dynamic string")
            self.win_start = index
            end = self.win.find(b"\0")
            if end >= 0:
                return self.win[:end].decode("utf-8", "surrogateescape")
        return self.get(index)

    def get(self, index: int) -> str:
        if index < 0 or index >= self.size:
            raise ElfError("string offset outside the dynamic string table")
        window = min(self.size - index, MAX_DYN_STRING)
        first = min(window, 256)
        raw = self.r.read(self.offset + index, first, "dynamic string")
        end = raw.find(b"\0")
        if end < 0 and window > first:
            raw = self.r.read(self.offset + index, window, "dynamic string")
            end = raw.find(b"\0")
        if end < 0:
            raise ElfError("unterminated string in the dynamic string table")
        return raw[:end].decode("utf-8", "surrogateescape")


class _Block:
    """Small reads from one table (the version tables), served from 4 KiB
    blocks: glibc walks them by next-offsets, one 16-20 byte record at a time,
    and a pread per record would cost more than the rest of the file."""

    def __init__(self, r: _Reader, loads: list[LoadSegment], vaddr: int, what: str) -> None:
        offset = _vaddr_to_offset(loads, vaddr)
        if offset is None:
            raise ElfError(f"{what} points outside every PT_LOAD")
        self.r = r
        self.base = offset
        self.what = what
        self.start = 0
        self.buf = b""

    def get(self, rel: int, length: int) -> bytes:
        pos = self.base + rel
        if not (self.start <= pos and pos + length <= self.start + len(self.buf)):
            size = min(max(length, HEAD_BYTES), self.r.size - pos)
            self.buf = self.r.read(pos, max(size, length), self.what)
            self.start = pos
        return self.buf[pos - self.start:pos - self.start + length]


_VERNEED = {"<": struct.Struct("<HHIII"), ">": struct.Struct(">HHIII")}
_VERNAUX = {"<": struct.Struct("<IHHII"), ">": struct.Struct(">IHHII")}
_VERDEF = {"<": struct.Struct("<HHHHIII"), ">": struct.Struct(">HHHHIII")}
_VERDAUX = {"<": struct.Struct("<II"), ">": struct.Struct(">II")}


def _read_verneed(table: _Block, strings: _Strings, end: str
                  ) -> tuple[tuple[str, tuple[tuple[str, int, bool], ...]], ...]:
    """The version needs as glibc's ``_dl_check_map_versions`` walks them:
    by ``vn_next``/``vna_next`` until 0 (the counts are ignored), and only
    the first record's ``vn_version`` checked (any other value is fatal)."""
    need, aux_s = _VERNEED[end], _VERNAUX[end]
    out: list[tuple[str, tuple[tuple[str, int, bool], ...]]] = []
    pos, budget = 0, MAX_VERSION_ENTRIES
    while True:
        version, _cnt, vn_file, vn_aux, vn_next = need.unpack(table.get(pos, need.size))
        if not out and version != 1:
            raise ElfError(f"unsupported version {version} of Verneed record")
        wants: list[tuple[str, int, bool]] = []
        apos = pos + vn_aux
        while True:
            budget -= 1
            if budget < 0:
                raise ElfError("too many symbol version entries")
            vna_hash, vna_flags, _other, vna_name, vna_next = aux_s.unpack(
                table.get(apos, aux_s.size))
            wants.append((strings.near(vna_name), vna_hash, bool(vna_flags & VER_FLG_WEAK)))
            if vna_next == 0:
                break
            apos += vna_next
        out.append((strings.near(vn_file), tuple(wants)))
        if vn_next == 0:
            return tuple(out)
        pos += vn_next


def _read_verdef(table: _Block, strings: _Strings, end: str) -> frozenset[tuple[int, str]]:
    """The defined versions as ``match_symbol`` compares them: the hash and
    the first Verdaux name of each record (the base version too)."""
    vdef, vaux = _VERDEF[end], _VERDAUX[end]
    out: set[tuple[int, str]] = set()
    pos = 0
    for _ in range(MAX_VERSION_ENTRIES):
        version, _flags, _ndx, _cnt, vd_hash, vd_aux, vd_next = vdef.unpack(
            table.get(pos, vdef.size))
        if version != 1:
            raise ElfError(f"unsupported version {version} of Verdef record")
        (vda_name, _vda_next) = vaux.unpack(table.get(pos + vd_aux, vaux.size))
        out.add((vd_hash, strings.near(vda_name)))
        if vd_next == 0:
            return frozenset(out)
        pos += vd_next
    raise ElfError("too many symbol version entries")
