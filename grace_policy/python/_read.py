"""Bounded reads of the small text files a Python check looks at (scripts,
METADATA, RECORD, top_level.txt): stat'ed through fsprobe, opened the way
elf.open_regular opens (no FIFO or device ever opened, a swap between stat
and open noted so the verdict is never cached), charged to the Budget before
each read."""

from __future__ import annotations

import os

from ..budget import Budget
from ..elf import ElfError, open_regular

_CHUNK = 8192


def read_bounded(host: str, budget: Budget, limit: int, *,
                 until: bytes | None = None) -> bytes | None:
    """The first ``limit`` bytes of a regular file, or None when it is not one
    or cannot be read. With ``until``, reading stops after the chunk that
    holds it (METADATA: the headers end at the first blank line). Only
    BudgetExceeded propagates."""
    try:
        fd, st = open_regular(host)
    except (OSError, ElfError, ValueError):
        return None
    try:
        size = min(st.st_size, limit)
        budget.take_file()
        if until is None:
            budget.spend_bytes(size)
            return os.pread(fd, size, 0)
        chunks: list[bytes] = []
        got = 0
        while got < size:
            want = min(_CHUNK, size - got)
            budget.spend_bytes(want)
            data = os.pread(fd, want, got)
            if not data:
                break
            chunks.append(data)
            got += len(data)
            if until in data:
                break
        return b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)
