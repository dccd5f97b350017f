"""``python3 -m bench.rollout``: what the rollout tools cost.

* ``grace-policy report``: audit lines per second, plain and gzip, for a
  node-sized log (how often a metrics timer can afford to run);
* exemptions on the launch path: ``decide()`` on a step with a finding,
  without exemptions and with 50 that do not match and 1 that does (the
  clean path never looks at exemptions; exempted verdicts are never cached).

Prints a table; not an assertion (no timing asserts in tests).
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RUNS = int(os.environ.get("GRACE_BENCH_RUNS", "30"))


def _log_lines(n: int) -> list[str]:
    from grace_policy import audit
    from grace_policy.findings import Finding, Verdict

    clean = Verdict(action="allow", mode="enforce", partition="gb200")
    bad = Verdict(action="warn", mode="warn", partition="warnp", findings=(
        Finding("exe-arch-mismatch", "error", "/home/u/bin/tool", "Exec format error", "fix"),))
    out = []
    for i in range(n):
        v = bad if i % 10 == 0 else clean
        fields = audit.record_fields(v, {"job_id": i, "step_id": 0, "uid": 1000 + i % 50,
                                         "node": "n1", "elapsed_ms": 3.0 + i % 7,
                                         "program": f"/home/u/bin/p{i % 20}"})
        fields.update(event="decision", time="2026-12-01T08:00:00.123456Z")
        out.append(json.dumps(fields, sort_keys=True))
    return out


def report_rate(path: str, rounds: int = 5) -> float:
    from grace_policy import auditlog

    rates = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        report = auditlog.Report().read([path])
        rates.append(report.lines["total"] / (time.perf_counter() - t0))
    return statistics.median(rates)


def decide_ms(policy: object, exe: str, who: object, runs: int) -> float:
    from grace_policy.decide import StepRequest, decide
    from grace_policy.node import detect

    node = detect()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        decide(policy, StepRequest(partition=None, argv=[exe], env={"PATH": "/usr/bin"}, cwd="/",
                                   node=node, who=who))  # type: ignore[arg-type]
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def main() -> int:
    from grace_policy.exempt import Who
    from grace_policy.policy import Exemption, Policy

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        lines = _log_lines(200_000)
        plain = Path(tmp) / "audit.log"
        plain.write_text("\n".join(lines) + "\n")
        packed = Path(tmp) / "audit.log.1.gz"
        with gzip.open(packed, "wt") as f:
            f.write("\n".join(lines) + "\n")
        rows.append(("report, plain log", f"{report_rate(str(plain)):,.0f} lines/s",
                     f"{plain.stat().st_size / 1e6:.0f} MB, 200k lines"))
        rows.append(("report, gzip log", f"{report_rate(str(packed)):,.0f} lines/s",
                     f"{packed.stat().st_size / 1e6:.1f} MB"))

        cc = shutil.which("aarch64-linux-gnu-gcc")
        if cc is None:
            rows.append(("exemptions in decide()", "skipped", "aarch64-linux-gnu-gcc missing"))
        else:
            src = Path(tmp) / "h.c"
            src.write_text("int main(void){return 0;}\n")
            exe = Path(tmp) / "vendor" / "tool"
            exe.parent.mkdir()
            subprocess.run([cc, "-o", str(exe), str(src)], check=True)
            who = Who.current()
            misses = tuple(Exemption(rule="exe-arch-mismatch", until="2999-01-01", reason="r",
                                     paths=(f"/opt/other{i}/**",)) for i in range(50))
            hit = Exemption(rule="exe-arch-mismatch", until="2999-01-01", reason="r",
                            paths=(str(exe),))
            base = decide_ms(Policy(), str(exe), who, RUNS)
            none = decide_ms(Policy(exemptions=misses), str(exe), who, RUNS)
            one = decide_ms(Policy(exemptions=(*misses, hit)), str(exe), who, RUNS)
            rows.append(("decide(), foreign exe, no exemptions", f"{base:.3f} ms", "median"))
            rows.append(("  with 50 non-matching exemptions", f"{none:.3f} ms",
                         f"+{none - base:.3f} ms"))
            rows.append(("  with 50 + 1 matching (released)", f"{one:.3f} ms",
                         f"+{one - base:.3f} ms"))
    width = max(len(r[0]) for r in rows)
    print(f"{sys.version.split()[0]}, {os.cpu_count()} CPUs, {RUNS} runs")
    for name, value, note in rows:
        print(f"{name.ljust(width)}  {value:>18}  {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
