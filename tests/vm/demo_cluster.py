"""``make demo-cluster``: the two-architecture cluster, for a newcomer.

Starts an x86_64 controller and login node on this machine (inside a
network namespace made for it) and an aarch64 64 KiB-page compute node
under qemu (first run: builds and caches the kernel and the node's root),
plus an x86_64 node (a second slurmd here), submits the seeds' scenarios
(srun steps and batch jobs, to gb200 and x86) from the x86_64 side as an
ordinary user, shows what the user saw, what the node's audit log recorded
and what ``grace-policy check --partition P`` predicted on the login node,
then stops everything. Needs root (namespace, tap, daemons).
"""

from __future__ import annotations

import signal
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
for _p in (str(HERE.parent), str(HERE.parent.parent)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

from vm import twoarch, twoarch_cases  # noqa: E402


def main() -> int:
    # Stopped by a signal, still stop the guest and the daemons (finally).
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    why = twoarch.unavailable()
    if why:
        print(f"demo-cluster: {why}", file=sys.stderr)
        return 1
    print("grace-policy on a two-architecture cluster: x86_64 controller and login node "
          "(this machine), aarch64 64 KiB node (qemu). Starting...", flush=True)
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gp-cluster-") as tmp:
        cluster = twoarch.TwoArchCluster(Path(tmp))
        try:
            cluster.start()
            twoarch_cases.build_home(cluster, None)
            print(f"node {twoarch.NODE} idle after {cluster.boot_seconds:.0f} s; "
                  f"user {twoarch.USER}, home {cluster.home} (9p on the node)\n", flush=True)
            rows: list[tuple[str, object, object, bool]] = []
            for case in twoarch_cases.CASES:
                before = len(cluster.audit_lines(case.partition))
                out = twoarch_cases.submit(cluster, case)
                records = (twoarch_cases.job_record(cluster, case.partition, out.job_id)
                           if out.job_id else
                           twoarch_cases.node_record(cluster, before, case.partition))
                pred = twoarch_cases.predict(cluster, case)
                shown = " ".join(f"{k}={twoarch_cases.expand(v, cluster.home)}"
                                 for k, v in case.env.items())
                cmd = (f"srun -p {case.partition} {' '.join((*case.srun_opts, *case.argv))}"
                       if case.kind == "srun" else
                       " ".join(("sbatch", "-p", case.partition, *case.srun_opts,
                                 f"{case.name}.sh")))
                print(f"== {case.what}\nlogin$ {shown + ' ' if shown else ''}{cmd}")
                for line in (out.stdout + out.stderr).splitlines():
                    print(f"   {line}")
                print(f"   exit {out.rc} {out.job_state} ({out.seconds:.0f} s)")
                node = [(r["action"], r["rules"]) for r in records]
                print(f"   node audit: {node}")
                print(f"   login-node prediction: {pred['action']} {pred['rules']}\n",
                      flush=True)
                rows.append((case.name, node, (pred["action"], pred["rules"]),
                             twoarch_cases.agrees(records, pred)))
                if case.action == "reject":
                    warned = twoarch_cases.submit(cluster, case, case.warn_partition)
                    print(f"   the same on {case.warn_partition} (warn mode): it runs and fails "
                          "for real:")
                    for line in (warned.stdout + warned.stderr).splitlines():
                        if not line.startswith("grace-policy: "):
                            print(f"   {line}")
                    print(f"   exit {warned.rc}\n", flush=True)
            print("scenario | node (action, rules) | prediction | agree")
            for name, node, pred, same in rows:
                print(f"{name} | {node} | {pred} | {'yes' if same else 'NO'}")
        finally:
            cluster.stop()
    print(f"\nstopped; {time.monotonic() - t0:.0f} s in all")
    differ = [name for name, _node, _pred, same in rows if not same]
    if differ:
        print(f"demo-cluster: the login node's prediction differs from the node's decision: "
              f"{', '.join(differ)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
