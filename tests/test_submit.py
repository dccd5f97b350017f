"""The submit-host check: the config's ``submit`` key and ``grace-policy
submit`` as packaging/cli_filter.lua runs it (the Lua side itself runs
against the tests' real Slurm in tests/slurm/test_batch.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from grace_policy.compiled import compile_config, load_policy
from grace_policy.config import load_config
from grace_policy.policy import ConfigError

REPO = Path(__file__).resolve().parent.parent

CONFIG = """\
mode = "enforce"
[partitions.gb200]
submit = "enforce"
[partitions.soft]
mode = "warn"
"""


def test_submit_is_validated_and_named_with_its_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('submit = "block"\n[partitions.g]\nsubmit = 3\n')
    with pytest.raises(ConfigError) as exc:
        load_config(str(bad))
    text = str(exc.value)
    assert f"{bad}:1: submit:" in text and f"{bad}:3: partitions.g.submit:" in text


def test_submit_per_partition_survives_compiling(tmp_path: Path) -> None:
    cfg = tmp_path / "gp.toml"
    cfg.write_text(CONFIG)
    compiled = compile_config(str(cfg))
    loaded = load_policy(str(cfg))
    for policy in (compiled, loaded):
        assert policy.submit_for("gb200") == "enforce"
        assert policy.submit_for("soft") == "warn"
        assert policy.submit_for(None) == "warn"


@pytest.fixture
def job(tmp_path: Path) -> dict[str, Path]:
    if shutil.which("aarch64-linux-gnu-gcc") is None:
        pytest.fail("aarch64-linux-gnu-gcc missing: bash packaging/install-deps.sh")
    src = tmp_path / "p.c"
    src.write_text("int main(void) { return 0; }\n")
    foreign = tmp_path / "foreign"
    subprocess.run(["aarch64-linux-gnu-gcc", "-o", str(foreign), str(src)], check=True)
    cfg = tmp_path / "gp.toml"
    cfg.write_text(CONFIG)
    bad = tmp_path / "bad.sh"
    bad.write_text(f"#!/bin/bash\n#SBATCH -p gb200\n{foreign} --epochs 3\n")
    clean = tmp_path / "clean.sh"
    clean.write_text("#!/bin/bash\nhostname\nsrun hostname\n")
    return {"foreign": foreign, "cfg": cfg, "bad": bad, "clean": clean, "dir": tmp_path}


def _submit(job: dict[str, Path], *args: str, env: dict[str, str] | None = None
            ) -> subprocess.CompletedProcess[str]:
    base = {"PATH": "/usr/bin:/bin", "HOME": str(job["dir"]), "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "grace_policy", "submit", "--config",
                           str(job["cfg"]), *args], capture_output=True, text=True,
                          cwd=job["dir"], env={**base, **(env or {})}, timeout=120)


def test_a_clean_job_prints_nothing(job: dict[str, Path]) -> None:
    done = _submit(job, "--type", "sbatch", "--partition", "gb200", "--script",
                   str(job["clean"]))
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")


def test_warn_prints_and_submits_enforce_refuses(job: dict[str, Path]) -> None:
    warn = _submit(job, "--type", "sbatch", "--script", str(job["bad"]))
    assert warn.returncode == 0
    assert (f"grace-policy: ERROR exe-arch-mismatch: line 3: {job['foreign']} --epochs 3 -> "
            f"{job['foreign']}") in warn.stdout
    assert "sbatch: submitted anyway" in warn.stdout
    refuse = _submit(job, "--type", "sbatch", "--partition", "gb200", "--script",
                     str(job["bad"]))
    assert refuse.returncode == 2 and "sbatch: job not submitted" in refuse.stdout
    soft = _submit(job, "--type", "sbatch", "--partition", "soft", "--script", str(job["bad"]))
    assert soft.returncode == 0 and "sbatch: submitted; on partition soft" in soft.stdout


def test_wrap_srun_and_export(job: dict[str, Path]) -> None:
    wrap = _submit(job, "--type", "sbatch", "--partition", "gb200", "--wrap",
                   f"{job['foreign']} x")
    assert wrap.returncode == 2 and f"line 4: {job['foreign']} x" in wrap.stdout
    srun = _submit(job, "--type", "srun", "--partition", "gb200", "--", str(job["foreign"]))
    assert srun.returncode == 2 and "srun: job not submitted" in srun.stdout
    tools = job["dir"] / "tools"
    tools.mkdir()
    shutil.copy2(job["foreign"], tools / "tool")
    env = {"PATH": f"{tools}:/usr/bin:/bin"}
    assert _submit(job, "--type", "srun", "--partition", "gb200", "--", "tool",
                   env=env).returncode == 2
    # --export=NONE: the node builds the job's environment; nothing known here.
    none = _submit(job, "--type", "srun", "--partition", "gb200", "--export", "NONE", "--",
                   "tool", env=env)
    assert (none.returncode, none.stdout) == (0, "")
    # --export=PATH=...: the rule's own value is what the step gets (no tool there).
    fixed = _submit(job, "--type", "srun", "--partition", "gb200", "--export",
                    "ALL,PATH=/usr/bin:/bin", "--", "tool", env=env)
    assert fixed.returncode == 0 and "WARNING exe-not-found" in fixed.stdout
    assert "exe-arch-mismatch" not in fixed.stdout


def test_salloc_without_a_command_and_a_broken_config_never_refuse(job: dict[str, Path]
                                                                   ) -> None:
    assert _submit(job, "--type", "salloc", "--partition", "gb200").returncode == 0
    job["cfg"].write_text('mode = "enforced"\n')
    broken = _submit(job, "--type", "sbatch", "--partition", "gb200", "--script",
                     str(job["bad"]))
    assert broken.returncode not in (0, 2)  # an error of the check: cli_filter.lua submits
    assert "Traceback" not in broken.stderr + broken.stdout
    os.unlink(job["cfg"])
