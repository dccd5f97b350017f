"""Page sizes compiled into code: an embedded jemalloc built for smaller pages.

jemalloc fixes its page size when it is configured (``--with-lg-page``, else
the build machine's page). At start-up ``pages_boot`` compares
``sysconf(_SC_PAGESIZE)`` with that constant and, if the system page is
larger, prints ``<jemalloc>: Unsupported system page size`` and gives up:
every allocation fails. jemalloc is usually linked statically (polars,
duckdb, pyarrow), so no library name gives it away; the program headers look
fine. What is left is the code itself, and on aarch64 it is regular::

    cmp   x0, #0x1, lsl #12     // PAGE: 0x1 << 12 = 4 KiB, 0x10 << 12 = 64 KiB
    b.hi  ERR                   // system page > PAGE
    ...
    ERR: adrp x0, STR@page
         add  x0, x0, STR@pageoff
         bl   malloc_write

So: find the message in ``.rodata``, find the ``adrp``/``add`` pair that
builds its address, take the basic block it starts, and find the one
``cmp xN, #imm, lsl #12`` whose ``b.hi`` enters that block (or whose ``b.ls``
jumps over it). Anything else (no section headers, no or several readings,
another architecture, a register compare) means "not sure", and the rule says
nothing. x86_64 is not decoded: its nodes have 4 KiB pages, the smallest any
jemalloc is built for, so there is nothing to find there.

Cost: only on nodes with pages larger than 4 KiB, only for aarch64 files with
section headers; the string search reads ``.rodata`` (a few MiB at most for
the largest Python extensions), the code scan reads executable sections only
when the message is there. Both are charged to the check's Budget and skipped
(silently) when they would take more than half of what is left of it. What was
learned is kept per file identity (device, inode, size, mtime) for the rest
of the process; a clean verdict is cached by the plugin with the stat of every
file it read, so later launches do not read anything.
"""

from __future__ import annotations

import struct

from . import a64, fsprobe
from ._record import dataclass
from .elf import ELFCLASS64, ELFDATA2LSB, ElfError, ElfInfo, open_regular
from .findings import Issue
from .node import NodeProfile, is_system_path

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .fsprobe import HostFile

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .budget import Budget
    from .loader import Loading

EM_AARCH64 = 183
SHT_PROGBITS = 1
SHT_STRTAB = 3
SHF_WRITE = 1
SHF_ALLOC = 2
SHF_EXECINSTR = 4

#: The message jemalloc prints (``malloc_write`` adds nothing before it).
MESSAGE = b"<jemalloc>: Unsupported system page size"
#: The smallest page any jemalloc is built for: nodes with this page need no scan.
SMALLEST_PAGE = 4096
#: Reads are done in chunks of this size (charged to the budget one by one).
CHUNK = 4 * 1024 * 1024
#: No file has a reason to have more section headers; more means crafted.
MAX_SECTIONS = 65535
#: Instructions looked at before an ``adrp``'s ``add`` and before a block start.
LOOKBACK = 8
#: Bytes of code around the message's block searched for the guarding compare.
WINDOW = 64 * 1024
#: Candidate ``add`` words looked at, and references followed, per file: a
#: real build has a few hundred and one; past these the file is crafted or
#: unusual, and the reading gives up (silence) instead of taking long.
MAX_CANDIDATES = 20_000
MAX_REFS = 4
#: Per-process memory of readings: identity -> compiled page (0: no jemalloc
#: message, -1: present but not readable).
_known: dict[tuple[int, int, int, int], int] = {}
MAX_KNOWN = 4096
#: What the rule may read in one check, over all files (see _File.affordable).
MAX_CHECK_BYTES = 48 * 1024 * 1024
_spent: dict[tuple[int, float], int] = {}

#: Python packages known to have shipped such builds, and the first release
#: built for 64 KiB pages (polars issue 5654; duckdb 0.10.0; pyarrow 6.0.0).
FIXED_IN = {"polars": "0.20.21", "duckdb": "0.10.0", "pyarrow": "6.0.0"}


@dataclass(frozen=True)
class Section:
    name: str
    type: int
    flags: int
    addr: int
    offset: int
    size: int


class _File:
    """Bounded, budget-charged reads of one open file."""

    def __init__(self, fh: HostFile, size: int, budget: Budget | None) -> None:
        self.fh, self.size, self.budget = fh, size, budget

    def read(self, offset: int, length: int) -> bytes:
        if offset < 0 or length < 0 or offset + length > self.size:
            raise ElfError("read beyond the end of the file")
        if self.budget is not None:
            self.budget.spend_bytes(length)
        data = self.fh.pread(length, offset)
        if len(data) != length:
            raise ElfError("short read")
        return data

    def affordable(self, length: int) -> bool:
        """Whether reading ``length`` more bytes fits this rule's share of the
        check: at most half of the bytes left and :data:`MAX_CHECK_BYTES` in
        all, and only in the first half of the deadline, so the rule never
        pushes a clean check over its limits (it goes silent instead)."""
        budget = self.budget
        if budget is None:
            return True
        key = (id(budget), budget.started)
        spent = _spent.get(key, 0)
        if (length > budget.bytes_left // 2 or spent + length > MAX_CHECK_BYTES
                or budget.elapsed_ms > budget.deadline_ms / 2):
            return False
        if len(_spent) >= 64:
            _spent.clear()
        _spent[key] = spent + length
        return True


def sections(f: _File) -> list[Section]:
    """Section headers of a 64-bit little-endian ELF file (names included)."""
    head = f.read(0, 64)
    shoff, = struct.unpack_from("<Q", head, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", head, 0x3A)
    if not shoff or not shnum or shentsize < 64 or shnum > MAX_SECTIONS:
        return []
    table = f.read(shoff, shnum * shentsize)
    raw = []
    for i in range(shnum):
        name, type_, flags, addr, offset, size = struct.unpack_from(
            "<IIQQQQ", table, i * shentsize)
        raw.append((name, type_, flags, addr, offset, size))
    names = b""
    if shstrndx < shnum:
        _n, _t, _f, _a, str_off, str_size = raw[shstrndx]
        if str_size <= 1 << 20 and str_off + str_size <= f.size:
            names = f.read(str_off, str_size)
    out = []
    for name, type_, flags, addr, offset, size in raw:
        end = names.find(b"\0", name) if name < len(names) else -1
        label = names[name:end].decode("ascii", "replace") if end >= 0 else ""
        out.append(Section(label, type_, flags, addr, offset, size))
    return out


def _imports_sysconf(f: _File, secs: list[Section]) -> bool:
    """The cheap gate: jemalloc asks ``sysconf(_SC_PAGESIZE)``, so a dynamic
    object without that name in ``.dynstr`` has no jemalloc of its own to read
    (most Python extensions and C libraries). A file without ``.dynstr`` (a
    static executable) is not ruled out."""
    dyn = [s for s in secs if s.name == ".dynstr" and s.type == SHT_STRTAB]
    if not dyn:
        return True
    s = dyn[0]
    if s.offset + s.size > f.size:
        return False
    if not f.affordable(s.size):
        raise _TooDear
    return f.read(s.offset, s.size).find(b"\0sysconf\0") >= 0


def _find_message(f: _File, secs: list[Section]) -> int | None:
    """Virtual address of :data:`MESSAGE` in a ``.rodata`` section."""
    ro = [s for s in secs if s.name.startswith(".rodata") and s.type == SHT_PROGBITS
          and s.flags & SHF_ALLOC and not s.flags & (SHF_WRITE | SHF_EXECINSTR)
          and s.offset + s.size <= f.size]
    if not f.affordable(sum(s.size for s in ro)):
        raise _TooDear
    keep = len(MESSAGE) - 1
    for s in ro:
        pos, tail = 0, b""
        while pos < s.size:
            length = min(CHUNK, s.size - pos)
            data = tail + f.read(s.offset + pos, length)
            hit = data.find(MESSAGE)
            if hit >= 0:
                return s.addr + pos - len(tail) + hit
            tail = data[-keep:]
            pos += length
    return None


class _TooDear(Exception):
    """Reading what the rule needs would take too much of the budget."""


class _Unusual(Exception):
    """The code does not look like a build: stop, the reading is unsure."""


def _xrefs(f: _File, secs: list[Section], target: int) -> list[tuple[Section, int]]:
    """(section, address of the ``adrp``) of each ``adrp``+``add`` pair that
    computes ``target``, found by the ``add``'s fixed bytes."""
    code = [s for s in secs if s.type == SHT_PROGBITS and s.flags & SHF_EXECINSTR
            and s.flags & SHF_ALLOC and s.offset + s.size <= f.size and s.addr % 4 == 0]
    if not f.affordable(sum(s.size for s in code)):
        raise _TooDear
    lo = target & 0xFFF
    page = target & ~0xFFF
    # add xD, xN, #lo: bytes 1..3 are ((lo & 63) << 2 | N >> 3), lo >> 6, 0x91.
    # N is x0..x7 in every build seen (the argument register); the other
    # three needles cost a pass over the code each, so they are a fallback.
    needles = [bytes(((lo & 63) << 2 | hi_n, lo >> 6, 0x91)) for hi_n in range(4)]
    first = _scan(f, code, needles[:1], page)
    return first or _scan(f, code, needles[1:], page)


def _scan(f: _File, code: list[Section], needles: list[bytes], page: int
          ) -> list[tuple[Section, int]]:
    found: dict[int, Section] = {}
    back = 4 * LOOKBACK
    seen = 0
    for s in code:
        pos = 0
        while pos < s.size:
            length = min(CHUNK, s.size - pos)
            # Each chunk re-reads the few words before it (an adrp may sit
            # there), instead of gluing a tail on: no copy of the chunk.
            lead = min(pos, back)
            data = f.read(s.offset + pos - lead, length + lead)
            base = s.addr + pos - lead  # address of data[0]
            for needle in needles:
                at = data.find(needle, lead)
                while at >= 0:
                    word_at = at - 1
                    seen += 1
                    if seen > MAX_CANDIDATES or len(found) > MAX_REFS:
                        raise _Unusual
                    if word_at % 4 == 0:
                        ref = _adrp_before(data, word_at, base, page)
                        if ref is not None:
                            found[ref] = s
                    at = data.find(needle, at + 1)
            pos += length
    return [(s, ref) for ref, s in found.items()]


def _word(data: bytes, at: int) -> int:
    return int.from_bytes(data[at:at + 4], "little")


def _adrp_before(data: bytes, add_at: int, base: int, page: int) -> int | None:
    add = a64.add_imm(_word(data, add_at))
    if add is None:
        return None
    _rd, rn, _imm = add
    for k in range(1, LOOKBACK + 1):
        at = add_at - 4 * k
        if at < 0:
            return None
        word = _word(data, at)
        hit = a64.adrp(word, base + at)
        if hit is not None and hit[0] == rn:
            return base + at if hit[1] == page else None
        if word & 31 == rn or a64.is_branch(word):
            return None  # something else may write xN (conservative), or control flow
    return None


def _guards(f: _File, sec: Section, ref: int) -> set[tuple[int, int]]:
    """(address, constant) of each compare whose branch leads to the block
    that starts at (or a few instructions before) ``ref``."""
    start = max(sec.addr, ref - WINDOW)
    end = min(sec.addr + sec.size, ref + WINDOW)
    data = f.read(sec.offset + (start - sec.addr), end - start)

    def word(addr: int) -> int:
        return _word(data, addr - start)

    entries = {ref}
    block = ref
    for _ in range(LOOKBACK):
        if block - 4 < start or a64.is_branch(word(block - 4)):
            break
        block -= 4
        entries.add(block)
    readings: set[tuple[int, int]] = set()
    # b.ls just before the block (the block is the fall-through path).
    before = block - 4
    if before >= start:
        br = a64.b_cond(word(before), before)
        if br is not None and br[0] == a64.COND_LS and br[1] > ref:
            found = _compare_before(word, before, start)
            if found is not None:
                readings.add(found)
    # b.hi into the block from anywhere in the window; the compare words
    # are found by their fixed bytes (cmp xN, #imm, lsl #12: 0x40|imm>>6, 0xf1).
    at = data.find(b"\xf1")
    while at >= 0:
        if at % 4 == 3:
            addr = start + at - 3
            cmp = a64.cmp_imm(word(addr))
            if cmp is not None:
                for k in range(1, 4):
                    pc = addr + 4 * k
                    if pc + 4 > end:
                        break
                    w = word(pc)
                    br = a64.b_cond(w, pc)
                    if br is not None:
                        if br[0] == a64.COND_HI and br[1] in entries:
                            readings.add((addr, cmp[1]))
                        break
                    if a64.sets_flags(w) or a64.is_branch(w):
                        break
        at = data.find(b"\xf1", at + 1)
    return readings


def _compare_before(word, branch_at: int, start: int  # type: ignore[no-untyped-def]
                    ) -> tuple[int, int] | None:
    for k in range(1, 4):
        pc = branch_at - 4 * k
        if pc < start:
            return None
        w = word(pc)
        cmp = a64.cmp_imm(w)
        if cmp is not None:
            return pc, cmp[1]
        if a64.sets_flags(w) or a64.is_branch(w):
            return None
    return None


def read_compiled_page(path: str, budget: Budget | None = None,
                       files: fsprobe.Files = fsprobe.HOST) -> int | None:
    """The page size jemalloc was built for, if ``path`` (in ``files``)
    embeds one and its start-up check can be read; 0 when there is no
    jemalloc message; None when unsure (or the reading would cost too much
    of ``budget``)."""
    try:
        st = files.stat(path)
    except OSError:
        return None
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    known = _known.get(key)
    if known is not None:
        return known if known >= 0 else None
    try:
        fh, st = open_regular(path, files)
    except (OSError, ElfError):
        return None
    try:
        value = _read(_File(fh, st.st_size, budget))
    except _TooDear:
        return None
    except (ElfError, OSError, struct.error, _Unusual):
        value = -1
    finally:
        fh.close()
    if len(_known) >= MAX_KNOWN:
        _known.clear()
    _known[(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)] = value
    return value if value >= 0 else None


@dataclass(frozen=True)
class Reading:
    """What the code scan saw in one file (for tests and ``inspect``)."""

    #: Compiled page size; 0: no jemalloc message; -1: not readable with certainty.
    page: int
    #: Virtual address of the message, None when absent.
    message: int | None = None
    #: Addresses of the ``adrp`` instructions that build its address.
    refs: tuple[int, ...] = ()
    #: (address, constant) of the compares guarding those blocks.
    compares: tuple[tuple[int, int], ...] = ()


def _read(f: _File) -> int:
    return scan(f).page


def scan(f: _File) -> Reading:
    unsure = Reading(-1)
    if f.size < 64:
        return unsure
    ident = f.read(0, 20)
    if (ident[:4] != b"\x7fELF" or ident[4] != ELFCLASS64 or ident[5] != ELFDATA2LSB
            or int.from_bytes(ident[18:20], "little") != EM_AARCH64):
        return unsure
    secs = sections(f)
    if not secs:
        return unsure
    if not _imports_sysconf(f, secs):
        return Reading(0)
    target = _find_message(f, secs)
    if target is None:
        return Reading(0)
    refs = _xrefs(f, secs, target)
    compares: set[tuple[int, int]] = set()
    for sec, ref in refs:
        compares |= _guards(f, sec, ref)
    values = {value for _addr, value in compares}
    page = values.pop() if len(values) == 1 else -1
    if page < SMALLEST_PAGE or page & (page - 1):
        page = -1
    return Reading(page, target, tuple(sorted(ref for _s, ref in refs)),
                   tuple(sorted(compares)))


def inspect_file(path: str) -> Reading:
    """:func:`scan` of ``path`` without budget or cache (tests, ``inspect``)."""
    fh, st = open_regular(path)
    try:
        return scan(_File(fh, st.st_size, None))
    except _Unusual:
        return Reading(-1)
    finally:
        fh.close()


def _package(path: str) -> str | None:
    """The top-level Python package a file belongs to, from its path."""
    parts = path.split("/")
    for i, part in enumerate(parts[:-1]):
        if part in ("site-packages", "dist-packages"):
            name = parts[i + 1]
            return name if name in FIXED_IN else None
    return None


def compiled_page_issues(path: str, info: ElfInfo, node: NodeProfile,
                         how: Loading | None = None) -> list[Issue]:
    """The ``page-size-compiled`` issue for one ELF file (executable, library
    or Python extension module) on ``node``, or nothing.

    Never raises for bad files; only the budget's own ``BudgetExceeded``
    (deadline) propagates, as in every other check. The node's own system
    files (:func:`~grace_policy.node.is_system_path`) are built for it and
    are not read, which keeps the rule's reads to what users bring.
    """
    page = node.page_size
    if (page <= SMALLEST_PAGE or node.machine != "aarch64" or not node.runs(info)
            or is_system_path(path)):
        return []
    # Read where the ELF facts were read (a node image's copy of ``path``).
    compiled = (read_compiled_page(info.path or path, how.budget, how.files) if how is not None
                else read_compiled_page(info.path or path))
    if not compiled or compiled >= page:
        return []
    package = _package(path)
    if package is not None:
        fix = (f"{package} {FIXED_IN[package]} and later are built for 64 KiB pages: "
               f"pip install '{package}>={FIXED_IN[package]}' in an environment used on "
               "these nodes.")
    else:
        fix = ("Use a build whose jemalloc is configured with --with-lg-page=16 "
               "(it works on 4 KiB and 64 KiB pages), or ask its provider for one.")
    return [Issue(
        "page-size-compiled", path,
        f"{path}: its jemalloc was built for {compiled // 1024} KiB pages and refuses "
        f"this node's {page // 1024} KiB pages at start-up ('<jemalloc>: Unsupported "
        "system page size', unless the program silences it): every allocation through "
        "it then fails, and the program or the Python import aborts (polars) or fails "
        "with an out-of-memory error (duckdb, whose interpreter then hangs at exit)",
        facts=(("page_size", str(page)), ("page_kib", str(page // 1024)),
               ("file_arch", info.machine_name), ("allocator", "jemalloc"),
               ("compiled_page_kib", str(compiled // 1024)), ("fix_hint", fix),
               ("detail", f"cmp with {compiled:#x} guarding jemalloc's page-size message")),
    )]
