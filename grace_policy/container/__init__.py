"""Container steps as slurmstepd sees them: what runs, in which image, with
which environment and working directory (issue 15).

The C side (spank/grace_container.c) says which runtime runs the step's
argv, on Slurm's and pyxis' word rather than the user's environment:
``pyxis`` with a local ``.sqsh`` (or an image pyxis imports later, or a
named container), or ``oci`` (Slurm's ``--container=BUNDLE``, from the
config.json slurmstepd wrote as root). :func:`plan` turns that into what
the core judges: an :class:`~grace_policy.image.Image` and the argv, env
and cwd *inside* it, or the reason the step cannot be judged here (one
audit line; the user is told nothing, the runtime reports its own errors).

Nothing here is imported by a host step.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .._record import dataclass

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ..image import Image


@dataclass(frozen=True)
class ContainerStep:
    """A container step as the C side found it (grace_container.c): which
    runtime runs it, its image, and the step as slurmstepd will start it."""

    #: ``pyxis``, ``oci`` or ``oci-bundle``.
    kind: str
    #: The image (a path, a registry reference, a bundle), as the runtime has it.
    image: str | None
    #: The image is a local file (not pulled by pyxis after the check).
    local: bool
    #: Why the step is a container step (names every skip in the audit line).
    reason: str
    argv: Sequence[str]
    env: Mapping[str, str]
    cwd: str
    #: The runtime's own options as C read them ("key=value" lines).
    args: str | None = None
    #: The job's batch step (argv[0] is slurmd's copy of the script).
    batch: bool = False
    #: A cap on the image's inodes (tests; None: the reader's default).
    max_inodes: int | None = None


@dataclass(frozen=True)
class Plan:
    """What to judge for a container step."""

    #: The image the argv runs in, or None: not judged (``skipped`` says why).
    image: Image | None
    argv: tuple[str, ...]
    env: dict[str, str]
    cwd: str
    #: Why the step is not judged (for the audit line), or None.
    skipped: str | None = None
    #: The step's budget ran out while its image was read: a check-limit.
    limit: str | None = None
    #: An image pyxis will pull from a registry (``image`` is None): a
    #: :class:`grace_policy.registry.step.RegistryStep`, judged from its
    #: manifest by the core within the check's deadline. (Not typed by name:
    #: the registry package reads enroot's settings from this package.)
    registry: object | None = None
