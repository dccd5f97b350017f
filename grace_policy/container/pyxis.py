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
(:mod:`grace_policy.registry`, issue 25): the architecture only. Once
pyxis has made the container, our task_init (listed after pyxis) asks for
the root it made to be judged as a local image (``after_pull`` in the
args; :func:`.named.plan_after_pull`, spank/grace_afterpull.c). A named
container without an image is not judged here (the audit line says so).
What pyxis fails to import or start is pyxis' error to report.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from ..budget import Budget
from ..fsprobe import HOST, Files
from . import ContainerStep, Plan

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ..image import Image

#: What pyxis keeps out of enroot's environment (pyxis_slurmstepd.c
#: enroot_deny_env): the container never sees the host's values of these.
_DENIED = ("PATH", "LD_LIBRARY_PATH", "LD_PRELOAD")


def mounts(args: Mapping[str, str], env: Mapping[str, str], image_fstab: str = "",
           cwd: str | None = None, files: Files = HOST) -> list[tuple[str, str]]:
    """(inner, host) of what is mounted from the host, in mount order:
    the image's ``/etc/fstab`` (``image_fstab``), enroot's own (``mounts.d``,
    the home mount; :mod:`.enroot`), then ``--container-mounts``
    (:func:`option_mounts`; ``cwd``: the job's, which pyxis runs enroot
    in). ``--container-mount-home`` / ``--no-container-mount-home`` (or
    pyxis' ``PYXIS_CONTAINER_MOUNT_HOME``) decide the home mount; without
    either, enroot's setting does. ``files``: the check's, whose host side
    enroot's files are read in and whose record notes them."""
    from .enroot import PYXIS_DENIED, NotedEnv, enroot_mounts, fstab_binds

    noted = NotedEnv(env, env, files)  # what is read by name is part of the verdict
    home_flag = {"1": True, "0": False}.get(args.get("mount_home", ""))
    if home_flag is None:
        home_flag = _bool(noted.get("PYXIS_CONTAINER_MOUNT_HOME"))
    site = enroot_mounts(env, home_flag, files=files)
    out = fstab_binds(image_fstab, NotedEnv(
        {k: v for k, v in env.items() if k not in PYXIS_DENIED}, env, files))
    home = noted.get("HOME")
    if site is not None:
        out.extend(site)
    elif home_flag and home and home.startswith("/"):
        out.append((home, home))  # no enroot found to ask: its default hook
    return option_mounts(args.get("mounts") or "", cwd, out)


def option_mounts(value: str, cwd: str | None, before: list[tuple[str, str]]
                  ) -> list[tuple[str, str]]:
    """``before`` with ``--container-mounts ITEM,...`` applied, as pyxis
    0.24.0 reads them (args.c ``parse_mount_option``, ``add_mount``) and
    enroot performs them after its own (runtime.sh ``_do_mounts_fini``):

    * ``SRC[:DST[:FLAGS]]``, items split at ``,``, fields at the first two
      ``:`` (FLAGS joined by ``+``); DST defaults to SRC.
    * SRC starting with ``.`` or ``/`` is a host path, bound (``rbind``
      whatever FLAGS add); a relative one is relative to the cwd enroot runs
      in, the job's (``mount(2)`` resolves it there).
    * SRC ``tmpfs``: an empty directory at DST; ``umount``: DST unmounted
      (``x-detach``), which takes away the latest earlier mount there.
    * DST must start with ``.`` or ``/``; it is a path in the container
      (enroot-mount resolves it under the rootfs), so ``./opt`` is ``/opt``.

    An item pyxis refuses (empty, another source word, a bad target) fails
    the step in pyxis before it runs: nothing to model. A tmpfs hides the
    image's files below DST, which the view cannot show empty: mounts
    below it are dropped and the image's files stay visible, so a program
    there is judged (refused if foreign) rather than reported missing."""
    out = list(before)
    for item in value.split(","):
        src, sep, rest = item.partition(":")
        dst = rest.partition(":")[0] if sep else src
        if not src or not dst or dst[0] not in "./":
            continue  # pyxis: "invalid format" / "mount target must be ...": no step
        inner = os.path.normpath("/" + dst.lstrip("/"))
        inner = "/" + inner.lstrip("/")  # normpath keeps a leading "//"
        if src == "umount":  # the latest mount at DST goes (umount2 MNT_DETACH)
            last = max((n for n, (i, _h) in enumerate(out) if i == inner), default=-1)
            if last >= 0:
                del out[last]
            continue
        if src == "tmpfs":
            under = inner.rstrip("/") + "/"
            out = [(i, h) for i, h in out if i != inner and not i.startswith(under)]
            continue
        if src[0] not in "./":
            continue  # pyxis: "mount source must be a relative path, ...": no step
        if src[0] != "/":
            if not cwd or not cwd.startswith("/"):
                continue  # no cwd to resolve it against: left to the image
            src = os.path.join(cwd, src)
        out.append((inner, os.path.normpath(src)))
    return out


def _bool(value: str | None) -> bool | None:
    """pyxis' boolean environment values (config.c parse_bool: exact words)."""
    word = value or ""
    if word in ("1", "true", "yes", "y"):
        return True
    if word in ("0", "false", "no", "n"):
        return False
    return None


def plan_pyxis(step: ContainerStep, args: Mapping[str, str] | None = None,
               budget: Budget | None = None, files: Files = HOST) -> Plan:
    """A pyxis step's plan; ``args``: pyxis' options as C read them;
    ``files``: this host's and the check's record."""
    image, local, reason = step.image, step.local, step.reason
    argv, env, cwd, max_inodes, batch = step.argv, step.env, step.cwd, step.max_inodes, step.batch
    opened: Image | None = None
    if args and args.get("after_pull"):  # asked from task_init: the root pyxis just made
        from .named import plan_after_pull

        made = plan_after_pull(step, args, files)
        if isinstance(made, Plan):
            return made
        image, local, opened = made.path, True, made
        args = {k: v for k, v in args.items() if k != "name"}  # judged: no second lookup
    if args and args.get("name"):  # --container-name: the container as it is now
        from .named import plan_named

        named = plan_named(step, args, files)
        if isinstance(named, Plan):
            return named  # pyxis will refuse the name: a skip
        if isinstance(named, bool):
            local = named  # no container yet: pyxis makes it from the image, judged below
        else:
            image, local, opened = named.path, True, named  # its root, judged below
    if not local and image:  # pulled by pyxis from a registry: its manifest (issue 25)
        from .registry import plan_registry

        return plan_registry(step, files=files)
    if not local or not image:
        return Plan(None, tuple(argv), dict(env), cwd,
                    skipped=f"{reason}: not judged: not a local image (pyxis imports or "
                            "reuses it in its task_init, after the check)")
    if not image.startswith("/"):
        # C joins a relative image to the step's cwd; with no cwd known
        # (getcwd failed) it stays relative, and the checker's own cwd would
        # be a guess.
        return Plan(None, tuple(argv), dict(env), cwd,
                    skipped=f"{reason}: not judged: a relative image and no known working "
                            "directory")
    from ..image import ImageError
    from ..image.open import open_image

    try:
        img = opened if opened is not None else open_image(image, budget=budget or Budget(),
                                                           max_inodes=max_inodes)
    except ImageError as exc:
        return Plan(None, tuple(argv), dict(env), cwd,
                    skipped=f"{reason}: not judged: {exc.reason}")
    except OSError as exc:  # the squashfs reader's word for a corrupt image
        return Plan(None, tuple(argv), dict(env), cwd,
                    skipped=f"{reason}: not judged: {exc.strerror or exc}")
    job = {k: v for k, v in env.items() if k not in _DENIED}
    inner = img.step_env(job)
    from .enroot import enroot_environ

    # environ.d of the site and the user, after the image's
    inner.update(enroot_environ(env, files=files))
    args = args or {}
    from ..image.view import MAX_ENV_BYTES, read_view_file

    try:  # enroot mounts what the image's own fstab binds from the host
        fstab = read_view_file(img.view, "/etc/fstab", MAX_ENV_BYTES) or b""
    except (ImageError, OSError):
        fstab = b""
    binds = mounts(args, env, fstab.decode("utf-8", "surrogateescape"), cwd, files)
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
