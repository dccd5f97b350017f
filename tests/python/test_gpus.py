"""step_gpus, held to the environments real Slurm 22.05 steps get.

The ``slurm`` tests start a one-node cluster whose node announces two
device-less GPUs (tests/slurm/cluster.py ``gpus``) and load a tiny SPANK
plugin, built here from source, that writes ``S_JOB_ENV`` as ``user_init``
sees it — the same item the grace-policy plugin reads — for each step. The
captured environments, not hand-written ones, are what ``step_gpus`` judges.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from slurm.cluster import Cluster, missing_binaries

from grace_policy import fsprobe
from grace_policy.cli.main import main
from grace_policy.cli.main_check import _gpu_count, apply_gpus, configure_parser
from grace_policy.python.gpus import step_gpus

ENVDUMP_C = r"""
#include <stdint.h>
#include <stdio.h>
#include <slurm/spank.h>
SPANK_PLUGIN(envdump, 1);
/* user_init: write the step environment slurmstepd hands to SPANK plugins
 * to DIR/<job>.<step>, one variable a line. */
int slurm_spank_user_init(spank_t sp, int ac, char **av)
{
	char **env = NULL, path[4096];
	uint32_t job = 0, step = 0;
	FILE *f;
	int i;
	if (ac < 1)
		return 0;
	spank_get_item(sp, S_JOB_ID, &job);
	spank_get_item(sp, S_JOB_STEPID, &step);
	if (spank_get_item(sp, S_JOB_ENV, &env) != ESPANK_SUCCESS)
		return 0;
	snprintf(path, sizeof(path), "%s/%u.%u", av[0], job, step);
	f = fopen(path, "w");
	if (!f)
		return 0;
	for (i = 0; env && env[i]; i++)
		fprintf(f, "%s\n", env[i]);
	fclose(f);
	return 0;
}
"""

#: srun steps: name -> srun options. The batch cases are below.
SRUN_CASES: dict[str, tuple[str, ...]] = {
    "no-gpus": ("-n1",),
    "gpus=1": ("-n1", "--gpus=1"),
    "gres=gpu:1": ("-n1", "--gres=gpu:1"),
    "gres=gpu:2": ("-n1", "--gres=gpu:2"),
    "gpus-per-task=1": ("-n1", "--gpus-per-task=1"),
    "gpus-per-node=2": ("-n1", "--gpus-per-node=2"),
    "2 tasks gpus-per-task=1": ("-n2", "--gpus-per-task=1"),
}

#: A user exporting GPU variables by hand into a step that has none.
FAKE_EXPORT = {"CUDA_VISIBLE_DEVICES": "3", "SLURM_GPUS_ON_NODE": "4", "SLURM_STEP_GPUS": "3"}


def _read_env(path: Path) -> dict[str, str]:
    env = {}
    for line in path.read_text(errors="surrogateescape").splitlines():
        key, sep, value = line.partition("=")
        if sep:
            env[key] = value
    return env


def _skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "the local Slurm cluster needs root"
    missing = missing_binaries()
    if missing:
        return f"not installed: {', '.join(missing)} (bash packaging/install-deps.sh)"
    if shutil.which("gcc") is None or not Path("/usr/include/slurm/spank.h").exists():
        return "gcc or slurm/spank.h (libslurm-dev) missing"
    return None


@pytest.fixture(scope="module")
def step_envs() -> Iterator[dict[str, dict[str, str]]]:
    """case name -> the step environment user_init saw, from real steps."""
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    root = Path(tempfile.mkdtemp(prefix="grace-gpus-"))
    root.chmod(0o755)
    plugin = root / "envdump.so"
    src = root / "envdump.c"
    src.write_text(ENVDUMP_C)
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(plugin), str(src)], check=True,
                   capture_output=True)
    cluster = Cluster(root / "cluster", gpus=2)
    dump = root / "dump"
    dump.mkdir()
    dump.chmod(0o1777)
    cluster.write_config()
    cluster.set_plugstack([f"required {plugin} {dump}"])
    envs: dict[str, dict[str, str]] = {}
    try:
        cluster.start()

        def one_step(name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
            before = set(os.listdir(dump))
            res = cluster.run(argv, env=env)
            assert res.returncode == 0, (name, res.stderr)
            new = sorted(set(os.listdir(dump)) - before)
            assert len(new) == 1, (name, new)
            envs[name] = _read_env(dump / new[0])

        for name, opts in SRUN_CASES.items():
            one_step(name, ["srun", "-N1", *opts, "true"])
        one_step("no-gpus, GPU variables exported by hand", ["srun", "-N1", "-n1", "true"],
                 env=FAKE_EXPORT)
        # Batch: the batch step itself, and steps inside a GPU job.
        script = ("#!/bin/bash\nsrun --gres=none true\n"
                  "export CUDA_VISIBLE_DEVICES=0 SLURM_GPUS_ON_NODE=2\n"
                  "srun --gres=none true\nsrun true\n")
        for opt in ("--gpus=1", "--gres=gpu:2"):
            before = set(os.listdir(dump))
            job = cluster.sbatch(script, [opt, "-o", "/dev/null"])
            assert cluster.wait_job(job) == "COMPLETED"
            got = {name.split(".", 1)[1]: _read_env(dump / name)
                   for name in set(os.listdir(dump)) - before}
            batch = next(k for k in got if int(k) > 1000)  # SLURM_BATCH_SCRIPT
            envs[f"sbatch {opt}: batch step"] = got[batch]
            envs[f"sbatch {opt}: srun --gres=none"] = got["0"]
            envs[f"sbatch {opt}: srun --gres=none, GPU variables exported"] = got["1"]
            envs[f"sbatch {opt}: srun"] = got["2"]
        yield envs
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


HAS_GPUS = {
    "gpus=1": "SLURM_GPUS_ON_NODE=1",
    "gres=gpu:1": "SLURM_GPUS_ON_NODE=1",
    "gres=gpu:2": "SLURM_GPUS_ON_NODE=2",
    "gpus-per-task=1": "SLURM_GPUS_ON_NODE=1",
    "gpus-per-node=2": "SLURM_GPUS_ON_NODE=2",
    "2 tasks gpus-per-task=1": "SLURM_GPUS_ON_NODE=2",
    "sbatch --gpus=1: batch step": "SLURM_GPUS_ON_NODE=1",
    "sbatch --gpus=1: srun": "SLURM_GPUS_ON_NODE=1",
    "sbatch --gres=gpu:2: batch step": "SLURM_GPUS_ON_NODE=2",
    "sbatch --gres=gpu:2: srun": "SLURM_GPUS_ON_NODE=2",
}
NO_GPUS = (
    "no-gpus",
    "no-gpus, GPU variables exported by hand",
    "sbatch --gpus=1: srun --gres=none",
    "sbatch --gpus=1: srun --gres=none, GPU variables exported",
    "sbatch --gres=gpu:2: srun --gres=none",
    "sbatch --gres=gpu:2: srun --gres=none, GPU variables exported",
)


@pytest.mark.slurm
@pytest.mark.parametrize("case", sorted(HAS_GPUS))
def test_real_gpu_steps_are_seen(step_envs: dict[str, dict[str, str]], case: str) -> None:
    env = step_envs[case]
    assert step_gpus(env) == HAS_GPUS[case]
    # What the variables really were, so a Slurm that changes them shows here.
    assert env.get("CUDA_VISIBLE_DEVICES"), env


@pytest.mark.slurm
@pytest.mark.parametrize("case", NO_GPUS)
def test_real_steps_without_gpus_are_not(step_envs: dict[str, dict[str, str]],
                                         case: str) -> None:
    env = step_envs[case]
    assert step_gpus(env) is None, {k: v for k, v in env.items() if "GPU" in k}


@pytest.mark.slurm
def test_what_slurm_2205_puts_in_the_step_environment(
        step_envs: dict[str, dict[str, str]]) -> None:
    """The facts gpus.py is built on (its docstring): if a Slurm release
    changes them, this fails and says how."""
    gpu = step_envs["gpus=1"]
    assert {k: gpu.get(k) for k in ("SLURM_GPUS_ON_NODE", "SLURM_STEP_GPUS",
                                    "CUDA_VISIBLE_DEVICES")} == {
        "SLURM_GPUS_ON_NODE": "1", "SLURM_STEP_GPUS": "0", "CUDA_VISIBLE_DEVICES": "0"}
    assert step_envs["sbatch --gpus=1: batch step"].get("SLURM_GPUS") == "1"
    assert step_envs["sbatch --gres=gpu:2: batch step"].get("SLURM_JOB_GPUS") == "0,1"
    # A GPU-less step in a GPU job keeps the job's list but not the step's
    # variables, even ones the user exported.
    none = step_envs["sbatch --gres=gpu:2: srun --gres=none, GPU variables exported"]
    assert none.get("SLURM_JOB_GPUS") == "0,1"
    assert "SLURM_GPUS_ON_NODE" not in none and "CUDA_VISIBLE_DEVICES" not in none
    faked = step_envs["no-gpus, GPU variables exported by hand"]
    assert not any(k in faked for k in FAKE_EXPORT), faked


#: ``grace-policy check``'s option for each real step above: what a user
#: types on the login node for the srun/sbatch option the step had.
CHECK_OPTION = {
    "no-gpus": None,
    "gpus=1": ("--gpus", "1"),
    "gres=gpu:1": ("--gres", "gpu:1"),
    "gres=gpu:2": ("--gres", "gpu:2"),
    "sbatch --gpus=1: batch step": ("--gpus", "1"),
    "sbatch --gres=gpu:2: batch step": ("--gres", "gpu:2"),
    "sbatch --gres=gpu:2: srun --gres=none, GPU variables exported": ("--gres", "none"),
    "no-gpus, GPU variables exported by hand": ("--gpus", "0"),
}


def _check_args(words: tuple[str, ...]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    configure_parser(parser.add_subparsers(dest="cmd"), "check", "")
    return parser.parse_args(["check", *words, "--", "true"])


@pytest.mark.slurm
@pytest.mark.parametrize("case", sorted(CHECK_OPTION))
def test_check_gpus_option_gives_what_the_real_step_got(
        step_envs: dict[str, dict[str, str]], case: str) -> None:
    """``check --gpus N`` / ``--gres gpu:N`` / ``--gres none``, given an
    environment that says the opposite (the user's shell, an env file copied
    from another job), judges what the real step's environment says."""
    count = _gpu_count(_check_args(CHECK_OPTION[case] or ()))
    start = {"PATH": "/usr/bin"}
    if count == 0:
        start.update(FAKE_EXPORT)
    elif count is not None:
        start["SLURM_GPUS_ON_NODE"] = "0"
    assert step_gpus(apply_gpus(start, count)) == step_gpus(step_envs[case]), case


@pytest.mark.parametrize(
    ("words", "expected"),
    [
        (("--gpus", "2"), {"SLURM_GPUS_ON_NODE": "2"}),
        (("--gpus", "a100:4"), {"SLURM_GPUS_ON_NODE": "4"}),
        (("--gres", "gpu"), {"SLURM_GPUS_ON_NODE": "1"}),
        (("--gres", "gpu:h100:8"), {"SLURM_GPUS_ON_NODE": "8"}),
        (("--gpus", "0"), {}),
        (("--gres", "none"), {}),
    ],
)
def test_check_gpu_options_set_the_step_variables(words: tuple[str, str],
                                                  expected: dict[str, str]) -> None:
    got = apply_gpus({"SLURM_STEP_GPUS": "7", "SLURM_GPUS_ON_NODE": "3", "HOME": "/h"},
                     _gpu_count(_check_args(words)))
    assert got == {"HOME": "/h", **expected}


@pytest.mark.parametrize("words", [("--gpus", "two"), ("--gpus", "-1"), ("--gpus", "\u00b2"),
                                   ("--gres", "mps:1"), ("--gres", "gpu:1,gpu:2"),
                                   ("--gpus", "9" * 40)])
def test_bad_gpu_options_are_usage_errors(words: tuple[str, str],
                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", *words, "--", "true"]) == 64
    err = capsys.readouterr().err
    assert err.startswith("grace-policy: ") and words[0] in err, err


def test_gpus_and_gres_together_are_a_usage_error() -> None:
    assert main(["check", "--gpus", "1", "--gres", "gpu:1", "--", "true"]) == 64


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, None),
        ({"SLURM_GPUS_ON_NODE": "4"}, "SLURM_GPUS_ON_NODE=4"),
        ({"SLURM_GPUS_ON_NODE": "0"}, None),
        ({"SLURM_GPUS_ON_NODE": "0", "SLURM_STEP_GPUS": "2,3"}, "SLURM_STEP_GPUS=2,3"),
        ({"SLURM_GPUS_ON_NODE": " 2 "}, "SLURM_GPUS_ON_NODE=2"),
        ({"SLURM_GPUS_ON_NODE": "-1"}, None),
        ({"SLURM_GPUS_ON_NODE": "two"}, None),
        ({"SLURM_GPUS_ON_NODE": "9" * 40}, None),
        ({"SLURM_GPUS_ON_NODE": "\u00b2"}, None),  # str.isdigit() is True, int() fails
        ({"SLURM_GPUS_ON_NODE": "\u0663"}, None),  # ARABIC-INDIC DIGIT THREE
        ({"SLURM_STEP_GPUS": "0,\x1b[2J"}, "SLURM_STEP_GPUS=0,\x1b[2J"),  # escaped when shown
        ({"SLURM_STEP_GPUS": ""}, None),
        ({"SLURM_STEP_GPUS": "N/A"}, None),
        ({"SLURM_STEP_GPUS": ",,"}, None),
        ({"SLURM_STEP_GPUS": ",".join(map(str, range(12)))},
         "SLURM_STEP_GPUS=0,1,2,3,4,5,6,7,..."),
        ({"SLURM_JOB_GPUS": "0,1"}, None),
        ({"CUDA_VISIBLE_DEVICES": "0"}, None),
        ({"SLURM_GPUS": "1"}, None),
    ],
)
def test_step_gpus_reads_only_the_step_variables(env: dict[str, str],
                                                 expected: str | None) -> None:
    assert step_gpus(env) == expected


def test_every_variable_read_is_noted_for_the_verdict_cache() -> None:
    files = fsprobe.Files.recorded()
    step_gpus({"SLURM_STEP_GPUS": "1"}, files)
    record = files.records()
    assert ("v", "SLURM_GPUS_ON_NODE", "-") in record
    assert ("v", "SLURM_STEP_GPUS", "=1") in record


#: What must stay off the launch path (PREAMBLE / ISSUE8-SHARED).
HEAVY = {"ast", "re", "typing", "dataclasses", "json", "tomllib", "email", "csv", "inspect",
         "importlib.metadata", "packaging", "sysconfig", "zipfile", "tokenize"}


@pytest.mark.parametrize("module", ["gpus", "torch_build", "torchcodec", "jitcache", "nodepath"])
def test_py_torch_modules_import_nothing_heavy(module: str) -> None:
    import sys

    repo = Path(__file__).resolve().parents[2]
    code = ("import sys; sys.path.insert(0, sys.argv[1]); before = set(sys.modules);"
            f"import grace_policy.python.{module};"
            "new = sorted(set(sys.modules) - before); print(' '.join(new))")
    out = subprocess.run([sys.executable, "-S", "-E", "-c", code, str(repo)],
                         capture_output=True, text=True, check=True, timeout=60).stdout
    pulled = set(out.split())
    assert f"grace_policy.python.{module}" in pulled
    assert not pulled & HEAVY, sorted(pulled & HEAVY)


def test_any_environment_text_never_raises() -> None:
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from grace_policy.python.jitcache import cache_dirs

    names = st.sampled_from(["SLURM_GPUS_ON_NODE", "SLURM_STEP_GPUS", "HOME", "USER",
                             "TMPDIR", "TRITON_CACHE_DIR", "XDG_CACHE_HOME", "TRITON_HOME",
                             "TORCH_EXTENSIONS_DIR", "FLASHINFER_WORKSPACE_BASE", "LOGNAME"])

    @settings(max_examples=200, deadline=None, database=None)
    @given(st.dictionaries(names, st.text(max_size=40)))
    def check(env: dict[str, str]) -> None:
        got = step_gpus(env)
        assert got is None or got.startswith(("SLURM_GPUS_ON_NODE=", "SLURM_STEP_GPUS="))
        for _var, path in cache_dirs(env):
            assert path.startswith("/") and not path.startswith("//")

    check()
