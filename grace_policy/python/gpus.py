"""Whether a step has GPUs, from the variables slurmstepd gives it.

Read off the environment the plugin sees (``S_JOB_ENV`` in ``user_init``) on
the tests' real Slurm 22.05 with a ``gpu`` gres (tests/python/test_gpus.py
captures it again on every run):

- ``srun --gpus=N``, ``--gres=gpu:N``, ``--gpus-per-task``, ``--gpus-per-node``
  and the batch step of ``sbatch --gpus/--gres``: ``SLURM_GPUS_ON_NODE=N``
  (the step's GPUs on this node), plus ``CUDA_VISIBLE_DEVICES``,
  ``ROCR_VISIBLE_DEVICES``, ``ZE_AFFINITY_MASK``, ``GPU_DEVICE_ORDINAL``;
  srun steps also ``SLURM_STEP_GPUS``, batch steps ``SLURM_JOB_GPUS``;
  ``SLURM_GPUS`` only where ``--gpus`` was given to sbatch.
- A step without GPUs inside a GPU job (``srun --gres=none``) still carries
  the job's ``SLURM_JOB_GPUS``, but slurmstepd removes ``SLURM_GPUS_ON_NODE``
  and ``CUDA_VISIBLE_DEVICES`` from it, also values the user exported.

So the step's own count is the evidence; ``SLURM_JOB_GPUS`` and
``CUDA_VISIBLE_DEVICES`` alone are not (a user sets the latter by hand).
"""

from __future__ import annotations

from .. import fsprobe

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

#: What slurmstepd sets for the step's own GPUs, most direct first.
STEP_GPU_VARIABLES = ("SLURM_GPUS_ON_NODE", "SLURM_STEP_GPUS")


def _count(value: str) -> int:
    """``SLURM_GPUS_ON_NODE`` as a number; anything else is no GPU."""
    value = value.strip()
    if not (value.isascii() and value.isdigit()) or len(value) > 6:
        return 0
    return int(value)


def _ids(value: str) -> list[str]:
    """``SLURM_STEP_GPUS=0,1`` -> ["0", "1"]; empty and placeholder values -> []."""
    out = []
    for part in value.split(","):
        part = part.strip()
        if part and part.upper() not in ("N/A", "NONE", "(NULL)"):
            out.append(part)
    return out


def step_gpus(env: Mapping[str, str], files: fsprobe.Files = fsprobe.HOST) -> str | None:
    """A short description such as ``"SLURM_GPUS_ON_NODE=2"`` when the step
    got GPUs on this node, else None. Every variable read is noted in
    ``files``' record, so a cached verdict depends on it."""
    for name in STEP_GPU_VARIABLES:
        value = env.get(name)
        files.note_env(name, value)
        if value is None:
            continue
        if name == "SLURM_GPUS_ON_NODE":
            if _count(value) > 0:
                return f"{name}={_count(value)}"
            # An explicit 0 (or garbage) says no GPUs; SLURM_STEP_GPUS, when
            # present, is still looked at.
            continue
        ids = _ids(value)
        if ids:
            shown = ",".join(ids[:8]) + (",..." if len(ids) > 8 else "")
            return f"{name}={shown}"
    return None
