"""decide(): the partition's mode, on_error, user lowering, containers,
budgets, and the rule that a cleaned leak never rejects on its own."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from fixtures.build import ElfBuilder, src
from roomy import ROOMY

from grace_policy.decide import StepRequest, decide
from grace_policy.findings import ACTIONS, Verdict
from grace_policy.node import NodeProfile, detect
from grace_policy.policy import Limits, PartitionPolicy, Policy

HOST = detect()


@pytest.fixture
def foreign_exe(elf_builder: ElfBuilder, have_cross: str) -> Path:
    exe = elf_builder.compile(src("hello.c"), "foreign/hello", arch="aarch64")
    exe.chmod(0o755)
    return exe


def run(policy: Policy, argv: list[str], *, env: dict[str, str] | None = None,
        partition: str | None = "gb200", **kw: object) -> Verdict:
    v = decide(policy, StepRequest(partition=partition, argv=argv,
                                   env=env or {"PATH": "/usr/bin:/bin"}, cwd="/", node=HOST, **kw))  # type: ignore[arg-type]
    assert isinstance(v, Verdict) and v.action in ACTIONS
    return v


@pytest.mark.parametrize(("mode", "action"), [("enforce", "reject"), ("warn", "warn"),
                                              ("off", "allow")])
def test_mode_decides_the_action(foreign_exe: Path, mode: str, action: str) -> None:
    policy = Policy(mode="enforce", partitions=(PartitionPolicy("gb200", mode=mode),))
    v = run(policy, [str(foreign_exe)])
    assert v.action == action and v.mode == mode
    if mode != "off":
        assert v.rule_ids == ("exe-arch-mismatch",)


def test_clean_step_is_allowed() -> None:
    v = run(Policy(), ["/bin/true"])
    assert (v.action, v.findings, v.error) == ("allow", (), None)


@pytest.mark.parametrize(("allowed", "expected"), [(True, "warn"), (False, "reject")])
def test_user_lowering_only_where_allowed(foreign_exe: Path, allowed: bool,
                                          expected: str) -> None:
    policy = Policy(partitions=(PartitionPolicy("gb200", mode="enforce",
                                                allow_user_lower=allowed),))
    assert run(policy, [str(foreign_exe)], user_lowered_mode="warn").action == expected


def test_user_cannot_raise_or_invent_a_mode(foreign_exe: Path) -> None:
    policy = Policy(partitions=(PartitionPolicy("gb200", mode="warn", allow_user_lower=True),))
    assert run(policy, [str(foreign_exe)], user_lowered_mode="enforce").mode == "warn"
    assert run(policy, [str(foreign_exe)], user_lowered_mode="bogus").mode == "warn"


def test_container_steps_are_skipped(foreign_exe: Path) -> None:
    v = run(Policy(), [str(foreign_exe)], container="pyxis image ubuntu")
    assert (v.action, v.skipped) == ("allow", "pyxis image ubuntu")
    # The step environment is the user's: exporting a container variable
    # must not switch the check off.
    for var in ("_SLURM_SPANK_OPTION_pyxis_container_image", "SLURM_CONTAINER"):
        v = run(Policy(), [str(foreign_exe)], env={"PATH": "/usr/bin", var: "ubuntu"})
        assert v.skipped is None and v.action == "reject"


@pytest.mark.parametrize(("on_error", "action"), [("allow", "allow"), ("deny", "reject")])
def test_exception_in_the_check_follows_on_error(on_error: str, action: str) -> None:
    """A real failure inside the check: a node profile whose page size is not
    a number makes the layout rules raise TypeError."""
    broken = NodeProfile(machine=HOST.machine, page_size="64k", glibc=(2, 36))  # type: ignore[arg-type]
    v = decide(Policy(on_error=on_error), StepRequest(partition=None, argv=["/bin/true"],
                                                      env={"PATH": "/usr/bin"}, cwd="/",
                                                      node=broken))
    assert v.action == action and v.error and "internal error" in v.error


@pytest.mark.parametrize(("on_error", "action"), [("allow", "allow"), ("deny", "reject")])
def test_budget_exceeded_is_check_limit(on_error: str, action: str) -> None:
    policy = Policy(on_error=on_error, limits=Limits(max_files=1))
    v = run(policy, ["/bin/true"])
    assert v.action == action and v.rule_ids[0 if action == "reject" else -1] == "check-limit"
    assert "files" in (v.error or "")


def test_check_limit_never_hides_a_known_error(elf_builder: ElfBuilder,
                                                foreign_padding) -> None:
    """on_error=allow, and an LD_LIBRARY_PATH long enough to exhaust the file
    cap; but the executable's own layout is already known to be fatal on
    this 64 KiB node: the stricter answer wins, and both are shown."""
    lib = elf_builder.library("lib/libgreet.so.1", page_size=4096)
    exe = elf_builder.compile(src("use_greet.c"), "bin/app", page_size=4096,
                              needed_libs=("greet",), lib_dirs=(lib.parent,))
    node = NodeProfile(machine="x86_64", page_size=65536, glibc=(2, 36))
    env = {"LD_LIBRARY_PATH": foreign_padding("libgreet.so.1", 30)}
    policy = Policy(on_error="allow", limits=Limits(max_files=20))
    v = decide(policy, StepRequest(partition=None, argv=[str(exe)], env=env, cwd="/", node=node))
    assert v.action == "reject"
    assert {"check-limit", "page-congruence"} <= set(v.rule_ids)
    assert v.error and "20 files" in v.error


def test_cleaned_leak_is_never_a_reject(foreign_exe: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    os.link(foreign_exe, venv / "bin" / "python")
    env = {"VIRTUAL_ENV": str(venv), "PATH": f"{venv}/bin:/usr/bin:/bin"}
    v = run(Policy(mode="enforce"), ["/bin/true"], env=env)
    assert v.action == "warn" and v.rule_ids == ("env-leak",)
    assert "VIRTUAL_ENV" in v.env.unset
    # Not cleaned (strip=never): still at most a warning (max_severity).
    from grace_policy.policy import EnvPolicy
    v = run(Policy(mode="enforce", env=EnvPolicy(strip="never")), ["/bin/true"], env=env)
    assert v.action != "reject"


def test_simulated_64k_node_does_not_blame_the_system_libraries(elf_builder: ElfBuilder) -> None:
    """On a 4 KiB host simulating a 64 KiB node, libc and ld.so are "wrong"
    by construction; telling a user to relink libc is noise. Their page
    findings are info (audit only); the user's own 4 KiB build still fails."""
    node = NodeProfile(machine=detect().machine, page_size=65536, glibc=(2, 36))
    env = {"PATH": "/usr/bin:/bin"}
    system = decide(ROOMY, StepRequest(partition=None, argv=["/bin/true"], env=env, cwd="/",
                                       node=node))
    assert system.action == "allow"
    assert system.findings and {f.severity for f in system.findings} == {"info"}
    assert all(f.remediation and "system image" in f.remediation for f in system.findings
               if f.rule.startswith("page-"))
    own = elf_builder.compile(src("hello.c"), "bin/app", page_size=4096)
    mine = decide(ROOMY, StepRequest(partition=None, argv=[str(own)], env=env, cwd="/", node=node))
    assert mine.action == "reject"
    assert ("page-congruence", "error") in {(f.rule, f.severity) for f in mine.findings
                                            if f.path == str(own)}


def test_check_limit_uses_the_sites_text() -> None:
    from grace_policy.policy import RuleOverride

    policy = Policy(limits=Limits(deadline_ms=0),
                    rules=(RuleOverride("check-limit", text="Ring the help desk ({limit})."),))
    v = decide(policy, StepRequest(partition=None, argv=["/bin/true"], env={"PATH": "/usr/bin"},
                                   cwd="/"))
    limit = [f for f in v.findings if f.rule == "check-limit"]
    assert limit and limit[0].remediation.startswith("Ring the help desk (")
    assert "deadline" in limit[0].remediation and "on_error=allow" in limit[0].remediation
