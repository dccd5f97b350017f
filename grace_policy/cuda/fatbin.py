"""What CUDA kernel images one ELF file carries, read from headers only.

nvcc (and clang) put the device code of a file into *fat binaries*: a 16-byte
header (magic ``0xBA55ED50``, version 1, header size, size of what follows)
and a run of entries, each a header of 64 bytes or more followed by its
payload, a cubin (machine code for one GPU architecture) or PTX (the virtual
ISA the driver can JIT-compile). The executable fat binaries of a linked file
lie in the section ``.nv_fatbin``; ``-rdc=true`` objects keep relocatable
ones, for a later device link, in ``__nv_relfatbin``; and each module the CUDA
runtime registers at start-up has a 24-byte wrapper (magic ``0x466243B1``)
in ``.nvFatBinSegment`` whose pointer names its fat binary.

NVIDIA does not document the container. The entry fields used here (see
docs/CUDA.md, "How the fat binary is read") are the ones open-source readers
agree on, and where they did not (how ``a`` and ``f`` targets are marked,
where the PTX ISA version sits) cuobjdump decided: tests/cuda compares this
reader with ``cuobjdump --list-elf --list-ptx`` (and ``-elf``/``-ptx``) on
every file of a corpus of nvcc-built fixtures and real CUDA libraries.

Only headers are read: a payload is skipped by its size, never read, never
decompressed. Reads go through a small window (one ``pread`` usually covers
an entry header and the next one when payloads are small) and through the
check's budget. Every size is checked against its fat binary, its section
and the file; every walk has a cap. A hostile or truncated file gives
:attr:`FatbinInfo.problems`, never an exception; only the budget's own
``BudgetExceeded`` (the check's deadline or byte cap) propagates.
"""

from __future__ import annotations

import bisect
import errno
import os
import struct

from .._record import dataclass

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs ms to import; annotations are strings anyway
    from ..budget import Budget

FATBIN_MAGIC = 0xBA55ED50
WRAPPER_MAGIC = 0x466243B1

KIND_PTX = 1
KIND_ELF = 2

#: Entry flags (u64 at offset 40). The compression bits are the ones the
#: open readers name; the two target bits were found by building each kind
#: of target with nvcc and reading cuobjdump -elf / --list-ptx: 0x100000 is
#: an ``a`` (architecture-specific) target, 0x200000 an ``f`` (family) one.
FLAG_LZ4 = 0x2000
FLAG_ZSTD = 0x8000
FLAG_ARCH_SPECIFIC = 0x100000
FLAG_FAMILY = 0x200000

#: Sections that hold fat binaries, and whether the driver loads their
#: images as they are (relocatable ones only feed a device link).
FATBIN_SECTIONS = {".nv_fatbin": False, "__nv_relfatbin": True}
WRAPPER_SECTION = ".nvFatBinSegment"

SHT_NOBITS = 8
SHN_XINDEX = 0xFFFF

#: Caps that keep a hostile file from making the walk long. Real files stay
#: far below them: a torch CUDA library has ~500 fat binaries and ~3000
#: entries, cuBLASLt a few thousand of each.
MAX_ENTRIES = 200_000
MAX_FATBINS = 100_000
MAX_WRAPPERS = 65_536
#: Section header table and section-name table, in bytes.
MAX_SECTION_TABLE = 1 << 20
MAX_SHSTRTAB = 1 << 20
#: An entry header is 64 bytes in every file seen (80, 96, 112, 120 with
#: extensions); anything outside these bounds is not a header.
MIN_ENTRY_HEADER = 64
MAX_ENTRY_HEADER = 4096
#: Zero bytes skipped between two fat binaries of one section (the linker
#: aligns each object's fat binary; 256 bytes seen on aarch64).
MAX_PADDING = 64 * 1024
#: Bytes read per window: a fat binary header, an entry header and, for
#: small payloads, the next header too.
WINDOW = 512
#: At most this many problems are kept per file (the first ones say why).
MAX_PROBLEMS = 8

_FATBIN_HEADER = struct.Struct("<IHHQ")
_ENTRY_HEAD = struct.Struct("<HHIQ")
_ENTRY_TARGET = struct.Struct("<II")
_FLAGS = struct.Struct("<Q")
_SHDR = struct.Struct("<IIQQQQIIQQ")
_WRAPPER = struct.Struct("<IIQQ")


@dataclass(frozen=True)
class Entry:
    """One kernel image of a fat binary."""

    #: "cubin", "ptx" or "other" (a kind number this reader does not know).
    kind: str
    #: The SM number as the header has it: 80 for sm_80, 100 for sm_100.
    sm: int
    #: "" for a plain target, "a" architecture-specific, "f" family.
    variant: str
    #: For PTX the ISA version (its ``.version``); for a cubin the ELF code
    #: version cuobjdump prints as ``code version = [1,8]``.
    version: tuple[int, int]
    #: "" (stored as is), "zstd" or "lz4".
    compression: str
    #: From ``__nv_relfatbin``: input for a device link, not loaded as is.
    relocatable: bool
    #: File offset of the entry header (for messages and tests).
    offset: int

    @property
    def arch(self) -> str:
        """``sm_90a`` for a cubin, ``compute_90a`` for PTX (nvcc's names)."""
        prefix = "compute_" if self.kind == "ptx" else "sm_"
        return f"{prefix}{self.sm}{self.variant}"

    @property
    def capability(self) -> tuple[int, int]:
        """The compute capability the image targets: (10, 0) for sm_100."""
        return divmod(self.sm, 10)


@dataclass(frozen=True)
class FatbinInfo:
    """What one file's fat binaries hold."""

    path: str
    entries: tuple[Entry, ...] = ()
    #: How many fat binaries were walked.
    fatbins: int = 0
    #: Why some or all of the file could not be read (hostile or truncated
    #: sizes, caps reached, read errors); empty for a well-formed file.
    problems: tuple[str, ...] = ()
    #: Wrappers whose pointer is left to a relocation (object files; the
    #: sections were walked instead).
    unresolved_wrappers: int = 0

    @property
    def has_kernels(self) -> bool:
        return bool(self.entries)

    def loadable(self) -> tuple[Entry, ...]:
        """The images the CUDA runtime hands to the driver: the executable
        fat binaries when the file has any, else the relocatable ones (what
        ``cuobjdump`` lists by default, too)."""
        executable = tuple(e for e in self.entries if not e.relocatable)
        return executable or self.entries

    def holds(self) -> str:
        """The distinct targets, sorted: ``"sm_80 sm_90 compute_90"``."""
        seen = {(e.kind != "cubin", e.sm, e.variant): e.arch for e in self.loadable()}
        return " ".join(seen[k] for k in sorted(seen))


class _Stop(Exception):
    """The walk of this file ends here (a cap or an unreadable region); the
    reason is already in the problems."""


#: preadv2(RWF_NOWAIT) answers from the page cache or fails with EAGAIN
#: instead of waiting for the disk (Linux 4.14+, Python 3.7+).
_NOWAIT = getattr(os, "RWF_NOWAIT", 0) if hasattr(os, "preadv") else 0
_WILLNEED = getattr(os, "POSIX_FADV_WILLNEED", None)


class _Reader:
    """Bounded positional reads, charged to the budget.

    A file that is not in the page cache (the first check after a reboot, a
    network filesystem) costs one disk round trip per header if headers are
    read one after the other, and a big library has thousands of them. So
    where the file is a host file descriptor, a read first asks the page
    cache only (``RWF_NOWAIT``); what is not there is asked for with
    ``POSIX_FADV_WILLNEED`` and read later, after the hints for every other
    header of the same round have gone out, so the disk serves them
    together. A file whose pages are cached pays nothing extra."""

    def __init__(self, fh, size: int, budget: Budget | None) -> None:  # type: ignore[no-untyped-def]
        self.fh = fh
        self.size = size
        self.budget = budget
        self.start = 0
        self.buf = b""
        self.problems: list[str] = []
        fd = getattr(fh, "fd", None)
        self.fd: int | None = fd if isinstance(fd, int) and _NOWAIT and _WILLNEED else None

    def problem(self, text: str) -> None:
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(text)

    def _check(self, offset: int, length: int) -> None:
        if offset < 0 or offset + length > self.size:
            self.problem(f"a header at offset {offset} runs past the end of the file")
            raise _Stop

    def pread(self, offset: int, length: int, *, charged: bool = False) -> bytes:
        """``length`` bytes at ``offset`` (already checked against the file
        size), waiting for the disk if need be."""
        if self.budget is not None and not charged:
            self.budget.spend_bytes(length)
        try:
            data = self.fh.pread(length, offset)
        except OSError as exc:
            self.problem(f"read failed at offset {offset}: {exc.strerror or exc}")
            raise _Stop from None
        if len(data) < length:
            self.problem(f"the file ended at offset {offset + len(data)} while reading")
            raise _Stop
        return data  # type: ignore[no-any-return]

    def cached(self, offset: int, length: int, need: int) -> bytes | bytearray | None:
        """At least ``need`` of ``length`` bytes at ``offset`` if the page
        cache has them; else None, with a read-ahead hint sent. The caller
        has charged the bytes (:meth:`charge`), also for its later
        :meth:`pread` of what was not cached."""
        if self.fd is None:
            return self.pread(offset, length, charged=True)
        buf = bytearray(length)
        try:
            got = os.preadv(self.fd, [buf], offset, _NOWAIT)
        except BlockingIOError:
            got = 0
        except OSError as exc:
            if exc.errno in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                self.fd = None  # this filesystem has no RWF_NOWAIT: plain reads
                return self.pread(offset, length, charged=True)
            self.problem(f"read failed at offset {offset}: {exc.strerror or exc}")
            raise _Stop from None
        if got >= need:
            if got < length:
                del buf[got:]
            return buf
        self.hint(offset, length)
        return None

    def charge(self, nbytes: int) -> None:
        """Charge reads about to be made (the budget raises before them)."""
        if self.budget is not None and nbytes:
            self.budget.spend_bytes(nbytes)

    def hint(self, offset: int, length: int) -> None:
        if self.fd is not None:
            try:
                os.posix_fadvise(self.fd, offset, length, _WILLNEED)  # type: ignore[arg-type]
            except OSError:
                self.fd = None

    def prefetch(self, offsets: list[int]) -> None:
        """Ask for every offset's page at once when the first is not cached."""
        if self.fd is None or not offsets:
            return
        first = min(offsets[0], self.size - 16)
        if first < 0:
            return
        self.charge(16)
        if self.cached(first, 16, 16) is not None:
            return
        for offset in offsets[:MAX_WRAPPERS]:
            self.hint(offset, WINDOW)

    def read(self, offset: int, length: int, window: int = WINDOW) -> bytes:
        """``length`` bytes at ``offset`` through one window; :class:`_Stop`
        (with a problem) when the file ends first or the read fails."""
        end = offset + length
        if self.start <= offset and end <= self.start + len(self.buf):
            return self.buf[offset - self.start:end - self.start]
        self._check(offset, length)
        want = min(max(length, window), self.size - offset)
        data = self.pread(offset, want)
        self.start, self.buf = offset, data
        return data[:length]


@dataclass(frozen=True)
class _Section:
    name: str
    type: int
    addr: int
    offset: int
    size: int


def _sections(r: _Reader) -> list[_Section]:
    """The section headers with their names (64-bit little-endian only)."""
    if r.size < 64:
        return []
    ident = r.read(0, 64)
    if ident[:4] != b"\x7fELF" or ident[4] != 2 or ident[5] != 1:
        return []  # not a 64-bit LE ELF: no CUDA images this reader knows
    (shoff,) = struct.unpack_from("<Q", ident, 40)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", ident, 58)
    if shoff == 0:
        return []  # no section headers (sstrip): nothing to find by name
    if shentsize != _SHDR.size:
        r.problem(f"section headers of {shentsize} bytes, not 64")
        return []
    if shnum == 0 or shstrndx == SHN_XINDEX:
        first = _SHDR.unpack(r.read(shoff, _SHDR.size))
        shnum = shnum or first[5]
        if shstrndx == SHN_XINDEX:
            shstrndx = first[6]
    if shnum * _SHDR.size > MAX_SECTION_TABLE:
        r.problem(f"{shnum} section headers, more than this reader reads")
        return []
    table = r.read(shoff, shnum * _SHDR.size, window=0)
    raw = [_SHDR.unpack_from(table, i * _SHDR.size) for i in range(shnum)]
    if shstrndx >= shnum:
        r.problem("the section name table index is out of range")
        return []
    _n, stype, _f, _a, stroff, strsize = raw[shstrndx][:6]
    if stype == SHT_NOBITS or strsize > MAX_SHSTRTAB or stroff + strsize > r.size:
        r.problem("the section name table is missing or out of bounds")
        return []
    names = r.read(stroff, strsize, window=0) if strsize else b""
    out = []
    for name_off, stype, _flags, addr, offset, size, *_rest in raw:
        end = names.find(b"\0", name_off)
        if name_off >= len(names) or end < 0:
            continue
        name = names[name_off:end].decode("latin-1")
        out.append(_Section(name, stype, addr, offset, size))
    return out


class _Cursor:
    """Where the walk of one fat binary's entries stands."""

    __slots__ = ("bstart", "buf", "out", "pos", "relocatable", "stop")

    def __init__(self, pos: int, stop: int, relocatable: bool) -> None:
        self.pos, self.stop, self.relocatable = pos, stop, relocatable
        self.out: list[Entry] = []
        self.bstart = 0
        self.buf: bytes | bytearray = b""


class _Walk:
    """The state of one file's walk: the fat binaries found, then their
    entries, walked a round at a time across all of them."""

    def __init__(self, r: _Reader) -> None:
        self.r = r
        self.cursors: list[_Cursor] = []
        self.starts: set[int] = set()
        self.count = 0

    @property
    def entries(self) -> list[Entry]:
        return [e for c in self.cursors for e in c.out]

    def region(self, start: int, end: int, relocatable: bool, *, one: bool = False) -> None:
        """Every fat binary from ``start`` to ``end`` (a section), or only
        the first when ``one``; zero padding between them is skipped."""
        r = self.r
        pos = start
        while pos + _FATBIN_HEADER.size <= end:
            head = r.read(pos, _FATBIN_HEADER.size)
            magic, version, hsize, size = _FATBIN_HEADER.unpack(head)
            if magic != FATBIN_MAGIC:
                if head[:8] == bytes(8) and not one:
                    pos = self._skip_zeros(pos, end)
                    continue
                r.problem(f"bytes at offset {pos} are not a fat binary header")
                return
            if version != 1 or not _FATBIN_HEADER.size <= hsize <= MAX_ENTRY_HEADER:
                r.problem(f"fat binary at offset {pos}: version {version}, header size {hsize}")
                return
            if len(self.cursors) >= MAX_FATBINS:
                r.problem(f"more than {MAX_FATBINS} fat binaries; the rest were not read")
                raise _Stop
            self.starts.add(pos)
            stop = pos + hsize + size
            if stop > end:
                r.problem(f"fat binary at offset {pos} claims {size} bytes, past the end of "
                          "its section")
                stop = end
            self.cursors.append(_Cursor(pos + hsize, stop, relocatable))
            if one:
                return
            pos = (stop + 7) & ~7

    def _skip_zeros(self, pos: int, end: int) -> int:
        """The first 8-byte-aligned offset at or after ``pos`` whose bytes are
        not all zero (``end`` when none is); bounded by :data:`MAX_PADDING`."""
        limit = min(end, pos + MAX_PADDING)
        while pos < limit:
            n = min(4096, limit - pos)
            chunk = self.r.read(pos, n, window=n)
            stripped = len(chunk.lstrip(b"\0"))
            if stripped:
                return pos + ((n - stripped) & ~7)
            pos += n
        if pos < end:
            self.r.problem(f"more than {MAX_PADDING} zero bytes between fat binaries")
            return end
        return pos

    def walk_entries(self) -> None:
        """Every fat binary's entries, one entry of each per round: the
        headers a round needs are asked of the disk together (see
        :class:`_Reader`), so a cold file costs about one round trip per
        round (the most entries one fat binary has), not one per entry."""
        r = self.r
        active = [c for c in self.cursors if c.pos + MIN_ENTRY_HEADER <= c.stop]
        while active:
            # Charged once a round, before its reads: each cursor whose next
            # header is not in its window reads at most one window.
            r.charge(sum(min(WINDOW, c.stop - c.pos) for c in active
                         if not 0 <= c.pos - c.bstart <= len(c.buf) - 48))
            waiting, more = [], []
            for c in active:
                at = c.pos - c.bstart
                if at < 0 or at + 48 > len(c.buf):
                    data = r.cached(c.pos, min(WINDOW, c.stop - c.pos), 48)
                    if data is None:
                        waiting.append(c)
                        continue
                    c.bstart, c.buf = c.pos, data
                if self._step(c):
                    more.append(c)
            for c in waiting:
                c.bstart = c.pos
                c.buf = r.pread(c.pos, min(WINDOW, c.stop - c.pos), charged=True)
                if self._step(c):
                    more.append(c)
            active = more

    def _step(self, c: _Cursor) -> bool:
        """Take the entry at the cursor (its header is in ``c.buf``); whether
        the fat binary has more."""
        r = self.r
        if self.count >= MAX_ENTRIES:
            r.problem(f"more than {MAX_ENTRIES} kernel images; the rest were not read")
            raise _Stop
        buf, at, pos = c.buf, c.pos - c.bstart, c.pos
        kind, _v, ehs, psz = _ENTRY_HEAD.unpack_from(buf, at)
        if not MIN_ENTRY_HEADER <= ehs <= MAX_ENTRY_HEADER:
            r.problem(f"entry at offset {pos}: header size {ehs}")
            return False
        nxt = pos + ehs + psz
        if nxt > c.stop:
            r.problem(f"entry at offset {pos} claims {psz} bytes, past the end of its "
                      "fat binary")
            return False
        version, sm = _ENTRY_TARGET.unpack_from(buf, at + 24)
        (flags,) = _FLAGS.unpack_from(buf, at + 40)
        c.out.append(Entry(
            "ptx" if kind == KIND_PTX else "cubin" if kind == KIND_ELF else "other",
            sm,
            "a" if flags & FLAG_ARCH_SPECIFIC else "f" if flags & FLAG_FAMILY else "",
            (version >> 16, version & 0xFFFF),
            "zstd" if flags & FLAG_ZSTD else "lz4" if flags & FLAG_LZ4 else "",
            c.relocatable,
            pos,
        ))
        self.count += 1
        c.pos = nxt
        return nxt + MIN_ENTRY_HEADER <= c.stop


def _wrapper_targets(r: _Reader, sections: list[_Section]) -> tuple[list[tuple[int, int]], int]:
    """(file offset, end of its section) of the fat binary each
    ``.nvFatBinSegment`` wrapper points to, and how many pointers are left
    to relocations (zero in the file: object files; the sections are walked
    instead)."""
    wrap = next((s for s in sections if s.name == WRAPPER_SECTION and s.type != SHT_NOBITS),
                None)
    if wrap is None or wrap.offset + wrap.size > r.size:
        return [], 0
    count = min(wrap.size // _WRAPPER.size, MAX_WRAPPERS)
    if wrap.size // _WRAPPER.size > MAX_WRAPPERS:
        r.problem(f"more than {MAX_WRAPPERS} fat binary wrappers; the rest were not read")
    if not count:
        return [], 0
    data = r.read(wrap.offset, count * _WRAPPER.size, window=0)
    mapped = sorted((s.addr, s.addr + s.size, s.offset) for s in sections
                    if s.type != SHT_NOBITS and s.addr and s.size)
    addrs = [m[0] for m in mapped]
    targets, unresolved, seen = [], 0, set()
    for magic, _version, pointer, _extra in _WRAPPER.iter_unpack(data):
        if magic != WRAPPER_MAGIC:
            continue
        if pointer == 0:
            unresolved += 1
            continue
        if pointer in seen:
            continue
        seen.add(pointer)
        i = bisect.bisect_right(addrs, pointer) - 1
        if i >= 0 and pointer < mapped[i][1]:
            start, end, offset = mapped[i]
            targets.append((offset + (pointer - start), offset + (end - start)))
    return targets, unresolved


def read_fatbins(path: str, files, budget: Budget | None = None) -> FatbinInfo:  # type: ignore[no-untyped-def]
    """The kernel images of the ELF file ``path``.

    ``files`` opens it: an object with ``open_regular(path) -> (file, stat)``
    whose file has ``pread(length, offset)`` and ``close()``, i.e.
    :mod:`grace_policy.fsprobe` or a view with the same methods. ``budget``
    (:class:`grace_policy.budget.Budget`) is charged every byte read; its
    ``BudgetExceeded`` propagates, everything else becomes a problem."""
    try:
        fh, st = files.open_regular(path)
    except OSError as exc:
        return FatbinInfo(path=path, problems=(f"cannot open: {exc.strerror or exc}",))
    r = _Reader(fh, st.st_size, budget)
    walk = _Walk(r)
    unresolved = 0
    try:
        sections = _sections(r)
        targets, unresolved = _wrapper_targets(r, sections)
        r.prefetch([t[0] for t in targets])
        walked = []
        for s in sections:
            relocatable = FATBIN_SECTIONS.get(s.name)
            if relocatable is None or s.type == SHT_NOBITS or not s.size:
                continue
            if s.offset + s.size > r.size:
                r.problem(f"section {s.name} runs past the end of the file")
                continue
            walked.append((s.offset, s.offset + s.size))
            walk.region(s.offset, s.offset + s.size, relocatable)
        for offset, end in targets:
            if offset in walk.starts:
                continue
            if any(a <= offset < b for a, b in walked):
                r.problem(f"a wrapper points into the middle of a fat binary section "
                          f"(offset {offset})")
                continue
            walk.region(offset, end, False, one=True)
        walk.walk_entries()
    except _Stop:
        pass
    finally:
        fh.close()
    return FatbinInfo(path=path, entries=tuple(walk.entries), fatbins=len(walk.cursors),
                      problems=tuple(r.problems), unresolved_wrappers=unresolved)
