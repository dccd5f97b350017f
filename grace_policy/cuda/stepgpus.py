"""Which of the node's GPUs a step was given, for judging its kernels.

Whether the step has GPUs at all is decided in one place,
:func:`grace_policy.python.gpus.step_gpus` (``SLURM_GPUS_ON_NODE``, then
``SLURM_STEP_GPUS``; a user's own ``CUDA_VISIBLE_DEVICES`` is no evidence),
which ``torch-cpu-only`` uses too; this module only narrows the node's GPUs
to the step's. ``SLURM_STEP_GPUS`` (``SLURM_JOB_GPUS`` for a batch step)
holds the GPUs' indices as Slurm's gres plugin numbers them, which follow the
``/dev/nvidiaN`` minor numbers on a node whose gres.conf lists the devices
in order (and with ``AutoDetect=nvml``). When the ids cannot be matched to
the node's GPUs, every GPU of the node counts: on the usual node all GPUs
are of one kind, and on a mixed one a kernel must then fit every kind.
"""

from __future__ import annotations

from .. import fsprobe
from ..python.gpus import step_gpus
from .nvml import Gpu

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

#: Variables with the step's GPU ids, the step's own first.
ID_VARIABLES = ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS")
MAX_IDS = 1024


def _digits(word: str) -> bool:
    return word.isascii() and word.isdigit()


def _ids(value: str) -> list[int] | None:
    """``"0,1,3"`` -> [0, 1, 3]; ranges (``0-3``) are expanded; None when
    any part is not a number."""
    out: list[int] = []
    for part in value.split(","):
        part = part.strip()
        lo, dash, hi = part.partition("-")
        # ASCII digits only: str.isdigit() takes '²', which int() refuses.
        if not _digits(lo) or (dash and not _digits(hi)) or len(part) > 12:
            return None
        first, last = int(lo), int(hi) if dash else int(lo)
        if last < first or len(out) + last - first >= MAX_IDS:
            return None
        out.extend(range(first, last + 1))
    return out or None


def step_devices(env: Mapping[str, str], node: Sequence[Gpu],
                 files: fsprobe.Files = fsprobe.HOST) -> tuple[Gpu, ...]:
    """The node GPUs the step may use: empty when the step has no GPUs
    (so nothing is judged for them), else the ones its ids name, else all.
    Every variable read is noted in ``files``' record."""
    if step_gpus(env, files) is None:
        return ()
    for name in ID_VARIABLES:
        value = env.get(name)
        files.note_env(name, value)
        if not value:
            continue
        ids = _ids(value)
        if ids is None:
            break
        by_minor = {g.minor: g for g in node if g.minor >= 0}
        chosen = [by_minor[i] for i in ids if i in by_minor]
        if len(chosen) == len(ids):
            return tuple(chosen)
        break
    return tuple(node)


def capabilities(gpus: Sequence[Gpu]) -> tuple[tuple[int, int], ...]:
    """The distinct compute capabilities, sorted."""
    return tuple(sorted({g.capability for g in gpus}))
