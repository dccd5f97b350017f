"""Why a problem file is where it is: the most specific explanation first.

The rule catalogue picks its remediation text by these causes, so a foreign
python inside a leaked virtualenv is told to unset the leak, and a binary in
``~/.local/bin`` is told it was installed on the login node.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

from . import fsprobe

#: Directory names that mark per-architecture JIT and extension caches.
_JIT_MARKERS = ("/.triton/", "/torch_extensions/", "/.cache/torch/kernels/",
                "/deepspeed/", "/.cache/flashinfer/", "/torchinductor_")


def _under(path: str, prefix: str) -> bool:
    prefix = prefix.rstrip("/")
    return bool(prefix) and (path == prefix or path.startswith(prefix + "/"))


def path_causes(
    path: str,
    env: Mapping[str, str],
    leaked_prefixes: Iterable[str] = (),
    files: fsprobe.Files = fsprobe.HOST,
) -> tuple[str, ...]:
    """Causes for ``path``, most specific first; ``system`` or nothing last.
    ``files``: the check's, where conda and venv markers are looked for."""
    causes: list[str] = []
    if any(_under(path, p) for p in leaked_prefixes):
        causes.append("leaked-env")
    pythonpath = env.get("PYTHONPATH")
    if pythonpath and any(_under(path, p) for p in pythonpath.split(":") if p.startswith("/")):
        causes.append("pythonpath")
    if any(m in path for m in _JIT_MARKERS):
        causes.append("jit-cache")
    if "jemalloc" in os.path.basename(path):
        causes.append("jemalloc")
    if "/site-packages/" in path or "/dist-packages/" in path:
        if ".libs/" in path:
            # auditwheel's PKG.libs: a library the wheel carries for itself.
            causes.append("bundled-lib")
        causes.append("pip-wheel")
    directory = os.path.dirname(path)
    for _ in range(8):
        if _looks_conda(directory, files):
            causes.append("conda")
            break
        if _looks_venv(directory, files):
            causes.append("venv")
            break
        parent = os.path.dirname(directory)
        if parent == directory:
            break
        directory = parent
    home = env.get("HOME", "")
    if (_under(path, os.path.join(home, ".local")) if home else "/.local/" in path):
        causes.append("user-local")
    if home and _under(path, home):
        causes.append("home")
    if path.startswith(("/usr/", "/lib", "/bin/", "/sbin/", "/opt/")):
        causes.append("system")
    return tuple(dict.fromkeys(causes))


def _looks_conda(root: str, files: fsprobe.Files) -> bool:
    return files.isdir(os.path.join(root, "conda-meta"))


def _looks_venv(root: str, files: fsprobe.Files) -> bool:
    return files.isfile(os.path.join(root, "pyvenv.cfg"))
