"""A GPU step judged on NVML's answer is replayed from the verdict cache, on
the real Slurm 22.05 with the node checker (follow-up to issue 26).

This machine has no NVIDIA driver. slurmd runs in a mount namespace of its
own whose ``/etc/ld.so.cache`` (made here by ``ldconfig -X -C``, the host's
directories plus one more) also lists the NVML ABI stand-in of
tests/gpu/test_nvml.py as ``libnvidia-ml.so.1``: the node checker slurmd
starts, with its fixed environment, loads it the way it loads the real one.
The stand-in is compiled with its defaults set to the GPUs each test wants
(its variables never reach the checker). The program is built with gcc
against the nvcc-built sm80+sm90 fixture library of tests/gpu and the
pinned CUDA 13.5 runtime, and only loads them.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from .harness import SlurmEnv

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from gpu.fixtures import build_fixtures
from gpu.test_nvml import STANDIN
from gpu.toolchain import toolchain

from grace_policy import __version__

pytestmark = [pytest.mark.slurm, pytest.mark.network]

CONFIG = """\
mode = "enforce"
contact = "the test suite"
deadline_ms = 5000
"""

MAIN = "extern int grace_probe(char *, int);\nint main(void) { char m[128]; " \
       "return grace_probe(m, 128) < 0; }\n"


@pytest.fixture(scope="module")
def setup(slurm: SlurmEnv) -> Iterator[tuple[Path, Path]]:
    """(program, config), readable by the job's user; slurmd back to normal
    (no namespace, the base line) afterwards."""
    fixtures = {f.name: f.path for f in build_fixtures(toolchain())}
    root = slurm.cluster.shared / "gpu-cache"
    if root.exists():
        shutil.rmtree(root)
    root.mkdir()
    shutil.copy(fixtures["x86_64/libsm80_sm90.so"], root / "libsm80_sm90.so")
    shutil.copy(toolchain().x86_lib / "libcudart.so.13", root / "libcudart.so.13")
    (root / "main.c").write_text(MAIN)
    subprocess.run(["gcc", str(root / "main.c"), "-o", str(root / "uses-sm80-sm90"),
                    f"-L{root}", "-lsm80_sm90", f"-Wl,--disable-new-dtags,-rpath,{root}"],
                   check=True, timeout=120)
    subprocess.run(["chmod", "-R", "a+rX", str(root)], check=True)
    config = slurm.cluster.root.parent / "etc-gpu-cache" / "grace-policy.toml"
    config.parent.mkdir(exist_ok=True)
    config.parent.chmod(0o755)
    config.write_text(CONFIG)
    config.chmod(0o644)
    done = subprocess.run([str(slurm.prefix / "bin" / "grace-policy"), "config", "check",
                           "--compile", str(config)], env={}, capture_output=True, text=True,
                          check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    try:
        yield root / "uses-sm80-sm90", config
    finally:
        slurm.use("base")
        slurm.cluster.restart_slurmd()
        state = slurm.cluster.settled_node_state()
        assert state in ("idle", "mixed", "allocated"), (state, slurm.cluster.node_reason())


def _ld_cache(where: Path, major: int) -> Path:
    """An ld.so.cache of the host's libraries plus an NVML stand-in whose
    GPUs are sm_<major>0 (two, minors 4 and 5) on a CUDA 13.5 driver."""
    lib = where / f"nvml-sm{major}0"
    lib.mkdir(parents=True, exist_ok=True)
    source = STANDIN.replace('env("GRACE_NVML_MAJOR", 10)', f'env("GRACE_NVML_MAJOR", {major})')
    source = source.replace('env("GRACE_NVML_DRIVER", 13000)', 'env("GRACE_NVML_DRIVER", 13050)')
    assert source.count(f"{major})") >= 1 and "13050" in source, "the stand-in changed"
    (lib / "nvml.c").write_text(source)
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(lib / "libnvidia-ml.so.1"),
                    str(lib / "nvml.c")], check=True, timeout=120)
    lib.chmod(0o755)
    conf = lib / "ld.so.conf"
    conf.write_text(f"include /etc/ld.so.conf.d/*.conf\n{lib}\n")
    cache = lib / "ld.so.cache"
    # -X: no links made anywhere; -C/-f: nothing of the host's is written.
    subprocess.run(["ldconfig", "-X", "-C", str(cache), "-f", str(conf)], check=True,
                   timeout=120)
    return cache


def _slurmd_with_nvml(slurm: SlurmEnv, cache: Path) -> None:
    slurm.cluster.restart_slurmd(wrap=(
        "unshare", "-m", "--propagation", "private", "sh", "-c",
        f'mount --bind {cache} /etc/ld.so.cache && exec "$0" "$@"'))


def _wait_for(path: Path, text: str, timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while not (path.exists() and path.read_text() == text):
        assert time.monotonic() < end, (path, path.read_text() if path.exists() else None)
        time.sleep(0.1)


def _step(slurm: SlurmEnv, prog: Path) -> tuple[subprocess.CompletedProcess[str],
                                                  dict[str, object]]:
    before = len(slurm.audit_lines())
    res = slurm.cluster.srun(["--gres=gpu:1", str(prog)], user="nobody", timeout=90)
    assert "Traceback" not in res.stderr + res.stdout
    records = [json.loads(line) for line in slurm.audit_lines()[before:]]
    records = [r for r in records if r.get("step_id") != "extern"]
    assert len(records) == 1, records
    return res, records[0]


def test_a_gpu_step_on_nvmls_facts_is_replayed_until_the_gpus_change(
        slurm: SlurmEnv, setup: tuple[Path, Path], tmp_path: Path) -> None:
    """sm80+sm90 kernels on NVML's two sm_90 GPUs: clean, and the second
    identical step is a hit in C. The node's GPUs become sm_100 (the
    checker's next start reads and publishes that): the same step is
    judged again, not replayed, and refused."""
    prog, config = setup
    cache_dir = slurm.cluster.root.parent / "cache-gpu"
    if cache_dir.exists():
        shutil.rmtree(cache_dir)
    facts = cache_dir / f"gpus.v{__version__}"
    slurm.use(config, f"cache_dir={cache_dir}")
    _slurmd_with_nvml(slurm, _ld_cache(tmp_path, 9))
    _wait_for(facts, "4:sm_90 5:sm_90 cuda 13.5")

    res, first = _step(slurm, prog)
    assert res.returncode == 0 and first["action"] == "allow", (res.stderr, first)
    assert first.get("cache") != "hit"
    res, second = _step(slurm, prog)
    assert res.returncode == 0 and second.get("cache") == "hit", (res.stderr, second)

    _slurmd_with_nvml(slurm, _ld_cache(tmp_path, 10))  # a GPU swap
    _wait_for(facts, "4:sm_100 5:sm_100 cuda 13.5")
    res, third = _step(slurm, prog)
    assert third.get("cache") != "hit" and third["action"] == "reject", (res.stderr, third)
    assert res.returncode != 0 and "gpu-arch-missing" in res.stderr, res.stderr
