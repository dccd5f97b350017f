"""Has the install the node checker loaded changed since it started?

Why: the server imported its modules once, at slurmd's start. A reinstall
(new files, new inodes) while slurmd runs would leave it judging steps with
the old code; a request that finds any of its module files changed is
turned away ('V': slurmstepd checks the step itself) and the server ends,
until slurmd starts the new install's checker.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

Stamp = tuple[int, int, int, int]


def _stamp(paths: Sequence[str]) -> dict[str, Stamp]:
    out = {}
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            out[path] = (0, 0, 0, 0)
            continue
        out[path] = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    return out


class Install:
    """The identity of the files a process loaded, taken once."""

    def __init__(self, paths: Sequence[str]) -> None:
        self.stamp = _stamp(paths)

    def changed(self) -> str | None:
        """Why this install must not judge any more, or None."""
        now = _stamp(list(self.stamp))
        changed = sorted(p for p in self.stamp if now[p] != self.stamp[p])
        if changed:
            return (f"{changed[0]} changed since the checker started (restart slurmd to "
                    "start the new install's checker)")
        return None
