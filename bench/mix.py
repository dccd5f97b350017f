"""A realistic day on a node (issue 18 item 4), with and without the plugin.

Five real accounts (made here with useradd, removed at the end), each with a
venv of a few thousand files (bench/pyenv.py's torch-shaped ``faketorch``)
in their home, each running

* a sweep ``srun .../venv/bin/python train.py --seed N`` (N = 1..STEPS), and
* STEPS ``srun`` of node programs, in turn: ``hostname``, an
  ``nvidia-smi``-like program (a root-owned tool with a library of its own,
  as a driver install puts it) and ``/usr/bin/python3 -c 'import json'``,

round-robin over the users, as a node sees them. Every step runs twice,
once with the plugin line in plugstack.conf and once without, alternating
which goes first; the plugin starts with an empty verdict cache, so the
first step of each kind is cold (its cost is in the total). Reported: the
hit rate (audit log), the mix's total time with/without, and the median of
the warm (hit) steps per kind against the same steps without the plugin.

Scale with ``GRACE_BENCH_MIX_USERS`` (default 5) and
``GRACE_BENCH_MIX_STEPS`` (default 50: sweep steps and node-program steps
per user).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from tests.slurm.harness import SlurmEnv

from . import pyenv

USERS = int(os.environ.get("GRACE_BENCH_MIX_USERS", "5"))
STEPS = int(os.environ.get("GRACE_BENCH_MIX_STEPS", "50"))
PATH = "/usr/local/bin:/usr/bin:/bin"

_SMI_LIB = "int smi_query(void) { return 0; }\n"
_SMI_MAIN = ('#include <stdio.h>\nint smi_query(void);\n'
             'int main(void) { puts("GPU 0: fake"); return smi_query(); }\n')


def _node_tool(root: Path) -> Path:
    """An nvidia-smi-like program: root's, in a root directory, with its own
    library found through RUNPATH (what the node image installs)."""
    top = root / "opt-nvidia"
    (top / "bin").mkdir(parents=True)
    (top / "lib").mkdir()
    (top / "src").mkdir()
    (top / "src" / "lib.c").write_text(_SMI_LIB)
    (top / "src" / "main.c").write_text(_SMI_MAIN)
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(top / "lib" / "libnvidia-ml.so.1"),
                    "-Wl,-soname,libnvidia-ml.so.1", str(top / "src" / "lib.c")], check=True)
    exe = top / "bin" / "nvidia-smi"
    subprocess.run(["gcc", "-o", str(exe), str(top / "src" / "main.c"),
                    str(top / "lib" / "libnvidia-ml.so.1"), "-Wl,--enable-new-dtags",
                    "-Wl,-rpath,$ORIGIN/../lib"], check=True)
    for dirpath, _dirs, files in os.walk(top):
        os.chmod(dirpath, 0o755)
        for f in files:
            os.chmod(os.path.join(dirpath, f), 0o755)
    return exe


class Users:
    """``USERS`` accounts made for the bench; removed by :meth:`remove`."""

    def __init__(self, root: Path, count: int) -> None:
        self.made: list[str] = []
        self.homes: dict[str, Path] = {}
        for i in range(1, count + 1):
            name = f"gpbench{i}"
            home = root / f"home-{name}"
            if subprocess.run(["id", "-u", name], capture_output=True,
                              check=False).returncode != 0:
                subprocess.run(["useradd", "--no-create-home", "--home-dir", str(home),
                                "--shell", "/bin/sh", "--user-group", name], check=True)
                self.made.append(name)
            home.mkdir(mode=0o755)
            shutil.chown(home, name, name)
            self.homes[name] = home

    def remove(self) -> None:
        for name in self.made:
            subprocess.run(["userdel", name], check=False, capture_output=True)


def _give(path: Path, user: str) -> None:
    subprocess.run(["chown", "-R", f"{user}:{user}", str(path)], check=True)


def build(root: Path, users: Users, files: int = 3_000, modules: int = 30
          ) -> tuple[dict[str, list[list[str]]], Path, int]:
    """Each user's steps in order, the nvidia-smi-like tool, and the size
    of one venv (files). One venv is built, then copied into every home."""
    template = pyenv.build(root / "venv-template", files, modules)
    count = pyenv.count_files(template)
    smi = _node_tool(root)
    node_programs = [["hostname"], [str(smi)], ["/usr/bin/python3", "-c", "import json"]]
    plans: dict[str, list[list[str]]] = {}
    for name, home in users.homes.items():
        shutil.copytree(template.parent.parent.parent, home / "env", symlinks=True)
        (home / "train.py").write_text("import sys\nimport faketorch\n\n"
                                       "print('training with', sys.argv[1:])\n")
        # What a user's first run leaves behind (compiled modules), so the
        # sweep's second step does not see a new __pycache__ directory.
        python = home / "env" / "venv" / "bin" / "python"
        subprocess.run([str(python), "-m", "compileall", "-q",
                        str(next((python.parent.parent / "lib").glob("python3*/site-packages")))],
                       check=True, capture_output=True)
        _give(home, name)
        steps = [[str(python), str(home / "train.py"), "--seed", str(seed)]
                 for seed in range(1, STEPS + 1)]
        steps += [node_programs[i % len(node_programs)] for i in range(STEPS)]
        # sweep and node programs interleaved, as a user's job script runs them
        plans[name] = [steps[i // 2 + (i % 2) * STEPS] for i in range(2 * STEPS)]
    return plans, smi, count


def _srun(env: SlurmEnv, user: str, home: Path, argv: Sequence[str]) -> float:
    cmd = ["srun", "-N1", "-n1", "-p", "enforce", *argv]
    run_env = env.cluster.env({"HOME": str(home), "PATH": PATH, "USER": user,
                               "LOGNAME": user})
    t0 = time.perf_counter()
    res = subprocess.run(cmd, env=run_env, cwd=str(home), user=user, text=True,
                         capture_output=True, timeout=120, check=False)
    ms = (time.perf_counter() - t0) * 1000
    if res.returncode != 0 or "grace-policy" in res.stderr:
        raise RuntimeError(f"{user}: {' '.join(cmd)} ({res.returncode}): {res.stderr[-2000:]}")
    return ms


def _kind(argv: Sequence[str]) -> str:
    if argv[-2:-1] == ["--seed"]:
        return "sweep"
    return os.path.basename(argv[0]) if argv[0] != "/usr/bin/python3" else "python3 -c"


def run(env: SlurmEnv, plans: dict[str, list[list[str]]], homes: dict[str, Path],
        cache_dir: Path) -> dict[str, object]:
    """The mix, alternating with/without per step. Returns the figures."""
    if cache_dir.exists():
        shutil.rmtree(cache_dir)
    with_ms: list[float] = []
    without_ms: list[float] = []
    #: per kind of warm step: with ms, without ms, with/without of each pair,
    #: and the plugin's own time in user_init (the audit line's elapsed_ms)
    warm: dict[str, tuple[list[float], list[float], list[float], list[float]]] = {}
    cold_ms: list[float] = []
    hits = decisions = 0
    order = [(user, plans[user][i]) for i in range(max(len(p) for p in plans.values()))
             for user in plans if i < len(plans[user])]
    turns: dict[str, int] = {}
    for user, argv in order:
        pair: dict[str, float] = {}
        hit = False
        # Which side goes first alternates per kind of step, so every kind
        # gets both orders equally (the second run of a pair finds warmer
        # caches; alternating over the whole sequence would hand one kind
        # mostly one order).
        turn = turns[_kind(argv)] = turns.get(_kind(argv), -1) + 1
        for side in (("with", "without") if turn % 2 == 0 else ("without", "with")):
            if side == "with":
                env.use("base", f"cache_dir={cache_dir}")
                before = len(env.audit_lines())
                pair[side] = _srun(env, user, homes[user], argv)
                records = [json.loads(line) for line in env.audit_lines()[before:]]
                decisions += len(records)
                hit = any(r.get("cache") == "hit" for r in records)
                hits += hit
                own = [float(r.get("elapsed_ms") or 0.0) for r in records]
            else:
                env.cluster.set_plugstack(["# bench: no plugin"])
                pair[side] = _srun(env, user, homes[user], argv)
        with_ms.append(pair["with"])
        without_ms.append(pair["without"])
        if hit:
            w, wo, ratio, inside = warm.setdefault(_kind(argv), ([], [], [], []))
            w.append(pair["with"])
            wo.append(pair["without"])
            ratio.append(pair["with"] / pair["without"])
            inside.extend(own)
        else:
            cold_ms.extend(own)
    env.cluster.set_plugstack(["# bench: no plugin"])
    return {
        "steps": len(order), "hits": hits, "decisions": decisions,
        "with_s": sum(with_ms) / 1000, "without_s": sum(without_ms) / 1000,
        "warm": {k: (statistics.median(w), statistics.median(wo), len(w),
                     statistics.median(ratio), statistics.median(inside))
                 for k, (w, wo, ratio, inside) in sorted(warm.items())},
        "cold_inside_ms": statistics.median(cold_ms) if cold_ms else 0.0,
        "node_file_entries": _entries(cache_dir / "node.v"),
    }


def _entries(prefix: Path) -> int:
    from grace_policy import verdict_cache

    files = list(prefix.parent.glob(prefix.name + "*")) if prefix.parent.exists() else []
    return sum(len(verdict_cache.parse_blocks(f.read_text())) for f in files)


def rows(env: SlurmEnv, root: Path, row) -> list[str]:  # type: ignore[no-untyped-def]
    """The mix's rows of the bench table (``row``: bench.run._row)."""
    users = Users(root, USERS)
    try:
        (root / "mix").mkdir()
        (root / "mix").chmod(0o755)
        plans, _smi, count = build(root / "mix", users)
        got = run(env, plans, users.homes, root / "mix-cache")
    finally:
        users.remove()
    steps, hits = int(got["steps"]), int(got["hits"])  # type: ignore[call-overload]
    w_s, wo_s = float(got["with_s"]), float(got["without_s"])  # type: ignore[arg-type]
    rate = 100.0 * hits / max(1, steps)
    title = (f"mix: {USERS} users × ({STEPS} `srun python train.py --seed N` in a "
             f"{count:,}-file venv + {STEPS} node programs), {steps} steps")
    out = [row(f"{title}: verdict-cache hits ({got['node_file_entries']} node-wide entries)",
               "≥ 95 %", "", f"{hits}/{steps} = {rate:.1f} %", "", "",
               "holds" if rate >= 95 else "**misses**"),
           row(f"{title}: total time, each step alternating with/without (misses: the "
               f"check's own median {got['cold_inside_ms']:.1f} ms)", "ratio ≤ 1.05",
               f"{wo_s:.1f} s", f"{w_s:.1f} s", f"{w_s - wo_s:+.1f} s", f"{w_s / wo_s:.3f}×",
               "holds" if w_s / wo_s <= 1.05 else "**misses**")]
    for kind, (w, wo, n, ratio, inside) in got["warm"].items():  # type: ignore[attr-defined]
        out.append(row(f"mix, warm `{kind}` steps: medians of {n} hits and of the same steps "
                       f"without; ratio: median of the pairs' ratios; the C lookup's own "
                       f"time (audit elapsed_ms) {inside:.2f} ms", "ratio ≤ 1.05",
                       f"{wo:.1f} ms", f"{w:.1f} ms", f"{w - wo:+.1f} ms", f"{ratio:.2f}×",
                       "holds" if ratio <= 1.05 else "**misses**"))
    return out


def main() -> int:
    """``python3 -m bench.mix``: the mix alone, on a cluster of its own
    (prints its rows; ``make bench`` runs it with the rest and writes the doc)."""
    import sys
    import tempfile

    from tests.slurm.harness import prepare, skip_reason

    from .run import _row

    reason = skip_reason()
    if reason:
        print(f"no cluster: {reason}", file=sys.stderr)
        return 1
    root = Path(tempfile.mkdtemp(prefix="grace-mix-"))
    root.chmod(0o755)
    env = prepare(root / "slurm")
    try:
        for line in rows(env, root, _row):
            print(line, flush=True)
    finally:
        env.cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
