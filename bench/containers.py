"""A pyxis container step with and without grace-policy (issue 15 item 9;
issue 25 for the registry image).

pyxis 0.24.0 and enroot 4.1.2 as the tests build them (tests/slurm/
containers.py), a small local ``.sqsh`` or the same root pushed to Debian's
``docker-registry`` on 127.0.0.1 (tests/registry/local_registry.py);
plugstack.conf alternates between
pyxis alone and pyxis followed by grace-policy on the same running cluster,
so the added time is the only difference. "pyxis' own start" is the
pyxis-alone step minus a plain ``srun /bin/true`` (no plugin): what pyxis
and enroot spend unpacking and starting the imported image. Steps run as
root (the tests' enroot build lives in root's cache).

A registry image's verdict is never cached (docs/SPANK.md), so its rows
differ in what enroot and the registry have seen: "warm" pulls one tag
over and over (enroot's layer cache, the registry and the page cache hold
it), "cold" gives every step a tag nobody has pulled yet (its own layer,
config and manifest; and ``cache_dir=none``). Either way the plugin reads
the manifest and config before pyxis' own pull.

``python3 -m bench.containers [local] [registry]`` prints those rows alone
(both without arguments); ``make bench`` adds them to docs/PERFORMANCE.md
when the cluster runs.
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

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

    # A copy of the tests' enroot build in ``work``, as their pyxis fixture
    # installs it: its enroot.conf.d (the registry rows' ENROOT_ALLOW_HTTP)
    # stays out of the shared cache.
    prefix = work / "enroot"
    if not prefix.exists():
        containers.install_enroot(prefix)
    plugin = work / "spank_pyxis.so"
    shutil.copy2(containers.pyxis_plugin(), plugin)
    for tool in (prefix / "bin").iterdir():
        link = env.cluster.bin_dir / tool.name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(tool)
    src = work / "tool.c"
    src.write_text(SIDE_EFFECT_C)
    subprocess.run(["gcc", "-O1", "-o", str(work / "tool"), str(src)], check=True)
    root = work / "root"
    if not root.exists():  # the registry rows reuse the local rows' root
        containers.make_root(root, "amd64", files={"/opt/app/bin/tool": work / "tool"})
        containers.mksquashfs(root, env.cluster.shared / "bench.sqsh")
    for sub in ("home", "run", "pyxis-runtime"):
        (work / sub).mkdir(exist_ok=True)
    extra = {"HOME": str(work / "home"), "XDG_RUNTIME_DIR": str(work / "run"), "TMPDIR": "/tmp",
             "PWD": str(env.cluster.shared)}
    return plugin, extra


_LOOP = r"""
set -e
k=0
for i in $(seq 1 "$RUNS"); do
  for side in $ORDER; do
    cp "$CONF/$side.conf" "$PLUGSTACK"
    if [ "$side" = bare ]; then set -- /bin/echo "side-effect program ran"
    else
      # IMAGES: one image for every container step, or one word per step.
      k=$((k + 1))
      set -- --container-image="$(echo $IMAGES | awk -v k=$k '{print NF == 1 ? $1 : $k}')" tool
    fi
    t0=$(date +%s%N)
    out=$(srun --quiet --overlap -N1 -n1 "$@" 2>&1)
    t1=$(date +%s%N)
    # srun exits 0 even when the launch failed: only the program's line
    # counts (and pyxis' own progress lines for a registry image).
    got=$(printf '%s\n' "$out" | grep -v '^pyxis: import' || true)
    [ "$got" = "side-effect program ran" ] || { echo "$side failed: $out" >&2; exit 3; }
    echo "$side $(( (t1 - t0) / 1000 ))"
  done
  ORDER=$(echo $ORDER | awk '{for (i = NF; i > 0; i--) printf "%s ", $i}')
done
"""


class Row(NamedTuple):
    """One PERFORMANCE.md row's figures (ms)."""

    title: str
    alone: float
    both: float
    #: pyxis alone minus the bare ``srun /bin/echo``
    start: float
    #: the check's own time in user_init (the audit lines' elapsed_ms)
    check: float
    #: the target: None for "≤ 5% of pyxis' own start", else ms added
    added_limit: float | None = None


def _measure(env: SlurmEnv, work: Path, plugin: Path, extra: dict[str, str], runs: int,
             plugin_args: Sequence[str], images: Sequence[str]
             ) -> tuple[float, float, float, float, list[dict[str, object]]]:
    """(pyxis alone, with grace-policy, pyxis' own start, the check's own
    time), medians, and the audit records of the steps with grace-policy.
    ``images``: one for every container step, or one per step in the loop's
    order (runs + 2 rounds of alone and both). All steps run in one
    allocation (salloc), so no job is allocated in the timed part."""
    import json

    pyxis = f"required {plugin} runtime_path={work / 'pyxis-runtime'}"
    conf = work / "confs"
    conf.mkdir(exist_ok=True)
    ours = "required " + env.plugin_line(env.plugin, f"config={env.configs['base']}",
                                         f"audit={env.audit_log}", *plugin_args)
    (conf / "alone.conf").write_text(pyxis + "\n")
    (conf / "both.conf").write_text(pyxis + "\n" + ours + "\n")
    (conf / "bare.conf").write_text("# bench: no plugin\n")
    before = len(env.audit_lines())
    loop = {**extra, "RUNS": str(runs + 2), "ORDER": "alone both bare", "IMAGES": " ".join(images),
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
    records = [json.loads(line) for line in env.audit_lines()[before:]]
    checks = [r.get("elapsed_ms") or 0.0 for r in records]
    a, b, t = (statistics.median(times[k]) for k in ("alone", "both", "bare"))
    return a, b, a - t, statistics.median(checks) if checks else float("nan"), records


def rows(env: SlurmEnv, work: Path, runs: int) -> list[Row]:
    """The local ``.sqsh`` rows, verdict cache warm and cold."""
    plugin, extra = setup(env, work)
    out = []
    for title, args in (("cache warm", (f"cache_dir={env.cache_dir}",)),
                        ("cache cold (cache_dir=none)", ("cache_dir=none",))):
        a, b, start, check, _ = _measure(env, work, plugin, extra, runs, args,
                                         ["./bench.sqsh"])
        out.append(Row(f"`srun --container-image=./IMG.sqsh tool` (pyxis 0.24.0, enroot 4.1.2, "
                       f"2 MiB lzo image), {title}", a, b, start, check,
                       100.0 if "cold" in title else None))
    env.cluster.set_plugstack(["# bench: no plugin"])
    return out


def registry_rows(env: SlurmEnv, work: Path, runs: int) -> list[Row]:
    """A registry image for this node (allowed, so enroot pulls it): the
    check's manifest read against pyxis' own pull and start, warm and cold
    (the module's docstring says what those mean here)."""
    for tool in ("docker-registry", "skopeo"):
        if shutil.which(tool) is None:  # the tests' helper would pytest.skip
            raise RuntimeError(f"{tool} not installed (bash packaging/install-deps.sh)")
    plugin, extra = setup(env, work)
    tests = str(Path(__file__).resolve().parent.parent / "tests" / "registry")
    if tests not in sys.path:
        sys.path.insert(0, tests)
    from local_registry import LocalRegistry, oci_image

    # The local row's root (busybox, glibc, tool) as one gzip layer; a file
    # naming the tag makes every tag's layer, config and manifest new.
    root = work / "root"
    reg = LocalRegistry(work / "registry")
    conf_d = Path(str(work / "enroot" / "etc" / "enroot" / "enroot.conf") + ".d")
    conf_d.mkdir(exist_ok=True)
    # pyxis withholds ENROOT_ALLOW_HTTP from the job: enroot's own settings.
    (conf_d / "50-bench-registry.conf").write_text("ENROOT_ALLOW_HTTP yes\n")
    try:
        sizes: list[int] = []

        def push(tag: str) -> str:
            layer = oci_image(work / "layout", tag, {"x86_64": root},
                              env=["PATH=/opt/app/bin:/usr/bin:/bin"],
                              files={"etc/image-tag": tag.encode()})["x86_64"]
            sizes.append((work / "layout" / "blobs" / "sha256" / layer.split(":")[1])
                         .stat().st_size)
            reg.push(work / "layout", tag, "bench/img")
            return f"{reg.address}#bench/img:{tag}"

        out = []
        warm = [push("warm")]
        cold = [push(f"cold{i}") for i in range(2 * (runs + 2))]
        for title, args, images, limit in (
                ("warm (one tag: enroot's layer cache, the registry and the page cache hold it)",
                 (f"cache_dir={env.cache_dir}",), warm, None),
                ("cold (a tag never pulled before for every step; cache_dir=none)",
                 ("cache_dir=none",), cold, 50.0)):
            a, b, start, _, records = _measure(env, work, plugin, extra, runs, args, images)
            # Each step is judged twice (audit "phase"): allowed from the
            # registry's manifest in user_init (not a skip or an error), then
            # from the root pyxis made, before the first task.
            first = [r for r in records if r.get("phase") == "before_pull"]
            again = [r for r in records if r.get("phase") == "after_pull"]
            judged = sum(r.get("action") == "allow" and "pyxis registry image" in str(
                r.get("skipped")) for r in first)
            ms = [statistics.median([r.get("elapsed_ms") or 0.0 for r in rs]) if rs
                  else float("nan") for rs in (first, again)]
            size = statistics.median(sizes)
            out.append(Row(f"`srun --container-image=127.0.0.1:PORT#IMG:TAG tool` (pyxis 0.24.0, "
                           f"enroot 4.1.2, docker-registry 2.8.2, one {size / 2**20:.1f} MiB "
                           f"gzip layer), {title}; {judged}/{len(first)} steps allowed from "
                           f"the manifest, {len(again)} judged again after the pull (its "
                           f"check {ms[1]:.1f} ms, in task_init)", a, b, start, ms[0], limit))
    finally:
        (conf_d / "50-bench-registry.conf").unlink(missing_ok=True)
        reg.stop()
        env.cluster.set_plugstack(["# bench: no plugin"])
    return out


def table(found: list[Row], runs: int) -> list[str]:
    """The PERFORMANCE.md rows (bench/run.py's columns)."""
    out = []
    for r in found:
        added = r.both - r.alone
        if r.added_limit is None:
            target, ok = "≤ 5% of pyxis' own start", added <= 0.05 * r.start
        else:
            target, ok = f"≤ {r.added_limit:.0f} ms added", added <= r.added_limit
        out.append(f"| {r.title} (median of {runs}; pyxis' own start {r.start:.1f} ms; the "
                   f"check in user_init {r.check:.1f} ms) | {target} | {r.alone:.1f} ms | "
                   f"{r.both:.1f} ms | {added:+.1f} ms ({100 * added / r.start:.1f}% of pyxis' "
                   f"start) | {r.both / r.alone:.2f}× | {'holds' if ok else '**misses**'} |")
    return out


def main(argv: Sequence[str] = ()) -> int:
    """``argv``: which rows (``local``, ``registry``); all without."""
    import os
    import tempfile

    from tests.slurm.harness import prepare

    which = set(argv) or {"local", "registry"}
    if which - {"local", "registry"}:
        print("usage: python3 -m bench.containers [local] [registry]", file=sys.stderr)
        return 2
    runs = int(os.environ.get("GRACE_BENCH_RUNS", "10"))
    root = Path(tempfile.mkdtemp(prefix="grace-bench-ct-"))
    root.chmod(0o755)
    env = prepare(root / "slurm")
    try:
        work = root / "pyxis"
        work.mkdir()
        found = rows(env, work, runs) if "local" in which else []
        if "registry" in which:
            found += registry_rows(env, work, runs)
        for line in table(found, runs):
            print(line, flush=True)
    finally:
        env.cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
