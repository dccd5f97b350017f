"""A pyxis step (``srun`` or ``sbatch --container-image=REF``) whose image
pyxis will import from a registry: the plan that lets the core judge the
image's manifest before the pull (:mod:`grace_policy.registry`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from . import Plan


def plan_registry(image: str, reason: str, argv: Sequence[str], env: Mapping[str, str],
                  cwd: str, *, search: str | None = None) -> Plan:
    """A Plan carrying the reference and the settings of the enroot pyxis
    runs (the job's environment without what pyxis withholds, enroot.conf),
    or a skip when enroot would not take the string as a registry image."""
    from ..registry.reference import parse

    ref = parse(image)
    if ref is None:
        return Plan(None, tuple(argv), dict(env), cwd,
                    skipped=f"{reason}: not judged: not a registry reference enroot reads")
    from ..registry.settings import for_pyxis
    from ..registry.step import RegistryStep

    step = RegistryStep(ref, for_pyxis(env, search=search), image)
    return Plan(None, tuple(argv), dict(env), cwd, registry=step)
