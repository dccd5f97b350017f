"""The node's GPUs, read from NVML once per process.

The node checker reads them when it starts, before it forks the children
that judge steps (:func:`preload`), so no step pays for loading NVML; a
process that did not (``checker=step``'s helper, the CLI) reads them the
first time a step with GPUs needs them, and keeps the answer. A driver
upgrade therefore takes effect at the checker's next start, like a config
change to the node's facts (docs/CUDA.md).

The node checker also *publishes* its answer (:func:`publish`): root writes
:func:`facts_text` to ``<cache_dir>/gpus.v<version>`` at its start, which the plugin's C
side reads as root beside the cache files and compares with the ``gpus``
input of an entry (spank/grace_cache.c). A clean verdict judged on NVML's
facts is then replayable exactly while the published facts are the ones it
was judged on: new GPUs or a new driver, read at the checker's next start,
rewrite the file and every such entry misses. Only a process whose answer
was published (the checker and the children it forks) may key an entry on
it; any other keeps the old rule (an input C never matches: no entry).
"""

from __future__ import annotations

import os
import stat

from .nvml import NodeGpus, read_node_gpus

_answer: NodeGpus | None = None
#: :func:`facts_text` of ``_answer`` when this process (or the checker it
#: was forked from) wrote it to the cache directory; None otherwise.
_published: str | None = None
#: (st_dev, st_ino) of the file this process wrote: it removes only that one.
_written: tuple[int, int] | None = None
#: The facts file's longest text C reads (grace_cache.c GRACE_GPU_FACTS_MAX - 1).
FACTS_MAX = 1023


def node_gpus() -> NodeGpus:
    """NVML's answer for this node, asked at most once per process."""
    global _answer
    if _answer is None:
        _answer = read_node_gpus()
    return _answer


def facts_text(answer: NodeGpus) -> str:
    """The published form of an answer: every GPU's minor number and compute
    capability in NVML's order, and the driver's CUDA version; one line of
    printable ASCII, so an entry records it unchanged
    (``0:sm_100 1:sm_100 cuda 13.0``). The minor numbers are part of it
    because a step is judged on its own devices (:mod:`.stepgpus`)."""
    gpus = " ".join(f"{g.minor}:sm_{g.capability[0]}{g.capability[1]}" for g in answer.gpus)
    driver = f"{answer.driver_cuda[0]}.{answer.driver_cuda[1]}" if answer.driver_cuda else "-"
    return f"{gpus} cuda {driver}"


def facts_path(cache_dir: str) -> str:
    from .. import __version__

    return os.path.join(cache_dir, f"gpus.v{__version__}")


def published() -> str | None:
    """The facts C compares an entry's ``gpus`` input with, when this
    process judges on exactly those; None: no entry may key on NVML."""
    if _published is not None and _answer is not None and facts_text(_answer) == _published:
        return _published
    return None


def _trusted_dir(cache_dir: str) -> bool:
    """As grace_cache.c trusts it: root's directory, no one else may write."""
    try:
        os.mkdir(cache_dir, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(cache_dir)
    return stat.S_ISDIR(st.st_mode) and st.st_uid == 0 and not st.st_mode & 0o022


def publish(cache_dir: str | None) -> str | None:
    """Write this process's answer for C (root only: the node checker at its
    start). Written afresh at every start, atomically: entries are keyed by
    its text, so a restart with the same GPUs keeps them, and the file is
    this checker's own (an old checker that ends late removes only its
    own). Without an answer, or when the file cannot be written, remove it:
    entries keyed on facts read before must not outlive them. Returns the
    published text; never raises."""
    global _published, _written
    _published = _written = None
    if not cache_dir or not cache_dir.startswith("/") or os.geteuid() != 0:
        return None
    path = facts_path(cache_dir)
    try:
        if not _trusted_dir(cache_dir):
            return None  # C refuses it too (verdict cache off)
        answer = node_gpus()
        text = facts_text(answer) if answer.available else ""
        if text and len(text) <= FACTS_MAX:
            from ..atomicfile import replace

            replace(path, text.encode("ascii"), mode=0o600)
            st = os.lstat(path)
            _published, _written = text, (st.st_dev, st.st_ino)
            return text
    except (OSError, ValueError):
        pass
    unpublish(cache_dir, mine_only=False)
    return None


def unpublish(cache_dir: str | None, *, mine_only: bool = True) -> None:
    """Remove the published facts: when the checker ends (no checker, no
    facts: no entry keyed on them is replayed), only the file it wrote
    itself; with no answer at its start, whatever an earlier one left."""
    global _published, _written
    written, _published, _written = _written, None, None
    if not cache_dir or not cache_dir.startswith("/") or os.geteuid() != 0:
        return
    path = facts_path(cache_dir)
    try:
        if mine_only:
            st = os.lstat(path)
            if (st.st_dev, st.st_ino) != written:
                return  # a newer checker's
        os.unlink(path)
    except OSError:
        pass


def preload(cache_dir: str | None = None) -> bool:
    """Ask NVML now (the node checker's start) and publish the answer in
    ``cache_dir`` (plugstack's ``cache_dir=``); whether it was published;
    never raises. On a node with GPUs, also import the judgement and parse
    the driver's rules (cuda.toml, tomllib: ~15 ms), so the children forked
    for steps have them already."""
    done = False
    try:
        done = publish(cache_dir) is not None
        if node_gpus().available:
            # What stepcheck uses (it imports this module: not itself).
            from . import arch, fatbin, judge, stepgpus  # noqa: F401  (for the children)

            arch.tables()
    except Exception:  # read_node_gpus never raises; a bug here must not stop the server
        pass
    return done


def set_for_tests(answer: NodeGpus | None, published: str | None = None) -> None:
    """Replace the process's answer (tests simulate NVML's with real files);
    ``published``: the facts as if a checker had written them."""
    global _answer, _published
    _answer = answer
    _published = published
