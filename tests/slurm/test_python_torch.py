"""A CPU-only torch on a GPU step, on the real Slurm (issue 8, item 4).

The test node announces two stand-in GPUs (cluster.py ``GPUS``), so
``srun --gpus=1`` gets the variables slurmstepd really sets. The venv holds a
``torch`` installed by the real pip whose torch/version.py is the real file of
the 2.13.0+cpu wheel (tests/python/torch_layouts.py); a second venv holds the
same file as a CUDA build writes it. The partition's ``cuda_index`` comes from
the plugin's config, as an admin sets it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from .harness import SlurmEnv

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from python import envs
from python.torch_layouts import cpu_files

pytestmark = [pytest.mark.slurm, pytest.mark.network]

PREFIX = "grace-policy: "

CONFIG = """\
mode = "enforce"
contact = "the test suite"
deadline_ms = 5000

[partitions.enforce]
mode = "enforce"
cuda_index = "cu130"

[audit]
path = "{audit}"
"""


def _venv_with_torch(slurm: SlurmEnv, name: str, version_py: str, version: str) -> Path:
    root = slurm.cluster.shared / name
    if root.exists():
        shutil.rmtree(root)
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", str(root)], check=True,
                   timeout=120)
    wheel = envs.build_wheel(slurm.cluster.root.parent / f"wheels-{name}", "torch", version, {
        "torch/__init__.py": b"from .version import __version__, cuda\n",
        "torch/version.py": version_py.encode(),
    }, requires=("filelock", "sympy>=1.13.3"))
    envs.pip_install(wheel, envs.site_packages(root))
    subprocess.run(["chmod", "-R", "a+rX", str(root)], check=True)
    return root / "bin" / "python"


@pytest.fixture(scope="module")
def torch_env(slurm: SlurmEnv) -> Iterator[dict[str, Path]]:
    real = (cpu_files() / "torch" / "version.py").read_text()
    assert "cuda: Optional[str] = None" in real
    cuda = real.replace("cuda: Optional[str] = None", "cuda: Optional[str] = '13.0'")
    config = slurm.cluster.root.parent / "etc-torch" / "grace-policy.toml"
    config.parent.mkdir(exist_ok=True)
    config.parent.chmod(0o755)
    config.write_text(CONFIG.format(audit=slurm.audit_log))
    config.chmod(0o644)
    done = subprocess.run([str(slurm.prefix / "bin" / "grace-policy"), "config", "check",
                           "--compile", str(config)], env={}, capture_output=True, text=True,
                          check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    yield {
        "cpu": _venv_with_torch(slurm, "venv-torch-cpu", real, "2.13.0+cpu"),
        "cuda": _venv_with_torch(slurm, "venv-torch-cuda", cuda, "2.13.0+cu130"),
        "config": config,
    }
    slurm.use("base")


def _step(slurm: SlurmEnv, python: Path, srun_opts: list[str], marker: str
          ) -> tuple[subprocess.CompletedProcess[str], Path, list[dict[str, object]]]:
    out = slurm.side_file(marker)
    before = len(slurm.audit_lines())
    res = slurm.cluster.srun([*srun_opts, str(python), "-c",
                              f"import torch; open({str(out)!r}, 'w').write(str(torch.cuda))"],
                             user="nobody")
    return res, out, [json.loads(line) for line in slurm.audit_lines()[before:]]


def test_cpu_torch_on_a_gpu_step_is_warned_and_runs(slurm: SlurmEnv,
                                                    torch_env: dict[str, Path]) -> None:
    slurm.use(torch_env["config"])
    res, out, records = _step(slurm, torch_env["cpu"], ["--gpus=1"], "torch-cpu-gpus.out")
    assert res.returncode == 0, res.stderr
    assert out.read_text() == "None"  # the step ran, with the CPU build
    assert f"{PREFIX}WARNING torch-cpu-only:" in res.stderr, res.stderr
    for word in ("torch 2.13.0+cpu", "SLURM_GPUS_ON_NODE=1", "/whl/cu130", "torch==2.13.0",
                 "uv.lock"):
        assert word in res.stderr, (word, res.stderr)
    assert "Traceback" not in res.stderr
    [record] = records
    assert record["action"] == "warn" and "torch-cpu-only" in record["rules"]


def test_no_warning_without_gpus_or_with_a_cuda_build(slurm: SlurmEnv,
                                                      torch_env: dict[str, Path]) -> None:
    slurm.use(torch_env["config"])
    for python, opts, marker in ((torch_env["cpu"], [], "torch-cpu-nogpu.out"),
                                 (torch_env["cpu"], ["--gres=none"], "torch-cpu-none.out"),
                                 (torch_env["cuda"], ["--gres=gpu:1"], "torch-cuda-gpu.out")):
        res, out, records = _step(slurm, python, opts, marker)
        assert res.returncode == 0 and out.exists(), res.stderr
        assert "torch-cpu-only" not in res.stderr, (opts, res.stderr)
        assert "torch-cpu-only" not in records[0].get("rules", []), records
