"""``make test``: the suite as independent parts run side by side.

Why: most of a cold run is waiting, not computing (Slurm daemons starting,
steps polled, Debian roots unpacked, a kernel built while nothing else
runs, a qemu guest booting): one pytest process kept this 2-core machine
about 40 % busy for 37 minutes. The parts share nothing at run time: each
real-Slurm part starts its own clusters (own directories, free ports;
tests/slurm/procs.py tells their processes apart), each Debian release
root is a cache entry of its own, and every cache entry is built under a
lock (tests/corpus.py), so two parts that need the same kernel or root
build it once.

Every test belongs to exactly one part: a part is a set of paths, the
last part ("unit") is everything the others leave out, and the matrix's
file is split by ``-k`` expressions whose complement is a part too. Each
part writes its own coverage data; they are combined and reported once at
the end. What it prints: a line as each part ends, then a table (part,
passed, failed, skipped, minutes), the slowest tests, the coverage
report, and the failing parts' pytest summaries. Exit status: 0 when every
part passed, else 1.

``GRACE_TEST_JOBS`` (default 5: most parts wait on Slurm, qemu or a
release root more than they compute) caps how many parts run at once;
``GRACE_TEST_PARTS=a,b`` runs only those parts (still one coverage
report). Arguments after ``--`` go to every part's pytest.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
from slurm.groups import CONTAINERS  # noqa: E402  (constants only)

LOGS = REPO / "build" / "test-logs"

_MATRIX = "tests/slurm/test_matrix.py"
_PACKAGES = "tests/slurm/test_packages.py"
#: The tests that boot the arm64 guests (they share the 64 KiB kernel,
#: built once under its cache lock by whichever starts first).
_VM_NODE = ("tests/test_demos.py", "tests/test_page_oracle.py", "tests/test_grace_node.py",
            "tests/test_pagecode_vm.py")
_VM_CLUSTER = ("tests/test_two_arch.py",)
#: The Python model's oracles (real CPythons, editable installs) and the
#: registry client: about half of the unit tests' time, split off so the
#: longest part of a warm run uses both CPUs.
_UNIT_PYTHON = ("tests/python", "tests/registry")
#: Each part's minutes in the last run that passed (ordering only).
TIMES = Path(os.environ.get("GRACE_TEST_CACHE")
             or Path.home() / ".cache" / "grace-policy-tests") / "part-minutes.json"


@dataclass(frozen=True)
class Part:
    name: str
    #: pytest's own arguments: paths, -k, --ignore.
    args: tuple[str, ...]
    #: Minutes a cold run took (b4d034d's, the split parts halved): the
    #: longest start first when no run has been recorded here yet
    #: (:func:`_weights`).
    weight: float


def _ignore(paths: Sequence[str]) -> tuple[str, ...]:
    return tuple(f"--ignore={p}" for p in paths)


def parts() -> list[Part]:
    vm = [p for p in (*_VM_NODE, *_VM_CLUSTER) if (REPO / p).exists()]
    vm_node = tuple(p for p in _VM_NODE if p in vm)
    vm_cluster = tuple(p for p in _VM_CLUSTER if p in vm)
    slurm_host_ignore = (_MATRIX, _PACKAGES, *CONTAINERS)
    return [
        Part("vm-node", vm_node, 18.0),
        Part("matrix-24.11", (_MATRIX, _PACKAGES, "-k", "24.11"), 10.0),
        Part("matrix-26.05", (_MATRIX, "-k", "26.05 and not contain_spank and not containers"),
             5.6),
        Part("matrix-26.05-more", (_MATRIX, "-k", "26.05 and (contain_spank or containers)"),
             7.6),
        Part("vm-cluster", vm_cluster, 6.9),
        Part("slurm-22.05", ("tests/slurm", *_ignore(slurm_host_ignore)), 7.0),
        Part("slurm-22.05-containers", CONTAINERS, 7.0),
        Part("packages", (_MATRIX, _PACKAGES, "-k", "not 24.11 and not 26.05"), 2.0),
        Part("unit-python", _UNIT_PYTHON, 11.0),
        Part("unit", ("tests", "--ignore=tests/slurm", *_ignore(vm), *_ignore(_UNIT_PYTHON)),
             11.0),
    ]


def _weights(todo: list[Part]) -> list[Part]:
    """Longest first, by the minutes each part took in the last run that
    passed here (a warm run's order differs from a cold one's: the unit
    parts build the CUDA toolchain and the wheels cold, the release parts
    their roots), else by the static weight."""
    try:
        last = json.loads(TIMES.read_text())
    except (OSError, ValueError):
        last = {}
    return sorted(todo, key=lambda p: -float(last.get(p.name, p.weight)))


def _record(done: list[Running]) -> None:
    try:
        last = json.loads(TIMES.read_text())
    except (OSError, ValueError):
        last = {}
    for run in done:
        if run.proc.returncode == 0 and run.ended is not None:
            last[run.part.name] = round((run.ended - run.started) / 60, 2)
    try:
        TIMES.parent.mkdir(parents=True, exist_ok=True)
        TIMES.write_text(json.dumps(last, indent=1, sort_keys=True) + "\n")
    except OSError:
        pass


@dataclass
class Running:
    part: Part
    proc: subprocess.Popen[bytes]
    started: float
    log: Path
    xml: Path
    ended: float | None = None
    counts: dict[str, int] = field(default_factory=dict)
    #: CPU minutes (user + system) of the part's pytest and the children it
    #: waited for: a warm run is CPU-bound on 2 cores, so this, not the wall
    #: clock, says which part to make cheaper.
    cpu: float = 0.0


def _counts(xml: Path) -> dict[str, int]:
    try:
        root = ET.parse(xml).getroot()
    except (OSError, ET.ParseError):
        return {}
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    total = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for suite in suites:
        for key in total:
            total[key] += int(suite.get(key, "0"))
    total["passed"] = total["tests"] - total["failures"] - total["errors"] - total["skipped"]
    return total


def _slowest(xml: Path, n: int) -> list[tuple[float, str]]:
    try:
        root = ET.parse(xml).getroot()
    except (OSError, ET.ParseError):
        return []
    out = []
    for case in root.iter("testcase"):
        out.append((float(case.get("time", "0")),
                    f"{case.get('classname', '')}::{case.get('name', '')}"))
    return sorted(out, reverse=True)[:n]


def _start(part: Part, extra: Sequence[str]) -> Running:
    LOGS.mkdir(parents=True, exist_ok=True)
    log, xml = LOGS / f"{part.name}.log", LOGS / f"{part.name}.xml"
    env = dict(os.environ, COVERAGE_FILE=str(REPO / f".coverage.{part.name}"))
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
            "--durations=15", "--cov=grace_policy", "--cov-report=", f"--junitxml={xml}",
            *part.args, *extra]
    with log.open("wb") as out:
        out.write((" ".join(argv) + "\n").encode())
        out.flush()
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
    return Running(part, proc, time.monotonic(), log, xml)


def _summary(log: Path) -> str:
    """pytest's short summary (the failures) from a part's log."""
    text = log.read_text(errors="replace")
    at = text.rfind("short test summary info")
    if at < 0:
        return text[-4000:]
    return text[text.rfind("\n", 0, at) + 1:]


def main(argv: Sequence[str]) -> int:
    extra = list(argv[argv.index("--") + 1:]) if "--" in argv else []
    jobs = max(1, int(os.environ.get("GRACE_TEST_JOBS", "5")))
    wanted = [p for p in os.environ.get("GRACE_TEST_PARTS", "").split(",") if p]
    todo = _weights([p for p in parts() if not wanted or p.name in wanted])
    unknown = set(wanted) - {p.name for p in parts()}
    if unknown:
        print(f"tests/parts.py: unknown parts {sorted(unknown)}", file=sys.stderr)
        return 64
    for stale in REPO.glob(".coverage*"):
        stale.unlink()
    began = time.monotonic()
    ticks = _busy_ticks()
    running: list[Running] = []
    done: list[Running] = []
    while todo or running:
        while todo and len(running) < jobs:
            part = todo.pop(0)
            running.append(_start(part, extra))
            print(f"[{_clock(began)}] started {part.name}", flush=True)
        time.sleep(1.0)
        for run in list(running):
            pid, status, usage = os.wait4(run.proc.pid, os.WNOHANG)
            if pid == 0:
                continue
            run.proc.returncode = os.waitstatus_to_exitcode(status)
            run.cpu = (usage.ru_utime + usage.ru_stime) / 60
            run.ended = time.monotonic()
            run.counts = _counts(run.xml)
            running.remove(run)
            done.append(run)
            status = "ok" if run.proc.returncode == 0 else f"FAILED (exit {run.proc.returncode})"
            print(f"[{_clock(began)}] {run.part.name}: {status}, {_line(run.counts)} in "
                  f"{(run.ended - run.started) / 60:.1f} min ({run.cpu:.1f} min CPU)", flush=True)
    _report(done, began)
    busy, total = (b - a for a, b in zip(ticks, _busy_ticks()))
    if total > 0:
        hz = os.sysconf("SC_CLK_TCK")
        print(f"\nmachine: {busy / hz / 60:.1f} CPU minutes busy of "
              f"{total / hz / 60:.1f} ({100 * busy / total:.0f} %), {os.cpu_count()} CPUs")
    _record(done)
    return 0 if all(r.proc.returncode == 0 for r in done) else 1


def _busy_ticks() -> tuple[int, int]:
    """(busy, total) clock ticks of every CPU since boot (/proc/stat): what
    the parts' own accounting misses, daemons and release roots included."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return 0, 0
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    total = sum(fields[:8])  # guest time is already in user
    return total - idle, total


def _clock(began: float) -> str:
    s = int(time.monotonic() - began)
    return f"{s // 60:02d}:{s % 60:02d}"


def _line(counts: dict[str, int]) -> str:
    if not counts:
        return "no results"
    bad = counts["failures"] + counts["errors"]
    return f"{counts['passed']} passed, {bad} failed, {counts['skipped']} skipped"


def _report(done: list[Running], began: float) -> None:
    print("\ntime per part (minutes)")
    print(f"{'part':<20} {'passed':>7} {'failed':>7} {'skipped':>8} {'minutes':>8} {'CPU min':>8}")
    total = {"passed": 0, "failures": 0, "errors": 0, "skipped": 0}
    for run in sorted(done, key=lambda r: r.part.name):
        c = run.counts or {"passed": 0, "failures": 0, "errors": 0, "skipped": 0}
        for key in total:
            total[key] += c.get(key, 0)
        assert run.ended is not None
        print(f"{run.part.name:<20} {c.get('passed', 0):>7} "
              f"{c.get('failures', 0) + c.get('errors', 0):>7} {c.get('skipped', 0):>8} "
              f"{(run.ended - run.started) / 60:>8.1f} {run.cpu:>8.1f}")
    print(f"{'all (wall clock)':<20} {total['passed']:>7} {total['failures'] + total['errors']:>7} "
          f"{total['skipped']:>8} {(time.monotonic() - began) / 60:>8.1f} "
          f"{sum(r.cpu for r in done):>8.1f}")
    slow = sorted((t for run in done for t in _slowest(run.xml, 30)), reverse=True)[:30]
    print("\nslowest tests (seconds)")
    for secs, name in slow:
        print(f"{secs:8.1f}  {name}")
    _coverage()
    for run in done:
        if run.proc.returncode != 0:
            print(f"\n===== {run.part.name} failed: {run.log} =====")
            print(_summary(run.log))


def _coverage() -> None:
    data = sorted(str(p) for p in REPO.glob(".coverage.*"))
    if not data:
        return
    env = dict(os.environ, COVERAGE_FILE=str(REPO / ".coverage"))
    subprocess.run([sys.executable, "-m", "coverage", "combine", *data], cwd=REPO, env=env,
                   stdout=subprocess.DEVNULL, check=False)
    print()
    subprocess.run([sys.executable, "-m", "coverage", "report", "-m", "--skip-covered"],
                   cwd=REPO, env=env, check=False)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
