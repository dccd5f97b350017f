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
class Plan:
    """What to judge for a container step."""

    #: The image the argv runs in, or None: not judged (``skipped`` says why).
    image: Image | None
    argv: tuple[str, ...]
    env: dict[str, str]
    cwd: str
    #: Why the step is not judged (for the audit line), or None.
    skipped: str | None = None


def plan(kind: str, image: str | None, local: bool, reason: str, argv: Sequence[str],
         env: Mapping[str, str], cwd: str, *, max_inodes: int | None = None,
         args: str | None = None) -> Plan:
    """The step as it will run in its container. Never raises. ``args``: the
    runtime's own options as C read them ("key=value" lines)."""
    try:
        if kind == "pyxis":
            from .pyxis import plan_pyxis

            return plan_pyxis(image, local, reason, argv, env, cwd, max_inodes=max_inodes,
                              args=_lines(args))
        if kind == "oci":
            from .slurm_oci import plan_oci

            return plan_oci(image or "", reason, env, max_inodes=max_inodes)
        if kind == "oci-bundle":
            from .slurm_oci import plan_bundle

            return plan_bundle(image or "", reason, argv, env)
    except Exception as exc:  # an image is user input: a skip, never a crash
        return Plan(None, tuple(argv), dict(env), cwd,
                    skipped=f"{reason}: not judged: {type(exc).__name__}: {exc}")
    return Plan(None, tuple(argv), dict(env), cwd,
                skipped=f"{reason}: not judged: unknown container kind {kind!r}")


def _lines(text: str | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in (text or "").splitlines():
        key, eq, value = line.partition("=")
        if eq and key:
            out[key] = value
    return out
