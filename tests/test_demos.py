"""The demos, run the way the README gives them: ``make demo`` and ``make
demo-node``, from the repository, each to its end.

A demo is the first thing a newcomer runs; nothing else runs its code, so a
scenario added to the tests without a place in the demo (``make demo-node``
once ended in a KeyError) is caught here. Each must exit 0, show every step
it is built from with its result, and show the site's contact text (the
config's ``contact``), not the tests' own.
"""

from __future__ import annotations

import shlex

import pytest
from slurm.demo import STEPS
from slurm.harness import TEST_CONTACT, site_contact, skip_reason
from vm import slurmnode
from vm.demo_run import DemoNode, make_as_newcomer

from grace_policy.node import host_machine

PREFIX = "grace-policy: "


def _said(out: str) -> str:
    """The plugin's lines as one text (wrapping and indentation undone)."""
    lines = [line.strip()[len(PREFIX):] for line in out.splitlines()
             if line.strip().startswith(PREFIX)]
    return " ".join(" ".join(lines).split())


def _sections(out: str, titles: list[str]) -> list[str]:
    """The output under each ``== title`` heading, in the order given; a
    missing or out-of-order heading fails."""
    starts = []
    at = 0
    for title in titles:
        at = out.find(f"== {title}\n", at)
        assert at >= 0, f"no section {title!r} (in this order) in:\n{out[-6000:]}"
        starts.append(at)
        at += 1
    ends = [*starts[1:], len(out)]
    return [out[a:b] for a, b in zip(starts, ends)]


def _contact_shown(out: str, rule: str) -> None:
    contact = site_contact()
    assert contact != TEST_CONTACT
    assert f"If this is wrong, contact {contact} quoting {rule}." in _said(out), out[-4000:]
    assert TEST_CONTACT not in out


@pytest.mark.slurm
def test_make_demo_shows_every_step_and_the_sites_contact() -> None:
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    out = make_as_newcomer("demo", timeout=1800)
    sections = _sections(out, [s.title for s in STEPS])
    for step, text in zip(STEPS, sections):
        assert "(exit status " in text, (step.title, text)
    # What each shows: the clean step says nothing, the foreign one is
    # refused, warned on warnp, the leaked venv cleaned, the 4 KiB build refused.
    native, foreign, warned, leak, small_pages = sections
    assert PREFIX not in native and "side-effect program ran" in native, native
    assert f"{PREFIX}ERROR exe-arch-mismatch" in foreign and "(exit status 1)" in foreign
    assert "the step runs anyway (partition warnp, mode warn)" in _said(warned), warned
    assert "VIRTUAL_ENV=unset" in leak and "(exit status 0)" in leak, leak
    assert f"{PREFIX}ERROR page-congruence" in small_pages, small_pages
    _contact_shown(out, "exe-arch-mismatch")
    assert "node state after all of it: idle" in out
    assert out.rstrip().endswith("cluster stopped.")


@pytest.mark.vm
@pytest.mark.network
@pytest.mark.cross
@pytest.mark.skipif(host_machine() != "x86_64",
                    reason="cross-builds with Debian's x86_64-hosted aarch64 toolchain")
def test_make_demo_node_shows_every_scenario_and_the_sites_contact(demo_node: DemoNode) -> None:
    out = demo_node.out
    shown = {**slurmnode.SCENARIOS, **slurmnode.DIRECT}
    sections = _sections(out, [s.what for s in shown.values()])
    for (name, scenario), text in zip(shown.items(), sections):
        assert "   exit status " in text, (name, text)
        assert shlex.join(scenario.argv) in text.splitlines()[1], (name, text)
    for name, text in zip(slurmnode.SCENARIOS, sections):
        assert f"node={slurmnode.NODE}" in text, (name, text)  # its audit line
    by_name = dict(zip(shown, sections))
    assert f"{PREFIX}ERROR exe-arch-mismatch" in by_name["x86-program"]
    assert "cache=hit" in by_name["native-again"]
    _contact_shown(out, "exe-arch-mismatch")
