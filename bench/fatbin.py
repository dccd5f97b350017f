"""What reading a big library's fat binaries costs (issue 26).

``python3 -m bench.fatbin [FILE]``: the fat binary reader on torch 2.14.1's
``libtorch_cuda.so`` (the tests' cached copy, fetched if missing) in a fresh
interpreter each time, with the check's default Budget, page cache warm
(the usual first-seen check: the library was just installed or used) and
page cache cold (``posix_fadvise(DONTNEED)`` drops this one file's pages
first, so every header comes from the disk). Medians. Not yet a row of
``make bench``: that comes with the check's integration, where the reading
is one part of a step's first-seen check.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import json, os, sys, time
path, cold = sys.argv[1], sys.argv[2] == "1"
if cold:
    fd = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
t0 = time.perf_counter()
from grace_policy import fsprobe
from grace_policy.budget import Budget
from grace_policy.cuda.fatbin import read_fatbins
t1 = time.perf_counter()
budget = Budget()
info = read_fatbins(path, fsprobe, budget)
t2 = time.perf_counter()
print(json.dumps({"import_ms": (t1 - t0) * 1e3, "read_ms": (t2 - t1) * 1e3,
                  "entries": len(info.entries), "fatbins": info.fatbins,
                  "bytes": budget.bytes_read, "problems": list(info.problems)}))
"""


def _run(path: str, cold: bool) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, path, "1" if cold else "0"],
                         capture_output=True, text=True, check=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    return json.loads(out.stdout)


def main(argv: list[str]) -> int:
    if argv:
        path = argv[0]
    else:
        sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]
        from gpu.toolchain import torch_cuda_lib

        path = str(torch_cuda_lib())
    size = os.path.getsize(path)
    _run(path, False)  # warm the page cache and the interpreter's .pyc files
    rows = []
    for label, cold, n in (("page cache warm", False, 21), ("page cache cold", True, 7)):
        runs = [_run(path, cold) for _ in range(n)]
        rows.append((label, n, statistics.median(r["read_ms"] for r in runs),
                     statistics.median(r["import_ms"] for r in runs), runs[0]))
    print(f"{path}: {size / 1e6:.0f} MB")
    for label, n, read_ms, import_ms, r in rows:
        print(f"  {label}: read {read_ms:.1f} ms (median of {n}), import {import_ms:.1f} ms; "
              f"{r['fatbins']} fat binaries, {r['entries']} entries, {r['bytes']} bytes read, "
              f"problems {r['problems']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
