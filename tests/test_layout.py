"""Page rules on compiled files: x86_64 and aarch64 builds with 4 KiB and
64 KiB max-page-size, judged on 4 KiB and 64 KiB nodes with glibc 2.34
(p_align rule) and 2.35+ (congruence only). Every PT_LOAD counts: cases are
built where only a later segment is wrong.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from elfpatch import load_headers, set_load_align
from fixtures.build import ElfBuilder, loader_list, src

from grace_policy.elf import read_elf
from grace_policy.layout import page_issues
from grace_policy.node import NodeProfile

K4, K64 = 4096, 65536
OLD, NEW = (2, 34), (2, 35)


def node(arch: str, page: int, glibc: tuple[int, int] | None = NEW) -> NodeProfile:
    return NodeProfile(machine=arch, page_size=page, glibc=glibc)


def rules(path: Path, n: NodeProfile, *, kernel: bool = False) -> dict[str, str]:
    """{rule: offending segment} for ``path`` on ``n``."""
    info = read_elf(str(path))
    return {i.rule: i.fact("segment") for i in page_issues(str(path), info, n,
                                                           mapped_by_kernel=kernel)}


def lib(builder: ElfBuilder, arch: str, page: int, *extra: str) -> Path:
    name = f"lib/{arch}-{page}-{len(extra)}/libgreet.so.1"
    return builder.library(name, arch=arch, page_size=page, extra_flags=extra)  # type: ignore[arg-type]


@pytest.mark.parametrize("arch", ["x86_64", pytest.param("aarch64", marks=pytest.mark.cross)])
def test_page_size_builds_on_both_nodes(elf_builder: ElfBuilder, arch: str) -> None:
    small, big = lib(elf_builder, arch, K4), lib(elf_builder, arch, K64)
    # 4 KiB node: both load.
    for f in (small, big):
        assert not {"page-align", "page-congruence", "page-overlap"} & set(
            rules(f, node(arch, K4, OLD)))
    # 64 KiB node: the 64 KiB build loads, the 4 KiB build does not.
    assert not {"page-align", "page-congruence", "page-overlap"} & set(
        rules(big, node(arch, K64, OLD)))
    on_new = rules(small, node(arch, K64, NEW))
    assert "page-congruence" in on_new and "page-overlap" in on_new
    assert "page-align" not in on_new                        # glibc >= 2.35 ignores p_align
    assert "page-align" in rules(small, node(arch, K64, OLD))  # glibc <= 2.34 refuses it


def test_unknown_glibc_is_judged_strictly(elf_builder: ElfBuilder) -> None:
    small = lib(elf_builder, "x86_64", K4)
    assert "page-align" in rules(small, node("x86_64", K64, None))


def test_only_a_later_segment_is_incongruent(elf_builder: ElfBuilder) -> None:
    """-z separate-code with 4 KiB pages: the first three PT_LOADs have
    vaddr == offset (fine everywhere), only the RW one is shifted by 4 KiB.
    A checker that looks at the first segment calls this file clean."""
    f = lib(elf_builder, "x86_64", K4, "-Wl,-z,separate-code")
    loads = [h for _, h in load_headers(f)]
    assert len(loads) >= 3
    assert all(s["vaddr"] == s["offset"] for s in loads[:-1])
    assert (loads[-1]["vaddr"] - loads[-1]["offset"]) % K64 != 0
    got = rules(f, node("x86_64", K64, NEW))
    assert got["page-congruence"].startswith("PT_LOAD RW-")
    assert f"offset 0x{loads[-1]['offset']:x}" in got["page-congruence"]


@pytest.mark.cross
def test_only_a_later_segment_has_a_small_p_align(elf_builder: ElfBuilder) -> None:
    """A 64 KiB aarch64 build whose last PT_LOAD says p_align 4 KiB (what old
    patchelf produced): glibc 2.34 on a 64 KiB node refuses it, 2.35 loads it."""
    f = lib(elf_builder, "aarch64", K64)
    set_load_align(f, -1, K4)
    aligns = [h["align"] for _, h in load_headers(f)]
    assert aligns[0] == K64 and aligns[-1] == K4
    old = rules(f, node("aarch64", K64, OLD))
    assert old["page-align"].startswith("PT_LOAD RW-") and "align 0x1000" in old["page-align"]
    assert "page-align" not in rules(f, node("aarch64", K64, NEW))
    assert "page-congruence" not in rules(f, node("aarch64", K64, NEW))


def test_old_glibc_wants_congruence_modulo_p_align(elf_builder: ElfBuilder,
                                                   tmp_path: Path) -> None:
    """glibc <= 2.34 tests ``(p_vaddr - p_offset) & (p_align - 1)``: a RW
    segment shifted by 4 KiB that claims 64 KiB alignment fails there even
    on a 4 KiB node ("address/offset not properly aligned"); 2.35+ only
    tests the page. This machine's loader (2.35+) is the oracle for that half."""
    f = lib(elf_builder, "x86_64", K4, "-Wl,-z,separate-code")
    set_load_align(f, -1, K64)
    old = rules(f, node("x86_64", K4, OLD))
    assert old["page-congruence"].startswith("PT_LOAD RW-")
    assert not rules(f, node("x86_64", K4, NEW)).keys() & {"page-align", "page-congruence"}

    host_glibc = os.confstr("CS_GNU_LIBC_VERSION") or ""
    if tuple(int(x) for x in host_glibc.split()[-1].split(".")[:2]) < NEW or \
            os.sysconf("SC_PAGE_SIZE") != K4:
        pytest.skip(f"oracle half needs glibc >= 2.35 on 4 KiB pages, host: {host_glibc}")
    exe = elf_builder.compile(src("use_greet.c"), "bin/app", needed_libs=("greet",),
                              lib_dirs=(f.parent,))
    listing = loader_list(exe, library_path=[f.parent])
    assert listing.libs["libgreet.so.1"] == str(f)


def test_overlap_needs_different_permissions(elf_builder: ElfBuilder) -> None:
    f = lib(elf_builder, "x86_64", K4, "-Wl,-z,noseparate-code")
    got = rules(f, node("x86_64", K64, NEW))
    assert "R-X" in got["page-overlap"] and "RW-" in got["page-overlap"]


def test_relro_tail_on_64k_from_a_4k_build(elf_builder: ElfBuilder) -> None:
    f = lib(elf_builder, "x86_64", K4)
    assert "relro-tail" in rules(f, node("x86_64", K64, NEW))
    big = lib(elf_builder, "x86_64", K64)
    # GNU ld pads RELRO to the common page size it was given.
    assert "relro-tail" not in rules(big, node("x86_64", K64, NEW))


def test_executable_is_mapped_by_the_kernel(elf_builder: ElfBuilder, tmp_path: Path) -> None:
    """execve ignores p_align: no page-align for the executable even with
    glibc 2.34; the congruence is fatal all the same."""
    exe = elf_builder.compile(src("hello.c"), "bin/hello", page_size=K4)
    n = node("x86_64", K64, OLD)
    as_exe = rules(exe, n, kernel=True)
    assert "page-align" not in as_exe
    assert "page-congruence" in as_exe
    assert "page-align" in rules(exe, n)  # the same file loaded as a library
    copy = tmp_path / "copy"
    shutil.copy(exe, copy)
    assert rules(copy, node("x86_64", K4, OLD), kernel=True) == {}


def test_loader_error_names_what_was_needed(elf_builder: ElfBuilder) -> None:
    """glibc's refusal of a DT_NEEDED library names the DT_NEEDED text, not
    the path it found ("error while loading shared libraries: libgreet.so.1:
    ELF load command ...", seen on a 64 KiB arm64 kernel with glibc 2.31 and
    2.36: tests/test_page_oracle.py); dlopen and ``ld.so FILE`` name the path."""
    from grace_policy.check import check_step

    small = lib(elf_builder, "x86_64", K4)
    exe = elf_builder.compile(src("use_greet.c"), "bin/app", page_size=K64,
                              needed_libs=("greet",), lib_dirs=(small.parent,))
    report = check_step([str(exe)], {"PATH": "/usr/bin:/bin",
                                     "LD_LIBRARY_PATH": str(small.parent)},
                        "/", node("x86_64", K64, NEW))
    found = [i for i in report.issues if i.rule == "page-congruence" and i.path == str(small)]
    assert [i.predicted_error for i in found] == [
        "error while loading shared libraries: libgreet.so.1: "
        "ELF load command address/offset not page-aligned"]
    info = read_elf(str(small))
    alone = page_issues(str(small), info, node("x86_64", K64, NEW), mapped_by_kernel=False)
    assert f"shared libraries: {small}: ELF" in alone[0].predicted_error
