"""A pyxis/enroot step (``srun --container-image=IMG``) as it will run.

pyxis 0.24.0 (pyxis_slurmstepd.c) hands a local image (a string starting
with ``.`` or ``/``) to ``enroot create`` in its task_init, after this
check; enroot starts the container with the job's environment (pyxis drops
PATH, LD_LIBRARY_PATH, LD_PRELOAD and its own variables from it) and the
image's ``/etc/environment`` over it, and pyxis copies the result back into
the step's environment; slurmstepd then resolves argv[0] with that PATH,
inside the container's mount namespace. So the check reads the squashfs
itself (:func:`grace_policy.image.open_image`, never mounted): the image's
PATH and loader, this node's CPU and page size, no host path.

``sbatch --container-image=IMG`` (pyxis' ``sbatch_support``, on by
default): pyxis starts the container for the batch step too, with slurmd's
copy of the script bind-mounted at its own path, and the script runs in
it; its ``#!`` interpreter is the image's.

An image pyxis imports from a registry exists on this node only after
pyxis' task_init; its manifest and config are judged before that
(:mod:`grace_policy.registry`, issue 25): the architecture only. A named
container without an image is not judged here (the audit line says so).
What pyxis fails to import or start is pyxis' error to report.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from . import Plan

#: What pyxis keeps out of enroot's environment (pyxis_slurmstepd.c
#: enroot_deny_env): the container never sees the host's values of these.
_DENIED = ("PATH", "LD_LIBRARY_PATH", "LD_PRELOAD")


def mounts(args: Mapping[str, str], env: Mapping[str, str], image_fstab: str = ""
           ) -> list[tuple[str, str]]:
    """(inner, host) of what is mounted from the host, in mount order:
    the image's ``/etc/fstab`` (``image_fstab``), enroot's own (``mounts.d``,
    the home mount; :mod:`.enroot`), then
    ``--container-mounts SRC:DST[:FLAGS],...`` (pyxis args.c: ``SRC`` alone
    mounts at the same path). ``--container-mount-home`` /
    ``--no-container-mount-home`` (or pyxis' ``PYXIS_CONTAINER_MOUNT_HOME``)
    decide the home mount; without either, enroot's setting does."""
    from .enroot import PYXIS_DENIED, enroot_mounts, fstab_binds

    home_flag = {"1": True, "0": False}.get(args.get("mount_home", ""))
    if home_flag is None:
        home_flag = _bool(env.get("PYXIS_CONTAINER_MOUNT_HOME"))
    site = enroot_mounts(env, home_flag)
    out = fstab_binds(image_fstab, {k: v for k, v in env.items() if k not in PYXIS_DENIED})
    home = env.get("HOME")
    if site is not None:
        out.extend(site)
    elif home_flag and home and home.startswith("/"):
        out.append((home, home))  # no enroot found to ask: its default hook
    for item in (args.get("mounts") or "").split(","):
        parts = item.split(":")
        src = parts[0]
        dst = parts[1] if len(parts) > 1 and parts[1] else src
        if src.startswith("/") and dst.startswith("/"):
            out.append((dst, src))
    return out


def _bool(value: str | None) -> bool | None:
    """pyxis' boolean environment values (config.c parse_bool: exact words)."""
    word = value or ""
    if word in ("1", "true", "yes", "y"):
        return True
    if word in ("0", "false", "no", "n"):
        return False
    return None


def plan_pyxis(image: str | None, local: bool, reason: str, argv: Sequence[str],
               env: Mapping[str, str], cwd: str, *, max_inodes: int | None = None,
               args: Mapping[str, str] | None = None, batch: bool = False) -> Plan:
    if not local and image:
        from .registry import plan_registry

        return plan_registry(image, reason, argv, env, cwd)
    if not local or not image:
        return Plan(None, tuple(argv), dict(env), cwd,
                    skipped=f"{reason}: not judged: not a local image (pyxis imports or "
                            "reuses it in its task_init, after the check)")
    from ..image import ImageError
    from ..image.open import open_image

    try:
        img = open_image(image, max_inodes=max_inodes)
    except ImageError as exc:
        return Plan(None, tuple(argv), dict(env), cwd,
                    skipped=f"{reason}: not judged: {exc.reason}")
    except OSError as exc:  # the squashfs reader's word for a corrupt image
        return Plan(None, tuple(argv), dict(env), cwd,
                    skipped=f"{reason}: not judged: {exc.strerror or exc}")
    job = {k: v for k, v in env.items() if k not in _DENIED}
    inner = img.step_env(job)
    from .enroot import enroot_environ

    inner.update(enroot_environ(env))  # environ.d of the site and the user, after the image's
    args = args or {}
    from ..image.view import MAX_ENV_BYTES, read_view_file

    try:  # enroot mounts what the image's own fstab binds from the host
        fstab = read_view_file(img.view, "/etc/fstab", MAX_ENV_BYTES) or b""
    except (ImageError, OSError):
        fstab = b""
    binds = mounts(args, env, fstab.decode("utf-8", "surrogateescape"))
    if batch and argv and argv[0].startswith("/"):
        # pyxis' user_init, batch step: slurmd's copy of the script is
        # bind-mounted read-only at the same path inside the container, which
        # runs it (pyxis_slurmstepd.c, stepid == SLURM_BATCH_SCRIPT).
        binds.append((argv[0], argv[0]))
    if binds:
        img = img.with_mounts(binds)
    workdir = args.get("workdir")
    if workdir and workdir.startswith("/"):
        return Plan(img, tuple(argv), inner, workdir)
    return Plan(img, tuple(argv), inner, _inner_cwd(img, cwd))


def _inner_cwd(img: object, cwd: str) -> str:
    """The job's cwd when the image has that directory (enroot starts there
    when it can), else ``/``."""
    view = getattr(img, "view", None)
    try:
        import stat

        st = view.stat(cwd) if view is not None and cwd.startswith("/") else None  # type: ignore[attr-defined]
        if st is not None and stat.S_ISDIR(st.st_mode):
            return cwd
    except (OSError, ValueError):
        pass
    return "/"
