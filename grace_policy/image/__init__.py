"""Container images, read without mounting: what a step will run inside.

A step started by pyxis/enroot (``--container-image``), Slurm's OCI support
(``--container=BUNDLE``) or ``apptainer exec IMG.sif`` runs its command in an
image, not on the host. :func:`open_image` gives, for an unpacked root, an
enroot squashfs (``.sqsh``), an Apptainer SIF or an OCI bundle, an
:class:`Image`: its view of the files (:mod:`.view`; every reader of a check
goes through it, see :class:`grace_policy.fsprobe.Files`), its architecture when the
image says, its environment and its identity (the image file's stat, what
the verdict cache keys a container step on).

Nothing here is imported by a host step.
"""

from __future__ import annotations

from .._record import dataclass

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping


class ImageError(Exception):
    """The image cannot be read (truncated, corrupt, hostile, unsupported):
    the reason is a sentence for the user."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Image:
    #: The image as the user named it (a path on this host).
    path: str
    #: ``dir``, ``squashfs``, ``sif`` or ``oci``.
    kind: str
    #: The files inside (:class:`grace_policy.image.view.TreeView`).
    view: object
    #: The architecture the image declares (normalized uname name), or None.
    arch: str | None = None
    #: Variables the image sets for its process (``/etc/environment``,
    #: ``process.env``, ``/.singularity.d/env``).
    env: tuple[tuple[str, str], ...] = ()
    #: Whether ``env`` is the whole environment (OCI ``process.env``) or is
    #: laid over the job's (enroot, Apptainer).
    env_replaces: bool = False
    #: What the image says to run and where (OCI ``process.args``/``cwd``).
    args: tuple[str, ...] = ()
    cwd: str | None = None
    #: The image file's identity (dev:ino:size:mtime_ns), "" for a tree.
    identity: str = ""

    def step_env(self, job_env: Mapping[str, str]) -> dict[str, str]:
        """The environment the command gets inside the image: the bundle's
        ``process.env`` alone for OCI (the runtime does not pass the host's),
        else the job's with the image's variables over it (enroot loads
        ``/etc/environment``, Apptainer its ``/.singularity.d/env``)."""
        if self.env_replaces:
            return dict(self.env)
        out = dict(job_env)
        out.update(self.env)
        return out

    def with_mounts(self, mounts: list[tuple[str, str]]) -> Image:
        """This image with host directories bind-mounted at the given inner
        paths, ``[(inner, host_dir), ...]``, as the runtime will mount them
        (enroot's home and ``--container-mounts``, Apptainer's binds)."""
        from .._record import replace

        return replace(self, view=self.view.mounted(list(mounts)))  # type: ignore[attr-defined]

    def describe(self) -> str:
        return f"{self.kind} image {self.path}"
