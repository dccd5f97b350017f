"""``apptainer exec IMAGE CMD...`` (and ``singularity exec``): the step's
program is the host's native ``apptainer``, the command runs in the image.

The host program is judged first, as any host step; when it is clean and
argv is an ``exec`` of a local SIF (or sandbox directory) with options this
parser knows, the command is judged inside the image (its SIF header's
architecture, then the command in its squashfs, read without mounting), with
the job's environment and the image's ``/.singularity.d/env`` over it
(``--cleanenv``/``--containall``: the image's alone), ``--env`` on top, and
``--pwd`` or the job's cwd. An option this parser does not know, a remote
image (``docker://``, ``library://``, ``oras://``) or another subcommand
leaves the step judged on the host only: guessing which word is the image
could judge the wrong file.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from ..budget import Budget
from ..contract import IMAGE_WRAPPERS, wraps_an_image
from . import Plan

#: argv[0] names that are Apptainer (a cheap test every host step pays):
#: the contract's, which the verdict cache's C side refuses to replay.
NAMES = frozenset(IMAGE_WRAPPERS)

#: Global options (before the subcommand): those that take a value.
_GLOBAL_VALUE = frozenset({"-c", "--config"})
_GLOBAL_FLAGS = frozenset({"-d", "--debug", "-q", "--quiet", "-s", "--silent", "-v",
                           "--verbose", "--nocolor"})

#: ``exec`` options of Apptainer 1.4 that take a value ...
_EXEC_VALUE = frozenset({
    "-B", "--bind", "--mount", "-H", "--home", "-W", "--workdir", "--pwd", "--cwd", "-S",
    "--scratch", "-o", "--overlay", "--env", "--env-file", "--security", "--network",
    "--network-args", "--hostname", "--apply-cgroups", "--dns", "--fusemount", "--app",
    "--no-mount", "--add-caps", "--drop-caps", "--cpus", "--memory", "--pem-path", "--uid",
    "--gid", "--cpu-shares", "--cpuset-cpus", "--cpuset-mems", "--blkio-weight",
    "--blkio-weight-device", "--memory-reservation", "--memory-swap", "--pids-limit",
    "--device", "--authfile", "--docker-host", "--passphrase-file",
})
#: ... and those that do not.
_EXEC_FLAGS = frozenset({
    "-c", "--contain", "-C", "--containall", "-e", "--cleanenv", "--nv", "--nvccli",
    "--rocm", "-u", "--userns", "-f", "--fakeroot", "-w", "--writable", "--writable-tmpfs",
    "--no-home", "--no-privs", "--keep-privs", "--oci", "--no-oci", "--no-https",
    "--passphrase", "--sif-fuse", "--unsquash", "--no-eval", "--no-init", "--disable-cache",
    "--oom-kill-disable", "--ipc", "-i", "-p", "--pid", "--uts", "-n", "--net", "--compat",
    "--no-umask", "--allow-setuid", "--boot", "--no-pid", "--no-setgroups",
})

_REMOTE = ("docker://", "docker-archive:", "docker-daemon:", "library://", "oras://",
           "shub://", "oci://", "oci-archive:", "http://", "https://", "instance://")


def is_apptainer(argv0: str) -> bool:
    return wraps_an_image(argv0)


def parse(argv: Sequence[str]) -> tuple[str, tuple[str, ...], dict[str, str | None]] | None:
    """(image, command, options) of ``apptainer [global] exec [opts] IMAGE
    CMD...``, or None when argv is anything else or not certain."""
    i = 1
    while i < len(argv):
        word = argv[i]
        name = word.split("=", 1)[0]
        if word in _GLOBAL_FLAGS:
            i += 1
        elif name in _GLOBAL_VALUE:
            i += 1 if "=" in word else 2
        elif word.startswith("-"):
            return None
        else:
            break
    if i >= len(argv) or argv[i] != "exec":
        return None
    i += 1
    opts: dict[str, str | None] = {}
    while i < len(argv):
        word = argv[i]
        if word == "--":
            i += 1
            break
        if not word.startswith("-") or word == "-":
            break
        name, eq, value = word.partition("=")
        if name in _EXEC_FLAGS and not eq:
            opts[name] = None
            i += 1
        elif name in _EXEC_VALUE:
            if eq:
                i += 1
            elif i + 1 < len(argv):
                value = argv[i + 1]
                i += 2
            else:
                return None
            if name == "--env":
                opts["--env"] = (opts.get("--env") or "") + "\0" + value
            else:
                opts[name] = value
        else:
            return None  # an option we do not know: which word is the image?
    if i + 1 >= len(argv):
        return None  # no image, or no command
    image, command = argv[i], tuple(argv[i + 1:])
    if not image or image.startswith(_REMOTE) or "://" in image:
        return None
    return image, command, opts


def plan_apptainer(argv: Sequence[str], env: Mapping[str, str], cwd: str, *,
                   budget: Budget | None = None) -> Plan | None:
    """The command as it will run in the image, or None (judged on the host
    only). An image that cannot be read is a Plan with ``skipped`` set; the
    image is read under ``budget`` (the inner step's), which may raise
    ``BudgetExceeded``."""
    parsed = parse(argv)
    if parsed is None:
        return None
    image, command, opts = parsed
    rel = image
    while rel.startswith("./"):
        rel = rel[2:].lstrip("/")
    path = image if image.startswith("/") else os.path.join(cwd or "/", rel)
    reason = f"apptainer exec {image}"
    from ..image import ImageError
    from ..image.open import open_image

    try:
        img = open_image(path, budget=budget or Budget())
    except ImageError as exc:
        return Plan(None, command, dict(env), cwd, skipped=f"{reason}: not judged: {exc.reason}")
    except OSError as exc:
        return Plan(None, command, dict(env), cwd,
                    skipped=f"{reason}: not judged: {exc.strerror or exc}")
    clean = any(o in opts for o in ("-e", "--cleanenv", "-C", "--containall"))
    inner = img.step_env({} if clean else env)
    for item in (opts.get("--env") or "").split("\0"):
        for pair in item.split(","):
            key, eq, value = pair.partition("=")
            if eq and key:
                inner[key] = value
    workdir = opts.get("--pwd") or opts.get("--cwd")
    inner_cwd = workdir if workdir and workdir.startswith("/") else (cwd or "/")
    binds = _binds(opts, env, cwd)
    if binds:
        img = img.with_mounts(binds)
    return Plan(img, command, inner, inner_cwd)


def _binds(opts: Mapping[str, str | None], env: Mapping[str, str], cwd: str
           ) -> list[tuple[str, str]]:
    """(inner, host) of what Apptainer mounts by default (the user's HOME,
    the cwd, /tmp; none of them with --contain/--containall, no HOME with
    --no-home) and of ``-B/--bind SRC[:DST[:OPTS]],...``."""
    contained = any(o in opts for o in ("-c", "--contain", "-C", "--containall"))
    out: list[tuple[str, str]] = []
    if not contained:
        home = opts.get("-H") or opts.get("--home") or env.get("HOME")
        if home and "--no-home" not in opts:
            src, _, dst = home.partition(":")
            if src.startswith("/"):
                out.append((dst if dst.startswith("/") else src, src))
        for path in ("/tmp", cwd):
            if path and path.startswith("/") and path != "/":
                out.append((path, path))
    for item in ((opts.get("-B") or "") + "," + (opts.get("--bind") or "")).split(","):
        parts = item.split(":")
        src = parts[0]
        dst = parts[1] if len(parts) > 1 and parts[1] else src
        if src.startswith("/") and dst.startswith("/"):
            out.append((dst, src))
    return out
