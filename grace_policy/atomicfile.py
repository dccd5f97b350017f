"""Replacing a file so that no reader ever sees half of it.

Two writers need this: the compiled config (every step reads it; a torn one
would be distrusted and cost every step a validation) and the metrics file
(node_exporter's collector reads it at any moment). Both write a temporary
file in the same directory, fsync it, then rename it over the old one: a
rename within one file system is atomic, so readers see the old file or the
new one, whole. On any failure the temporary file is removed and the old
file stays as it was.
"""

from __future__ import annotations

import os


def replace(path: str, data: bytes, *, mode: int = 0o644, suffix: str = ".tmp") -> None:
    """Put ``data`` at ``path`` atomically, with ``mode`` (0644 by default:
    the readers are other users). Raises OSError, after cleaning up."""
    import tempfile  # a write per config change or report run, never per step

    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".grace-policy-", suffix=suffix, dir=directory)
    try:
        os.fchmod(fd, mode)
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
        os.fsync(fd)
        os.close(fd)
        fd = -1
        os.replace(tmp, path)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
