"""Batch scripts (issue 21): what reading a job script costs.

* the submit-host check, ``grace-policy submit --type sbatch --script F``
  as cli_filter.lua runs it (the installed launcher, a fresh
  ``/usr/bin/python3 -I``, the compiled config): target ≤ 300 ms;
* the batch step's Python side with and without the script's lines
  (``decide_batch`` vs ``decide`` on the same script, fresh processes).
"""

from __future__ import annotations

import statistics
import subprocess
import time
from pathlib import Path

from . import core

#: A typical GPU job script: a venv, a cd, python, an srun line.
TYPICAL = """#!/bin/bash
#SBATCH -J train
#SBATCH -p gpu --gpus=4 --time=04:00:00
#SBATCH -o %x-%j.out
set -euo pipefail
export OMP_NUM_THREADS=8
source {venv}/bin/activate
cd "$SLURM_SUBMIT_DIR"
echo "starting on $(hostname)"
python -c 'import sys' --epochs 3
srun --ntasks=1 hostname
"""


def typical_script(root: Path) -> Path:
    venv = root / "bench-venv"
    (venv / "bin").mkdir(parents=True, exist_ok=True)
    python = venv / "bin" / "python"
    if not python.exists():
        python.symlink_to(core.PY)
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (venv / "bin" / "activate").write_text(
        f'deactivate () {{ :; }}\nVIRTUAL_ENV="{venv}"\nexport VIRTUAL_ENV\n')
    script = root / "typical.sh"
    script.write_text(TYPICAL.format(venv=venv))
    script.chmod(0o755)
    return script


def submit_ms(prefix: Path, config: Path, script: Path, runs: int) -> float:
    """Median wall time of the submit-host check on ``script``."""
    argv = [str(prefix / "bin" / "grace-policy"), "submit", "--type", "sbatch",
            "--config", str(config), "--script", str(script)]
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(argv, capture_output=True, check=False, cwd=script.parent)
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def batch_step_ms(pkgdir: str, config: str, script: Path, runs: int) -> tuple[float, float]:
    """Medians (decide_batch, decide) of the Python side of a batch step on
    ``script``, each in a fresh ``-I -S`` interpreter, the policy loaded."""
    code = ("import sys, time; sys.path.insert(0, sys.argv[1]);"
            "from grace_policy.compiled import load_policy; p = load_policy(sys.argv[2]);"
            "t = time.perf_counter();"
            "from grace_policy.decide import StepRequest, decide;"
            "from grace_policy.batch.judge import decide_batch;"
            "f = decide_batch if sys.argv[4] == 'batch' else decide;"
            "f(p, StepRequest(partition=None, argv=[sys.argv[3]], env={'PATH': '/usr/bin:/bin',"
            " 'HOME': '/root', 'SLURM_SUBMIT_DIR': '/tmp'}, cwd='/tmp', node=None));"
            "print((time.perf_counter() - t) * 1000)")
    out: dict[str, list[float]] = {"batch": [], "plain": []}
    for _ in range(runs):
        for kind in out:
            done = subprocess.run([core.PY, "-I", "-S", "-c", code, pkgdir, config,
                                   str(script), kind], capture_output=True, text=True,
                                  check=True)
            out[kind].append(float(done.stdout.strip()))
    return statistics.median(out["batch"]), statistics.median(out["plain"])
