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


def host_path(path: str, node: NodeProfile | None = None, cwd: str = "/",
              files: fsprobe.Files = fsprobe.HOST) -> str:
    """Where this host reads node path ``path`` (the loader's rule) in the
    check's ``files``."""
    if node is None:
        return path if path.startswith("/") else os.path.join(cwd or "/", path)
    return loader_host_path(node, path, cwd, files)


def listdir(path: str, files: fsprobe.Files = fsprobe.HOST) -> list[str]:
    """A directory's names (a host path), recorded for the verdict cache.
    Raises OSError like ``os.listdir``."""
    return files.listdir(path)


def scandir(path: str, files: fsprobe.Files = fsprobe.HOST) -> list[os.DirEntry[str]]:
    """A directory's entries with their types (a host path), recorded."""
    return files.scandir(path)


def read_small(path: str, limit: int, budget: Budget,
               files: fsprobe.Files = fsprobe.HOST) -> bytes | None:
    """At most ``limit`` bytes from the start of regular file ``path`` (a host
    path), charged to ``budget``; None when it is missing, not a regular file
    or unreadable. Opened without blocking (a FIFO planted as version.py must
    not hang a step launch); ``files`` records its identity."""
    try:
        fh, st = open_regular(path, files)
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
               chunk: int = 8192, files: fsprobe.Files = fsprobe.HOST) -> bytes | None:
    """:func:`read_small`, but in chunks that stop after the one holding
    ``until`` (METADATA: its headers end at the first blank line, its body is
    a README that can be megabytes); each chunk is charged before it is read."""
    try:
        fh, st = open_regular(path, files)
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


def read_text(path: str, limit: int, budget: Budget,
              files: fsprobe.Files = fsprobe.HOST) -> str | None:
    """:func:`read_small` as text (undecodable bytes kept as surrogates)."""
    data = read_small(path, limit, budget, files)
    return None if data is None else data.decode("utf-8", "surrogateescape")
