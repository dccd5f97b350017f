"""NVML through ctypes: what the node reports, and every way that can fail.

There is no GPU here. The absent-library and timeout paths are tested for
real. The ctypes calls are tested against ``nvml_standin.c`` below: a small
library compiled here that exports the NVML functions with their C
signatures and answers from environment variables. It is a stand-in for
NVML's ABI, not NVML: it shows that the calls are made with the right
arguments and that each error is handled, not that a real driver answers so
(``make verify-gpu`` holds the reading to nvidia-smi on a GPU machine).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from grace_policy.cuda.nvml import Gpu, read_node_gpus
from grace_policy.cuda.stepgpus import capabilities, step_devices

STANDIN = textwrap.dedent(r"""
    /* A stand-in for NVML's ABI (not NVML): answers from GRACE_NVML_* variables. */
    #include <stdlib.h>
    #include <string.h>
    #include <unistd.h>
    static int env(const char *n, int d) { const char *v = getenv(n); return v ? atoi(v) : d; }
    int nvmlInit_v2(void) {
      if (env("GRACE_NVML_HANG", 0)) sleep(30);
      return env("GRACE_NVML_INIT", 0);
    }
    int nvmlShutdown(void) { return 0; }
    int nvmlSystemGetCudaDriverVersion_v2(int *v) {
      *v = env("GRACE_NVML_DRIVER", 13000); return 0;
    }
    int nvmlDeviceGetCount_v2(unsigned *n) {
      *n = env("GRACE_NVML_COUNT", 2); return env("GRACE_NVML_COUNT_RC", 0);
    }
    int nvmlDeviceGetHandleByIndex_v2(unsigned i, void **h) {
      *h = (void *)(long)(i + 1); return 0;
    }
    int nvmlDeviceGetCudaComputeCapability(void *h, int *ma, int *mi) {
      long i = (long)h - 1;
      if (i == env("GRACE_NVML_BAD", -1)) return 999;
      *ma = env("GRACE_NVML_MAJOR", 10); *mi = i == 1 ? env("GRACE_NVML_MINOR1", 0) : 0; return 0;
    }
    int nvmlDeviceGetMinorNumber(void *h, unsigned *m) {
      *m = (unsigned)((long)h - 1) + 4; return 0;
    }
    const char *nvmlErrorString(int rc) { return rc == 9 ? "Driver Not Loaded" : "Unknown Error"; }
""")


@pytest.fixture(scope="module")
def standin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("nvml")
    (d / "nvml.c").write_text(STANDIN)
    lib = d / "libnvml-standin.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(lib), str(d / "nvml.c")], check=True)
    return lib


def _read_in_child(lib: Path, env: dict[str, str], timeout: float = 5.0) -> str:
    """Each reading in a fresh interpreter: dlopen'ed libraries and the
    variables they read at call time stay out of the test process."""
    code = ("import sys; from grace_policy.cuda.nvml import read_node_gpus; "
            f"print(repr(read_node_gpus({str(lib)!r}, {timeout})))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, **env, "PYTHONPATH": str(Path.cwd())}, timeout=60,
                          check=True)
    assert proc.stderr == ""
    return proc.stdout


def test_absent_library_is_an_answer_not_an_exception() -> None:
    got = read_node_gpus("/nonexistent/libnvidia-ml.so.1")
    assert not got.available and got.gpus == () and "not loaded" in got.error


def test_the_real_library_is_absent_on_this_machine() -> None:
    """No driver here: the default name must give a clean 'not loaded'."""
    got = read_node_gpus()
    if got.available:  # a GPU machine: make verify-gpu compares with nvidia-smi
        pytest.skip("NVML answers on this machine")
    assert got.error


def test_a_library_without_the_symbols(tmp_path: Path) -> None:
    (tmp_path / "x.c").write_text("int unrelated(void) { return 0; }\n")
    lib = tmp_path / "libx.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(lib), str(tmp_path / "x.c")], check=True)
    got = read_node_gpus(str(lib))
    assert not got.available and "lacks an NVML function" in got.error


def test_standin_answers(standin: Path) -> None:
    out = _read_in_child(standin, {"GRACE_NVML_MINOR1": "3"})
    assert "Gpu(index=0, minor=4, capability=(10, 0))" in out
    assert "Gpu(index=1, minor=5, capability=(10, 3))" in out
    assert "driver_cuda=(13, 0)" in out and "error=''" in out


def test_standin_errors(standin: Path) -> None:
    out = _read_in_child(standin, {"GRACE_NVML_INIT": "9"})
    assert "nvmlInit_v2 returned 9 (Driver Not Loaded)" in out and "gpus=()" in out
    out = _read_in_child(standin, {"GRACE_NVML_COUNT_RC": "3"})
    assert "nvmlDeviceGetCount_v2 returned 3" in out
    out = _read_in_child(standin, {"GRACE_NVML_BAD": "1"})
    assert "capability=(10, 0)" in out and "nvmlDeviceGetCudaComputeCapability(1) returned 999" \
        in out
    out = _read_in_child(standin, {"GRACE_NVML_COUNT": "100000"})
    assert "the first 64 read" in out
    out = _read_in_child(standin, {"GRACE_NVML_DRIVER": "-5"})
    assert "driver_cuda=None" in out
    out = _read_in_child(standin, {"GRACE_NVML_MAJOR": "-1"})
    assert "gpus=()" in out


def test_a_hung_driver_call_does_not_hold_the_caller(standin: Path) -> None:
    out = _read_in_child(standin, {"GRACE_NVML_HANG": "1"}, timeout=0.5)
    assert "did not answer within 0.5 s" in out


NODE = (Gpu(0, 4, (9, 0)), Gpu(1, 5, (10, 0)))


def test_step_devices_follow_slurm_and_the_shared_gpu_decision() -> None:
    assert step_devices({}, NODE) == ()
    assert step_devices({"CUDA_VISIBLE_DEVICES": "0"}, NODE) == ()  # a user's own setting
    assert step_devices({"SLURM_GPUS_ON_NODE": "0"}, NODE) == ()
    assert step_devices({"SLURM_GPUS_ON_NODE": "1", "SLURM_STEP_GPUS": "5"}, NODE) == NODE[1:]
    assert step_devices({"SLURM_STEP_GPUS": "4-5"}, NODE) == NODE
    assert step_devices({"SLURM_GPUS_ON_NODE": "1", "SLURM_JOB_GPUS": "4"}, NODE) == NODE[:1]
    # Ids that match no GPU, or garbage: every GPU of the node counts.
    assert step_devices({"SLURM_GPUS_ON_NODE": "1", "SLURM_STEP_GPUS": "7"}, NODE) == NODE
    assert step_devices({"SLURM_GPUS_ON_NODE": "1", "SLURM_STEP_GPUS": "x,9-1"}, NODE) == NODE
    # Digits str.isdigit() takes and int() refuses (the user's variables):
    # garbage too, never an internal error that on_error=allow lets through.
    for ids in ("\u00b2", "4-\u00b2", "\u0664"):
        assert step_devices({"SLURM_GPUS_ON_NODE": "1", "SLURM_STEP_GPUS": ids}, NODE) == NODE
    assert capabilities(NODE) == ((9, 0), (10, 0))
