"""Whether a step's CUDA code can run on the GPUs it was given.

The judgement is per file, as the step would meet it: a library whose fat
binaries hold no image any of the step's GPUs can use fails at its first
kernel launch (``gpu-arch-missing``); one that only PTX serves starts with a
JIT compilation (``gpu-ptx-jit``); PTX too new for the driver's JIT, or a
CUDA runtime of a newer major than the driver supports, fails too
(``cuda-driver-too-old``). A file counts as runnable when any of its images
fits: libraries such as cuBLASLt carry many modules for one architecture
each and pick among them at run time, so one module without an image for
this GPU says nothing. An older CUDA runtime on a newer driver is fine
(the second seed's vLLM built for CUDA 12 on a CUDA 13 node).
"""

from __future__ import annotations

from .._record import dataclass, replace
from ..findings import Issue
from . import arch

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable

    from .fatbin import FatbinInfo

NO_IMAGE_ERROR = ("CUDA error: no kernel image is available for execution on the device "
                  "(cudaErrorNoKernelImageForDevice)")
PTX_TOO_NEW_ERROR = ("CUDA error: the provided PTX was compiled with an unsupported toolchain "
                     "(cudaErrorUnsupportedPtxVersion)")
OLD_DRIVER_ERROR = ("CUDA driver version is insufficient for CUDA runtime version "
                    "(cudaErrorInsufficientDriver)")


@dataclass(frozen=True)
class StepGpus:
    """The GPUs a step will use, as the judgement needs them."""

    #: Distinct compute capabilities, e.g. ((10, 0),); empty: no GPU step.
    capabilities: tuple[tuple[int, int], ...]
    #: The CUDA version the node's driver supports; None when unknown.
    driver: tuple[int, int] | None


def _version(v: tuple[int, int]) -> str:
    return f"{v[0]}.{v[1]}"


def _arch_list(caps: Iterable[tuple[int, int]]) -> str:
    """TORCH_CUDA_ARCH_LIST's spelling: ``"9.0;10.0"``."""
    return ";".join(_version(c) for c in caps)


def judge_kernels(info: FatbinInfo, gpus: StepGpus,
                  tables: arch.Tables | None = None) -> Issue | None:
    """The issue of one file's kernels on the step's GPUs, or None."""
    entries = info.loadable()
    if not entries or not gpus.capabilities:
        return None
    t = tables or arch.tables()
    worst: tuple[int, str, tuple[int, int], arch.Choice] | None = None
    rank = {"none": 3, "ptx-too-new": 2, "jit": 1, "cubin": 0}
    for cc in gpus.capabilities:
        choice = arch.choose(entries, cc, gpus.driver, t)
        score = rank[choice.outcome]
        if worst is None or score > worst[0]:
            worst = (score, choice.outcome, cc, choice)
    assert worst is not None
    _score, outcome, cc, choice = worst
    if outcome == "cubin":
        return None
    if outcome == "none" and info.problems:
        # Part of the file was unreadable: an image may lie in that part.
        return None
    facts = [("holds", info.holds()), ("gpu_arch", arch.sm_name(cc)),
             ("arch_list", _version(cc)),
             ("cuda_driver", _version(gpus.driver) if gpus.driver else "unknown")]
    if outcome == "none":
        return Issue(rule="gpu-arch-missing", path=info.path, predicted_error=NO_IMAGE_ERROR,
                     facts=tuple(facts))
    assert choice.entry is not None
    isa = choice.entry.version
    facts += [("ptx_version", _version(isa)), ("detail", choice.entry.arch)]
    if outcome == "jit":
        return Issue(rule="gpu-ptx-jit", path=info.path, predicted_error="", facts=tuple(facts))
    needs = t.ptx_needs(isa)
    facts.append(("cuda_needed", _version(needs) if needs else f"newer than "
                  f"{_version(max(t.ptx_isa.values()))}"))
    return Issue(rule="cuda-driver-too-old", path=info.path, predicted_error=PTX_TOO_NEW_ERROR,
                 facts=tuple(facts))


def judge_runtime(soname: str, path: str, gpus: StepGpus,
                  tables: arch.Tables | None = None) -> Issue | None:
    """A CUDA library of a newer major than the driver supports, or None.
    An older major on a newer driver is what CUDA promises to run."""
    if not gpus.capabilities or gpus.driver is None:
        return None
    major = arch.runtime_major(soname, tables)
    if major is None or major <= gpus.driver[0]:
        return None
    return Issue(rule="cuda-driver-too-old", path=path, predicted_error=OLD_DRIVER_ERROR,
                 facts=(("name", soname), ("cuda_major", str(major)),
                        ("cuda_driver", _version(gpus.driver)),
                        ("cuda_needed", f"{major}.0")))


def index_facts(cuda_index: str | None) -> tuple[tuple[str, str], ...]:
    """``cuda_index``/``index_note`` as torch-cpu-only fills them: the
    partition's PyTorch wheel index from the config, or a placeholder and
    how to read it. (The integration moves both rules onto one helper.)"""
    index = (cuda_index or "").strip()
    if index:
        return (("cuda_index", index), ("index_note", ""))
    return (("cuda_index", "cuXYZ"),
            ("index_note", " (XYZ: the node's CUDA version without the dot, e.g. cu130 for "
                           "CUDA 13.0; the cluster admins know which one)"))


def judge(files: Iterable[FatbinInfo], runtimes: Iterable[tuple[str, str]],
          gpus: StepGpus, *, cuda_index: str | None = None) -> tuple[Issue, ...]:
    """Every issue of a step: ``files`` are the fat binary readings of what
    it loads, ``runtimes`` the (soname, path) of the CUDA libraries in its
    closure (``libcudart.so.13``, ``libcublas.so.12``, ...), ``cuda_index``
    the partition's PyTorch wheel index (config ``cuda_index``)."""
    if not gpus.capabilities:
        return ()
    t = arch.tables()
    out = []
    for soname, path in runtimes:
        out.append(judge_runtime(soname, path, gpus, t))
    for info in files:
        out.append(judge_kernels(info, gpus, t))
    extra = index_facts(cuda_index)
    return tuple(replace(i, facts=i.facts + extra) for i in out if i is not None)
