"""Node paths as this host reads them, and bounded reads of small files.

A node path P is read at ``node.in_root(P)`` when that exists, else at P
(shared storage): the loader's own rule (``loader.host_path``). Every module
of this package lists directories and reads small files through here, so
the verdict cache records each question and no read can block or run past
the budget.
"""

from __future__ import annotations

import os

from .. import fsprobe
from ..elf import ElfError, open_regular
from ..loader import host_path as loader_host_path

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ..budget import Budget
    from ..node import NodeProfile


def host_path(path: str, node: NodeProfile | None = None, cwd: str = "/") -> str:
    """Where this host reads node path ``path`` (the loader's rule)."""
    if node is None:
        return path if path.startswith("/") else os.path.join(cwd or "/", path)
    return loader_host_path(node, path, cwd)


def listdir(path: str) -> list[str]:
    """A directory's names (a host path), recorded for the verdict cache.
    Raises OSError like ``os.listdir``."""
    return fsprobe.listdir(path)


def scandir(path: str) -> list[os.DirEntry[str]]:
    """A directory's entries with their types (a host path), recorded."""
    return fsprobe.scandir(path)


def read_small(path: str, limit: int, budget: Budget) -> bytes | None:
    """At most ``limit`` bytes from the start of regular file ``path`` (a host
    path), charged to ``budget``; None when it is missing, not a regular file
    or unreadable. Opened without blocking (a FIFO planted as version.py must
    not hang a step launch); ``fsprobe`` records its identity."""
    try:
        fh, st = open_regular(path)
    except (OSError, ElfError, ValueError):
        return None
    try:
        size = min(st.st_size, limit)
        budget.take_file(size)
        return fh.pread(size, 0)
    except OSError:
        return None
    finally:
        fh.close()


def read_until(path: str, limit: int, budget: Budget, until: bytes,
               chunk: int = 8192) -> bytes | None:
    """:func:`read_small`, but in chunks that stop after the one holding
    ``until`` (METADATA: its headers end at the first blank line, its body is
    a README that can be megabytes); each chunk is charged before it is read."""
    try:
        fh, st = open_regular(path)
    except (OSError, ElfError, ValueError):
        return None
    try:
        size = min(st.st_size, limit)
        budget.take_file()
        parts: list[bytes] = []
        got = 0
        while got < size:
            want = min(chunk, size - got)
            budget.spend_bytes(want)
            data = fh.pread(want, got)
            if not data:
                break
            parts.append(data)
            got += len(data)
            if until in data:
                break
        return b"".join(parts)
    except OSError:
        return None
    finally:
        fh.close()


def read_text(path: str, limit: int, budget: Budget) -> str | None:
    """:func:`read_small` as text (undecodable bytes kept as surrogates)."""
    data = read_small(path, limit, budget)
    return None if data is None else data.decode("utf-8", "surrogateescape")
