"""The page rules held to real large-page kernels (issue 10).

Boots a 64 KiB-page arm64 kernel (built from Debian's source) and Debian's
16 KiB kernel under ``qemu-system-aarch64`` and runs, in a glibc 2.31 and a
glibc 2.36 userland, every page fixture (:data:`vm.oracle.LIB_FIXTURES`,
:data:`vm.oracle.EXE_FIXTURES`) and real aarch64 files (the Debian arm64
packages and the wheel of ``tests/corpus.py``) the way they are used. For each
(kernel, userland, file, use) the plugin's prediction for that node must
match what happened: see :mod:`vm.oracle` for how outcomes are compared.

``make test`` runs every fixture and a fixed sample of :data:`SAMPLE` corpus
files; ``make verify-pages`` (``GRACE_VERIFY_FULL=1``) runs every corpus file.
The first run builds and caches the kernel and the userlands
(``~/.cache/grace-policy-tests/vm``); see docs/DESIGN.md for the costs.
"""

from __future__ import annotations

import collections
import os
from pathlib import Path

import pytest
from corpus import (
    CorpusUnavailable,
    _give_up,
    fetch_aarch64_wheel,
    fetch_debian_arm64,
    list_elf_files,
)
from fixtures.build import CompileCache
from vm import oracle
from vm.qemu import BootError, qemu_binary

from grace_policy.node import host_machine

FULL = os.environ.get("GRACE_VERIFY_FULL") == "1"
#: Corpus files in the sample (each: 1-2 uses x 2 userlands x 2 kernels).
SAMPLE = 24
BOOT_TIMEOUT = 2400 if FULL else 600

pytestmark = [
    pytest.mark.vm, pytest.mark.network, pytest.mark.cross,
    pytest.mark.skipif(host_machine() != "x86_64",
                       reason="cross-builds with Debian's x86_64-hosted aarch64 toolchain"),
]


@pytest.fixture(scope="session")
def case_set(tmp_path_factory: pytest.TempPathFactory,
             compile_cache: CompileCache) -> oracle.CaseSet:
    if qemu_binary() is None:
        _give_up("qemu-system-aarch64 not installed (make deps: qemu-system-arm)")
    cs = oracle.CaseSet(tmp_path_factory.mktemp("page-oracle") / "cases")
    cs.cases_dir.mkdir()
    try:
        oracle.build_fixtures(cs, compile_cache)
        debian = fetch_debian_arm64()
        oracle.corpus_cases(cs, "debian", debian, list_elf_files(debian),
                            None if FULL else SAMPLE)
        wheel = fetch_aarch64_wheel()
        oracle.corpus_cases(cs, "wheel", wheel, list_elf_files(wheel), None)
    except CorpusUnavailable as exc:
        _give_up(f"page oracle setup: {exc}")
    return cs


_runs: dict[str, list[oracle.Row]] = {}


def rows_for(kernel: str, cs: oracle.CaseSet, tmp_path_factory: pytest.TempPathFactory
             ) -> list[oracle.Row]:
    if kernel not in _runs:
        work = tmp_path_factory.mktemp(f"vm-{kernel}")
        try:
            rows, seconds, _console = oracle.run_kernel(kernel, work, cs,
                                                        timeout=BOOT_TIMEOUT)
        except CorpusUnavailable as exc:
            _give_up(f"{kernel} kernel: {exc}")
        except BootError as exc:
            pytest.fail(f"{kernel} kernel did not finish the cases: {exc}")
        _runs[kernel] = rows
        kinds = collections.Counter((r.userland, r.got.kind) for r in rows)
        print(f"\npage oracle, {kernel} kernel: {len(cs.cases)} cases x 2 userlands in "
              f"{seconds:.1f} s of guest time; observed {dict(sorted(kinds.items()))}")
    return _runs[kernel]


@pytest.mark.parametrize("kernel", list(oracle.KERNELS))
def test_predictions_match_the_kernel(kernel: str, case_set: oracle.CaseSet,
                                      tmp_path_factory: pytest.TempPathFactory,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    with capsys.disabled():
        rows = rows_for(kernel, case_set, tmp_path_factory)
    wrong = [f"{r.userland} {r.case.id} {r.case.mode} {r.case.file}: {r.problem}"
             for r in rows if r.problem]
    assert not wrong, f"{len(wrong)} of {len(rows)} disagree:\n" + "\n".join(wrong)
    # Every case ran in both userlands, and each kind of outcome occurred:
    # a run that refused (or loaded) everything would say nothing.
    assert len(rows) == 2 * len(case_set.cases)
    for userland in oracle.images.USERLANDS:
        kinds = {r.got.kind for r in rows if r.userland == userland}
        assert kinds == {"runs", "kernel", "loader"}, (userland, kinds)


@pytest.mark.parametrize("kernel", list(oracle.KERNELS))
def test_glibc_235_changed_what_loads(kernel: str, case_set: oracle.CaseSet,
                                      tmp_path_factory: pytest.TempPathFactory,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    """A congruent library whose last PT_LOAD claims 4 KiB alignment: refused
    by glibc 2.31 ("alignment not page-aligned"), loaded by 2.36, on both
    page sizes and by all three ways of loading it."""
    with capsys.disabled():
        rows = rows_for(kernel, case_set, tmp_path_factory)
    got = {(r.userland, r.case.mode): r.got for r in rows
           if r.case.id.startswith("lib-64k-last-align-4k-")}
    for mode in oracle.LIB_MODES:
        old, new = got[("glibc231", mode)], got[("glibc236", mode)]
        assert old.kind == "loader" and "alignment not page-aligned" in old.text, (mode, old)
        assert new.kind == "runs", (mode, new)
    if kernel == "16k":
        # p_align 64 KiB, congruent modulo the 16 KiB page only: 2.31 tests
        # modulo p_align ("not properly aligned"), 2.36 modulo the page.
        got = {(r.userland, r.case.mode): r.got for r in rows
               if r.case.id.startswith("lib-16k-last-align-64k-")}
        for mode in oracle.LIB_MODES:
            old, new = got[("glibc231", mode)], got[("glibc236", mode)]
            assert old.kind == "loader" and "not properly aligned" in old.text, (mode, old)
            assert new.kind == "runs", (mode, new)


def test_the_kernels_have_the_page_sizes_they_claim(case_set: oracle.CaseSet,
                                                   tmp_path_factory: pytest.TempPathFactory,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """sysconf(_SC_PAGESIZE) in the guest, both userlands, both kernels."""
    for kernel, (page, _image) in oracle.KERNELS.items():
        with capsys.disabled():
            rows = rows_for(kernel, case_set, tmp_path_factory)
        probes = [r for r in rows if r.case.id == "probe-pagesize"]
        assert [r.got.text for r in probes] == [f"{page}\n"] * 2, (kernel, probes)


def test_console_parser_keeps_escapes_and_needs_the_end_marker(tmp_path: Path) -> None:
    text = ("USERLAND\tu1\nR\ta\texit\t0\thello\\n\tx\\ty\\\\z\\x01\nEND\n"
            "USERLAND\tu2\nR\tb\tsignal\t11\t\t\n")
    runs = oracle.parse_console(text)
    assert list(runs) == ["u1"]  # u2 never printed END: its results do not count
    res = runs["u1"]["a"]
    assert (res.how, res.value, res.out, res.err) == ("exit", 0, "hello\n", "x\ty\\z\x01")
