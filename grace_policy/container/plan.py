"""Which runtime's plan a container step gets: the one entry point the
bridge calls (C says which runtime runs the step, grace_container.c)."""

from __future__ import annotations

from ..budget import Budget, BudgetExceeded
from ..fsprobe import HOST, Files
from . import ContainerStep, Plan


def plan(step: ContainerStep, budget: Budget | None = None, files: Files = HOST) -> Plan:
    """The step as it will run in its container. Never raises. ``budget``:
    the step's (the image is read under it from its first byte; running out
    is ``Plan.limit``). ``files``: this host's, with the record of what the
    plan reads there (enroot, its configuration, the user's mounts.d)."""
    budget = budget or Budget()
    kind, image, reason = step.kind, step.image, step.reason
    argv, env, cwd, max_inodes = step.argv, step.env, step.cwd, step.max_inodes
    try:
        if kind == "pyxis":
            from .pyxis import plan_pyxis

            lines = option_lines(step.args)
            if "uncarried" in lines:  # a named step (never "local") too
                # C could not pass an option whole (grace_container.c): judging
                # the image without its mounts would be a guess, and a guess
                # must not become a cached allow.
                return Plan(None, tuple(argv), dict(env), cwd,
                            skipped=f"{reason}: not judged: a pyxis option "
                                    "(--container-mounts or --container-workdir) is too long "
                                    "for the check to read")
            return plan_pyxis(step, lines, budget, files)
        if kind == "oci":
            from .slurm_oci import plan_oci

            return plan_oci(image or "", reason, env, max_inodes=max_inodes)
        if kind == "oci-bundle":
            from .slurm_oci import plan_bundle

            return plan_bundle(image or "", reason, argv, env)
    except BudgetExceeded as exc:  # a huge or slow image: the step's check-limit
        return Plan(None, tuple(argv), dict(env), cwd, limit=str(exc))
    except Exception as exc:  # an image is user input: a skip, never a crash
        return Plan(None, tuple(argv), dict(env), cwd,
                    skipped=f"{reason}: not judged: {type(exc).__name__}: {exc}")
    return Plan(None, tuple(argv), dict(env), cwd,
                skipped=f"{reason}: not judged: unknown container kind {kind!r}")


def option_lines(text: str | None) -> dict[str, str]:
    """C's "key=value" lines; a value's ``%`` and newlines come as ``%25``
    and ``%0A`` (grace_container.c ``grace_args_put``)."""
    out: dict[str, str] = {}
    for line in (text or "").split("\n"):
        key, eq, value = line.partition("=")
        if eq and key:
            out[key] = value.replace("%0A", "\n").replace("%25", "%") if "%" in value else value
    return out
