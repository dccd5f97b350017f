"""page-bss-clobber: a later segment mapped over an earlier segment's .bss.

The oracle is the real aarch64 glibc loader under ``qemu-aarch64 -p PAGE``
(the guest's AT_PAGESZ, so ld.so maps in PAGE-sized pages): a library whose
layout patchelf changed the way old auditwheel repairs did, and a program
that says whether the library's zero-initialised globals are still zero.
The real case is Pillow 7.2.0's aarch64 wheel, named in issue 11.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from corpus import PILLOW_BSS, wheel_or_skip
from fixtures.build import AARCH64_SYSROOT, ElfBuilder, qemu_aarch64, src

from grace_policy.budget import Budget
from grace_policy.elf import read_elf
from grace_policy.layout import bss_clobbers, page_issues
from grace_policy.loader import Loading
from grace_policy.node import NodeProfile

K4, K16, K64 = 4096, 16384, 65536


def rules(path: Path, page: int, glibc: tuple[int, int] = (2, 36)) -> list[str]:
    node = NodeProfile(machine="aarch64", page_size=page, glibc=glibc, root_is_native=False)
    return [i.rule for i in page_issues(str(path), read_elf(str(path)), node,
                                        mapped_by_kernel=False, how=Loading(budget=Budget()))]


def patchelf() -> str:
    tool = shutil.which("patchelf")
    if tool is None:
        pytest.skip("patchelf not installed (apt-get install patchelf)")
    return tool


@pytest.fixture
def bss_case(elf_builder: ElfBuilder, have_cross: str) -> tuple[Path, Path]:
    """(program, library): the library has .bss right after its data, linked
    for 64 KiB pages (GNU ld's aarch64 default), then given a long RPATH by
    patchelf with 4 KiB pages, which appends a 4 KiB-aligned PT_LOAD."""
    lib = elf_builder.library("lib/libbss.so", source=src("libbss.c"), arch="aarch64",
                              soname="libbss.so")
    exe = elf_builder.compile(src("use_bss.c"), "bin/use_bss", arch="aarch64",
                              needed_libs=("bss",), lib_dirs=(lib.parent,))
    subprocess.run([patchelf(), "--page-size", "4096", "--set-rpath", "/opt/" + "x" * 300,
                    str(lib)], check=True, capture_output=True)
    return exe, lib


def run_on(exe: Path, lib_dir: Path, page: int) -> str:
    qemu = qemu_aarch64()
    if qemu is None:
        pytest.skip("qemu-aarch64 not installed (apt-get install qemu-user)")
    proc = subprocess.run([qemu, "-p", str(page), "-L", AARCH64_SYSROOT, "-E",
                           f"LD_LIBRARY_PATH={lib_dir}", str(exe)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.stdout.startswith("counters "), (proc.returncode, proc.stderr)
    return proc.stdout.strip()


@pytest.mark.cross
@pytest.mark.qemu
def test_rule_fires_exactly_when_the_loader_leaves_garbage_in_bss(
        bss_case: tuple[Path, Path]) -> None:
    exe, lib = bss_case
    loads = read_elf(str(lib)).load_segments
    assert len(loads) == 3 and loads[2].align == K4   # what patchelf appended
    for page in (K4, K16, K64):
        garbage = run_on(exe, lib.parent, page) == "counters NOT ZERO"
        assert ("page-bss-clobber" in rules(lib, page)) == garbage, page
    assert run_on(exe, lib.parent, K64) == "counters NOT ZERO"  # the case is real here


@pytest.mark.cross
@pytest.mark.qemu
def test_a_shared_page_over_zero_bytes_is_harmless(bss_case: tuple[Path, Path]) -> None:
    """The same layout, with the file bytes that land in .bss zeroed: the
    pages are still shared, the loader leaves zeros, the rule says nothing."""
    exe, lib = bss_case
    info = read_elf(str(lib))
    hits = bss_clobbers(str(lib), info, K64)
    assert hits
    data = bytearray(lib.read_bytes())
    for a, b, hit in hits:
        # Zero the later mapping's file bytes for the whole overwritten range
        # (glibc maps page-down(vaddr) from page-down(offset)).
        delta = (b.offset - b.offset % K64) - (b.vaddr - b.vaddr % K64)
        data[hit.start + delta:hit.end + delta] = bytes(hit.end - hit.start)
        assert a.memsz > a.filesz and hit.start >= a.vaddr + a.filesz
    lib.write_bytes(bytes(data))
    assert run_on(exe, lib.parent, K64) == "counters zero"
    assert "page-bss-clobber" not in rules(lib, K64)


@pytest.mark.network
def test_pillow_7_2_0_imaging_on_64k_pages() -> None:
    corpus = wheel_or_skip(PILLOW_BSS)
    pil = corpus.root / "site-packages" / "PIL"
    imaging = pil / "_imaging.cpython-38-aarch64-linux-gnu.so"
    assert "page-bss-clobber" in rules(imaging, K64)
    assert "page-bss-clobber" not in rules(imaging, K16)   # next segment starts a new page
    assert rules(imaging, K4) == []
    (a, b, hit), = bss_clobbers(str(imaging), read_elf(str(imaging)), K64)
    # What lands in .bss is the file's own bytes past the data: here the
    # .comment section (the compiler's name) and the section name table.
    raw = imaging.read_bytes()[hit.file_offset:hit.file_offset + hit.end - hit.start]
    assert b"GCC: " in raw
    assert hit.start == a.vaddr + a.filesz and b.vaddr > a.vaddr + a.memsz
    assert rules(pil / "_imagingmath.cpython-38-aarch64-linux-gnu.so", K64) == []
    # glibc 2.34 and older refuse the 4 KiB-aligned segments outright: the file
    # never loads, so that is what is reported, not what loading would do.
    old = rules(imaging, K64, glibc=(2, 34))
    assert "page-align" in old and "page-bss-clobber" not in old
