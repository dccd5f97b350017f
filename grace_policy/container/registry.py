"""A pyxis step (``srun`` or ``sbatch --container-image=REF``) whose image
pyxis will import from a registry: the plan that lets the core judge the
image's manifest before the pull (:mod:`grace_policy.registry`)."""

from __future__ import annotations

from ..fsprobe import HOST, Files
from . import ContainerStep, Plan


def plan_registry(step: ContainerStep, *, search: str | None = None,
                  files: Files = HOST) -> Plan:
    """A Plan carrying the reference of ``step.image`` and the settings of
    the enroot pyxis runs (the job's environment without what pyxis
    withholds, enroot.conf, read in ``files``), or a skip when enroot would
    not take the string as a registry image."""
    from ..registry.reference import parse

    image, reason, argv, env, cwd = step.image or "", step.reason, step.argv, step.env, step.cwd

    ref = parse(image)
    if ref is None:
        return Plan(None, tuple(argv), dict(env), cwd,
                    skipped=f"{reason}: not judged: not a registry reference enroot reads")
    from ..registry.settings import for_pyxis
    from ..registry.step import RegistryStep

    found = RegistryStep(ref, for_pyxis(env, search=search, files=files), image)
    return Plan(None, tuple(argv), dict(env), cwd, registry=found)
