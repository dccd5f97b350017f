"""Has the install the node checker loaded changed since it started?

Why: the server imported its modules once, at slurmd's start. A reinstall
(new files, new inodes) while slurmd runs would leave it judging steps with
the old code; a request that finds any of its module files changed is
turned away ('V': slurmstepd checks the step itself) and the server ends,
until slurmd starts the new install's checker.

The modules it loaded are not enough: a miss may import one it had not
(``image/`` for the first container step), and an upgrade that replaced
that one would mix old and new code. So the whole package tree is stamped
too: every directory by its entries (a module added, removed or renamed)
and every file, but ``__pycache__`` (the server runs with ``-B``; a root
running the CLI may still write bytecode there). A hundred-odd stats and
a dozen listings per miss, in the child (~0.3 ms).
"""

from __future__ import annotations

import os
import stat

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

Stamp = tuple[int, int, int, int, int]

#: The installed ``grace_policy`` package directory this process runs.
PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _stamp(paths: Sequence[str]) -> dict[str, Stamp]:
    out = {}
    for path in paths:
        try:
            st = os.stat(path)
            if stat.S_ISDIR(st.st_mode):
                # A directory by its entries, not its times: a __pycache__
                # made beside the modules (the CLI run as root) is no change.
                names = tuple(sorted(n for n in os.listdir(path) if n != "__pycache__"))
                out[path] = (st.st_dev, st.st_ino, -1, hash(names), 0)
                continue
        except OSError:
            out[path] = (0, 0, 0, 0, 0)
            continue
        out[path] = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    return out


def tree(root: str) -> list[str]:
    """Every directory and file under ``root`` (itself included), but
    ``__pycache__`` and what is in it."""
    out = [root]
    for here, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        out.extend(os.path.join(here, d) for d in dirs)
        out.extend(os.path.join(here, f) for f in sorted(files))
    return out


class Install:
    """The identity of the files a process loaded, and of every file and
    directory of the package trees ``roots``, taken once."""

    def __init__(self, paths: Sequence[str], roots: Sequence[str] = ()) -> None:
        every = list(paths)
        for root in roots:
            every.extend(tree(root))
        self.stamp = _stamp(list(dict.fromkeys(every)))

    def changed(self) -> str | None:
        """Why this install must not judge any more, or None."""
        now = _stamp(list(self.stamp))
        changed = sorted(p for p in self.stamp if now[p] != self.stamp[p])
        if changed:
            return (f"{changed[0]} changed since the checker started (restart slurmd to "
                    "start the new install's checker)")
        return None
