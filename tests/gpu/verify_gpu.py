"""``make verify-gpu``: the CUDA rules against a real GPU and driver.

On a machine where NVML answers: NVML's reading is held to ``nvidia-smi``
(each GPU's compute capability, the driver's "CUDA Version"); then every
nvcc fixture built for this machine's architecture (tests/gpu/fixtures.py)
is run once per kind of GPU (``CUDA_VISIBLE_DEVICES``), and what the driver
did (``kernel ran binary=SM``, or the runtime's error name) is held to what
grace_policy.cuda predicts: a cubin runs as its own SM, PTX is compiled for
the device's SM, no image gives cudaErrorNoKernelImageForDevice, PTX too new
cudaErrorUnsupportedPtxVersion, a runtime newer than the driver
cudaErrorInsufficientDriver. Prints the table; exits 1 on any difference.

Without a GPU (no NVML, or no device) it prints that it was not run and
why, and exits 0: CI has no GPU, and make test does not count this.
"""

from __future__ import annotations

import os
import platform
import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
for p in (str(HERE.parent), str(HERE.parent.parent)):
    if p not in sys.path:
        sys.path.insert(0, p)

from grace_policy import fsprobe  # noqa: E402
from grace_policy.cuda import arch  # noqa: E402
from grace_policy.cuda.fatbin import read_fatbins  # noqa: E402
from grace_policy.cuda.judge import StepGpus, judge_runtime  # noqa: E402
from grace_policy.cuda.nvml import read_node_gpus  # noqa: E402
from grace_policy.elf import read_elf  # noqa: E402


def smi() -> tuple[list[tuple[int, tuple[int, int]]], tuple[int, int] | None]:
    caps = subprocess.run(["nvidia-smi", "--query-gpu=index,compute_cap",
                           "--format=csv,noheader"], capture_output=True, text=True,
                          timeout=60, check=True).stdout
    gpus = []
    for line in caps.splitlines():
        index, _, cap = line.partition(",")
        cc = arch.parse_version(cap.strip())
        if cc is not None:
            gpus.append((int(index), cc))
    head = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=60,
                          check=True).stdout
    m = re.search(r"CUDA Version:\s*(\d+\.\d+)", head)
    return gpus, arch.parse_version(m.group(1)) if m else None


def predict(path: Path, gpu: tuple[int, int], driver: tuple[int, int] | None) -> str:
    gpus = StepGpus((gpu,), driver)
    for soname in read_elf(str(path)).needed:
        if judge_runtime(soname, str(path), gpus) is not None:
            return "cudaErrorInsufficientDriver"
    info = read_fatbins(str(path), fsprobe.HOST)
    choice = arch.choose(info.loadable(), gpu, driver)
    if choice.outcome == "cubin":
        return f"kernel ran binary={choice.entry.sm}"  # type: ignore[union-attr]
    if choice.outcome == "jit":
        return f"kernel ran binary={gpu[0] * 10 + gpu[1]}"
    if choice.outcome == "ptx-too-new":
        return "cudaErrorUnsupportedPtxVersion"
    return "cudaErrorNoKernelImageForDevice"


def observe(path: Path, index: int, libdir: Path) -> str:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": str(index),
           "LD_LIBRARY_PATH": f"{libdir}:{os.environ.get('LD_LIBRARY_PATH', '')}"}
    if path.name.startswith("_graceprobe"):
        cmd = [sys.executable, "-c", f"import sys; sys.path.insert(0, {str(path.parent)!r}); "
               "import _graceprobe; print(_graceprobe.run())"]
    else:
        cmd = [str(path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env,
                          check=False)
    return (proc.stdout.strip().splitlines() or [proc.stderr.strip()[-200:]])[-1]


def main() -> int:
    node = read_node_gpus()
    if not node.available:
        print(f"verify-gpu: not run: NVML gave no GPU on this machine "
              f"({node.error or 'no devices'}); the CUDA rules were held to the written "
              "table only (tests/gpu/test_verdicts.py)")
        return 0
    failures = 0
    listed, driver = smi()
    mine = sorted((g.index, g.capability) for g in node.gpus)
    print(f"NVML: {mine}, driver CUDA {node.driver_cuda}; nvidia-smi: {listed}, CUDA {driver}")
    if mine != sorted(listed) or node.driver_cuda != driver:
        print("verify-gpu: FAIL: NVML and nvidia-smi disagree")
        failures += 1
    from gpu.fixtures import build_fixtures
    from gpu.toolchain import toolchain

    tc = toolchain()
    machine = platform.machine()
    libdir = tc.x86_lib if machine == "x86_64" else tc.arm_lib
    by_cc: dict[tuple[int, int], int] = {}
    for g in node.gpus:
        by_cc.setdefault(g.capability, g.index)
    print(f"{'fixture':34} {'GPU':7} {'predicted':36} {'driver did':36}")
    for fx in build_fixtures(tc):
        if fx.arch != machine or fx.kind == "lib":
            continue
        path = fx.path
        for cc, index in sorted(by_cc.items()):
            want = predict(path, cc, node.driver_cuda)
            got = observe(path, index, libdir)
            ok = got == want
            failures += not ok
            print(f"{fx.name:34} {arch.sm_name(cc):7} {want:36} {got:36} "
                  f"{'ok' if ok else 'DIFFERS'}")
    print(f"verify-gpu: {'FAIL' if failures else 'ok'} ({failures} differences)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
