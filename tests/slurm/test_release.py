"""Facts of the Slurm release the scenarios run on (host, or a release root of
tests/slurm/test_matrix.py), checked where the release matrix relies on them."""

from __future__ import annotations

import os

import pytest

from .harness import SlurmEnv

pytestmark = pytest.mark.slurm


def _config_value(slurm: SlurmEnv, key: str) -> str:
    res = slurm.cluster.run(["scontrol", "show", "config"])
    assert res.returncode == 0, res.stderr
    for line in res.stdout.splitlines():
        name, _, value = line.partition("=")
        if name.strip() == key:
            return value.strip()
    raise AssertionError(f"{key} not in scontrol show config:\n{res.stdout[-2000:]}")


def test_slurmd_parameters_are_the_ones_asked_for(slurm: SlurmEnv) -> None:
    """The contain_spank run of the matrix is only a contain_spank run if Slurm
    took the setting (an unknown value would be ignored with a log line)."""
    asked = os.environ.get("GRACE_SLURMD_PARAMETERS", "").strip()
    value = _config_value(slurm, "SlurmdParameters")
    if asked:
        assert set(asked.split(",")) <= set(value.split(",")), value
    else:
        assert "contain_spank" not in value, value
