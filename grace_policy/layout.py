"""PT_LOAD layout against the node's page size: the rules that glibc and the
kernel enforce when they map a file, and the ones that only bite later.

Every PT_LOAD is judged (tools that look only at the first segment miss real
cases). Each rule reports once per file, naming the first offending segment.
"""

from __future__ import annotations

from .elf import ElfInfo, LoadSegment
from .findings import Issue
from .node import NodeProfile

#: glibc up to this version also requires p_align to be a multiple of the page.
OLD_GLIBC = (2, 34)


def _seg(seg: LoadSegment) -> str:
    return (f"PT_LOAD {seg.perms} offset 0x{seg.offset:x} vaddr 0x{seg.vaddr:x} "
            f"align 0x{seg.align:x}")


def page_issues(path: str, info: ElfInfo, node: NodeProfile, *, mapped_by_kernel: bool,
                name: str | None = None) -> list[Issue]:
    """Page-size problems of one file on ``node``.

    ``mapped_by_kernel``: the executable and its PT_INTERP are mapped by
    execve, which does not look at p_align; libraries are mapped by ld.so.
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

    segs = sorted(info.load_segments, key=lambda s: s.vaddr)
    for a, b in zip(segs, segs[1:]):
        if a.flags == b.flags or a.memsz == 0:
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
