"""The compiled-page rule (page-size-compiled): an embedded jemalloc's page
size read from its start-up compare, held to a real disassembler
(``aarch64-linux-gnu-objdump``), to real wheels (polars, duckdb, pyarrow),
to Debian's arm64 libjemalloc2, and to jemalloc built here from Debian's
source with 4 KiB and 64 KiB pages, whose own start-up check runs under
``qemu-aarch64 -p`` (the guest's page size) as the oracle.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from corpus import (
    DUCKDB_16K,
    POLARS_4K,
    PYARROW_4K,
    Corpus,
    debian_arm64_python_or_skip,
    fetch_jemalloc_source,
    jemalloc_or_skip,
    wheel_or_skip,
)
from fixtures.build import AARCH64_SYSROOT, ElfBuilder, qemu_aarch64, src

from grace_policy import a64, pagecode
from grace_policy._record import replace
from grace_policy.budget import Budget
from grace_policy.check import CheckInput, check, check_step
from grace_policy.elf import read_elf
from grace_policy.loader import Loading
from grace_policy.node import NodeProfile
from grace_policy.rules import Catalogue

K4, K16, K64 = 4096, 16384, 65536
OBJDUMP = "aarch64-linux-gnu-objdump"


def grace(page: int = K64) -> NodeProfile:
    return NodeProfile(machine="aarch64", page_size=page, glibc=(2, 36), root_is_native=False)


# --------------------------------------------------------------------------
# The reference: objdump's own reading
# --------------------------------------------------------------------------

_LINE = re.compile(r"^\s*([0-9a-f]+):\t([0-9a-f]{8}) \t(\S+)(?:\t(.*))?$")


def objdump(path: Path, start: int | None = None, stop: int | None = None
            ) -> list[tuple[int, int, str, str]]:
    """(address, word, mnemonic, operands without comments) of each
    instruction objdump decodes in the executable sections of ``path``."""
    if shutil.which(OBJDUMP) is None:
        pytest.skip(f"{OBJDUMP} not installed (binutils-aarch64-linux-gnu)")
    cmd = [OBJDUMP, "-d", str(path)]
    if start is not None:
        cmd.insert(2, f"--start-address={start:#x}")
    if stop is not None:
        cmd.insert(2, f"--stop-address={stop:#x}")
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    rows = []
    for line in out.splitlines():
        m = _LINE.match(line)
        if m:
            ops = (m.group(4) or "").split("//")[0]
            ops = re.sub(r"\s*<[^>]*>", "", ops).strip()
            rows.append((int(m.group(1), 16), int(m.group(2), 16), m.group(3), ops))
    return rows


def _imm(text: str) -> int:
    return int(text.lstrip("#"), 0)


def objdump_page(path: Path, reading: pagecode.Reading) -> set[int]:
    """objdump's reading of the guard: in a window before each block that
    builds the message's address (checked by objdump's own operands), the
    constant of every ``cmp xN, #imm, lsl #12`` whose first following branch
    is a ``b.hi`` into that block or a ``b.ls`` over it."""
    assert reading.message is not None and reading.refs
    pages: set[int] = set()
    for ref in reading.refs:
        rows = objdump(path, max(0, ref - pagecode.WINDOW), ref + 16)
        by_addr = {addr: i for i, (addr, *_rest) in enumerate(rows)}
        i = by_addr[ref]
        _a, _w, mnem, ops = rows[i]
        assert mnem == "adrp", rows[i]
        reg, page = ops.split(", ")
        # The add that completes the address may come a few instructions later.
        adds = [r for r in rows[i + 1:i + 5] if r[2] == "add" and r[3].split(", ")[1] == reg]
        assert adds, rows[i:i + 5]
        _dst, _base, lo = adds[0][3].split(", ")
        assert int(page, 16) + _imm(lo) == reading.message

        def falls_into_ref(start: int, rows: list = rows, i: int = i) -> bool:  # type: ignore[type-arg]
            """Execution from row ``start`` reaches ``ref`` without a branch."""
            return start <= i and not any(m in BLOCK_ENDS or m.startswith("b.")
                                          for _x, _y, m, _z in rows[start:i])
        for j, (_addr, _word, mnem, ops) in enumerate(rows):
            if not (mnem == "cmp" and ops.startswith("x") and ops.endswith("lsl #12")):
                continue
            for k, (_a, _w, later, target) in enumerate(rows[j + 1:j + 4], start=j + 1):
                # The first flag user after the compare, with nothing in
                # between that objdump names as setting flags or branching:
                # either b.hi into the block, or b.ls over it when the block
                # is the fall-through path (no branch between b.ls and it).
                if later == "b.hi" and int(target, 16) in by_addr \
                        and falls_into_ref(by_addr[int(target, 16)]):
                    pages.add(_imm(ops.split(", ")[1]) << 12)
                if later == "b.ls" and int(target, 16) > ref and falls_into_ref(k + 1):
                    pages.add(_imm(ops.split(", ")[1]) << 12)
                if later in FLAG_SETTERS or later in BLOCK_ENDS or later.startswith("b."):
                    break
    return pages


def rodata_address(path: Path, needle: bytes) -> int:
    """Where ``needle`` is in .rodata, by pyelftools (independent of ours)."""
    from elftools.elf.elffile import ELFFile

    with open(path, "rb") as fh:
        sec = ELFFile(fh).get_section_by_name(".rodata")
        return sec["sh_addr"] + sec.data().index(needle)


# --------------------------------------------------------------------------
# The decoder, instruction by instruction, against objdump
# --------------------------------------------------------------------------

FLAG_SETTERS = {"cmp", "cmn", "tst", "adds", "subs", "ands", "bics", "negs", "ngcs", "adcs",
                "sbcs", "ccmp", "ccmn", "fcmp", "fcmpe", "fccmp", "fccmpe"}
BLOCK_ENDS = {"b", "cbz", "cbnz", "tbz", "tbnz", "br", "ret", "brk", "svc", "hlt"}


def check_decoder(path: Path) -> int:
    rows = objdump(path)
    assert len(rows) > 1000
    counts = dict.fromkeys(("adrp", "add", "cmp", "b.cond", "flags", "branch"), 0)
    for addr, word, mnem, ops in rows:
        hit = a64.adrp(word, addr)
        assert (hit is not None) == (mnem == "adrp"), (hex(addr), mnem, ops)
        if hit is not None:
            reg, page = ops.split(", ")
            assert (f"x{hit[0]}", hit[1]) == (reg, int(page, 16))
            counts["adrp"] += 1
        add = a64.add_imm(word)
        regs = ops.split(", ")
        x_add = mnem == "add" and "lsl" not in ops and "#" in ops and len(regs) == 3 \
            and regs[0][0] in "xs" and regs[1][0] in "xs"
        mov_sp = mnem == "mov" and "sp" in ops.split(", ")
        assert (add is not None) == (x_add or mov_sp), (hex(addr), mnem, ops)
        if add is not None and x_add:
            rd, rn, imm = ops.split(", ")
            name = {31: "sp"}
            assert (name.get(add[0], f"x{add[0]}"), name.get(add[1], f"x{add[1]}"),
                    add[2]) == (rd, rn, _imm(imm))
            counts["add"] += 1
        cmp = a64.cmp_imm(word)
        x_cmp = mnem == "cmp" and ops[:1] in ("x", "s") and regs[1].startswith("#")
        assert (cmp is not None) == x_cmp, (hex(addr), mnem, ops)
        if cmp is not None:
            parts = ops.split(", ")
            value = _imm(parts[1]) << (12 if len(parts) > 2 else 0)
            assert cmp[1] == value, (hex(addr), ops)
            counts["cmp"] += 1
        br = a64.b_cond(word, addr)
        assert (br is not None) == mnem.startswith("b."), (hex(addr), mnem)
        if br is not None:
            assert (f"b.{a64.CONDITIONS[br[0]]}", br[1]) == (mnem, int(ops, 16))
            counts["b.cond"] += 1
        if mnem in FLAG_SETTERS:
            assert a64.sets_flags(word), (hex(addr), mnem, ops)  # never miss one
            counts["flags"] += 1
        if mnem in BLOCK_ENDS or mnem.startswith("b."):
            assert a64.is_branch(word), (hex(addr), mnem)
            counts["branch"] += 1
        if a64.is_branch(word):
            assert mnem in BLOCK_ENDS or mnem.startswith("b.") or mnem in (
                "eret", "hvc", "smc", "braa", "retaa", "retab"), (hex(addr), mnem)
    assert all(counts.values()), counts  # every form was actually exercised
    return len(rows)


@pytest.mark.network
@pytest.mark.cross
def test_decoder_agrees_with_objdump_on_debian_libjemalloc(debian_arm64: Corpus) -> None:
    assert check_decoder(debian_arm64.find("libjemalloc.so.2")) > 50_000


@pytest.mark.cross
def test_decoder_agrees_with_objdump_on_a_compiled_program(elf_builder: ElfBuilder,
                                                           have_cross: str) -> None:
    exe = elf_builder.compile(src("jemalloc_use.c"), "bin/plain", arch="aarch64",
                              extra_flags=("-static",))
    check_decoder(exe)


# --------------------------------------------------------------------------
# Real files
# --------------------------------------------------------------------------


@pytest.mark.network
@pytest.mark.cross
def test_debian_arm64_libjemalloc_is_a_64k_build(debian_arm64: Corpus) -> None:
    """Debian configures jemalloc with --with-lg-page=16 on every non-x86
    architecture (debian/rules of the same source package says so)."""
    rules = (fetch_jemalloc_source() / "debian" / "rules").read_text()
    other_arches = rules.split("else", 1)[1].split("endif", 1)[0]
    assert "--with-lg-page=16" in other_arches
    lib = debian_arm64.find("libjemalloc.so.2")
    reading = pagecode.inspect_file(str(lib))
    assert reading.message == rodata_address(lib, pagecode.MESSAGE)
    assert reading.page == 1 << 16
    assert objdump_page(lib, reading) == {reading.page}
    assert pagecode.compiled_page_issues(str(lib), read_elf(str(lib)), grace()) == []


@pytest.mark.network
@pytest.mark.cross
@pytest.mark.parametrize(("wheel", "member", "page"), [
    (POLARS_4K, "polars/polars.abi3.so", K4),
    (DUCKDB_16K, "duckdb/duckdb.cpython-311-aarch64-linux-gnu.so", K16),
    (PYARROW_4K, "pyarrow/libarrow.so.500", K4),
], ids=["polars-0.14.8", "duckdb-0.9.2", "pyarrow-5.0.0"])
def test_real_wheels_are_read_as_objdump_reads_them(wheel, member: str, page: int) -> None:  # type: ignore[no-untyped-def]
    corpus = wheel_or_skip(wheel)
    path = corpus.root / "site-packages" / member
    reading = pagecode.inspect_file(str(path))
    assert reading.message == rodata_address(path, pagecode.MESSAGE)
    assert reading.page == page
    assert objdump_page(path, reading) == {page}
    info = read_elf(str(path))
    for node_page, fires in ((K4, False), (K16, page < K16), (K64, True)):
        issues = pagecode.compiled_page_issues(str(path), info, grace(node_page),
                                               Loading(budget=Budget()))
        assert [i.rule for i in issues] == (["page-size-compiled"] if fires else [])
    issue = pagecode.compiled_page_issues(str(path), info, grace(), Loading(budget=Budget()))[0]
    package = member.split("/")[0]
    assert f"'{package}>={pagecode.FIXED_IN[package]}'" in issue.fact("fix_hint")
    assert "<jemalloc>: Unsupported system page size" in issue.predicted_error
    assert issue.fact("compiled_page_kib") == str(page // 1024)


@pytest.mark.network
def test_a_library_without_jemalloc_is_read_as_such() -> None:
    corpus = wheel_or_skip(PYARROW_4K)
    path = corpus.root / "site-packages" / "pyarrow" / "libparquet.so.500"
    assert pagecode.MESSAGE not in path.read_bytes()
    assert pagecode.inspect_file(str(path)).page == 0


# --------------------------------------------------------------------------
# jemalloc built here, and its own start-up check as the oracle
# --------------------------------------------------------------------------


def run_with_page(exe: Path, page: int) -> subprocess.CompletedProcess[str]:
    """``exe`` under qemu-aarch64 with the guest told its page is ``page``
    (AT_PAGESZ and sysconf both say so), with the real aarch64 glibc."""
    qemu = qemu_aarch64()
    if qemu is None:
        pytest.skip("qemu-aarch64 not installed (apt-get install qemu-user)")
    return subprocess.run([qemu, "-p", str(page), "-L", AARCH64_SYSROOT, str(exe)],
                          capture_output=True, text=True, timeout=60, check=False)


@pytest.fixture(scope="module")
def jemalloc_programs(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    """The small program statically linked with jemalloc built for 4 KiB and
    for 64 KiB pages (linked for 64 KiB segments, so only jemalloc's own check
    decides)."""
    if shutil.which("aarch64-linux-gnu-gcc") is None:
        pytest.skip("aarch64-linux-gnu-gcc not installed")
    out = tmp_path_factory.mktemp("jemalloc")
    programs = {}
    for lg in (12, 16):
        lib = jemalloc_or_skip(lg)
        exe = out / f"use-lg{lg}"
        subprocess.run(["aarch64-linux-gnu-gcc", "-O1", "-o", str(exe), str(src("jemalloc_use.c")),
                        str(lib), "-lpthread", "-Wl,-z,max-page-size=65536"],
                       check=True, capture_output=True)
        programs[1 << lg] = exe
    return programs


@pytest.mark.network
@pytest.mark.cross
@pytest.mark.qemu
def test_jemalloc_builds_read_and_run(jemalloc_programs: dict[int, Path]) -> None:
    for compiled, exe in jemalloc_programs.items():
        reading = pagecode.inspect_file(str(exe))
        assert reading.page == compiled
        assert objdump_page(exe, reading) == {compiled}
        info = read_elf(str(exe))
        for page in (K4, K16, K64):
            run = run_with_page(exe, page)
            refused = "<jemalloc>: Unsupported system page size" in run.stderr
            assert refused == (run.returncode == 3), (run.returncode, run.stderr)
            if refused:
                assert run.stdout.strip() == "malloc failed"
            issues = pagecode.compiled_page_issues(str(exe), info, grace(page),
                                                   Loading(budget=Budget()))
            # What the rule predicts is what jemalloc does, page size by page size.
            assert bool(issues) == refused == (page > compiled), (compiled, page)
            if issues:
                assert "<jemalloc>: Unsupported system page size" in issues[0].predicted_error


@pytest.mark.network
@pytest.mark.cross
def test_check_step_reports_the_embedded_jemalloc(jemalloc_programs: dict[int, Path],
                                                 tmp_path: Path) -> None:
    exe = shutil.copy(jemalloc_programs[K4], tmp_path / "app")
    os.chmod(exe, 0o755)
    for page, expected in ((K4, False), (K64, True)):
        report = check_step([str(exe)], {"PATH": "/usr/bin"}, str(tmp_path), grace(page))
        assert ("page-size-compiled" in [i.rule for i in report.issues]) == expected
    report = check_step([str(exe)], {"PATH": "/usr/bin"}, str(tmp_path), grace())
    finding = Catalogue.load().findings(report.issues, {"partition": "gb200"})[0]
    assert finding.rule == "page-size-compiled" and finding.severity == "error"
    assert "4 KiB pages" in finding.remediation and "--with-lg-page=16" in finding.remediation
    assert "{" not in finding.remediation
    same = check_step([str(exe)], {"PATH": "/usr/bin"}, str(tmp_path),
                      NodeProfile(machine="x86_64", page_size=K4, glibc=(2, 36)))
    assert "page-size-compiled" not in [i.rule for i in same.issues]


IMPORT_PROBE = """\
import os, sys
sys.path.insert(0, {site!r})
try:
    {statement}
except BaseException as exc:
    print("FAILED", type(exc).__name__, exc, flush=True)
    os._exit(7)
print("IMPORTED", flush=True)
os._exit(0)
"""


@pytest.mark.network
@pytest.mark.qemu
@pytest.mark.parametrize(("wheel", "member", "statement"), [
    (POLARS_4K, "polars/polars.abi3.so", "import polars; polars.DataFrame({'a': [1]})"),
    (DUCKDB_16K, "duckdb/duckdb.cpython-311-aarch64-linux-gnu.so",
     "import duckdb; duckdb.sql('select 42').fetchall()"),
], ids=["polars-0.14.8", "duckdb-0.9.2"])
def test_real_imports_fail_exactly_where_the_rule_says(wheel, member: str,  # type: ignore[no-untyped-def]
                                                       statement: str) -> None:
    """Debian 12's aarch64 CPython imports the real wheel under qemu-aarch64
    with a 4, 16 and 64 KiB page: the import fails exactly on the page sizes
    for which the rule reports the extension module. (os._exit after the
    probe: duckdb's failed import otherwise hangs at interpreter exit under
    qemu.)"""
    root = debian_arm64_python_or_skip()
    qemu = qemu_aarch64()
    if qemu is None:
        pytest.skip("qemu-aarch64 not installed (apt-get install qemu-user)")
    site = wheel_or_skip(wheel).root / "site-packages"
    module = site / member
    info = read_elf(str(module))
    code = IMPORT_PROBE.format(site=str(site), statement=statement)
    for page in (K4, K16, K64):
        run = subprocess.run([qemu, "-p", str(page), "-L", str(root),
                              str(root / "usr" / "bin" / "python3.11"), "-I", "-c", code],
                             capture_output=True, text=True, timeout=600, check=False)
        imported = run.returncode == 0 and run.stdout.strip() == "IMPORTED"
        issues = pagecode.compiled_page_issues(str(module), info, grace(page),
                                               Loading(budget=Budget()))
        assert imported != bool(issues), (page, run.returncode, run.stdout, run.stderr[-500:])
        if not imported and wheel is POLARS_4K:
            # polars: jemalloc's message (twice), Rust's allocation failure, SIGABRT.
            assert run.stderr.count("<jemalloc>: Unsupported system page size") >= 1
            assert run.returncode in (134, -6), run.returncode
        if not imported and wheel is DUCKDB_16K:
            # duckdb keeps jemalloc quiet; its own error says what failed.
            assert "Out of Memory Error" in run.stdout, run.stdout


# --------------------------------------------------------------------------
# Cost: budget share, cache by identity, silence when unsure
# --------------------------------------------------------------------------


@pytest.mark.network
def test_reading_is_cached_by_file_identity(tmp_path: Path) -> None:
    corpus = wheel_or_skip(POLARS_4K)
    path = tmp_path / "polars.abi3.so"
    shutil.copy(corpus.root / "site-packages" / "polars" / "polars.abi3.so", path)
    first = Budget()
    assert pagecode.read_compiled_page(str(path), first) == K4
    assert first.bytes_read > 1_000_000        # it did read the code
    again = Budget()
    assert pagecode.read_compiled_page(str(path), again) == K4
    assert again.bytes_read == 0               # the same file is not read twice
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    changed = Budget()
    assert pagecode.read_compiled_page(str(path), changed) == K4
    assert changed.bytes_read > 1_000_000      # another identity: read again


@pytest.mark.network
def test_a_small_budget_makes_the_rule_silent_not_the_check_fail(tmp_path: Path) -> None:
    corpus = wheel_or_skip(DUCKDB_16K)
    path = tmp_path / "duckdb.so"
    shutil.copy(corpus.root / "site-packages" / "duckdb" /
                "duckdb.cpython-311-aarch64-linux-gnu.so", path)
    small = Budget(max_bytes=8 * 1024 * 1024)
    info = read_elf(str(path))
    assert pagecode.compiled_page_issues(str(path), info, grace(), Loading(budget=small)) == []
    assert small.bytes_left > 0                # silent, without using the budget up
    assert pagecode.read_compiled_page(str(path), Budget()) == K16  # not cached as "none"


def test_unsure_and_foreign_files_are_silent(elf_builder: ElfBuilder, tmp_path: Path) -> None:
    junk = tmp_path / "junk.so"
    junk.write_bytes(b"\x7fELF" + bytes(200))
    info_exe = elf_builder.compile(src("hello.c"), "bin/hello")  # x86_64: never decoded
    info = read_elf(str(info_exe))
    assert pagecode.compiled_page_issues(str(info_exe), info, grace()) == []
    assert pagecode.read_compiled_page(str(junk)) is None
    assert pagecode.read_compiled_page(str(tmp_path / "missing")) is None


INLINE_GUARD = r"""
#include <stdio.h>
#include <unistd.h>
int main(void) {
    if ((unsigned long)sysconf(_SC_PAGESIZE) > 16384UL) {
        fputs("<jemalloc>: Unsupported system page size\n", stderr);
        return 1;
    }
    return 0;
}
"""


@pytest.mark.cross
@pytest.mark.parametrize("opt", ["-O0", "-O1", "-O2", "-Os"])
def test_both_block_layouts_of_the_guard(elf_builder: ElfBuilder, have_cross: str,
                                         opt: str) -> None:
    """jemalloc's check reduced to its shape: gcc lays the message block out
    of line behind a b.hi (-O1, -O2) or inline behind a b.ls that skips it
    (-O0, -Os). Both read as 16 KiB, as objdump reads them."""
    exe = elf_builder.compile(INLINE_GUARD, f"bin/guard{opt}", arch="aarch64",
                              extra_flags=(opt,))
    reading = pagecode.inspect_file(str(exe))
    assert reading.page == K16
    assert objdump_page(exe, reading) == {K16}


@pytest.mark.cross
def test_message_without_a_readable_guard_is_silent(elf_builder: ElfBuilder,
                                                    have_cross: str) -> None:
    """The message alone (no compare against an immediate guarding it) is no
    reading: here the page constant is in a register, so nothing is said."""
    exe = elf_builder.compile(REGISTER_COMPARE, "bin/regcmp", arch="aarch64")
    reading = pagecode.inspect_file(str(exe))
    assert reading.message is not None and reading.refs
    assert reading.page == -1
    info = read_elf(str(exe))
    assert pagecode.compiled_page_issues(str(exe), info, grace()) == []


REGISTER_COMPARE = r"""
#include <stdio.h>
#include <unistd.h>
volatile long limit = 4096;
int main(void) {
    if (sysconf(_SC_PAGESIZE) > limit) {
        fputs("<jemalloc>: Unsupported system page size\n", stderr);
        return 1;
    }
    return 0;
}
"""


@pytest.mark.cross
def test_code_made_of_candidates_gives_up_instead_of_taking_long(
        elf_builder: ElfBuilder, have_cross: str) -> None:
    """A file whose whole .text is the ``add`` that would build the message's
    address (a crafted file): the scan stops at its candidate cap, unsure."""
    from elftools.elf.elffile import ELFFile

    exe = elf_builder.compile(REGISTER_COMPARE, "bin/static", arch="aarch64",
                              extra_flags=("-static",))
    message = pagecode.inspect_file(str(exe)).message
    assert message is not None
    with open(exe, "rb") as fh:
        text = ELFFile(fh).get_section_by_name(".text")
        start, size = text["sh_offset"], text["sh_size"]
    assert size // 4 > pagecode.MAX_CANDIDATES
    word = (0x91000000 | (message & 0xFFF) << 10).to_bytes(4, "little")  # add x0, x0, #lo
    data = bytearray(exe.read_bytes())
    data[start:start + size - size % 4] = word * (size // 4)
    exe.write_bytes(bytes(data))
    assert a64.add_imm(int.from_bytes(word, "little")) == (0, 0, message & 0xFFF)
    assert pagecode.inspect_file(str(exe)).page == -1
    assert pagecode.read_compiled_page(str(exe), Budget()) is None


@pytest.mark.network
def test_truncated_and_damaged_copies_never_raise(tmp_path: Path) -> None:
    corpus = wheel_or_skip(POLARS_4K)
    whole = (corpus.root / "site-packages" / "polars" / "polars.abi3.so").read_bytes()
    info = read_elf(str(corpus.root / "site-packages" / "polars" / "polars.abi3.so"))
    for i, cut in enumerate((64, 4096, len(whole) // 3, len(whole) - 4096)):
        path = tmp_path / f"cut{i}.so"
        path.write_bytes(whole[:cut])
        assert pagecode.read_compiled_page(str(path), Budget()) in (None, 0)
        # The headers as read from the whole file, the bytes from the cut copy.
        cut_info = replace(info, path=str(path))
        assert pagecode.compiled_page_issues(str(path), cut_info, grace(),
                                             Loading(budget=Budget())) == []
    # Section header fields pointing anywhere: no exception, no reading.
    for i, (field, value) in enumerate(((0x28, len(whole) - 8), (0x3C, 0xFFFF), (0x3E, 0xFFF0))):
        data = bytearray(whole)
        size = 8 if field == 0x28 else 2
        data[field:field + size] = value.to_bytes(size, "little")
        path = tmp_path / f"bad{i}.so"
        path.write_bytes(bytes(data))
        assert pagecode.read_compiled_page(str(path), Budget()) in (None, 0, K4)


@pytest.mark.network
@pytest.mark.cross
def test_a_clean_verdict_records_the_identity_of_what_the_rule_read(
        jemalloc_programs: dict[int, Path], tmp_path: Path) -> None:
    """The plugin replays a clean verdict only while every file it read has
    the same identity (the check's fsprobe.Files record): the file the code
    scan read is among them,
    so a cached verdict never outlives a rebuilt program."""
    from grace_policy import fsprobe

    exe = tmp_path / "app"
    shutil.copy(jemalloc_programs[K64], exe)
    os.chmod(exe, 0o755)
    pagecode._known.clear()
    files = fsprobe.Files.recorded()
    budget = Budget()
    report = check(CheckInput([str(exe)], {"PATH": "/usr/bin"}, str(tmp_path), grace(),
                              budget=budget, files=files))
    probes = files.records()
    assert report.issues == () and report.limit is None
    from elftools.elf.elffile import ELFFile

    with open(exe, "rb") as fh:
        text = ELFFile(fh).get_section_by_name(".text")["sh_size"]
    assert budget.bytes_read > text  # the code scan did read it
    answers = {answer for op, path, answer in probes if path == str(exe) and op == "s"}
    assert answers == {fsprobe.signature(exe.stat())}
    assert fsprobe.still_true(probes)
    with open(exe, "r+b") as fh:  # a rebuilt program: the recorded answer no longer holds
        fh.seek(0, 2)
        fh.write(b"\0")
    assert not fsprobe.still_true(probes)
