"""Node paths as this host reads them, and bounded reads of small files.

A node path P is read at ``node.in_root(P)`` when that exists, else at P
(shared storage): the loader's own rule, through ``finder.host_path`` (one
implementation for the whole subpackage).
"""

from __future__ import annotations

import os

from .. import fsprobe
from ..elf import ElfError, open_regular
from .finder import host_path

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ..budget import Budget


__all__ = ["host_path", "listdir", "read_small"]


def listdir(path: str) -> list[str]:
    """The one place these modules list a directory: ``fsprobe.listdir``, so
    the verdict cache records the directory's identity and times (a file
    added later is a miss). Raises OSError like ``os.listdir``."""
    return fsprobe.listdir(path)


def read_small(path: str, limit: int, budget: Budget) -> bytes | None:
    """At most ``limit`` bytes from the start of regular file ``path`` (a host
    path), charged to ``budget``; None when it is missing, not a regular file
    or unreadable. Opened without blocking (a FIFO planted as version.py must
    not hang a step launch); ``fsprobe`` records its identity."""
    try:
        fd, st = open_regular(path)
    except (OSError, ElfError, ValueError):
        return None
    try:
        size = min(st.st_size, limit)
        budget.take_file(size)
        return os.pread(fd, size, 0)
    except OSError:
        return None
    finally:
        os.close(fd)
