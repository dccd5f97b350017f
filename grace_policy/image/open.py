"""Which kind of image a path is, and the facts each kind gives.

An unpacked root (a directory), an OCI bundle (a directory with
``config.json``), an enroot squashfs (``hsqs`` magic) or an Apptainer SIF
(``SIF_MAGIC`` at byte 32). Everything read here is bounded: a hostile
``config.json`` or ``/etc/environment`` ends in :class:`ImageError` or is
ignored, never in an exception of another kind or an unbounded read.
"""

from __future__ import annotations

import os
import stat as _stat

from . import Image, ImageError
from .view import DirView, TreeView

#: Largest config.json / environment file read (a real one is a few KiB).
MAX_CONFIG_BYTES = 1 << 20
MAX_ENV_BYTES = 64 * 1024
MAX_ENV_VARS = 4096


def identity(st: os.stat_result) -> str:
    """An image file's identity: its content cannot change without one of
    these changing (what the verdict cache keys a container step on)."""
    return f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"


def open_image(path: str, *, max_inodes: int | None = None) -> Image:
    try:
        st = os.stat(path)
    except (OSError, ValueError) as exc:
        raise ImageError(f"cannot read the image: {getattr(exc, 'strerror', None) or exc}"
                         ) from None
    if _stat.S_ISDIR(st.st_mode):
        if os.path.lexists(os.path.join(path, "config.json")):
            from .oci import open_bundle

            return open_bundle(path)
        view = DirView(path, name=path)
        return Image(path=path, kind="dir", view=view, env=environment_file(view))
    if not _stat.S_ISREG(st.st_mode):
        raise ImageError("the image is neither a directory nor a regular file")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError as exc:
        raise ImageError(f"cannot open the image: {exc.strerror}") from None
    try:
        head = os.pread(fd, 64, 0)
    except OSError as exc:
        os.close(fd)
        raise ImageError(f"cannot read the image: {exc.strerror}") from None
    if head[:4] == b"hsqs":
        from .squashfs import SquashView

        try:
            view = SquashView(fd, path, st, max_inodes=max_inodes)
        except BaseException:
            os.close(fd)
            raise
        return Image(path=path, kind="squashfs", view=view, env=environment_file(view),
                     identity=identity(st))
    if head[32:42] == b"SIF_MAGIC\0":
        from .sif import open_sif

        return open_sif(fd, path, st, max_inodes=max_inodes)
    os.close(fd)
    raise ImageError("not an image this check can read (neither a directory, a squashfs "
                     "file nor an Apptainer SIF)")


def read_view_file(view: TreeView, path: str, limit: int) -> bytes | None:
    """At most ``limit`` bytes of a regular file in ``view``; None if absent
    or unreadable (links resolve in the view)."""
    try:
        fh, st = view.open_regular(path)
    except OSError:
        return None
    try:
        return fh.pread(min(st.st_size, limit), 0)  # type: ignore[no-any-return]
    except OSError:
        return None
    finally:
        fh.close()


def environment_file(view: TreeView, path: str = "/etc/environment"
                     ) -> tuple[tuple[str, str], ...]:
    """``KEY=VALUE`` lines (``export`` and one level of quotes allowed), as
    enroot sets them for the container's process; comments and anything
    else ignored."""
    data = read_view_file(view, path, MAX_ENV_BYTES)
    if not data:
        return ()
    return parse_env_lines(data.decode("utf-8", "surrogateescape"))


def parse_env_lines(text: str) -> tuple[tuple[str, str], ...]:
    out: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("export "):
            line = line[7:].lstrip()
        name, eq, value = line.partition("=")
        if not eq or not name or not (name[0].isalpha() or name[0] == "_") or not all(
                c.isalnum() or c == "_" for c in name):
            continue
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        out[name] = value
        if len(out) >= MAX_ENV_VARS:
            break
    return tuple(out.items())
