"""Whether a program can be a Python step at all, from its name alone.

The launch check asks this for every step: it must cost a string test, not
the import of the Python-step machinery. Only a program named like a CPython
(python, python3, python3.X; on its path or its real path) or a shell that
may start the active environment's python goes further.
"""

from __future__ import annotations

import os

from .. import fsprobe

#: Programs whose steps usually start Python from the environment they inherit.
SHELLS = frozenset({"bash", "sh", "dash", "zsh", "ksh", "mksh", "tcsh", "csh", "fish"})
#: Launchers that run a project's environment (``uv run ...``).
LAUNCHERS = frozenset({"uv"})


def _pythonish(name: str) -> bool:
    return name.startswith("python") and not name.endswith("-config")


def may_run_python(path: str, files: fsprobe.Files = fsprobe.HOST) -> bool:
    name = os.path.basename(path)
    if _pythonish(name) or name in SHELLS or name in LAUNCHERS:
        return True
    real = os.path.basename(files.realpath(path))
    return real != name and (_pythonish(real) or real in SHELLS or real in LAUNCHERS)
