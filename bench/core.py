"""The policy core alone, in-process and in fresh isolated interpreters.

Figures: ELF files/s of :func:`grace_policy.elf.read_elf` over the system
library directory; a full check of the 500-file tree and of the 100-library
executable (medians of repeated ``check_step`` calls, and the first call of
a process, which parses ld.so.cache too); the wall time of a clean step's
Python side in a fresh ``-I -S`` interpreter next to ``-c pass``; the
check's own time in a forked child of a preloaded process; and the
profiles (``-X importtime``, cProfile of one ``decide``).
"""

from __future__ import annotations

import cProfile
import io
import os
import pstats
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
STEP_SCRIPT = Path(__file__).resolve().parent / "_step.py"
WARM_SCRIPT = Path(__file__).resolve().parent / "_warm.py"
PY = "/usr/bin/python3"


def elf_files(directory: str) -> list[str]:
    """Regular files starting with the ELF magic (symlinks skipped: each file once)."""
    out = []
    for entry in os.scandir(directory):
        if entry.is_symlink() or not entry.is_file():
            continue
        try:
            with open(entry.path, "rb") as f:
                if f.read(4) == b"\x7fELF":
                    out.append(entry.path)
        except OSError:
            pass
    return sorted(out)


def read_elf_rate(files: list[str], rounds: int = 5) -> tuple[float, int]:
    """Median files/s over ``rounds`` passes (page cache warm after the first
    pass, which is what a node running many steps sees), and the error count."""
    from grace_policy.elf import ElfError, read_elf

    rates, errors = [], 0
    for _ in range(rounds):
        errors = 0
        t0 = time.perf_counter()
        for path in files:
            try:
                read_elf(path)
            except (ElfError, OSError):
                errors += 1
        rates.append(len(files) / (time.perf_counter() - t0))
    return statistics.median(rates), errors


def _check(exe: str, *args: str) -> object:
    from grace_policy.budget import Budget
    from grace_policy.check import check_step
    from grace_policy.node import detect

    env = {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent"}
    budget = Budget(deadline_ms=60_000, max_files=100_000, max_bytes=1 << 34)
    return check_step([exe, *args], env, "/", detect(), budget=budget)


def check_times(exe: str, runs: int = 15, args: tuple[str, ...] = ()
                ) -> tuple[float, float, int]:
    """(first call in a fresh interpreter ms (imports done before the clock
    starts: they are the importtime figure's), median of ``runs`` in-process ms,
    objects in the tree). ``args``: the step's arguments after ``exe``."""
    exe = os.path.abspath(exe)
    code = ("import sys, time; sys.path.insert(0, sys.argv[1]);"
            "from bench.core import _check; import grace_policy.check, grace_policy.node;"
            "t0 = time.perf_counter(); r = _check(*sys.argv[2:]);"
            "print((time.perf_counter() - t0) * 1000, len(r.tree.objects), len(r.issues),"
            " r.limit is not None)")
    res = subprocess.run([PY, "-I", "-S", "-c", code, str(REPO), exe, *args], check=True,
                         capture_output=True, text=True)
    first, _n, issues, limited = res.stdout.split()
    if int(issues) or limited == "True":
        raise RuntimeError(f"{exe}: the bench fixture is not clean ({issues} issues, "
                           f"stopped early: {limited})")
    times, report = [], None
    for _ in range(runs):
        t0 = time.perf_counter()
        report = _check(exe, *args)
        times.append((time.perf_counter() - t0) * 1000)
    return float(first), statistics.median(times), len(report.tree.objects)  # type: ignore[union-attr]


def fresh_step_ms(pkgdir: str, config: str, argv: list[str], runs: int = 21
                  ) -> tuple[float, float]:
    """Median wall ms of a fresh isolated interpreter running one clean step's
    Python side, and of ``-I -S -c pass``, alternated."""
    step_cmd = [PY, "-I", "-S", str(STEP_SCRIPT), pkgdir, config, *argv]
    bare_cmd = [PY, "-I", "-S", "-c", "pass"]
    subprocess.run(step_cmd, check=True)  # warm the page cache; fail loudly if not clean
    with_t, bare_t = [], []
    for _ in range(runs):
        for cmd, into in ((step_cmd, with_t), (bare_cmd, bare_t)):
            t0 = time.perf_counter()
            subprocess.run(cmd, check=True)
            into.append((time.perf_counter() - t0) * 1000)
    return statistics.median(with_t), statistics.median(bare_t)


def warm_check_ms(pkgdir: str, config: str, argv: list[str], runs: int = 21
                  ) -> dict[str, tuple[float, float]]:
    """The check's own time (``slurm_bridge.run_step``: config, check, audit,
    cache entry) of one clean step, as medians of (wall, CPU) ms, by mode:
    ``fork``: in a forked child of a process that imported everything
    (``grace_policy.warm.preload``) but never checked, what a pre-started
    per-node checker pays per miss; ``prefault``: the same child after
    ``warm.prefault`` (a checker that forks its next child ahead of the
    step); ``fresh``: the first call of a fresh process (the bridge imported
    before the clock), what the in-process check pays."""
    base = [PY, "-I", "-S", str(WARM_SCRIPT), pkgdir, config]

    def run(mode: str, n: int) -> tuple[list[float], list[float]]:
        out = subprocess.run([*base, mode, str(n), *argv], check=True, capture_output=True,
                             text=True).stdout.splitlines()
        return [float(x) for x in out[0].split()], [float(x) for x in out[1].split()]

    got: dict[str, tuple[list[float], list[float]]] = {
        "fork": run("fork", runs), "prefault": run("fork-prefault", runs)}
    fresh: tuple[list[float], list[float]] = ([], [])
    for _ in range(max(5, runs // 3)):
        wall, cpu = run("fresh", 1)
        fresh[0].extend(wall)
        fresh[1].extend(cpu)
    got["fresh"] = fresh
    return {mode: (statistics.median(w), statistics.median(c)) for mode, (w, c) in got.items()}


def importtime(pkgdir: str, config: str, argv: list[str], top: int = 25) -> str:
    """``-X importtime`` of a clean step in the isolated config: the modules
    the bare interpreter does not already have, by cumulative time."""
    bare = subprocess.run([PY, "-I", "-S", "-c", "import sys; print(' '.join(sys.modules))"],
                          check=True, capture_output=True, text=True).stdout.split()
    res = subprocess.run([PY, "-I", "-S", "-X", "importtime", str(STEP_SCRIPT), pkgdir, config,
                          *argv], check=True, capture_output=True, text=True)
    rows = []
    for line in res.stderr.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        self_us, cum_us, name = line[len("import time:"):].split("|")
        rows.append((int(cum_us), int(self_us), name[1:].rstrip()))
    depth0 = [r for r in rows if not r[2].startswith(" ")]
    total = sum(r[0] for r in depth0 if r[2].strip() not in bare)
    lines = [f"modules imported by a clean step beyond the bare interpreter's "
             f"{len(bare)}: {sum(1 for r in rows if r[2].strip() not in bare)}, "
             f"{total / 1000:.1f} ms at top level (one run, `-X importtime`)",
             f"{'cumulative us':>14} {'self us':>8}  module"]
    for cum, self_us, name in sorted(rows, reverse=True)[:top]:
        lines.append(f"{cum:>14} {self_us:>8}  {name}")
    return "\n".join(lines)


def profile_decide(config: str, argv: list[str], top: int = 18) -> str:
    """cProfile of one clean ``decide`` (the second call of the process: the
    imports are the importtime figure's business)."""
    from grace_policy.compiled import load_policy
    from grace_policy.decide import StepRequest, decide

    policy = load_policy(config)
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin"}
    decide(policy, StepRequest(partition="enforce", argv=argv, env=env, cwd="/"))
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    verdict = decide(policy, StepRequest(partition="enforce", argv=argv, env=env, cwd="/"))
    prof.disable()
    ms = (time.perf_counter() - t0) * 1000
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out)
    stats.sort_stats("cumulative").print_stats(top)
    body = "\n".join(line for line in out.getvalue().splitlines()
                     if line.strip() and not line.startswith(("   Ordered", "         ")))
    return (f"decide({argv}) -> {verdict.action}, {ms:.2f} ms under cProfile\n"
            + body.replace(str(REPO) + "/", ""))


if __name__ == "__main__":
    sys.exit("run: make bench")
