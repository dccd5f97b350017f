"""``sbatch --container-image=IMG script.sh`` with real pyxis 0.24.0 and
enroot 4.1.2 (issue 15).

pyxis registers its options for sbatch too (``sbatch_support``, on by
default, pyxis_alloc.c) and, in the batch step (S_JOB_STEPID ==
SLURM_BATCH_SCRIPT), bind-mounts slurmd's copy of the script read-only at
its own path inside the container (pyxis_slurmstepd.c user_init), then
starts the container in task_init as for any step: the script runs inside
the image, its ``#!`` interpreter is the image's. So the plugin judges the
script and its first line in the image, never on the host: no host-only
``exe-not-found`` for the spool path, and a host-only interpreter is not
taken for the image's.

The world (pyxis, enroot, images) is test_containers.py's ``pyxis`` fixture.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .test_containers import Pyxis, pyxis  # noqa: F401  (the fixture)

pytestmark = pytest.mark.slurm

PREFIX = "grace-policy: "


def _sbatch(env: Pyxis, name: str, script: str, *args: str) -> tuple[str, str, Path]:
    """(final state, output text, side file) of ``script`` submitted with
    ``args``; the script's own first command leaves ``NAME.side``. With a
    container, the shared directory is mounted at its own path, so what the
    script leaves there is seen on the host."""
    out = env.slurm.cluster.shared / f"{name}.out"
    if out.exists():
        out.unlink()
    side = env.slurm.side_file(f"{name}.side")
    shared = env.slurm.cluster.shared
    if any(a.startswith("--container-image") for a in args):
        args = (*args, f"--container-mounts={shared}:{shared}")
    job = env.slurm.cluster.sbatch(script.format(side=side),
                                   ["-o", str(out), *args], env=env.env())
    state = env.slurm.cluster.wait_job(job, timeout=240)
    text = out.read_text() if out.exists() else ""
    assert "Traceback" not in text
    return state, text, side


def _batch_records(env: Pyxis, before: int) -> list[dict[str, object]]:
    return [r for r in env.records(before) if r.get("step_id") == "batch"]


def test_batch_script_in_a_clean_image_runs_in_silence(pyxis: Pyxis) -> None:  # noqa: F811
    """The script and ``tool`` (only in the image) are judged inside it."""
    pyxis.use()
    before = len(pyxis.slurm.audit_lines())
    state, text, side = _sbatch(pyxis, "pb-clean", "#!/bin/sh\n: > {side}\ntool\n",
                                "--container-image=./clean.sqsh")
    assert state == "COMPLETED", text
    assert "side-effect program ran" in text, text  # tool ran, in the image
    assert PREFIX not in text, text
    assert side.exists()
    [rec] = _batch_records(pyxis, before)
    assert (rec["action"], rec["rules"], rec["skipped"]) == ("allow", [], None)
    assert rec["image"] == f"{pyxis.slurm.cluster.shared}/clean.sqsh"


def test_batch_script_in_an_image_of_the_other_architecture(pyxis: Pyxis) -> None:  # noqa: F811
    """The script's ``#!/bin/sh`` is the image's aarch64 dash: refused
    before the script starts, with our image-arch-mismatch."""
    pyxis.use()
    before = len(pyxis.slurm.audit_lines())
    state, text, side = _sbatch(pyxis, "pb-arm64", "#!/bin/sh\n: > {side}\ntool\n",
                                "--container-image=./arm64.sqsh")
    assert state == "FAILED", text
    image = f"{pyxis.slurm.cluster.shared}/arm64.sqsh"
    assert f"{PREFIX}ERROR image-arch-mismatch: {image}" in text, text
    assert not side.exists(), "the script ran although the job was refused"
    [rec] = _batch_records(pyxis, before)
    assert rec["action"] == "reject" and rec["rules"] == ["image-arch-mismatch"]
    assert pyxis.slurm.cluster.settled_node_state() in ("idle", "mixed")


def test_batch_interpreter_only_on_the_host_is_judged_in_the_image(pyxis: Pyxis) -> None:  # noqa: F811
    """``#!/usr/bin/python3`` exists on the host, not in the image: the
    script would fail in the container (the kernel finds no interpreter);
    refused naming the script inside the image. In warn mode it runs and
    fails as predicted."""
    pyxis.use()
    image = f"{pyxis.slurm.cluster.shared}/clean.sqsh"
    script = "#!/usr/bin/python3\nopen('{side}', 'w')\n"
    state, text, side = _sbatch(pyxis, "pb-interp", script, "--container-image=./clean.sqsh")
    assert state == "FAILED", text
    assert f"{PREFIX}ERROR interp-missing: {image}:" in text, text
    assert not side.exists()
    state, text, side = _sbatch(pyxis, "pb-interp-warn", script, "-p", "warnp",
                                "--container-image=./clean.sqsh")
    assert state == "FAILED", text
    assert f"{PREFIX}ERROR interp-missing: {image}:" in text, text
    assert f"{PREFIX}the step runs anyway (partition warnp, mode warn)" in text, text
    assert not side.exists()  # python3 never started: the container has none
    # The same script without a container runs on the host, judged there.
    state, text, side = _sbatch(pyxis, "pb-interp-host", script)
    assert state == "COMPLETED", text
    assert side.exists() and PREFIX not in text, text
