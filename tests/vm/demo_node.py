"""``make demo-node``: the plugin on a real 64 KiB aarch64 node, for a newcomer.

Boots the 64 KiB arm64 guest under qemu (building and caching what it needs
on first use: the kernel takes minutes), starts a one-node Slurm there with
the plugin built for aarch64, submits what a user from an x86_64 login node
would, and prints what each user saw and what the audit log recorded.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
for _p in (str(HERE.parent), str(HERE.parent.parent)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

from vm import slurmnode  # noqa: E402

WHAT = {
    "native": "a clean aarch64 program built for 64 KiB pages",
    "native-again": "the same step again (answered by the verdict cache, no Python)",
    "x86-program": "a program built on the x86_64 login node",
    "x86-venv-leak": "a clean program, with VIRTUAL_ENV leaked from an x86_64 venv",
    "4k-build": "an aarch64 program linked for 4 KiB pages",
    "python-4k-ext": "a venv of the node's python importing an extension linked for 4 KiB",
    "python-unused": "the same venv, the broken package not imported",
    "login-venv-x86": "a venv of the login node's python3.11 importing an x86_64 wheel",
    "login-venv-unused": "the same venv, the x86_64 package not imported",
    "login-user-site": "python3.11 importing an x86_64 wheel from a PYTHONUSERBASE",
    "login-pythonpath": "python3.11 importing an x86_64 wheel from PYTHONPATH",
    "login-console-script": "a console script of that venv importing the x86_64 wheel",
    "login-clean": "a venv of python3.11 holding aarch64 wheels only",
}


def main() -> int:
    print("grace-policy on a 64 KiB-page aarch64 node (qemu-system-aarch64, TCG): "
          "booting; the first run builds the kernel and the node's root.", flush=True)
    with tempfile.TemporaryDirectory(prefix="grace-node-demo-") as tmp:
        run = slurmnode.run_node(Path(tmp), None)
    records = [json.loads(line) for line in run.audit]
    print(f"Slurm was idle {run.boot_seconds:.0f} s after boot (guest clock); "
          f"the whole run took {run.total_seconds:.0f} s.\n")
    for i, (name, (argv, env)) in enumerate(slurmnode.SCENARIOS.items()):
        step = run.steps.get(name)
        shown_env = " ".join(f"{k}={v}" for k, v in env.items() if k != "PATH")
        print(f"== {WHAT.get(name, name)}\n$ {shown_env + ' ' if shown_env else ''}"
              f"srun -p {slurmnode.PARTITION} {' '.join(argv)}")
        if step is None:
            print("   (no result)\n")
            continue
        for line in (step.stdout + step.stderr).splitlines():
            print(f"   {line}")
        print(f"   exit status {step.rc}, {step.seconds:.1f} s")
        if i < len(records):
            r = records[i]
            print(f"   audit: action={r['action']} rules={r['rules']} "
                  f"cache={r.get('cache', '-')} node={r['node']}")
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
