"""The demos run as a newcomer runs them, for the tests.

``make demo-node`` boots the 64 KiB guest and runs every scenario of
:mod:`vm.slurmnode` on it; tests/test_grace_node.py asserts on the same
scenarios. Booting them twice cost a warm ``make test`` 1.5 minutes of
qemu (TCG) for the same steps, so one session fixture (``demo_node`` in
tests/conftest.py) runs the demo once and both modules read it: test_demos
what it shows, test_grace_node what the node decided.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from . import slurmnode

REPO = Path(__file__).resolve().parent.parent.parent


def make_as_newcomer(target: str, timeout: float, env: dict[str, str] | None = None) -> str:
    """``make TARGET`` from the repository; its stdout. Fails on a non-zero
    exit or a traceback on stderr."""
    # As a newcomer types it in a shell: not as a sub-make of `make test`,
    # whose MAKELEVEL/MAKEFLAGS would add "make[1]: Entering directory" lines.
    full = {k: v for k, v in os.environ.items() if k not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS")}
    full.update(env or {})
    done = subprocess.run(["make", target], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, check=False, env=full)
    out = done.stdout + done.stderr
    assert done.returncode == 0, f"make {target} exited {done.returncode}:\n{out[-6000:]}"
    # The demo's own crash goes to stderr; what the steps print (a node's
    # python failing an import, shown on purpose) is on stdout.
    assert "Traceback" not in done.stderr, done.stderr[-6000:]
    return done.stdout


@dataclass(frozen=True)
class DemoNode:
    #: What ``make demo-node`` printed.
    out: str
    #: The node's side of the same boot: every step, the audit, the cases.
    run: slurmnode.NodeRun


def run_demo_node(work: Path) -> DemoNode:
    out = make_as_newcomer("demo-node", timeout=3600, env={"GRACE_DEMO_NODE_DIR": str(work)})
    return DemoNode(out, slurmnode.load_run(work))
