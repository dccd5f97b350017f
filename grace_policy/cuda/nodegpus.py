"""The node's GPUs, read from NVML once per process.

The node checker reads them when it starts, before it forks the children
that judge steps (:func:`preload`), so no step pays for loading NVML; a
process that did not (``checker=step``'s helper, the CLI) reads them the
first time a step with GPUs needs them, and keeps the answer. A driver
upgrade therefore takes effect at the checker's next start, like a config
change to the node's facts (docs/CUDA.md).
"""

from __future__ import annotations

from .nvml import NodeGpus, read_node_gpus

_answer: NodeGpus | None = None


def node_gpus() -> NodeGpus:
    """NVML's answer for this node, asked at most once per process."""
    global _answer
    if _answer is None:
        _answer = read_node_gpus()
    return _answer


def preload() -> None:
    """Ask NVML now (the node checker's start); never raises. On a node with
    GPUs, also import the judgement and parse the driver's rules (cuda.toml,
    tomllib: ~15 ms), so the children forked for steps have them already."""
    try:
        if node_gpus().available:
            # What stepcheck uses (it imports this module: not itself).
            from . import arch, fatbin, judge, stepgpus  # noqa: F401  (for the children)

            arch.tables()
    except Exception:  # read_node_gpus never raises; a bug here must not stop the server
        pass


def set_for_tests(answer: NodeGpus | None) -> None:
    """Replace the process's answer (tests simulate NVML's with real files)."""
    global _answer
    _answer = answer
