"""Environments a script activates, found the way their tools find them,
by reading files (an ``activate`` script, ``.condarc``), never running them.
"""

from __future__ import annotations

import os

from .. import fsprobe
from ..python.nodepath import read_text

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ..budget import Budget

#: How much of an ``activate`` script or ``.condarc`` is read.
_SMALL = 64 * 1024


def venv_of_activate(path: str, budget: Budget, files: fsprobe.Files = fsprobe.HOST) -> str | None:
    """The ``VIRTUAL_ENV`` a venv's ``bin/activate`` sets, or None if ``path``
    is not one. virtualenv and ``python -m venv`` write the prefix literally
    (``VIRTUAL_ENV="/p"`` or ``VIRTUAL_ENV='/p'``); newer ones compute it
    from the script's own location (``$(cd "$(dirname "$BASH_SOURCE")/.."
    ...)``), which is the directory above ``bin/`` of the path as sourced
    (bash does not resolve the symlink). The file is read through its
    symlinks, non-blocking and bounded (a FIFO or /dev/zero is no activate)."""
    text = read_text(path, _SMALL, budget, files)
    if text is None or "deactivate" not in text:
        return None
    for line in text.splitlines():
        budget.tick()
        stripped = line.strip()
        for lead in ("VIRTUAL_ENV=", "export VIRTUAL_ENV="):
            if not stripped.startswith(lead):
                continue
            raw = stripped[len(lead):].strip()
            if len(raw) >= 2 and raw[0] == raw[-1] and raw[0] in "'\"":
                raw = raw[1:-1]
            if raw.startswith("/") and not any(c in raw for c in "$`\\"):
                return raw.rstrip("/") or "/"
    bindir = os.path.dirname(os.path.abspath(path))
    if os.path.basename(bindir) not in ("bin", "Scripts"):
        return None
    return os.path.dirname(bindir)


def conda_root(values: dict[str, str | None]) -> str | None:
    """The conda installation: ``CONDA_EXE`` (set by ``conda.sh`` / the shell
    hook) is ``ROOT/bin/conda``; mamba's ``MAMBA_ROOT_PREFIX``."""
    exe = values.get("CONDA_EXE")
    if exe and exe.startswith("/"):
        return os.path.dirname(os.path.dirname(exe))
    root = values.get("MAMBA_ROOT_PREFIX")
    if root and root.startswith("/"):
        return root.rstrip("/") or "/"
    return None


def _condarc_envs_dirs(home: str | None, root: str | None, budget: Budget,
                       files: fsprobe.Files) -> list[str]:
    """``envs_dirs`` of the user's and the installation's ``.condarc`` (the
    simple YAML list form conda writes: ``envs_dirs:`` then ``- DIR`` lines)."""
    out: list[str] = []
    rcs = []
    if root:
        rcs.append(f"{root}/.condarc")
    if home:
        rcs += [f"{home}/.condarc", f"{home}/.config/conda/.condarc"]
    for rc in rcs:
        text = read_text(rc, _SMALL, budget, files)
        if not text:
            continue
        inside = False
        for line in text.splitlines():
            budget.tick()
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            if not line[0].isspace() and not line.startswith("-"):
                inside = line.split(":", 1)[0].strip() == "envs_dirs"
                continue
            item = line.strip()
            if inside and item.startswith("- "):
                d = item[2:].strip().strip("'\"")
                if d.startswith("~/") and home:
                    d = home + d[1:]
                if d.startswith("/"):
                    out.append(d.rstrip("/"))
    return out


def conda_prefix(name: str, values: dict[str, str | None], cwd: str,
                 budget: Budget, files: fsprobe.Files = fsprobe.HOST) -> str | None:
    """The prefix ``conda activate NAME`` activates: a path (it has a ``/``)
    is the prefix itself; ``base`` the installation; otherwise the first
    ``envs_dirs`` entry holding NAME: ``.condarc``'s, then ROOT/envs,
    then ``~/.conda/envs`` (conda's defaults). None when not found."""
    home = values.get("HOME")
    root = conda_root(values)
    if "/" in name:
        path = name if name.startswith("/") else os.path.join(cwd, name)
        if name.startswith("~/") and home:
            path = home + name[1:]
        return os.path.normpath(path) if files.isdir(path) else None
    if name == "base":
        return root
    dirs = _condarc_envs_dirs(home, root, budget, files)
    if root:
        dirs.append(f"{root}/envs")
    if home:
        dirs.append(f"{home}/.conda/envs")
    for d in dirs:
        budget.tick()
        candidate = f"{d}/{name}"
        if files.isdir(f"{candidate}/conda-meta") or files.isdir(f"{candidate}/bin"):
            return candidate
    return None


def has_activate_hooks(prefix: str, files: fsprobe.Files = fsprobe.HOST) -> bool:
    """An environment with ``etc/conda/activate.d`` scripts runs them on
    activation: what they set is unknown to a reader."""
    try:
        return bool(files.listdir(f"{prefix}/etc/conda/activate.d"))
    except OSError:
        return False
