"""The plugin on a real Grace-like node (issue 10): aarch64, 64 KiB pages.

One boot of the 64 KiB guest, the one ``make demo-node`` makes (:mod:`vm.slurmnode`,
shared with tests/test_demos.py): Debian 12 arm64's Slurm
22.05 with the plugin cross-built for aarch64, a config without ``[node]``,
and steps a user from an x86_64 login node would submit. Each must get the
verdict, the message and the audit line it gets on x86_64 with a simulated
node, here with the node detected. The verdict cache is the C one, so the
second identical clean step must be a hit.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from roomy import ROOMY
from vm import slurmnode
from vm.demo_run import DemoNode

from grace_policy.decide import StepRequest, decide
from grace_policy.node import NodeProfile, host_machine

pytestmark = [
    pytest.mark.vm, pytest.mark.network, pytest.mark.cross,
    pytest.mark.skipif(host_machine() != "x86_64",
                       reason="cross-builds with Debian's x86_64-hosted aarch64 toolchain"),
]
PREFIX = "grace-policy: "


@pytest.fixture(scope="module")
def node(demo_node: DemoNode) -> slurmnode.NodeRun:
    """The boot ``make demo-node`` made (tests/conftest.py): the same
    scenarios, the site's contact text instead of the tests' own."""
    run = demo_node.run
    steps = ", ".join(f"{k} {v.seconds:.1f} s" for k, v in run.steps.items())
    print(f"\ngrace node: Slurm idle {run.boot_seconds:.1f} s after boot; steps: {steps}; "
          f"whole qemu run {run.total_seconds:.1f} s")
    return run


def said(stderr: str) -> str:
    """The plugin's lines as one text (their wrapping undone)."""
    lines = [line[len(PREFIX):] for line in stderr.splitlines() if line.startswith(PREFIX)]
    return " ".join(" ".join(lines).split())


def audit_of(run: slurmnode.NodeRun) -> list[dict[str, object]]:
    return [json.loads(line) for line in run.audit]


def test_every_scenario_ran(node: slurmnode.NodeRun) -> None:
    assert list(node.steps) == [*slurmnode.SCENARIOS, *slurmnode.DIRECT], node.console[-2000:]
    # One decision line per step, from this node.
    records = audit_of(node)
    assert len(records) == len(slurmnode.SCENARIOS), node.audit
    assert {r["node"] for r in records} == {slurmnode.NODE}


def test_clean_native_step_runs_and_is_then_cached(node: slurmnode.NodeRun) -> None:
    first, again = node.steps["native"], node.steps["native-again"]
    for step in (first, again):
        assert step.rc == 0, step.stderr
        assert step.stdout == "hello\n" and PREFIX not in step.stderr
    records = audit_of(node)
    assert records[0]["action"] == "allow" and records[0].get("cache") != "hit"
    assert records[1]["action"] == "allow" and records[1].get("cache") == "hit"


def test_x86_program_is_refused_with_the_remedy(node: slurmnode.NodeRun) -> None:
    step = node.steps["x86-program"]
    assert step.rc != 0 and "hello" not in step.stdout
    assert f"{PREFIX}ERROR exe-arch-mismatch: /cases/bin/tool-x86" in step.stderr
    assert "built for x86_64; these nodes are aarch64" in said(step.stderr)
    assert "without this check: slurmstepd: error: execve(): /cases/bin/tool-x86: Exec " \
           "format error" in said(step.stderr)
    record = audit_of(node)[2]
    assert (record["action"], record["rules"]) == ("reject", ["exe-arch-mismatch"])


def test_leaked_x86_venv_is_removed_and_the_step_runs(node: slurmnode.NodeRun) -> None:
    step = node.steps["x86-venv-leak"]
    assert step.rc == 0 and step.stdout == "hello\n", step.stderr
    assert "removed from the step's environment: VIRTUAL_ENV" in said(step.stderr)
    record = audit_of(node)[3]
    assert "VIRTUAL_ENV" in record["env_unset"]  # type: ignore[operator]


def test_4k_build_is_refused_on_the_detected_64k_node(node: slurmnode.NodeRun) -> None:
    """The config names no page size and this host has 4 KiB pages: the
    64 KiB in the message can only come from the node itself."""
    step = node.steps["4k-build"]
    assert step.rc != 0 and "hello" not in step.stdout
    assert f"{PREFIX}ERROR page-congruence: /cases/bin/hello-4k" in step.stderr
    assert "pages smaller than this node's 64 KiB" in said(step.stderr)
    record = audit_of(node)[4]
    assert record["action"] == "reject" and "page-congruence" in record["rules"]  # type: ignore[operator]


def test_the_guest_had_no_network_device(node: slurmnode.NodeRun) -> None:
    """Everything ran over loopback: qemu gets -nodefaults and no NIC, so the
    guest's kernel has no interface but lo."""
    assert node.netdevs == ("lo",)


def test_python_step_importing_a_4k_extension_is_refused(node: slurmnode.NodeRun) -> None:
    # The prediction, and what the node's own python really does without Slurm.
    step = node.steps["python-4k-ext"]
    assert step.rc != 0, step.stderr
    assert f"{PREFIX}ERROR page-congruence: /cases/venv-py/lib/python3.11/site-packages/" \
           "ext4k/_core.abi3.so" in step.stderr
    predicted = "ELF load command address/offset not page-aligned"
    assert f"ImportError: /cases/venv-py/lib/python3.11/site-packages/ext4k/_core.abi3.so: " \
           f"{predicted}" in said(step.stderr)
    real = node.steps["python-4k-ext-direct"]
    assert real.rc != 0 and predicted in real.stderr, real.stderr
    assert "ImportError" in real.stderr
    # The same environment, the package not imported: a warning, and it runs.
    unused = node.steps["python-unused"]
    assert unused.rc == 0 and unused.stdout == "ran\n", unused.stderr
    assert f"{PREFIX}WARNING py-dist-broken:" in unused.stderr
    actions = [r["action"] for r in audit_of(node) if "venv-py" in str(r.get("program"))]
    assert actions == ["reject", "warn"], actions


#: What the plugin must decide here for the login node's environments (issue 16).
LOGIN_VERDICTS = {
    "login-venv-x86": ("reject", ["py-ext-arch"]),
    "login-venv-unused": ("warn", ["py-dist-broken"]),
    "login-user-site": ("reject", ["py-ext-arch"]),
    "login-pythonpath": ("reject", ["py-ext-arch"]),
    "login-console-script": ("reject", ["py-ext-arch"]),
    "login-clean": ("allow", []),
}


def _on_host(cases: Path, text: str) -> str:
    return str(cases) + text[len("/cases"):] if text.startswith("/cases/") else text


def _on_guest(cases: Path, path: str) -> str:
    return "/cases" + path[len(str(cases)):] if path.startswith(f"{cases}/") else path


def shown(stderr: str) -> list[tuple[str, str, str]]:
    """(severity, rule, path) of each finding the job's user saw."""
    out = []
    for line in stderr.splitlines():
        words = line.split(" ", 3)
        if len(words) == 4 and words[0] == PREFIX.strip() and words[1] in ("ERROR", "WARNING"):
            out.append((words[1], words[2].rstrip(":"), words[3]))
    return sorted(out)


def test_login_node_predictions_are_the_nodes_verdicts(node: slurmnode.NodeRun) -> None:
    """Each environment filled on the x86_64 login node with its
    distribution's python, judged from this x86_64 host for the aarch64
    64 KiB partition, gets the verdict the plugin gave on the node, where
    the node's own /usr/bin/python3.11 ran it: the same action and the same
    findings (severity, rule, file) in the job's output. The node's audit
    line may name INFO rules besides (relro-tail on Debian's own
    libnsl.so.2, loaded by the standard library): those concern the node's
    own files, which the login node does not judge, and no user sees them."""
    assert node.cases is not None and set(LOGIN_VERDICTS) == set(slurmnode.LOGIN_SCENARIOS)
    records = dict(zip(slurmnode.SCENARIOS, audit_of(node)))
    grace = NodeProfile(machine="aarch64", page_size=65536, glibc=(2, 36),
                        root_is_native=False)
    for name in slurmnode.LOGIN_SCENARIOS:
        argv, extra = slurmnode.SCENARIOS[name].argv, slurmnode.SCENARIOS[name].env
        here = [_on_host(node.cases, a) for a in argv]
        script = Path(here[0])
        if script.read_bytes().startswith(b"#!/cases/"):
            # the console script's #! names the guest path; the same script
            # as pip would have written it here
            copy = script.with_name(script.name + "-here")
            copy.write_text("#!" + _on_host(node.cases, script.read_text()[2:]))
            copy.chmod(0o755)
            here[0] = str(copy)
        env = {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent",
               **{k: _on_host(node.cases, v) for k, v in extra.items()}}
        verdict = decide(ROOMY,
                         StepRequest(partition=None, argv=here, env=env, cwd=str(node.cases),
                                     node=grace))
        predicted = sorted((f.severity.upper(), f.rule, _on_guest(node.cases, f.path))
                           for f in verdict.findings if f.severity != "info")
        step = node.steps[name]
        record = records[name]
        assert (verdict.action, predicted) == (record["action"], shown(step.stderr)), \
            (name, verdict.findings, record, step.stderr)
        action, rules = LOGIN_VERDICTS[name]
        assert (verdict.action, sorted({r for _s, r, _p in predicted})) == (action, rules)
        if action == "reject":
            assert step.rc != 0 and "ran" not in step.stdout, (name, step.stderr)
        else:
            assert step.rc == 0 and "ran" in step.stdout, (name, step.stderr)
    # Without Slurm the node's python fails at the import the plugin named.
    real = node.steps["login-venv-x86-direct"]
    assert real.rc != 0 and "ImportError: /cases/venv-sys/lib/python3.11/site-packages/bcrypt/" \
                              "_bcrypt.abi3.so: cannot open shared object file" in real.stderr


def test_the_check_ran_under_its_system_call_filter(node: slurmnode.NodeRun) -> None:
    """The guest's kernel has seccomp filters (tests/vm/images.py), so every
    check above ran under the aarch64 filter (grace_policy/checker/confine.py)
    and still gave its verdict; a check that ran without it says so in
    slurmd's log, and one whose filter failed to install is failure check."""
    assert "without its system call filter" not in node.slurmd_log, node.slurmd_log[-3000:]
    assert "was not confined" not in node.slurmd_log, node.slurmd_log[-3000:]
