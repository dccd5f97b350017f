"""A step whose library has no kernel for the node's GPUs, on the real Slurm 22.05.

The test node announces stand-in GPUs (cluster.py ``GPUS``), so
``srun --gres=gpu:1`` gets the variables slurmstepd really sets; the node's
GPUs are what the plugin's config says (``[node] gpu_arch = "sm_100"``, a
GB200): this machine has no NVIDIA driver for NVML to ask. The program is
built here with gcc against the nvcc-built sm_90-only fixture library of
tests/gpu (and the pinned CUDA 13.5 runtime wheel's libcudart), and only
loads them: it runs without a GPU.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .harness import SlurmEnv

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from gpu.fixtures import build_fixtures
from gpu.toolchain import toolchain

pytestmark = [pytest.mark.slurm, pytest.mark.network]

PREFIX = "grace-policy: "

CONFIG = """\
mode = "enforce"
contact = "the test suite"
deadline_ms = 5000

[node]
gpu_arch = "sm_100"
cuda_driver = "13.0"

[audit]
path = "{audit}"
"""

MAIN = r"""
#include <stdio.h>
int main(int argc, char **argv) {
  if (argc > 1) { FILE *f = fopen(argv[1], "w"); if (!f) return 2; fputs("ran", f); fclose(f); }
  return 0;
}
"""


@pytest.fixture(scope="module")
def gpu_prog(slurm: SlurmEnv) -> tuple[Path, Path]:
    """(program, config): the program in the shared dir, readable by the
    job's user, with the sm_90-only library and libcudart beside it."""
    fixtures = {f.name: f.path for f in build_fixtures(toolchain())}
    root = slurm.cluster.shared / "gpu-arch"
    if root.exists():
        shutil.rmtree(root)
    root.mkdir()
    shutil.copy(fixtures["x86_64/libsm90.so"], root / "libsm90.so")
    shutil.copy(toolchain().x86_lib / "libcudart.so.13", root / "libcudart.so.13")
    (root / "main.c").write_text(MAIN)
    # DT_RPATH (not RUNPATH): the library's own libcudart.so.13 is found
    # through the program's path too, before anything the machine has.
    subprocess.run(["gcc", str(root / "main.c"), "-o", str(root / "uses-sm90"),
                    "-Wl,--no-as-needed", f"-L{root}", "-lsm90",
                    f"-Wl,--disable-new-dtags,-rpath,{root}"], check=True, timeout=120)
    subprocess.run(["chmod", "-R", "a+rX", str(root)], check=True)
    config = slurm.cluster.root.parent / "etc-gpu-arch" / "grace-policy.toml"
    config.parent.mkdir(exist_ok=True)
    config.parent.chmod(0o755)
    config.write_text(CONFIG.format(audit=slurm.audit_log))
    config.chmod(0o644)
    done = subprocess.run([str(slurm.prefix / "bin" / "grace-policy"), "config", "check",
                           "--compile", str(config)], env={}, capture_output=True, text=True,
                          check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    yield root / "uses-sm90", config
    slurm.use("base")


def _step(slurm: SlurmEnv, prog: Path, opts: list[str], marker: str
          ) -> tuple[subprocess.CompletedProcess[str], Path, list[dict[str, object]]]:
    out = slurm.side_file(marker)
    before = len(slurm.audit_lines())
    res = slurm.cluster.srun([*opts, str(prog), str(out)], user="nobody")
    return res, out, [json.loads(line) for line in slurm.audit_lines()[before:]]


def test_sm90_library_on_an_sm100_node_is_refused_with_a_gpu(
        slurm: SlurmEnv, gpu_prog: tuple[Path, Path]) -> None:
    prog, config = gpu_prog
    slurm.use(config)
    res, out, records = _step(slurm, prog, ["--gres=gpu:1"], "gpu-arch-refused.out")
    assert res.returncode != 0, res.stderr
    assert not out.exists()  # refused before the program started
    assert f"{PREFIX}ERROR gpu-arch-missing:" in res.stderr, res.stderr
    for word in ("libsm90.so", "sm_90 only", "sm_100", "no kernel image is available"):
        assert word in res.stderr, (word, res.stderr)
    assert "Traceback" not in res.stderr
    [record] = records
    assert record["action"] == "reject" and "gpu-arch-missing" in record["rules"]


def test_the_same_program_runs_without_gpus(slurm: SlurmEnv,
                                            gpu_prog: tuple[Path, Path]) -> None:
    prog, config = gpu_prog
    slurm.use(config)
    for opts, marker in (([], "gpu-arch-none.out"), (["--gres=none"], "gpu-arch-gres-none.out")):
        res, out, records = _step(slurm, prog, opts, marker)
        assert res.returncode == 0, (opts, res.stderr)
        assert out.read_text() == "ran"
        assert "gpu-arch-missing" not in res.stderr, (opts, res.stderr)
        assert records and records[-1]["action"] == "allow", records
