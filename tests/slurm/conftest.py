"""The real Slurm the plugin scenarios run on.

Session fixture ``slurm``: installs the plugin with ``make install PREFIX=<tmp>``
(the same path an admin takes), starts munged/slurmctld/slurmd
(:mod:`cluster`), writes the configs and test executables
(:func:`harness.prepare`), and stops every daemon it started at the end, also
when a test failed. Missing daemons or compilers skip the tests with the
reason; a plugin that does not build fails.

``plugstack.conf`` is re-read by Slurm at every launch, so each test states the
plugin line it needs (``slurm.use(...)``) without restarting anything.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from .harness import SetupError, SlurmEnv, prepare, skip_reason


@pytest.fixture(scope="session")
def slurm() -> Iterator[SlurmEnv]:
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    root = Path(tempfile.mkdtemp(prefix="grace-slurm-"))
    env = None
    try:
        try:
            env = prepare(root)
        except SetupError as exc:
            pytest.fail(str(exc))
        yield env
    finally:
        if env is not None:
            env.cluster.stop()
        if os.environ.get("GRACE_KEEP_CLUSTER"):
            print(f"\nkept {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def grace(slurm: SlurmEnv) -> SlurmEnv:
    """The plugin with the base config, whatever the previous test left."""
    slurm.use("base")
    return slurm
