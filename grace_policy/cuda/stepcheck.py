"""The GPU side of one step's check: which GPUs it gets, and each file's kernels.

:func:`for_step` is called only for a step that has GPUs (the
``python.gpus.step_gpus`` decision ``torch-cpu-only`` uses too), so a step
without them never imports this package. The node's facts come from the
config or ``check --gpu-arch/--cuda-driver`` (:class:`~grace_policy.node.
NodeProfile`'s ``gpu_arch``/``cuda_driver``) and, for what those leave
open, from NVML (read once per process: :mod:`.nodegpus`). A stated value
wins over NVML's: the admin states it for a reason NVML cannot see (a node
on CUDA forward compatibility supports a newer CUDA than its kernel driver
reports; a simulated node; a node whose NVML is broken).

:meth:`GpuCheck.file` is called for every ELF file the check already reads
(a program, its libraries as the loader model resolves them, Python
extension modules and what they load, inside images too) and turns its fat
binaries and its soname into issues (:mod:`.judge`).
"""

from __future__ import annotations

import os

from .. import fsprobe
from .._record import replace
from .fatbin import read_fatbins
from .judge import StepGpus, index_facts, judge_kernels, judge_runtime
from .stepgpus import capabilities, step_devices

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

    from ..budget import Budget
    from ..elf import ElfInfo
    from ..findings import Issue
    from ..node import NodeProfile

#: The verdict-cache input a judgement on NVML's facts records when the node
#: checker published them (grace_cache.c compares it with the facts file),
#: and the one it records otherwise, which C never matches (see
#: :meth:`GpuCheck._depends`).
CACHE_INPUT = "gpus"
UNPUBLISHED_INPUT = "nvml"
#: How every soname that names a CUDA major begins.
RUNTIME_PREFIXES = ("libcu", "libnv")


class GpuCheck:
    """The GPUs of one step and every file judged for them, at most once."""

    def __init__(self, gpus: StepGpus, stated: bool, budget: Budget,
                 cuda_index: str | None, files: fsprobe.Files = fsprobe.HOST) -> None:
        self.gpus = gpus
        #: Both facts came from the config or the command line, which the
        #: verdict cache keys on already (the config file's identity).
        self.stated = stated
        self.budget = budget
        #: The step's files (its kernels are read there) and record.
        self.files = files
        self.extra = index_facts(cuda_index)
        self._seen: set[str] = set()
        self._noted = False

    @property
    def known(self) -> bool:
        return bool(self.gpus.capabilities)

    def describe(self) -> str:
        caps = " ".join(f"sm_{a}{b}" for a, b in self.gpus.capabilities) or "unknown"
        driver = f"{self.gpus.driver[0]}.{self.gpus.driver[1]}" if self.gpus.driver \
            else "unknown"
        return f"{caps} cuda {driver}"

    def _depends(self) -> None:
        """The verdict depended on the node's GPUs. Stated facts need no
        input: the config's identity is part of every entry. NVML's answer
        is keyed by the facts the node checker published for C
        (:func:`.nodegpus.published`; the step's own devices are keyed by
        ``SLURM_STEP_GPUS``/``SLURM_JOB_GPUS``, which :mod:`.stepgpus`
        notes): the entry replays while the checker's facts are these, and
        misses once it read others. A process whose answer nobody published
        (``checker=step``'s helper, the CLI) records an input C never
        matches, so no entry is written: a clean verdict on sm_90 is never
        replayed after the node (or its driver) changed."""
        if not self._noted and not self.stated:
            self._noted = True
            from .nodegpus import published

            facts = published()
            if facts is not None:
                self.files.note_input(CACHE_INPUT, facts)
            else:
                self.files.note_input(UNPUBLISHED_INPUT, self.describe())

    def file(self, path: str, info: ElfInfo, host_path: str | None = None) -> list[Issue]:
        """The issues of one ELF file the step loads: ``path`` as messages
        show it, ``host_path`` where to read it (default ``path``)."""
        if not self.known:
            return []
        host = host_path or path
        key = os.path.normpath(host)
        if key in self._seen:
            return []
        self._seen.add(key)
        out: list[Issue] = []
        soname = info.soname or os.path.basename(path)
        if soname.startswith(RUNTIME_PREFIXES):
            # Only these can name a CUDA major (cuda.toml's runtime_sonames;
            # tests/test_cuda_check.py holds the table to the prefixes): the
            # other files of a closure never load the tables' TOML parser.
            from .arch import runtime_major

            if runtime_major(soname) is not None:
                self._depends()
            runtime = judge_runtime(soname, path, self.gpus)
            if runtime is not None:
                out.append(runtime)
        self.budget.tick()
        fat = read_fatbins(host, self.files, self.budget)
        if fat.has_kernels:
            self._depends()
            shown = fat if fat.path == path else replace(fat, path=path)
            issue = judge_kernels(shown, self.gpus)
            if issue is not None:
                out.append(issue)
        return [replace(i, facts=i.facts + self.extra) for i in out]


def for_step(node: NodeProfile, env: Mapping[str, str], budget: Budget,
             cuda_index: str | None, files: fsprobe.Files = fsprobe.HOST) -> GpuCheck:
    """The GPU check of a step that has GPUs (the caller decided that),
    reading ``files`` and noting what it read in their record."""
    caps: tuple[tuple[int, int], ...] = ()
    driver = node.cuda_driver
    if node.gpu_arch is not None:
        caps = (node.gpu_arch,)
    if not caps or driver is None:
        from .nodegpus import node_gpus

        found = node_gpus()
        if not caps:
            caps = capabilities(step_devices(env, found.gpus, files))
        if driver is None:
            driver = found.driver_cuda
    stated = node.gpu_arch is not None and node.cuda_driver is not None
    return GpuCheck(StepGpus(capabilities=caps, driver=driver), stated, budget, cuda_index,
                    files)
