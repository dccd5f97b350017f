"""What one step's check reads from: one record instead of loose parameters.

Every part of a check asks the same few things: which node (its CPU, page
size, glibc), which files (the host, or an image seen from inside: the
view), the step's environment and working directory, how much it may still
spend (the budget) and where the answers are written down (the verdict
cache's record). They travel together as a :class:`StepContext`, so a
reader cannot pick up the host's files while the step runs in an image, and
adding a fact (the image) does not grow every signature.
"""

from __future__ import annotations

from collections.abc import Mapping

from ._record import dataclass, field
from .fsprobe import HOST, Files

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .budget import Budget
    from .cuda.stepcheck import GpuCheck
    from .image import Image
    from .node import NodeProfile


@dataclass(frozen=True)
class StepContext:
    #: The node the step runs on (the CPU, page size and glibc judged against).
    node: NodeProfile
    #: The step's environment as the program will see it.
    env: Mapping[str, str]
    #: The working directory, a path in ``view``.
    cwd: str
    #: The check's allowance of time, files and bytes.
    budget: Budget
    #: The files the check reads (this host's, or the image's view) and the
    #: record of every question asked (:class:`grace_policy.fsprobe.Files`).
    files: Files = field(default=HOST, compare=False)
    #: The image the step runs in (names every finding), None on the host.
    image: Image | None = None
    #: The package index of the partition, for torch-build remedies.
    cuda_index: str | None = None
    #: The step's GPUs and the judgement of every file's kernels for them;
    #: None for a step without GPUs (nothing of :mod:`grace_policy.cuda` is
    #: imported then).
    gpu: GpuCheck | None = field(default=None, compare=False)
