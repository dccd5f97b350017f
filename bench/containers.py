"""A pyxis container step with and without grace-policy (issue 15 item 9).

pyxis 0.24.0 and enroot 4.1.2 as the tests build them (tests/slurm/
containers.py), a small local ``.sqsh``; plugstack.conf alternates between
pyxis alone and pyxis followed by grace-policy on the same running cluster,
so the added time is the only difference. "pyxis' own start" is the
pyxis-alone step minus a plain ``srun /bin/true`` (no plugin): what pyxis
and enroot spend unpacking and starting the imported image. Steps run as
root (the tests' enroot build lives in root's cache).

``python3 -m bench.containers`` prints the rows alone; ``make bench`` adds
them to docs/PERFORMANCE.md when the cluster runs.
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from tests.slurm.harness import SIDE_EFFECT_C, SlurmEnv


def _srun(env: SlurmEnv, argv: Sequence[str], extra: dict[str, str]) -> float:
    cmd = ["srun", "-N1", "-n1", "-p", "enforce", *argv]
    t0 = time.perf_counter()
    res = subprocess.run(cmd, env=env.cluster.env(extra), cwd=str(env.cluster.shared),
                         text=True, capture_output=True, timeout=300, check=False)
    ms = (time.perf_counter() - t0) * 1000
    if res.returncode != 0 or "grace-policy" in res.stderr:
        raise RuntimeError(f"{' '.join(cmd)}: {res.returncode}: {res.stderr[-1500:]}")
    return ms


def setup(env: SlurmEnv, work: Path) -> tuple[Path, dict[str, str]]:
    """pyxis/enroot wired into the cluster and a clean image; returns the
    pyxis plugin and the step environment enroot needs."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from tests.slurm import containers

    prefix = containers.enroot_prefix()
    plugin = work / "spank_pyxis.so"
    shutil.copy2(containers.pyxis_plugin(), plugin)
    for tool in (prefix / "bin").iterdir():
        link = env.cluster.bin_dir / tool.name
        if not link.is_symlink():
            link.symlink_to(tool)
    src = work / "tool.c"
    src.write_text(SIDE_EFFECT_C)
    subprocess.run(["gcc", "-O1", "-o", str(work / "tool"), str(src)], check=True)
    root = containers.make_root(work / "root", "amd64", files={"/opt/app/bin/tool": work / "tool"})
    containers.mksquashfs(root, env.cluster.shared / "bench.sqsh")
    for sub in ("home", "run", "pyxis-runtime"):
        (work / sub).mkdir(exist_ok=True)
    extra = {"HOME": str(work / "home"), "XDG_RUNTIME_DIR": str(work / "run"), "TMPDIR": "/tmp",
             "PWD": str(env.cluster.shared)}
    return plugin, extra


_LOOP = r"""
set -e
for i in $(seq 1 "$RUNS"); do
  for side in $ORDER; do
    cp "$CONF/$side.conf" "$PLUGSTACK"
    if [ "$side" = bare ]; then set -- /bin/echo "side-effect program ran"
    else set -- --container-image=./bench.sqsh tool; fi
    t0=$(date +%s%N)
    out=$(srun --quiet --overlap -N1 -n1 "$@" 2>&1)
    t1=$(date +%s%N)
    # srun exits 0 even when the launch failed: only the program's line counts.
    [ "$out" = "side-effect program ran" ] || { echo "$side failed: $out" >&2; exit 3; }
    echo "$side $(( (t1 - t0) / 1000 ))"
  done
  ORDER=$(echo $ORDER | awk '{for (i = NF; i > 0; i--) printf "%s ", $i}')
done
"""


def rows(env: SlurmEnv, work: Path, runs: int) -> list[tuple[str, float, float, float, float]]:
    """(title, pyxis alone ms, with grace-policy ms, pyxis' own start ms,
    the check's own time in user_init from the audit line). All steps run
    in one allocation (salloc), so no job is allocated in the timed part."""
    plugin, extra = setup(env, work)
    pyxis = f"required {plugin} runtime_path={work / 'pyxis-runtime'}"
    conf = work / "confs"
    conf.mkdir(exist_ok=True)
    out = []
    for title, args in (("cache warm", (f"cache_dir={env.cache_dir}",)),
                        ("cache cold (cache_dir=none)", ("cache_dir=none",))):
        ours = "required " + env.plugin_line(env.plugin, f"config={env.configs['base']}",
                                             f"audit={env.audit_log}", *args)
        (conf / "alone.conf").write_text(pyxis + "\n")
        (conf / "both.conf").write_text(pyxis + "\n" + ours + "\n")
        (conf / "bare.conf").write_text("# bench: no plugin\n")
        before = len(env.audit_lines())
        loop = {**extra, "RUNS": str(runs + 2), "ORDER": "alone both bare",
                "CONF": str(conf), "PLUGSTACK": str(env.cluster.plugstack)}
        res = subprocess.run(["salloc", "-N1", "-p", "enforce", "sh", "-c", _LOOP],
                             env=env.cluster.env(loop), cwd=str(env.cluster.shared), text=True,
                             capture_output=True, timeout=1800, check=False)
        if res.returncode != 0:
            raise RuntimeError(f"salloc loop failed: {res.stderr[-1500:]}")
        times: dict[str, list[float]] = {"alone": [], "both": [], "bare": []}
        for line in res.stdout.splitlines():
            side, _, us = line.partition(" ")
            if side in times:
                times[side].append(int(us) / 1000)
        for side in times:
            times[side] = times[side][2:]  # warm-up rounds
        import json

        checks = [json.loads(line).get("elapsed_ms") or 0.0
                  for line in env.audit_lines()[before:]]
        a, b, t = (statistics.median(times[k]) for k in ("alone", "both", "bare"))
        out.append((f"`srun --container-image=./IMG.sqsh tool` (pyxis 0.24.0, enroot 4.1.2, "
                    f"2 MiB lzo image), {title}", a, b, a - t,
                    statistics.median(checks) if checks else float("nan")))
    env.cluster.set_plugstack(["# bench: no plugin"])
    return out


def table(found: list[tuple[str, float, float, float, float]], runs: int) -> list[str]:
    """The PERFORMANCE.md rows (bench/run.py's columns)."""
    out = []
    for title, alone, both, start, check in found:
        added = both - alone
        cold = "cold" in title
        target = "≤ 100 ms added" if cold else "≤ 5% of pyxis' own start"
        ok = (added <= 100) if cold else (added <= 0.05 * start)
        out.append(f"| {title} (median of {runs}; pyxis' own start {start:.1f} ms; the check "
                   f"in user_init {check:.1f} ms) | {target} | {alone:.1f} ms | {both:.1f} ms "
                   f"| {added:+.1f} ms ({100 * added / start:.1f}% of pyxis' start) | "
                   f"{both / alone:.2f}× | {'holds' if ok else '**misses**'} |")
    return out


def main() -> int:
    import os
    import tempfile

    from tests.slurm.harness import prepare

    runs = int(os.environ.get("GRACE_BENCH_RUNS", "10"))
    root = Path(tempfile.mkdtemp(prefix="grace-bench-ct-"))
    root.chmod(0o755)
    env = prepare(root / "slurm")
    try:
        work = root / "pyxis"
        work.mkdir()
        for line in table(rows(env, work, runs), runs):
            print(line, flush=True)
    finally:
        env.cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
