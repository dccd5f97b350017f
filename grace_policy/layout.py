"""PT_LOAD layout against the node's page size: the rules that glibc and the
kernel enforce when they map a file, and the ones that only bite later.

Every PT_LOAD is judged (tools that look only at the first segment miss real
cases). Each rule reports once per file, naming the first offending segment.
"""

from __future__ import annotations

from ._record import dataclass
from .elf import ElfError, ElfInfo, LoadSegment, open_regular
from .findings import Issue
from .node import NodeProfile

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .loader import Loading

#: glibc up to this version also requires p_align to be a multiple of the page.
OLD_GLIBC = (2, 34)


def _seg(seg: LoadSegment) -> str:
    return (f"PT_LOAD {seg.perms} offset 0x{seg.offset:x} vaddr 0x{seg.vaddr:x} "
            f"align 0x{seg.align:x}")


def page_issues(path: str, info: ElfInfo, node: NodeProfile, *, mapped_by_kernel: bool,
                how: Loading | None = None, name: str | None = None) -> list[Issue]:
    """Page-size problems of one file on ``node``.

    ``mapped_by_kernel``: the executable and its PT_INTERP are mapped by
    execve, which does not look at p_align; libraries are mapped by ld.so.
    ``how``: the check's files, where the .bss rule reads its few bytes,
    and its budget, charged for them (None: this host, unbounded).
    ``name``: what ld.so was asked to load (the DT_NEEDED text), which its
    error message names instead of the path (seen on a 64 KiB kernel with
    glibc 2.31 and 2.36); a dlopen or ``ld.so FILE`` names the path.
    """
    shown = name or path
    page = node.page_size
    if page <= 0 or not info.load_segments:
        return []
    base = (("page_size", str(page)), ("page_kib", str(page // 1024)),
            ("file_arch", info.machine_name), ("min_align", str(info.min_load_align or 0)))
    old = node.glibc is None or node.glibc <= OLD_GLIBC
    issues: list[Issue] = []

    if old and not mapped_by_kernel:
        bad = next((s for s in info.load_segments if s.align % page != 0), None)
        if bad is not None:
            issues.append(Issue(
                "page-align", path,
                f"error while loading shared libraries: {shown}: "
                "ELF load command alignment not page-aligned",
                facts=(*base, ("segment", _seg(bad))),
            ))

    bad = next((s for s in info.load_segments if (s.vaddr - s.offset) % page != 0), None)
    if bad is None and old and not mapped_by_kernel:
        # glibc <= 2.34 wants congruence modulo p_align itself
        # ((p_vaddr - p_offset) & (p_align - 1), unsigned: p_align 0 means
        # "equal"), which is stricter than modulo the page when p_align is
        # a larger multiple of it.
        bad = next((s for s in info.load_segments
                    if s.align % page == 0
                    and (s.vaddr - s.offset) & ((s.align - 1) % (1 << 64)) != 0), None)
    if bad is not None:
        if mapped_by_kernel:
            error = ("the kernel maps the program at the wrong file offsets: execve fails "
                     "or the program crashes at start (Segmentation fault)")
        elif old:
            error = (f"error while loading shared libraries: {shown}: "
                     "ELF load command address/offset not properly aligned")
        else:
            error = (f"error while loading shared libraries: {shown}: "
                     "ELF load command address/offset not page-aligned")
        issues.append(Issue("page-congruence", path, error,
                            facts=(*base, ("segment", _seg(bad)))))

    clobbered: set[tuple[LoadSegment, LoadSegment]] = set()
    if not any(i.rule in ("page-align", "page-congruence") for i in issues):
        # Only a file that loads at all can have its .bss overwritten.
        # info.path is where the file was read (a node image's copy), path
        # the node's name for it.
        for a, b, hit in bss_clobbers(info.path or path, info, page, how):
            clobbered.add((a, b))
            issues.append(Issue(
                "page-bss-clobber", path,
                f"with {page // 1024} KiB pages the mapping of a later segment puts "
                f"{hit.nonzero} non-zero file bytes into .bss (vaddr 0x{hit.start:x}-"
                f"0x{hit.end:x}), which must start as zeros: global or static variables "
                "there start with garbage, and the program misbehaves or crashes "
                "(Segmentation fault) with no message from the loader",
                facts=(*base, ("segment", f"{_seg(a)} and {_seg(b)}"),
                       ("detail", f"{hit.nonzero} of {hit.end - hit.start} bytes of .bss "
                                  f"at 0x{hit.start:x} come from file offset "
                                  f"0x{hit.file_offset:x}")),
            ))
            break

    segs = sorted(info.load_segments, key=lambda s: s.vaddr)
    for a, b in zip(segs, segs[1:]):
        if a.flags == b.flags or a.memsz == 0 or (clobbered and (a, b) in clobbered):
            continue
        if (a.vaddr + a.memsz - 1) // page >= b.vaddr // page:
            issues.append(Issue(
                "page-overlap", path,
                "segments with different permissions share one "
                f"{page // 1024} KiB page: the later mapping wins, so code or read-only "
                "data loses its protection or becomes unusable (Segmentation fault)",
                facts=(*base, ("segment", f"{_seg(a)} and {_seg(b)}")),
            ))
            break

    if info.relro is not None:
        start, size = info.relro
        if size and (start + size) % page != 0:
            issues.append(Issue(
                "relro-tail", path,
                f"the last {(start + size) % page} bytes of the RELRO region stay writable "
                "after relocation (weaker hardening, no crash)",
                facts=(*base, ("segment", f"PT_GNU_RELRO vaddr 0x{start:x} size 0x{size:x}")),
            ))
    return issues


def code_page_issues(path: str, info: ElfInfo, node: NodeProfile, how: Loading
                     ) -> list[Issue]:
    """Page sizes compiled into the code of one object (embedded jemalloc).
    On 4 KiB nodes nothing can be compiled for smaller pages, and the module
    is not even imported."""
    if node.page_size <= 4096:
        return []
    from .pagecode import compiled_page_issues

    return compiled_page_issues(path, info, node, how)


@dataclass(frozen=True)
class BssHit:
    """Bytes of one segment's zero-fill region that end up non-zero:
    ``[start, end)`` is the overwritten range, ``file_offset`` where the first
    non-zero byte comes from."""

    start: int
    end: int
    nonzero: int
    file_offset: int


def _down(x: int, page: int) -> int:
    return x - x % page


def _up(x: int, page: int) -> int:
    return _down(x + page - 1, page)


def bss_clobbers(path: str, info: ElfInfo, page: int, how: Loading | None = None
                 ) -> list[tuple[LoadSegment, LoadSegment, BssHit]]:
    """(earlier segment, the later one that overwrites it, what is lost) for
    each segment whose zero-fill region ends up holding non-zero bytes.

    Replays what glibc's ``_dl_map_segments`` (and, alike, the kernel's ELF
    loader) does, in program-header order: map ``[down(vaddr), up(vaddr +
    filesz))`` from file offset ``down(offset)``, then zero ``[vaddr + filesz,
    vaddr + memsz)``. A later mapping that starts in the same page as an
    earlier segment's zero fill replaces those zeros with whatever the file
    holds there. Only the affected range (less than one page per segment) is
    simulated and read, so the cost is a few small preads, and none at all for
    the usual file whose segments do not share a page.
    """
    loads = info.load_segments
    out: list[tuple[LoadSegment, LoadSegment, BssHit]] = []
    if page <= 0:
        return out
    for i, a in enumerate(loads):
        zero_start, zero_end = a.vaddr + a.filesz, a.vaddr + a.memsz
        if zero_end <= zero_start:
            continue
        later = [b for b in loads[i + 1:]
                 if b.filesz and _down(b.vaddr, page) < zero_end
                 and _up(b.vaddr + b.filesz, page) > zero_start]
        if not later:
            continue
        lo = max(zero_start, min(_down(b.vaddr, page) for b in later))
        hi = min(zero_end, max(_up(b.vaddr + b.filesz, page) for b in later))
        if hi - lo > page * 2:  # not a shared page: a crafted layout, left to others
            continue
        memory = _replay(path, loads[i:], (lo, hi), page, how)
        if memory is None:
            continue
        nonzero = len(memory) - memory.count(0)
        if nonzero:
            first = next(k for k, byte in enumerate(memory) if byte)
            culprit = later[-1]
            for b in later:
                if _down(b.vaddr, page) <= lo + first < _up(b.vaddr + b.filesz, page):
                    culprit = b
            offset = _down(culprit.offset, page) + (lo + first - _down(culprit.vaddr, page))
            out.append((a, culprit, BssHit(lo, hi, nonzero, offset)))
    return out


def _replay(path: str, loads: tuple[LoadSegment, ...], span: tuple[int, int], page: int,
            how: Loading | None) -> bytearray | None:
    """The bytes of ``span`` (``[lo, hi)``) after mapping ``loads`` in order
    (the first is the segment whose zero fill is watched); None if the file
    cannot be read (another rule reports that)."""
    lo, hi = span
    budget = how.budget if how is not None else None
    memory = bytearray(hi - lo)
    try:
        fh, st = open_regular(path, how.files) if how is not None else open_regular(path)
    except (OSError, ElfError):
        return None
    try:
        for seg in loads:
            start, end = _down(seg.vaddr, page), _up(seg.vaddr + seg.filesz, page)
            a, b = max(start, lo), min(end, hi)
            if seg.filesz and a < b:
                offset = _down(seg.offset, page) + (a - start)
                length = max(0, min(b - a, st.st_size - offset))
                if budget is not None:
                    budget.spend_bytes(length)
                data = fh.pread(length, offset) if length else b""
                # Past the end of the file the page reads as zeros.
                memory[a - lo:b - lo] = data + bytes(b - a - len(data))
            a, b = max(seg.vaddr + seg.filesz, lo), min(seg.vaddr + seg.memsz, hi)
            if a < b:
                memory[a - lo:b - lo] = bytes(b - a)
    except OSError:
        return None
    finally:
        fh.close()
    return memory

