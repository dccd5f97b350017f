"""With and without the plugin on the tests' real one-node Slurm.

The cluster, the installed plugin and its configs come from
``tests.slurm.harness.prepare`` (the same code as the plugin scenarios and
``make demo``). plugstack.conf is re-read by slurmstepd at every launch, so
"with" and "without" alternate run by run on the same running cluster: the
only difference between the two columns is the plugin line.

Steps run as ``nobody`` (the plugin's real situation: a user, not root),
through ``subprocess``'s own setuid rather than runuser, so no extra process
sits in the measured time.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from tests.slurm.harness import SlurmEnv

USER = "nobody"


def _srun(env: SlurmEnv, argv: Sequence[str]) -> tuple[float, subprocess.CompletedProcess[str]]:
    cmd = ["srun", "-N1", "-n1", "-p", "enforce", *argv]
    t0 = time.perf_counter()
    res = subprocess.run(cmd, env=env.cluster.env(), cwd=str(env.cluster.shared), user=USER,
                         text=True, capture_output=True, timeout=120, check=False)
    ms = (time.perf_counter() - t0) * 1000
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({res.returncode}): {res.stderr[-2000:]}")
    return ms, res


def _touch_ctime(files: Sequence[Path]) -> None:
    """Give every file a new ctime (chmod to the same mode): any cache keyed
    by file identity sees a first-seen executable again. Not timed."""
    for f in files:
        os.chmod(f, os.stat(f).st_mode & 0o7777)


def cache_hits(env: SlurmEnv, before: int) -> tuple[int, int]:
    """(verdict-cache hits, decisions) among the audit lines after ``before``."""
    lines = env.audit_lines()[before:]
    return sum('"cache": "hit"' in line for line in lines), len(lines)


def alternate(env: SlurmEnv, argv: Sequence[str], runs: int, *,
              first_seen: Sequence[Path] = (), warmup: int = 3, plugin_args: Sequence[str] = ()
              ) -> tuple[list[float], list[float], tuple[int, int]]:
    """``runs`` timed sruns of ``argv`` each way, alternating which goes first
    in each pair. ``plugin_args``: extra plugstack arguments (``cache_dir=none``
    for the cold case). Returns (with ms, without ms, (cache hits, decisions)
    of the timed with-runs, from the audit log)."""
    with_ms: list[float] = []
    without_ms: list[float] = []
    hits = decisions = 0
    for i in range(warmup + runs):
        order = ("with", "without") if i % 2 == 0 else ("without", "with")
        for side in order:
            if side == "with":
                env.use("base", *plugin_args)
                _touch_ctime(first_seen)
                before = len(env.audit_lines())
            else:
                env.cluster.set_plugstack(["# bench: no plugin"])
            ms, res = _srun(env, argv)
            if side == "with":
                last = res.stdout + res.stderr
                if "grace-policy" in last:
                    raise RuntimeError(f"not a clean step: {last[-1000:]}")
                if i >= warmup:
                    h, d = cache_hits(env, before)
                    hits, decisions = hits + h, decisions + d
            if i >= warmup:
                (with_ms if side == "with" else without_ms).append(ms)
    env.cluster.set_plugstack(["# bench: no plugin"])
    return with_ms, without_ms, (hits, decisions)


def peak_rss(env: SlurmEnv, runs: int, plugin_args: Sequence[str] = ()
             ) -> tuple[list[int], list[int]]:
    """slurmstepd's VmHWM (KiB) as its task sees it: after user_init, so the
    embedded interpreter and everything the check imported are in it."""
    argv = ["sh", "-c", "grep VmHWM /proc/$PPID/status; cat /proc/$PPID/comm"]
    with_kib: list[int] = []
    without_kib: list[int] = []
    for i in range(runs):
        order = ("with", "without") if i % 2 == 0 else ("without", "with")
        for side in order:
            if side == "with":
                env.use("base", *plugin_args)
            else:
                env.cluster.set_plugstack(["# bench: no plugin"])
            _, res = _srun(env, argv)
            words = res.stdout.split()
            if "slurmstepd" not in words or "VmHWM:" not in words:
                raise RuntimeError(f"cannot read slurmstepd's VmHWM: {res.stdout!r}")
            kib = int(words[words.index("VmHWM:") + 1])
            (with_kib if side == "with" else without_kib).append(kib)
    env.cluster.set_plugstack(["# bench: no plugin"])
    return with_kib, without_kib


def start_node_checker(env: SlurmEnv, timeout: float = 60.0) -> tuple[tuple[str, ...], int]:
    """Restart slurmd with checker=node (it starts the server at its own
    start) and wait for the server. Returns the plugstack arguments that
    send misses to it and the server's pid."""
    sock = env.checker_socket
    args = ("checker=node", f"checker_socket={sock}")
    env.use("base", *args)
    env.cluster.restart_slurmd()
    want = f"--socket\0{sock}\0".encode()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for entry in Path("/proc").iterdir():
            try:
                if entry.name.isdigit() and want in (entry / "cmdline").read_bytes() \
                        and sock.exists():
                    return args, int(entry.name)
            except OSError:
                continue
        time.sleep(0.1)
    raise RuntimeError(f"no node checker on {sock} after a slurmd restart")


def rss_kib(pid: int) -> tuple[int, int]:
    """(VmRSS, Pss) of a process in KiB: what the node checker holds idle
    (Pss shares the interpreter's pages with every child it forks)."""
    status = Path(f"/proc/{pid}/status").read_text().split()
    rss = int(status[status.index("VmRSS:") + 1])
    pss = 0
    try:
        rollup = Path(f"/proc/{pid}/smaps_rollup").read_text().split()
        pss = int(rollup[rollup.index("Pss:") + 1])
    except (OSError, ValueError):
        pass
    return rss, pss


def node_checker_rows(env: SlurmEnv, runs: int, row: Callable[..., str],
                      first_seen: tuple[Sequence[str], Sequence[Path]] | None = None
                      ) -> list[str]:
    """The checker=node rows of ``make bench``: slurmd restarted with the
    line (it starts the server at its own start), cold and warm steps
    alternating with no plugin, slurmstepd's peak RSS and the server's own;
    then slurmd restarted with the base line (the default, checker=node), as
    the rest of the bench and every site without a checker= runs."""
    cold = ("cache_dir=none",)
    try:
        node_args, server = start_node_checker(env)
    except Exception as exc:
        return [row("checker=node figures", "", "", "", "", "",
                    f"not run: {type(exc).__name__}: {exc}")]
    rows = []
    # (title, argv, plugstack args, files whose ctime changes before each
    # run (a first-seen program: miss + store), ratio limit, ms-added limit)
    cases: list[tuple[str, Sequence[str], tuple[str, ...], Sequence[Path], float, float]] = [
        ("`srun /bin/true`, cache warm, checker=node", ["/bin/true"], (), (), 1.05, 0),
        ("`srun python3 -c pass`, cache warm, checker=node", ["python3", "-c", "pass"], (),
         (), 1.05, 0),
        ("`srun /bin/true`, cache cold, checker=node", ["/bin/true"], cold, (), 1.25, 0),
        ("`srun python3 -c pass`, cache cold, checker=node", ["python3", "-c", "pass"], cold,
         (), 1.25, 0)]
    if first_seen is not None:
        # What a first step of a new program costs by default.
        cases.append(("`srun` first-seen executable, 100 own libraries (miss + store), "
                      "checker=node", first_seen[0], (), first_seen[1], 0, 40))
    for title, argv, args, files, ratio, added in cases:
        w, wo, (hits, decisions) = alternate(env, argv, runs, first_seen=files,
                                             plugin_args=(*node_args, *args))
        mw, mwo = median(w), median(wo)
        ok = (mw / mwo <= ratio) if ratio else (mw - mwo <= added)
        rows.append(row(f"{title} (median of {runs}; {hits}/{decisions} cache hits)",
                        f"ratio ≤ {ratio}" if ratio else f"≤ {added:g} ms added",
                        f"{mwo:.1f} ms", f"{mw:.1f} ms", f"{mw - mwo:+.1f} ms",
                        f"{mw / mwo:.2f}×", "holds" if ok else "**misses**"))
    rw, rwo = peak_rss(env, max(5, runs // 3), plugin_args=(*node_args, *cold))
    mw, mwo = median(rw) / 1024, median(rwo) / 1024
    rows.append(row("slurmstepd peak RSS (VmHWM seen by the task), cache cold, checker=node",
                    "≤ 16 MiB added", f"{mwo:.1f} MiB", f"{mw:.1f} MiB", f"{mw - mwo:+.1f} MiB",
                    f"{mw / mwo:.2f}×", "holds" if mw - mwo <= 16 else "**misses**"))
    rss, pss = rss_kib(server)
    rows.append(row("node checker server, idle, once per node: VmRSS / Pss", "(informational)",
                    "", f"{rss / 1024:.1f} / {pss / 1024:.1f} MiB", "", "", ""))
    env.use("base")
    env.cluster.restart_slurmd()
    return rows


def median(values: Sequence[float]) -> float:
    return statistics.median(values)
