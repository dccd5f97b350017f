"""What enroot itself mounts into a pyxis container (enroot 4.1.2).

A program or library under a host directory that enroot mounts is the
host's file at that path in the container, not the image's, so the check
reads it there (:class:`~grace_policy.image.view.MountedView`). Read in
enroot 4.1.2's source:

* ``enroot`` is a bash script with its configuration baked in at install:
  ``config::init "SYSCONF/enroot.conf"`` and the default
  ``ENROOT_SYSCONF_PATH``. pyxis runs the first ``enroot`` on slurmstepd's
  own PATH (pyxis' enroot.c, ``execvpe``), so this module looks there.
* Settings (``config::export``): the first value wins, in this order: the
  environment enroot gets (the job's, without what pyxis withholds:
  ``ENROOT_SYSCONF_PATH`` among others, pyxis_slurmstepd.c
  ``enroot_deny_env``; with pyxis' own ``ENROOT_MOUNT_HOME``/
  ``ENROOT_REMAP_ROOT`` set over it), then ``enroot.conf``, then
  ``enroot.conf.d/*.conf``, then the defaults. A value spelled ``n``, ``no``,
  ``f``, ``false`` (any case enroot accepts) unsets it (``config::fini``).
* Mounts (runtime.sh ``_do_mounts_init``): the image's ``/etc/fstab``
  (:func:`fstab_binds`, read in the image by the caller), then
  ``$ENROOT_SYSCONF_PATH/mounts.d/*.fstab`` and
  ``$ENROOT_CONFIG_PATH/mounts.d/*.fstab`` (default
  ``$XDG_CONFIG_HOME/enroot``, that ``$HOME/.config``), each file in name
  order, ``${VAR}`` replaced from that environment; fstab lines ``SRC DST
  TYPE OPTS``, DST inside the container. Bind mounts of a host path are what
  changes a program's file; pseudo file systems (/proc, /sys, /dev) and
  tmpfs are not read for programs and are left out.
* Environment (runtime.sh ``_do_environ``): the image's
  ``/etc/environment``, then ``environ.d/*.env`` of both directories
  (:func:`enroot_environ`): a site that puts its tools on the container's
  PATH there changes what argv[0] finds.
* Home (hooks.d/10-home.sh, run when ``ENROOT_MOUNT_HOME`` is set and the
  hook is installed): ``$HOME`` at ``$HOME``, or at ``/root`` with
  ``ENROOT_REMAP_ROOT``.

A value this reader cannot be sure of (a setting with a command
substitution, an fstab line it cannot split) is left out: the file at that
path is then judged in the image, as before this module.

Every file and directory here is the user's or the site's, read on the
host through the check's :class:`~grace_policy.fsprobe.Files` (``files.host()``,
never the image's view): regular
files only, opened without blocking (a FIFO in ``mounts.d`` is left out
instead of holding the check to its deadline), and each answer written
into the check's record, so a cached verdict is replayed only while
``enroot``, its configuration and every ``mounts.d``/``environ.d`` file
and directory are what they were (a new ``.fstab`` is a miss).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from .. import fsprobe

#: What pyxis keeps from enroot's environment (pyxis_slurmstepd.c): these
#: come from enroot's own configuration only.
PYXIS_DENIED = frozenset({
    "PATH", "LD_LIBRARY_PATH", "LD_PRELOAD", "ENROOT_LIBRARY_PATH", "ENROOT_SYSCONF_PATH",
    "ENROOT_RUNTIME_PATH", "ENROOT_CACHE_PATH", "ENROOT_DATA_PATH", "ENROOT_TEMP_PATH",
    "ENROOT_ZSTD_OPTIONS", "ENROOT_TRANSFER_RETRIES", "ENROOT_CONNECT_TIMEOUT",
    "ENROOT_MAX_CONNECTIONS", "ENROOT_ALLOW_HTTP",
})
#: config::fini's ``^(no?|N[oO]?|[fF](alse)?|FALSE)$``, spelled out (no
#: ``re`` on a step's path: it costs tens of milliseconds to import).
_FALSE = frozenset({"n", "no", "N", "No", "NO", "f", "false", "F", "False", "FALSE"})
_UPPER = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZ_")
_NAME = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")
_DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_SKIP_POINTS = ("/proc", "/sys", "/dev")
_MAX_FILE = 256 * 1024
_MAX_FILES = 64


def _read(path: str, files: fsprobe.Files) -> str | None:
    """A whole small regular file, or None (missing, too large, not a
    regular file: a FIFO or a device is never opened for reading)."""
    try:
        fh, st = files.open_regular(path)
    except OSError:
        return None
    try:
        if st.st_size > _MAX_FILE:
            return None
        data = fh.pread(_MAX_FILE + 1, 0)
    except OSError:
        return None
    finally:
        fh.close()
    if len(data) > _MAX_FILE:
        return None
    return data.decode("utf-8", "replace")  # type: ignore[no-any-return]


def _runnable(path: str, files: fsprobe.Files) -> bool:
    """A regular file the job's user may run (recorded by its identity)."""
    return files.isfile(path) and files.executable(path)


def _enroot_script(search: str | None, files: fsprobe.Files) -> str | None:
    for entry in (search or _DEFAULT_PATH).split(":"):
        if not entry.startswith("/"):
            continue
        path = os.path.join(entry, "enroot")
        if _runnable(path, files):
            return path
    return None


def _is_key(word: str) -> bool:
    """enroot's ``^ENROOT_[[:upper:]_]+$``."""
    return word.startswith("ENROOT_") and len(word) > 7 and all(c in _UPPER for c in word)


def _quoted_path(line: str, head: str) -> str | None:
    """``X`` of a line ``HEAD "X"`` with no expansion in X."""
    if not line.startswith(head):
        return None
    rest = line[len(head):].strip()
    if len(rest) < 3 or rest[0] != '"' or rest[-1] != '"' or any(c in rest[1:-1]
                                                               for c in '"$`'):
        return None
    return rest[1:-1]


def _baked(script: str, files: fsprobe.Files) -> tuple[str | None, str | None]:
    """(enroot.conf path, default ENROOT_SYSCONF_PATH) from the script."""
    conf = sysconf = None
    for line in (_read(script, files) or "").splitlines():
        conf = conf or _quoted_path(line, "config::init ")
        if line.startswith("config::export ENROOT_SYSCONF_PATH ") and sysconf is None:
            sysconf = _quoted_path(line, "config::export ENROOT_SYSCONF_PATH ")
    return conf, sysconf


def _subst(text: str, env: Mapping[str, str], bare: bool) -> str:
    """``${VAR}`` (and, with ``bare``, ``$VAR``) replaced from ``env``."""
    out: list[str] = []
    i = 0
    while i < len(text):
        c = text[i]
        if c == "$" and text.startswith("{", i + 1):
            end = text.find("}", i + 2)
            name = text[i + 2:end] if end > 0 else ""
            if name and not name[0].isdigit() and all(ch in _NAME for ch in name):
                out.append(env.get(name, ""))
                i = end + 1
                continue
        elif c == "$" and bare:
            j = i + 1
            while j < len(text) and text[j] in _NAME:
                j += 1
            name = text[i + 1:j]
            if name and not name[0].isdigit():
                out.append(env.get(name, ""))
                i = j
                continue
        out.append(c)
        i += 1
    return "".join(out)


def _expand(value: str, env: Mapping[str, str]) -> str | None:
    """``eval echo VALUE`` for the values an admin writes: quotes and
    ``$VAR``/``${VAR}``; None for anything else (a command, a glob)."""
    if any(c in value for c in "`*?[;|&<>()"):
        return None
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        value = value[1:-1]
    return _subst(value, env, bare=True)


def _load(path: str, settings: dict[str, str], env: Mapping[str, str],
          job: Mapping[str, str], files: fsprobe.Files) -> None:
    """One config file, read as ``IFS=$' \\t=' read -r key value`` does."""
    for line in (_read(path, files) or "").splitlines():
        line = line.strip(" \t")
        cut = next((i for i, c in enumerate(line) if c in " \t="), -1)
        if cut <= 0:
            continue
        key, value = line[:cut], line[cut:].lstrip(" \t=")
        if not _is_key(key) or key in settings or not value:
            continue
        expanded = _expand(value, NotedEnv({**env, **settings}, job, files))
        if expanded is not None:
            settings[key] = expanded


def _fstab(path: str, env: Mapping[str, str], files: fsprobe.Files) -> list[tuple[str, str]]:
    return fstab_binds(_read(path, files) or "", env)


def fstab_binds(text: str, env: Mapping[str, str]) -> list[tuple[str, str]]:
    """(inner, host) of the host-path bind mounts in one fstab text (a
    mounts.d file, or the image's own ``/etc/fstab``, which enroot reads
    first), ``${VAR}`` replaced from ``env`` as enroot's envsubst does."""
    out: list[tuple[str, str]] = []
    for line in text.splitlines():
        line = _subst(line, env, bare=False).strip()
        if not line or line.startswith("#"):
            continue
        fields = line.split()
        if len(fields) < 4:
            continue
        src, dst, kind, opts = fields[:4]
        binds = {"bind", "rbind"} & set(opts.split(","))
        if kind != "none" or not binds or not src.startswith("/"):
            continue
        point = os.path.normpath("/" + dst.lstrip("/"))
        if any(point == p or point.startswith(p + "/") for p in _SKIP_POINTS):
            continue
        out.append((point, src))
    return out


def _files(directory: str, suffix: str, files: fsprobe.Files) -> list[str]:
    """``DIR/*SUFFIX`` in name order, as bash's glob lists them."""
    try:
        names = sorted(n for n in files.listdir(directory) if n.endswith(suffix))
    except OSError:
        return []
    return [os.path.join(directory, n) for n in names[:_MAX_FILES]]


class NotedEnv(Mapping[str, str]):
    """A mapping enroot's model reads by name that records, for the verdict
    cache, the *job's* value of each name it is asked about (absent ones
    too). What enroot mounts and sets follows the job's variables (its own
    ``ENROOT_CONFIG_PATH``, ``HOME``, ``XDG_CONFIG_HOME``, a ``${VAR}`` in
    enroot.conf or an fstab, pyxis' ``PYXIS_CONTAINER_MOUNT_HOME``), so a
    cached verdict is replayed only while each of them holds. Only names
    looked up are recorded, never the whole environment: the SLURM_*
    variables of every step differ and would end every hit. ``files``:
    whose record they go to (the check's)."""

    def __init__(self, data: Mapping[str, str], job: Mapping[str, str],
                 files: fsprobe.Files) -> None:
        self._data, self._job, self._files = data, job, files

    def __getitem__(self, name: str) -> str:
        self._files.note_env(name, self._job.get(name))
        return self._data[name]

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)


def _settings(job_env: Mapping[str, str], mount_home: bool | None,
              remap_root: bool | None, search: str | None, files: fsprobe.Files
              ) -> tuple[dict[str, str], dict[str, str]] | None:
    """(enroot's ENROOT_* settings, the environment enroot runs with), or
    None when no ``enroot`` is found."""
    script = _enroot_script(search if search is not None else os.environ.get("PATH"), files)
    if script is None:
        return None
    conf, sysconf = _baked(script, files)
    env = {k: v for k, v in job_env.items() if k not in PYXIS_DENIED}
    for name, value in (("ENROOT_MOUNT_HOME", mount_home), ("ENROOT_REMAP_ROOT", remap_root)):
        if value is not None:
            env[name] = "y" if value else "n"
    settings = {k: v for k, v in env.items() if _is_key(k)}
    if conf:
        _load(conf, settings, env, job_env, files)
        for dropin in _files(conf + ".d", ".conf", files):
            _load(dropin, settings, env, job_env, files)
    if sysconf and "ENROOT_SYSCONF_PATH" not in settings:
        settings["ENROOT_SYSCONF_PATH"] = sysconf
    noted = NotedEnv(env, job_env, files)
    home = noted.get("HOME", "")
    xdg = noted.get("XDG_CONFIG_HOME") or (f"{home}/.config" if home else "")
    if "ENROOT_CONFIG_PATH" not in settings and xdg:
        settings["ENROOT_CONFIG_PATH"] = f"{xdg}/enroot"
    settings = {k: v for k, v in settings.items() if v not in _FALSE}
    return NotedEnv(settings, job_env, files), NotedEnv({**env, **settings}, job_env, files)


def _config_files(settings: Mapping[str, str], sub: str, suffix: str,
                  files: fsprobe.Files) -> list[str]:
    """``SUB/*SUFFIX`` of the site's, then the user's enroot configuration."""
    out: list[str] = []
    for key in ("ENROOT_SYSCONF_PATH", "ENROOT_CONFIG_PATH"):
        where = settings.get(key, "")
        if where.startswith("/"):
            out.extend(_files(os.path.join(where, sub), suffix, files))
    return out


def enroot_mounts(job_env: Mapping[str, str], mount_home: bool | None = None,
                  remap_root: bool | None = None, *, search: str | None = None,
                  files: fsprobe.Files = fsprobe.HOST) -> list[tuple[str, str]] | None:
    """(inner, host) of what enroot mounts from the host for a pyxis step,
    in enroot's order (a later mount at the same point wins); None when no
    ``enroot`` is found there.
    ``mount_home``/``remap_root``: pyxis' own choice (None: not given, the
    environment and enroot's configuration decide). ``search``: the PATH
    pyxis finds ``enroot`` on (slurmstepd's). ``files``: the check's (its
    host side is read)."""
    files = files.host()
    found = _settings(job_env, mount_home, remap_root, search, files)
    if found is None:
        return None
    settings, full = found
    out: list[tuple[str, str]] = []
    for path in _config_files(settings, "mounts.d", ".fstab", files):
        out.extend(_fstab(path, full, files))
    home = full.get("HOME", "")
    sysconf = settings.get("ENROOT_SYSCONF_PATH", "")
    hook = os.path.join(sysconf, "hooks.d", "10-home.sh")
    if settings.get("ENROOT_MOUNT_HOME") and home.startswith("/") and sysconf.startswith("/") \
            and _runnable(hook, files):
        out.append(("/root" if settings.get("ENROOT_REMAP_ROOT") else home, home))
    return out


def enroot_environ(job_env: Mapping[str, str], *, search: str | None = None,
                   files: fsprobe.Files = fsprobe.HOST) -> list[tuple[str, str]]:
    """What ``environ.d/*.env`` of the site's and the user's configuration
    set in the container, after the image's ``/etc/environment``
    (runtime.sh ``_do_environ``; ``${VAR}`` from enroot's environment), in
    order: a later value wins. ``files``: the check's (its host side is
    read)."""
    from ..image.view import parse_env_lines

    files = files.host()
    found = _settings(job_env, None, None, search, files)
    if found is None:
        return []
    settings, full = found
    out: list[tuple[str, str]] = []
    for path in _config_files(settings, "environ.d", ".env", files):
        out.extend(parse_env_lines(_subst(_read(path, files) or "", full, bare=False)))
    return out
