"""Which kind of image a path is, and the facts each kind gives.

An unpacked root (a directory), an OCI bundle (a directory with
``config.json``), an enroot squashfs (``hsqs`` magic) or an Apptainer SIF
(``SIF_MAGIC`` at byte 32). Everything read here is bounded: a hostile
``config.json`` or ``/etc/environment`` ends in :class:`ImageError` or is
ignored, never in an exception of another kind or an unbounded read.

The caller's :class:`~grace_policy.budget.Budget` (the step's: the one its
check goes on with) is charged from the first byte: what this module and
the view read, the time it takes, the image as one file. Exceeding it
raises :class:`~grace_policy.budget.BudgetExceeded` (the step's
``check-limit``), here or at any later read of the view.

The identity an image file records is the ``fstat`` of the descriptor its
view reads, never a second look at the name.
"""

from __future__ import annotations

import os
import stat as _stat

from . import Image, ImageError
from .view import DirView, environment_file, identity

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ..budget import Budget


def open_image(path: str, *, budget: Budget, max_inodes: int | None = None) -> Image:
    """The image at ``path``, read under ``budget`` (kept by its view for
    every later read). Raises :class:`ImageError` or ``BudgetExceeded``."""
    budget.take_file()
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
        # What was opened, not what the name was a moment ago: the view's
        # size bounds and the recorded identity are this file's.
        st = os.fstat(fd)
        if not _stat.S_ISREG(st.st_mode):
            raise ImageError("the image is neither a directory nor a regular file")
        budget.spend_bytes(64)
        head = os.pread(fd, 64, 0)
    except OSError as exc:
        os.close(fd)
        raise ImageError(f"cannot read the image: {exc.strerror}") from None
    except BaseException:
        os.close(fd)
        raise
    if head[:4] == b"hsqs":
        from .squashfs import SquashView

        try:
            view = SquashView(fd, path, st, budget=budget, max_inodes=max_inodes)
        except BaseException:
            os.close(fd)
            raise
        try:
            env = environment_file(view)
        except BaseException:
            view.close()
            raise
        return Image(path=path, kind="squashfs", view=view, env=env, identity=identity(st))
    if head[32:42] == b"SIF_MAGIC\0":
        from .sif import open_sif

        return open_sif(fd, path, st, budget=budget, max_inodes=max_inodes)
    os.close(fd)
    raise ImageError("not an image this check can read (neither a directory, a squashfs "
                     "file nor an Apptainer SIF)")
