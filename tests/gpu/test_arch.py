"""The driver's rules as data: the tables parse, are ordered as releases are,
and the rules give the documented answers at their edges."""

from __future__ import annotations

import pytest

from grace_policy.cuda import arch
from grace_policy.cuda.fatbin import Entry


def entry(kind: str, sm: int, variant: str = "", version: tuple[int, int] = (1, 8)) -> Entry:
    return Entry(kind, sm, variant, version, "", False, 0)


def test_tables_parse_and_are_monotonic() -> None:
    t = arch.tables()
    rows = sorted(t.ptx_isa.items())
    assert [cuda for _, cuda in rows] == sorted(cuda for _, cuda in rows)
    assert t.ptx_isa[(9, 5)] == (13, 5) and t.ptx_isa[(9, 0)] == (13, 0)
    assert t.ptx_isa[(8, 8)] == (12, 9) and t.ptx_isa[(8, 6)] == (12, 7)
    for name, members in t.families.items():
        sm = int(name[:-1])
        assert all(m[0] == sm // 10 for m in members), name
        assert divmod(sm, 10) in members, name
    assert t.families["100f"] == {(10, 0), (10, 3)}
    assert arch.runtime_major("libcudart.so.13") == 13
    assert arch.runtime_major("libcufft.so.11") is None


def test_a_broken_table_fails_loudly() -> None:
    with pytest.raises(ValueError):
        arch.parse_tables({"families": {"100f": ["ten"]}, "ptx_isa": {}, "runtime_sonames": {}})


@pytest.mark.parametrize(("text", "cc"), [
    ("sm_100", (10, 0)), ("sm_90", (9, 0)), ("10.3", (10, 3)), ("9.0", (9, 0)),
    ("SM_121", (12, 1)), ("sm_90a", None), ("", None), ("sm_", None), ("x.y", None),
    ("9" * 50, None),
])
def test_parse_capability(text: str, cc: tuple[int, int] | None) -> None:
    assert arch.parse_capability(text) == cc


def test_cuda_version_from_nvml_encoding() -> None:
    assert arch.cuda_version_from_nvml(13000) == (13, 0)
    assert arch.cuda_version_from_nvml(12080) == (12, 8)


def test_cubin_and_ptx_rules_at_their_edges() -> None:
    assert arch.cubin_runs(entry("cubin", 80), (8, 6))
    assert not arch.cubin_runs(entry("cubin", 86), (8, 0))
    assert not arch.cubin_runs(entry("cubin", 90), (10, 0))
    assert not arch.cubin_runs(entry("cubin", 100, "a"), (10, 3))
    assert arch.cubin_runs(entry("cubin", 100, "f"), (10, 3))
    assert not arch.cubin_runs(entry("cubin", 103, "f"), (10, 0))
    assert not arch.cubin_runs(entry("cubin", 120, "f"), (10, 0))
    # An f target the table does not know is judged like a plain one.
    assert arch.cubin_runs(entry("cubin", 150, "f"), (15, 3))
    assert arch.ptx_fits(entry("ptx", 80), (12, 0))
    assert not arch.ptx_fits(entry("ptx", 100), (9, 0))
    assert not arch.ptx_fits(entry("ptx", 90, "a"), (10, 0))
    assert arch.ptx_fits(entry("ptx", 90, "a"), (9, 0))


def test_driver_reads_ptx_up_to_its_release() -> None:
    assert arch.driver_reads((9, 0), (13, 0))
    assert not arch.driver_reads((9, 5), (13, 0))
    assert arch.driver_reads((9, 5), (13, 5))
    assert arch.driver_reads((8, 8), (13, 0))
    # Newer than every row: a driver of the last row's release cannot.
    assert not arch.driver_reads((9, 9), (13, 5))
    assert arch.driver_reads((9, 9), (13, 6))


def test_choose_prefers_cubin_then_newest_readable_ptx() -> None:
    es = [entry("cubin", 80), entry("ptx", 80, version=(8, 0)), entry("ptx", 90, version=(9, 5))]
    assert arch.choose(es, (8, 6), (13, 0)).outcome == "cubin"
    jit = arch.choose(es, (10, 0), (13, 0))
    assert jit.outcome == "jit" and jit.entry is not None and jit.entry.sm == 80
    assert arch.choose(es, (10, 0), (13, 5)).entry.sm == 90  # type: ignore[union-attr]
    assert arch.choose(es[2:], (10, 0), (13, 0)).outcome == "ptx-too-new"
    assert arch.choose(es[2:], (10, 0), None).outcome == "jit"
    assert arch.choose(es, (7, 5), (13, 0)).outcome == "none"
