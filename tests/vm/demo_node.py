"""``make demo-node``: the plugin on a real 64 KiB aarch64 node, for a newcomer.

Boots the 64 KiB arm64 guest under qemu (building and caching what it needs
on first use: the kernel takes minutes), starts a one-node Slurm there with
the plugin built for aarch64, submits what a user from an x86_64 login node
would, and prints what each user saw and what the audit log recorded.

``GRACE_DEMO_NODE_DIR=DIR`` runs it in DIR and leaves the guest's console,
its cases and its audit there (the tests judge that one boot twice: what a
newcomer sees, and what the node decided).
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
for _p in (str(HERE.parent), str(HERE.parent.parent)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

from slurm.harness import site_contact  # noqa: E402

from vm import slurmnode  # noqa: E402


def _show(name: str, scenario: slurmnode.Scenario, step: slurmnode.StepResult | None,
          command: str, record: dict[str, object] | None) -> None:
    shown_env = " ".join(f"{k}={v}" for k, v in scenario.env.items() if k != "PATH")
    print(f"== {scenario.what}\n$ {shown_env + ' ' if shown_env else ''}{command}")
    if step is None:
        print(f"   (no result for {name})\n")
        return
    for line in (step.stdout + step.stderr).splitlines():
        print(f"   {line}")
    print(f"   exit status {step.rc}, {step.seconds:.1f} s")
    if record is not None:
        print(f"   audit: action={record['action']} rules={record['rules']} "
              f"cache={record.get('cache', '-')} node={record['node']}")
    print()


def main() -> int:
    contact = site_contact()
    print("grace-policy on a 64 KiB-page aarch64 node (qemu-system-aarch64, TCG): "
          "booting; the first run builds the kernel and the node's root.", flush=True)
    print(f"The node's config names no [node]: it is detected. Its contact = "
          f"{json.dumps(contact)} (a site's, from packaging/grace-policy.example.toml) "
          "is whom the messages tell users to ask.", flush=True)
    keep = os.environ.get("GRACE_DEMO_NODE_DIR")  # the tests read this run (demo_run.py)
    with (contextlib.nullcontext(keep) if keep
          else tempfile.TemporaryDirectory(prefix="grace-node-demo-")) as work:
        run = slurmnode.run_node(Path(work), None, contact=contact)
    records = [json.loads(line) for line in run.audit]
    print(f"Slurm was idle {run.boot_seconds:.0f} s after boot (guest clock); "
          f"the whole run took {run.total_seconds:.0f} s.\n")
    # One audit line per srun step, in the order they ran.
    for i, (name, scenario) in enumerate(slurmnode.SCENARIOS.items()):
        _show(name, scenario, run.steps.get(name),
              f"srun -p {slurmnode.PARTITION} {shlex.join(scenario.argv)}",
              records[i] if i < len(records) else None)
    for name, scenario in slurmnode.DIRECT.items():
        _show(name, scenario, run.steps.get(name), shlex.join(scenario.argv), None)
    missing = [n for n in [*slurmnode.SCENARIOS, *slurmnode.DIRECT] if n not in run.steps]
    if missing:
        print(f"demo-node: no result for {', '.join(missing)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
