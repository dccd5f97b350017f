"""Cost of the py-imports pieces on synthetic environments (issue 8, item 8).

    python3 -m bench.py_imports_walk [--files 30000] [--repeat 5] [--wheel torch-....whl]

Prints, per case, the best wall and CPU time of ``--repeat`` runs (the page
cache warm after the first) and files per second:

- finder.package_extensions over a torch-shaped tree (20 files a directory,
  one extension module in 5 directories: 300 at 30,000 files) and a flat
  one (1,000 files a directory), at several sizes, to show the growth;
- dists.dists_in over 300 distributions (half with top_level.txt, half
  RECORD-only with 100 lines);
- usage.source_imports on scripts of 2, 50 and 200 KiB.

The trees are built once under ``$TMPDIR/grace-bench-py-imports``. No
timing is asserted anywhere: this is a report.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from grace_policy.budget import Budget
from grace_policy.node import NodeProfile
from grace_policy.python.dists import dists_in
from grace_policy.python.finder import DATA_DIRS, package_extensions
from grace_policy.python.suffixes import extension_suffixes
from grace_policy.python.usage import source_imports

TAG = ".cpython-311-aarch64-linux-gnu.so"
NODE = NodeProfile(machine="aarch64", page_size=65536, glibc=(2, 36))


def _big_budget() -> Budget:
    return Budget(deadline_ms=600_000, max_files=10**9, max_bytes=1 << 40)


def _tree(base: Path, files: int, per_dir: int) -> Path:
    root = base / f"tree-{files}-{per_dir}"
    done = root / ".done"
    if done.exists():
        return root / "torch"
    n = 0
    d = 0
    while n < files:
        dd = root / "torch" / f"d{d % 7}" / f"s{d % 31}" / f"p{d}"
        dd.mkdir(parents=True, exist_ok=True)
        for f in range(min(per_dir, files - n)):
            if f == 0 and d % 5 == 0:
                name = f"_ext{d}{TAG}"
            elif f == 1:
                name = "__init__.py"
            else:
                name = f"mod{f}.py"
            (dd / name).touch()
            n += 1
        d += 1
    done.touch()
    return root / "torch"


def _wheel_shape(base: Path, wheel: Path) -> tuple[Path, int]:
    """Empty files named like the wheel's (its biggest top-level package)."""
    import zipfile
    with zipfile.ZipFile(wheel) as zf:
        names = [n for n in zf.namelist() if not n.endswith("/")]
    tops: dict[str, int] = {}
    for n in names:
        if "/" in n and ".dist-info/" not in n:
            tops[n.split("/", 1)[0]] = tops.get(n.split("/", 1)[0], 0) + 1
    top = max(tops, key=lambda t: tops[t])
    root = base / f"wheel-{wheel.name}"
    if not (root / ".done").exists():
        for n in names:
            if n.startswith(top + "/"):
                path = root / n
                path.parent.mkdir(parents=True, exist_ok=True)
                path.touch()
        (root / ".done").touch()
    return root / top, sum(1 for n in names if n.startswith(top + "/"))


def _site(base: Path, count: int = 300) -> Path:
    site = base / f"site-{count}"
    if (site / ".done").exists():
        return site
    for i in range(count):
        meta = site / f"pkg{i}-1.0.dist-info"
        meta.mkdir(parents=True, exist_ok=True)
        reqs = "".join(f"Requires-Dist: pkg{(i + k) % count}\n" for k in (1, 2))
        (meta / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: pkg{i}\nVersion: 1.0\n{reqs}"
            'Requires-Dist: pytest ; extra == "test"\n\n' + "long description\n" * 200)
        if i % 2:
            (meta / "top_level.txt").write_text(f"pkg{i}\n")
        else:
            (meta / "RECORD").write_text("".join(
                f"pkg{i}/m{k}.py,sha256=abc,{k}\n" for k in range(100)))
    (site / ".done").touch()
    return site


def _best(fn: Callable[[], object], repeat: int) -> tuple[float, float]:
    fn()    # warm the page cache
    wall = cpu = float("inf")
    for _ in range(repeat):
        w, c = time.perf_counter(), time.process_time()
        fn()
        wall = min(wall, time.perf_counter() - w)
        cpu = min(cpu, time.process_time() - c)
    return wall * 1000, cpu * 1000


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=30_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--wheel", help="also walk a tree shaped like this wheel (empty files with "
                    "its names), e.g. a torch wheel, with and without skip_dirs=DATA_DIRS")
    args = ap.parse_args()
    base = Path(os.environ.get("TMPDIR", tempfile.gettempdir())) / "grace-bench-py-imports"
    sfx = extension_suffixes((3, 11), "aarch64")
    print("package_extensions (warm page cache):")
    sizes = sorted({3_000, 10_000, args.files, 100_000})
    for per_dir in (20, 1000):
        for files in sizes:
            top = _tree(base, files, per_dir)
            wall, cpu = _best(lambda top=top: package_extensions(str(top), sfx, _big_budget()),
                              args.repeat)
            loaded, _ = package_extensions(str(top), sfx, _big_budget())
            print(f"  {files:>7} files, {per_dir:>4}/dir: {wall:7.1f} ms wall {cpu:7.1f} ms cpu"
                  f"  {files / (cpu / 1000):>10,.0f} files/s (cpu)  {len(loaded)} modules")
    if args.wheel:
        top, count = _wheel_shape(base, Path(args.wheel))
        for skip in (frozenset(), DATA_DIRS):
            wall, cpu = _best(lambda top=top, skip=skip: package_extensions(
                str(top), sfx, _big_budget(), skip_dirs=skip), args.repeat)
            what = "skip_dirs=DATA_DIRS" if skip else "every directory"
            print(f"  {Path(args.wheel).name} shape ({count} files), {what}: {wall:.1f} ms wall"
                  f" {cpu:.1f} ms cpu")
    site = _site(base)
    wall, cpu = _best(lambda: dists_in(str(site), NODE, (3, 11), _big_budget()), args.repeat)
    print(f"dists_in, 300 distributions: {wall:.1f} ms wall {cpu:.1f} ms cpu")
    for kib in (2, 50, 200):
        body = "import torch\nimport numpy as np\n"
        chunk = "def f{n}(x):\n    y = x + 1\n    return [i * y for i in range(10)]\n\n"
        n = 0
        while len(body) < kib * 1024:
            body += chunk.format(n=n)
            n += 1
        data = body.encode()
        wall, cpu = _best(lambda data=data: source_imports(data), args.repeat)
        print(f"source_imports, {kib:>3} KiB script: {wall:.2f} ms wall {cpu:.2f} ms cpu")


if __name__ == "__main__":
    main()
