"""A pyxis step that reuses a named enroot container (``--container-name``).

A container a user keeps across steps is changed by hand (``pip install``
inside it, a program copied into its root): what the step runs is the
container's root *as it is now*, not the image it was made from. Read in
pyxis 0.24.0 and enroot 4.1.2:

* pyxis' args.c splits ``--container-name=NAME[:FLAG]`` at the first ``:``
  (``FLAG`` one of ``auto`` (the default), ``create``, ``exec``,
  ``no_exec``; anything else, or an empty name, is pyxis' own error). Its
  user_init names the container ``pyxis_NAME``, or ``pyxis_JOBID_NAME``
  with ``container_scope=job`` on pyxis' plugstack.conf line, and looks it
  up with ``enroot list -f``: a directory ``$ENROOT_DATA_PATH/<name>``.
* Found (stopped, or running and ``:no_exec``): its root directory is reused
  as it stands, with its ``/etc/environment``, enroot's environ.d and
  mounts; running (``auto``/``exec``): its namespaces are joined and
  ``--container-mounts`` is ignored. ``:create`` with the container there,
  ``:exec`` with none running, or no container and no ``--container-image``:
  pyxis fails the step on its own. No container but an image: pyxis makes
  the container from the image, which is then judged as any image.
* enroot's data path: ``ENROOT_DATA_PATH`` from enroot.conf (pyxis keeps the
  job's value from enroot), else ``$XDG_DATA_HOME/enroot``, else
  ``$HOME/.local/share/enroot`` (enroot.in ``config::export``), with the
  job's environment, as the user: the check runs with the user's rights.

The root is judged exactly as a local image (plan_pyxis, which calls this
first, goes on with an unpacked-root
:class:`~grace_policy.image.view.DirView`: links resolve inside the root, the
final open never follows one, nothing blocks). A running container is judged
on its root with the mounts a new start would get: what it mounted when it
started is not known here.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping

from ..fsprobe import HOST, Files
from . import ContainerStep, Plan

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ..image import Image

#: pyxis args.c: the flags --container-name accepts after the name.
FLAGS = ("auto", "create", "exec", "no_exec")
#: What ``enroot list -f`` (one name per line, split at spaces) and
#: ``enroot start NAME`` (no ``/``) can never match or accept.
_NOT_IN_A_NAME = frozenset("/ \t\n\r\0")


def split(value: str) -> tuple[str, str] | None:
    """(name, flag) of a ``--container-name`` value as pyxis parses it, or
    None for one pyxis refuses."""
    name, _, flag = value.partition(":")
    flag = flag or "auto"
    if not name or flag not in FLAGS:
        return None
    return name, flag


def scope(slurm_conf: str = "") -> str:
    """pyxis' ``container_scope`` (``job`` or ``global``, its default),
    from the plugstack.conf of this slurmstepd's slurm.conf (``slurm_conf``:
    SLURM_CONF of slurmstepd's own environment, as C read it; else Slurm's
    default path), never from the job's environment."""
    from .. import plugstack

    try:
        stack = plugstack.read(plugstack.locate(slurm_conf or plugstack.slurm_conf_path({})))
    except Exception:  # an unreadable config: pyxis' default
        return "global"
    for plugin in stack.plugins:
        if not plugstack.is_pyxis(plugin.path):
            continue
        words = _line(plugin.file, plugin.line)
        for word in words[2:]:
            if word.startswith("container_scope="):
                return "job" if word == "container_scope=job" else "global"
        return "global"
    return "global"


def _line(path: str, number: int) -> list[str]:
    try:
        with open(path, encoding="utf-8", errors="surrogateescape") as fh:
            for index, raw in enumerate(fh, 1):
                if index == number:
                    return raw.split("#", 1)[0].split()
    except OSError:
        pass
    return []


def data_path(job_env: Mapping[str, str], files: Files = HOST) -> str | None:
    """enroot's ENROOT_DATA_PATH for this step, or None (no ``enroot`` on
    slurmstepd's PATH, or a relative path). An enroot.conf value enroot.py
    cannot expand (a command substitution) is left out there, so the
    default is looked at instead: a directory pyxis does not use, which
    at worst makes the step a skip or judges its image. ``files``: the
    check's, whose host side enroot's configuration is read in."""
    from .enroot import _settings

    found = _settings(job_env, None, None, None, files.host())
    if found is None:
        return None
    settings, full = found
    where = settings.get("ENROOT_DATA_PATH")
    if where is None:
        xdg = full.get("XDG_DATA_HOME")
        if not xdg:
            home = full.get("HOME") or _home()
            xdg = f"{home}/.local/share" if home else ""
        where = f"{xdg}/enroot"
    return where if where.startswith("/") else None


def _home() -> str:
    """bash's ``~`` when HOME is unset: the password file's entry."""
    try:
        import pwd

        return pwd.getpwuid(os.geteuid()).pw_dir
    except (KeyError, ImportError):
        return ""


def plan_named(step: ContainerStep, args: Mapping[str, str], files: Files = HOST
               ) -> Plan | bool | Image:
    """The container's root as an :class:`~grace_policy.image.Image` (which
    plan_pyxis judges as it judges a local image: environment, mounts,
    workdir), a skip, or - when pyxis will make the container from
    ``--container-image`` - whether that image is a local file (judged then
    as any image). ``files``: this host's and the check's record. Never
    raises."""
    image, reason, argv, env, cwd = step.image, step.reason, step.argv, step.env, step.cwd

    def skip(why: str) -> Plan:
        return Plan(None, tuple(argv), dict(env), cwd, skipped=f"{reason}: not judged: {why}")

    full_name, why = _full_name(args)
    if full_name is None:
        return skip(why)
    flag = (split(args["name"]) or ("", None))[1]
    root = _root(env, full_name, files)
    if root is None:
        return skip(NO_DATA_PATH)
    exists = _exists(root, files)
    if exists is None:
        return skip(f"cannot examine the container's root {root}")
    if exists and flag == "create":
        return skip(f"container {full_name} exists and the name says :create (pyxis' error)")
    if not exists and flag == "exec":
        return skip(f"container {full_name} does not exist and the name says :exec "
                    "(pyxis' error)")
    if not exists:
        if not image:
            return skip(f"container {full_name} does not exist and no image is given "
                        "(pyxis' error)")
        # pyxis creates it from the image: judged as that image.
        return image.startswith(("/", "."))
    return _dir_image(root)


def container_name(args: Mapping[str, str]) -> str | None:
    """The name pyxis 0.24.0 gave the container of this step
    (pyxis_slurmstepd.c user_init): ``pyxis_NAME`` / ``pyxis_JOB_NAME`` for
    ``--container-name``, else ``pyxis_JOB.STEP`` / ``pyxis_JOB_JOB.STEP``
    with ``container_scope=job``; None when C's facts do not make one."""
    if args.get("name"):
        return _full_name(args)[0]
    job, step = args.get("job", ""), args.get("step", "")
    if not (job.isdigit() and step.isdigit()):
        return None
    per_job = scope(args.get("slurm_conf", "")) == "job"
    return f"pyxis_{job}_{job}.{step}" if per_job else f"pyxis_{job}.{step}"


def _full_name(args: Mapping[str, str]) -> tuple[str | None, str]:
    """(enroot's name for ``--container-name``'s container, "") or (None,
    why there is none)."""
    parsed = split(args.get("name", ""))
    if parsed is None:
        return None, "pyxis refuses this --container-name (an empty name or an unknown flag)"
    name = parsed[0]
    if any(c in _NOT_IN_A_NAME for c in name):
        return None, "enroot cannot use this container name"
    if scope(args.get("slurm_conf", "")) != "job":
        return f"pyxis_{name}", ""
    job = args.get("job", "")
    if not job.isdigit():
        return None, "pyxis names containers per job here, and the job id is not known"
    return f"pyxis_{job}_{name}", ""


def plan_after_pull(step: ContainerStep, args: Mapping[str, str], files: Files = HOST
                    ) -> Plan | Image:
    """The root pyxis has just created from a registry image (its task_init,
    first task of the node; asked from ours, listed after pyxis), as an
    :class:`~grace_policy.image.Image` judged as any local image: before the
    pull only the manifest's architecture was read, and an index can say one
    architecture while the programs are another's. A root that is not where
    enroot puts it is a skip (C follows the verdict; nothing runs unjudged
    on our word alone). ``files``: this host's and the check's record.
    Never raises."""
    reason, argv, env, cwd = step.reason, step.argv, step.env, step.cwd

    def skip(why: str) -> Plan:
        return Plan(None, tuple(argv), dict(env), cwd, skipped=f"{reason}: not judged: {why}")

    full_name = container_name(args)
    if full_name is None:
        return skip("the name pyxis gave the container is not known here")
    root = _root(env, full_name, files)
    if root is None:
        return skip(NO_DATA_PATH)
    exists = _exists(root, files)
    if not exists:
        return skip(f"the container's root {root} is not there (pyxis did not create it "
                    "where enroot keeps containers)")
    return _dir_image(root)


NO_DATA_PATH = ("enroot's data path is not known here (no enroot on slurmstepd's PATH, "
                "or a relative path)")


def _root(env: Mapping[str, str], full_name: str, files: Files) -> str | None:
    """Where enroot keeps the container ``full_name`` (its data path, as
    the enroot pyxis runs resolves it), or None when that is not known."""
    where = data_path(env, files)
    return None if where is None else f"{where.rstrip('/')}/{full_name}"


def _dir_image(root: str) -> Image:
    from ..image import Image, ImageError
    from ..image.view import DirView, environment_file

    # Not open_image: a config.json the user put at the container's root
    # would make it an OCI bundle whose root.path the user chose.
    view = DirView(root, name=root)
    try:
        inner_env = environment_file(view)
    except (ImageError, OSError):
        inner_env = ()
    return Image(path=view.root, kind="dir", view=view, env=inner_env)


def _exists(root: str, files: Files) -> bool | None:
    """Whether enroot finds a container there (a directory, through links:
    enroot takes its realpath), None when that cannot be told."""
    try:
        return stat.S_ISDIR(files.host().stat(root).st_mode)
    except FileNotFoundError:
        return False
    except NotADirectoryError:
        return False
    except (OSError, ValueError):
        return None
