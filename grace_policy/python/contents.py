"""Which loadable files an installed distribution holds, from its RECORD.

pip writes every installed file into ``*.dist-info/RECORD``. Reading that one
file instead of walking a package tree is what keeps a 30,000-file torch
environment within the launch budget, and it is what makes the verdict
cache sound for Python steps: a reinstall replaces RECORD (a new identity),
an install or removal changes the site directory's listing. RECORD only
says *where* compiled files live: the step check lists those directories to
see what is there now (a site directory filled from two machines holds both
machines' files, RECORD only the last install's), and walks the top-level
entries that no RECORD claims.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence

from .. import fsprobe
from .._record import dataclass
from ..budget import Budget
from .dists import record_paths
from .nodepath import read_text

#: A RECORD larger than this is not read (torch's is ~2 MiB).
MAX_RECORD_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True)
class Files:
    """What RECORD lists that matters for imports."""

    #: Paths of files whose name holds ``.so`` (modules and libraries): the
    #: directories to look into.
    shared: tuple[str, ...]
    #: The site directory's entries it installed (``numpy``, ``numpy.libs``,
    #: ``six.py``): what no RECORD claims is walked instead.
    entries: tuple[str, ...]


def record_files(meta_dir: str, site_dir: str, budget: Budget,
                 reads: fsprobe.Files = fsprobe.HOST) -> Files | None:
    """The loadable files a ``.dist-info`` lists, as absolute paths inside
    ``site_dir`` (files installed elsewhere, such as scripts, are left out);
    None when it has no readable RECORD (read in ``reads``, the check's
    files)."""
    text = read_text(os.path.join(meta_dir, "RECORD"), MAX_RECORD_BYTES, budget, reads)
    if text is None:
        return None
    # A torch RECORD has ~30,000 lines and only a few hundred name a ".so":
    # the full CSV parse is kept for those, the rest is split in bulk.
    lines = text.split("\n")
    base = site_dir.rstrip("/") + "/"
    shared: list[str] = []
    for rel in record_paths("\n".join(line for line in lines if ".so" in line)):
        if not rel or rel.startswith(("/", "../")) or "/../" in rel:
            continue
        if ".so" in rel.rsplit("/", 1)[-1]:
            shared.append(base + rel)
    tops = {line.lstrip('"').split("/", 1)[0].split(",", 1)[0] for line in lines}
    tops.discard("")
    tops.discard("..")
    budget.tick()
    return Files(tuple(shared), tuple(sorted(tops)))


@dataclass(frozen=True)
class Loadables:
    #: ``(dotted module name, file)`` the node's importer would load.
    modules: tuple[tuple[str, str], ...]
    #: Libraries a package may load itself (ctypes, ``torch.ops.load_library``).
    libraries: tuple[str, ...]
    #: ``(dotted module name, files)`` that exist only with other tags.
    foreign: tuple[tuple[str, tuple[str, ...]], ...]


def is_library(name: str) -> bool:
    # libfoo.so, libfoo.so.1, libfoo-abc123.so.1.2 (auditwheel's .libs)
    return name.startswith("lib") and (name.endswith(".so") or ".so." in name)


def classify(paths: Iterable[str], site_dir: str, suffixes: Sequence[str],
             sources: frozenset[str] | set[str] = frozenset()) -> Loadables:
    """Sort ``.so`` files into modules the node's CPython would import (the
    first of its suffixes present per module), libraries, and modules that
    are present only as builds for another platform or Python. ``sources``
    (``dir/name`` without ``.py``): such a module falls back to its Python
    source, so a foreign build next to it is never tried."""
    from .suffixes import split_extension

    rank = {s: i for i, s in enumerate(suffixes)}
    best: dict[str, tuple[int, str]] = {}
    other: dict[str, list[str]] = {}
    libraries: list[str] = []
    base = site_dir.rstrip("/") + "/"
    for path in paths:
        directory, name = path.rsplit("/", 1) if "/" in path else ("", path)
        if is_library(name):
            libraries.append(path)
            continue
        split = split_extension(name)
        if split is None:
            if ".so." in name:
                libraries.append(path)
            continue
        module, suffix = split
        key = f"{directory}/{module}"
        if suffix in rank:
            known = best.get(key)
            if known is None or rank[suffix] < known[0]:
                best[key] = (rank[suffix], path)
        else:
            other.setdefault(key, []).append(path)

    def dotted(key: str) -> str:
        rel = key[len(base):] if key.startswith(base) else key.lstrip("/")
        return rel.replace("/", ".")

    modules = tuple((dotted(k), p) for k, (_r, p) in best.items())
    foreign = tuple((dotted(k), tuple(v)) for k, v in other.items()
                    if k not in best and k not in sources)
    return Loadables(modules, tuple(libraries), foreign)
