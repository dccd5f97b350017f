"""What plugstack.conf tells the plugin, read the way Slurm and the plugin
read it, so ``grace-policy config check`` can say what the plugin will do.

Some settings exist only there, because the plugin needs them before any
Python runs or while it still is root: ``audit=`` (opened as root in
``slurm_spank_init``, before privileges drop: the one place the audit log
is configured), ``on_error=`` for a check that cannot run at all,
``timeout_ms=``, ``max_memory=`` (set before the policy is read),
``cache_dir=``, ``container_env=``, ``python_path=``.
The key parsing mirrors ``grace_parse_args`` in spank/grace_spank.c.

Slurm's format (src/common/spank.c): ``required|optional PATH ARGS...`` or
``include GLOB``, whitespace-split, ``#`` to the end of a line is a comment,
a relative include is taken relative to the including file's directory.
Where plugstack.conf is: ``PlugStackConfig=`` of slurm.conf, else
``plugstack.conf`` next to it.
"""

from __future__ import annotations

import glob
import os
import stat
from dataclasses import dataclass, field

PLUGIN_NAME = "spank_grace_policy.so"
DEFAULT_CACHE_DIR = "/run/grace-policy"
DEFAULT_TIMEOUT_MS = 10000
#: MiB a check may allocate beyond what its process had (grace.h
#: GRACE_DEFAULT_MAX_MEMORY; checker/confine.py). 0: no limit.
DEFAULT_MAX_MEMORY = 512
MAX_MEMORY_RANGE = (16, 1 << 20)
DEFAULT_CHECKER_SOCKET = "/run/grace-policy/checker/socket"
KNOWN = ("config", "on_error", "python_path", "timeout_ms", "audit", "container_env",
         "cache_dir", "prestart", "checker", "checker_socket", "max_memory")


@dataclass
class PluginLine:
    """One ``required|optional .../spank_grace_policy.so ...`` line, as the
    plugin will understand it."""

    file: str
    line: int
    kind: str
    path: str
    args: list[str]
    config: str | None = None
    audit: str | None = None
    on_error: str = "allow"
    timeout_ms: int = DEFAULT_TIMEOUT_MS
    max_memory: int = DEFAULT_MAX_MEMORY
    cache_dir: str | None = DEFAULT_CACHE_DIR
    container_env: str | None = None
    python_path: str | None = None
    prestart: bool = False
    #: "node" (the default: the node checker slurmd starts;
    #: spank/grace_node.c) or "step" (a helper of slurmstepd runs a miss),
    #: and the node checker's socket.
    checker: str = "node"
    checker_socket: str = DEFAULT_CHECKER_SOCKET
    #: The first argument problem: the plugin then follows on_error for every step.
    error: str | None = None


@dataclass(frozen=True)
class AnyPlugin:
    """Any ``required|optional`` line, in the order Slurm loads and calls them."""

    file: str
    line: int
    kind: str
    path: str


@dataclass
class Plugstack:
    main: str
    lines: list[PluginLine] = field(default_factory=list)
    #: Every plugin line, ours included, in Slurm's order.
    plugins: list[AnyPlugin] = field(default_factory=list)
    #: Files that could not be read (name, reason).
    unreadable: list[tuple[str, str]] = field(default_factory=list)


def slurm_conf_path(env: dict[str, str] | None = None) -> str:
    env = os.environ if env is None else env
    return env.get("SLURM_CONF") or "/etc/slurm/slurm.conf"


def locate(slurm_conf: str) -> str:
    """plugstack.conf for ``slurm_conf``: its ``PlugStackConfig=``, else the
    file next to it (Slurm's default)."""
    try:
        with open(slurm_conf, encoding="utf-8", errors="replace") as f:
            for raw in f:
                text = raw.split("#", 1)[0].strip()
                key, sep, value = text.partition("=")
                if sep and key.strip().lower() == "plugstackconfig" and value.strip():
                    return value.strip()
    except OSError:
        pass
    return os.path.join(os.path.dirname(slurm_conf) or ".", "plugstack.conf")


def parse_args(entry: PluginLine) -> None:
    """``grace_parse_args``: the same keys, defaults and first error."""

    def fail(text: str) -> None:
        if entry.error is None:
            entry.error = text

    for arg in entry.args:
        key, eq, val = arg.partition("=")
        if not eq:
            fail(f"plugstack argument '{arg}' is not key=value")
        elif key == "config":
            entry.config = val
        elif key == "on_error":
            if val in ("allow", "deny"):
                entry.on_error = val
            else:
                fail(f"on_error must be allow or deny, not '{val}' (using allow)")
        elif key == "python_path":
            entry.python_path = val
            parts = val.split(":")
            if val and any(not p.startswith("/") for p in parts):
                fail(f"python_path entries must be absolute, not '{val}'")
        elif key == "timeout_ms":
            if val.isdigit() and 10 <= int(val) <= 600000:
                entry.timeout_ms = int(val)
            else:
                fail(f"timeout_ms must be 10..600000, not '{val}'")
        elif key == "max_memory":
            low, high = MAX_MEMORY_RANGE
            if val.isdigit() and (int(val) == 0 or low <= int(val) <= high):
                entry.max_memory = int(val)
            else:
                fail(f"max_memory must be 0 or {low}..{high} (MiB), not '{val}'")
        elif key == "audit":
            entry.audit = val or None
        elif key == "cache_dir":
            entry.cache_dir = None if (val or "none") == "none" else val
        elif key == "container_env":
            entry.container_env = val or None
        elif key in ("prestart", "checker"):
            options = ("on", "off") if key == "prestart" else ("node", "step")
            if val not in options:
                fail(f"{key} must be {options[0]} or {options[1]}, not '{val}'")
            elif key == "prestart":
                entry.prestart = val == "on"
            else:
                entry.checker = val
        elif key == "checker_socket":
            entry.checker_socket = val
            if not val.startswith("/"):
                fail(f"checker_socket must be an absolute path, not '{val}'")
        else:
            fail(f"unknown plugstack argument '{arg}' (known: {', '.join(KNOWN)})")
    if not entry.config:
        fail("no config=FILE in plugstack.conf")


def read(main: str) -> Plugstack:
    stack = Plugstack(main=main)
    _read_file(stack, main, depth=0)
    return stack


def _read_file(stack: Plugstack, path: str, depth: int) -> None:
    if depth > 10:
        stack.unreadable.append((path, "includes nested too deep"))
        return
    try:
        with open(path, encoding="utf-8", errors="surrogateescape") as f:
            text = f.read()
    except OSError as exc:
        stack.unreadable.append((path, exc.strerror or str(exc)))
        return
    for number, raw in enumerate(text.splitlines(), 1):
        words = raw.split("#", 1)[0].split()
        if not words:
            continue
        if words[0] == "include" and len(words) > 1:
            pattern = words[1]
            if not pattern.startswith("/"):
                pattern = os.path.join(os.path.dirname(path), pattern)
            for name in sorted(glob.glob(pattern)):
                _read_file(stack, name, depth + 1)
            continue
        if words[0] in ("required", "optional") and len(words) > 1:
            stack.plugins.append(AnyPlugin(path, number, words[0], words[1]))
        if words[0] in ("required", "optional") and len(words) > 1 \
                and os.path.basename(words[1]) == PLUGIN_NAME:
            entry = PluginLine(file=path, line=number, kind=words[0], path=words[1],
                               args=words[2:])
            parse_args(entry)
            stack.lines.append(entry)


def audit_file_state(path: str) -> tuple[bool, str]:
    """(usable, what the plugin will find) for ``audit=PATH``, as
    grace_open_audit checks it: created root 0640 if missing (its directory
    must exist), refused if not a regular file with one link or a symlink,
    used but flagged if users may write it."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        parent = os.path.dirname(path) or "."
        if os.path.isdir(parent):
            return True, "does not exist yet: the first step creates it (root, 0640)"
        return False, f"cannot be created: directory {parent} does not exist; nothing is written"
    except OSError as exc:
        return False, f"cannot be examined: {exc.strerror or exc}"
    if stat.S_ISLNK(st.st_mode):
        return False, "is a symlink: the plugin refuses it (O_NOFOLLOW); nothing is written"
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
        return False, "is not a regular file with one link: the plugin refuses it"
    mode = st.st_mode & 0o7777
    if st.st_uid != 0 or mode & 0o022:
        return True, (f"owned by uid {st.st_uid}, mode {mode:04o}: written, but users may be "
                      "able to forge lines (make it root-owned 0640)")
    return True, f"root-owned, mode {mode:04o}"


def is_pyxis(path: str) -> bool:
    """pyxis' plugin by its usual file name (``spank_pyxis.so``); the plugin
    itself asks the loaded object's ``plugin_name`` (spank/grace_container.c)."""
    return os.path.basename(path) == "spank_pyxis.so"


def pyxis_order(stack: Plugstack, entry: PluginLine) -> list[str]:
    """What the order of pyxis and this line means for container steps.

    pyxis starts the container in its task_init; Slurm calls plugins in
    file order (``plugstack.conf.d/*.conf`` in collation order), so only a
    grace-policy listed after pyxis can tell, in its own task_init, that an
    ``optional`` pyxis failed and the step would exec on the host."""
    order = [(p.file, p.line) for p in stack.plugins]
    ours = order.index((entry.file, entry.line)) if (entry.file, entry.line) in order else -1
    out = []
    for index, plugin in enumerate(stack.plugins):
        if not is_pyxis(plugin.path):
            continue
        where = f"{plugin.file}:{plugin.line}"
        if index > ours:
            out.append(f"pyxis ({where}) comes after grace-policy: a container step whose "
                       "container fails to start is not caught; list pyxis first (its "
                       "plugstack.conf.d file must sort before this one)")
        else:
            out.append(f"pyxis ({where}) comes first: container steps are judged in their "
                       "image")
        if plugin.kind == "optional":
            out.append("pyxis is optional: when its container does not start Slurm runs the "
                       "step on the host; grace-policy refuses such a step"
                       + (" (it comes after pyxis)" if index < ours else
                          " only when listed after pyxis"))
    return out
