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
info = read_fatbins(path, fsprobe.HOST, budget)
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


STEP_CHILD = r"""
import json, sys, time
sys.path.insert(0, sys.argv[3])
t0 = time.perf_counter()
from grace_policy.decide import StepRequest, decide
from grace_policy.node import detect
from grace_policy.policy import Policy
prog, gpus = sys.argv[1], sys.argv[2] == "1"
env = {"PATH": "/usr/bin:/bin", **({"SLURM_GPUS_ON_NODE": "1"} if gpus else {})}
node = detect().with_overrides(gpu_arch=(10, 0), cuda_driver=(13, 0))
probes = []
spent = [0.0]
if gpus:  # timed where the check calls it (a step without GPUs imports none of it)
    import grace_policy.cuda.stepcheck as sc
    real = sc.read_fatbins
    def timed(*a, **k):
        t = time.perf_counter()
        try:
            return real(*a, **k)
        finally:
            spent[0] += time.perf_counter() - t
    sc.read_fatbins = timed
v = decide(Policy(), StepRequest(partition=None, argv=[prog], env=env, cwd="/", node=node),
           probes=probes)
t1 = time.perf_counter()
print(json.dumps({"ms": (t1 - t0) * 1e3, "fatbin_ms": spent[0] * 1e3, "action": v.action,
                  "rules": [f.rule for f in v.findings], "files": len(probes)}))
"""

#: What libtorch_cuda.so needs besides glibc, libstdc++ and libgcc: where
#: torch's RPATH finds each (under site-packages), stood in for by empty
#: libraries with the soname (only libcudart is the real one).
TORCH_NEEDS = {
    "torch/lib": ("libtorch_nvshmem.so", "libc10_cuda.so", "libc10.so", "libtorch_cpu.so"),
    "nvidia/cu13/lib": ("libcusparse.so.12", "libcufft.so.12", "libcufile.so.0",
                        "libcurand.so.10", "libcublas.so.13", "libcublasLt.so.13",
                        "libnvrtc.so.13"),
    "nvidia/cusparselt/lib": ("libcusparseLt.so.0",),
    "nvidia/nccl/lib": ("libnccl.so.2",),
    "nvidia/cudnn/lib": ("libcudnn.so.9",),
}


def torch_step(work: Path) -> Path:
    """A program whose closure holds libtorch_cuda.so, laid out as a
    torch install (its RPATH resolves everything); returns the program."""
    sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]
    from gpu.toolchain import toolchain, torch_cuda_lib

    from grace_policy.elf import read_elf

    # The version nodes libtorch_cuda.so asks of each (libcublas.so.13 ...):
    # a stand-in defines them, so the check sees a clean closure.
    wanted = {name: [v for v, _hash, _weak in vers]
              for name, vers in read_elf(str(torch_cuda_lib())).verneed}
    site = work / "site-packages"
    for sub, names in TORCH_NEEDS.items():
        (site / sub).mkdir(parents=True, exist_ok=True)
        for name in names:
            script = work / f"{name}.map"
            script.write_text("".join(f"{v} {{ global: *; }};\n" for v in wanted.get(name, ()))
                              or "{ global: *; };\n")
            subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(site / sub / name),
                            "-x", "c", "/dev/null", f"-Wl,-soname,{name}",
                            f"-Wl,--version-script,{script}"], check=True)
    lib = site / "torch" / "lib"
    os.symlink(torch_cuda_lib(), lib / "libtorch_cuda.so")
    import shutil

    shutil.copy(toolchain().x86_lib / "libcudart.so.13", site / "nvidia/cu13/lib")
    (work / "main.c").write_text("int main(void) { return 0; }\n")
    prog = work / "uses-torch-cuda"
    subprocess.run(["gcc", str(work / "main.c"), "-o", str(prog), "-Wl,--no-as-needed",
                    str(lib / "libtorch_cuda.so"), "-Wl,--allow-shlib-undefined",
                    f"-Wl,-rpath,{lib}"], check=True)
    return prog


def step_row(work: Path, runs: int = 11) -> tuple[float, float, float, dict]:
    """(median ms without GPUs, with one GPU, of which reading fat binaries,
    one run's details) of the torch_step check in fresh processes."""
    prog = torch_step(work)

    def one(gpus: bool) -> dict:
        out = subprocess.run([sys.executable, "-I", "-S", "-c", STEP_CHILD, str(prog),
                              "1" if gpus else "0", str(ROOT)], capture_output=True,
                             text=True, check=True, cwd=ROOT)
        return json.loads(out.stdout.splitlines()[-1])

    one(True)  # page cache and .pyc files warm
    without, with_ = [], []
    for _ in range(runs):
        without.append(one(False))
        with_.append(one(True))
    return (statistics.median(r["ms"] for r in without),
            statistics.median(r["ms"] for r in with_),
            statistics.median(r["fatbin_ms"] for r in with_), with_[0])


def main(argv: list[str]) -> int:
    if argv[:1] == ["--step"]:
        import tempfile

        with tempfile.TemporaryDirectory(prefix="grace-bench-torch-") as tmp:
            wo, w, fat, one = step_row(Path(tmp))
        print(f"first-seen check, closure with libtorch_cuda.so: without GPUs {wo:.1f} ms, "
              f"with 1 GPU (sm_100) {w:.1f} ms (+{w - wo:.1f} ms; reading fat binaries "
              f"{fat:.1f} ms); {one['action']} {one['rules']}, {one['files']} answers recorded")
        return 0
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
