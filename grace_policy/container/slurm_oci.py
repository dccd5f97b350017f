"""Slurm's own OCI containers (``srun --container=BUNDLE``, oci.conf).

Slurm 22.05 (slurmstepd.c ``setup_container``, container.c) reads the
bundle's config.json before any plugin is loaded and writes a copy for the
runtime into ``<SlurmdSpoolDir>/oci-jobJJJJJ-SSSSS/config.json`` (as root,
O_EXCL, mode 0750, group the job's), with ``process.args`` the user's argv,
``process.env`` the bundle's followed by the job's, and ``root.path`` set
to ``BUNDLE/rootfs``; the step's own argv becomes a ``/bin/sh -c`` canary.
spank/grace_container.c finds that copy (it is root's, the user cannot
forge it) and hands its path here: the check judges ``process.args`` in
``root.path`` with ``process.env`` and ``process.cwd``, as runc will run
them. ``SLURM_CONTAINER`` in the step environment is not read there: srun
leaves a user's own value alone.

Newer Slurm (26.05) moves argv into config.json only per task, after the
plugins' task_init: spank/grace_container.c then knows the step is an OCI
step from the spool directory slurmstepd made, and the bundle only from
``SLURM_CONTAINER`` (``oci-bundle``, :func:`plan_bundle`): the bundle's own
config.json, with the step's argv and the job's variables merged over
``process.env`` by name, as 26.05's ``_merge_step_config_env`` does.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from .._record import replace
from . import Plan


def plan_oci(config: str, reason: str, env: Mapping[str, str], *,
             max_inodes: int | None = None) -> Plan:
    from .. import _json
    from ..image import ImageError
    from ..image.oci import _read_config
    from ..image.view import DirView

    def skip(why: str) -> Plan:
        return Plan(None, (), dict(env), "/", skipped=f"{reason}: not judged: {why}")

    try:
        data = _json.loads(_read_config(config))
    except ImageError as exc:
        return skip(exc.reason)
    except (ValueError, RecursionError, UnicodeDecodeError):
        return skip("slurmstepd's config.json is not valid JSON")
    if not isinstance(data, dict):
        return skip("slurmstepd's config.json is not a JSON object")
    root = data.get("root")
    root_path = root.get("path") if isinstance(root, dict) else None
    process = data.get("process")
    if not isinstance(root_path, str) or not root_path.startswith("/") or "\0" in root_path \
            or not isinstance(process, dict):
        return skip("slurmstepd's config.json names no absolute root.path or no process")
    args = process.get("args")
    env_list = process.get("env", [])
    cwd = process.get("cwd", "/")
    if not isinstance(args, list) or not args or not all(isinstance(a, str) for a in args):
        return skip("slurmstepd's config.json has no process.args")
    if not isinstance(env_list, list) or not all(isinstance(e, str) for e in env_list):
        return skip("slurmstepd's config.json: process.env is not a list of strings")
    if not isinstance(cwd, str) or not cwd.startswith("/"):
        cwd = "/"
    if not os.path.isdir(root_path):
        return skip(f"the bundle's root {root_path} is not a directory")
    inner: dict[str, str] = {}
    for item in env_list:
        name, eq, value = item.partition("=")
        if eq and name:
            inner[name] = value  # runc: the last definition wins
    bundle = os.path.dirname(root_path.rstrip("/")) or "/"
    from ..image import Image

    img = Image(path=bundle, kind="oci", view=DirView(root_path, name=bundle),
                env=tuple(inner.items()), env_replaces=True, args=tuple(args), cwd=cwd)
    arch = _declared_arch(bundle)
    if arch:
        img = replace(img, arch=arch)
    return Plan(img, tuple(args), inner, cwd)


def _declared_arch(bundle: str) -> str | None:
    """The bundle's own config.json may carry an image config's
    ``architecture`` (not runtime-spec, but bundle makers copy it)."""
    try:
        from ..image.oci import open_bundle

        return open_bundle(bundle).arch
    except Exception:
        return None


def plan_bundle(bundle: str, reason: str, argv: Sequence[str], env: Mapping[str, str]) -> Plan:
    from ..image import ImageError
    from ..image.oci import open_bundle

    try:
        img = open_bundle(bundle)
    except ImageError as exc:
        return Plan(None, tuple(argv), dict(env), "/", skipped=f"{reason}: not judged: "
                                                              f"{exc.reason}")
    inner = dict(img.env)
    inner.update(env)  # the step's variables replace the bundle's of the same name
    cwd = img.cwd or "/"
    return Plan(replace(img, env=tuple(inner.items())), tuple(argv), inner, cwd)
