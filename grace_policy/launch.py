"""The first executable of a step, found the way slurmstepd and the kernel will.

slurmstepd (``_build_path`` in ``src/slurmd/slurmstepd/task.c``) resolves
argv[0] after ``task_init``: a leading ``/`` is absolute, a leading ``.`` is
relative to the cwd, anything else is searched in the job's PATH with
``stat()`` and "not a directory" (no exec-bit test, empty PATH elements are
skipped by ``strtok``). Every candidate is built in a ``PATH_MAX`` buffer
(``strlcpy``/``snprintf``), so longer names are cut, not refused. A name not
found is passed to execve as it is, and execve resolves any relative path —
with or without a ``/`` — against the cwd.

The kernel then follows ``#!`` lines (``fs/binfmt_script.c``): it reads 256
bytes, splits on spaces and tabs only (a ``\\r`` stays in the name), refuses
an interpreter name cut off by the buffer, and gives up with ELOOP after
:data:`MAX_DEPTH` scripts. ``/usr/bin/env`` is a separate execve that
searches PATH like ``execvp``.

Every loop here runs over user-sized input (PATH, ``#!`` chains), so each
step looks at the check's :class:`~grace_policy.budget.Budget`.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping

from . import fsprobe
from ._record import dataclass
from .elf import ElfError, open_regular

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .budget import Budget

#: ``#!`` scripts the kernel follows in one execve. Measured on Linux 6.x:
#: five nested scripts ending in an ELF run, a sixth fails with ELOOP
#: (``exec_binprm``: ``if (depth > 5) return -ELOOP``).
MAX_DEPTH = 5
#: The kernel reads this much of a script to find its interpreter line
#: (BINPRM_BUF_SIZE).
SHEBANG_BYTES = 256
#: slurmstepd's path buffer; names are cut to PATH_MAX - 1 bytes.
PATH_MAX = 4096
#: glibc's execvp search path when PATH is unset (``_CS_PATH``).
EXECVP_DEFAULT_PATH = "/bin:/usr/bin"
#: More hops than any real chain has: a backstop, the budget stops earlier.
_MAX_HOPS = 64


@dataclass(frozen=True)
class Hop:
    """One file execve would open: the step's command or an interpreter."""

    path: str
    #: "elf", "script", "missing", "unreadable", "format", "not-executable",
    #: "not-regular" (directory, FIFO, device), "loop" (too many #! levels, or
    #: a cycle), "env" (an ``env`` ELF a ``#!`` line runs to start a command)
    kind: str
    #: For scripts: the interpreter path and optional argument from ``#!``.
    interp: str | None = None
    interp_arg: str | None = None
    detail: str = ""


def c_string(text: str) -> str:
    """``text`` as C sees it: cut at the first NUL, and encodable.

    Values reach us from C decoded with surrogateescape, so they never hold
    a NUL or a lone surrogate; other callers (tests, the CLI) might, and
    ``os.stat`` would raise ValueError on them. A lone surrogate becomes the
    escaped form of its bytes, so it still names no real file.
    """
    if "\0" in text:
        text = text.split("\0", 1)[0]
    try:
        os.fsencode(text)
    except UnicodeError:
        text = text.encode("utf-8", "surrogatepass").decode("utf-8", "surrogateescape")
    return text


def _c_cut(text: str, limit: int = PATH_MAX - 1) -> str:
    """What fits in slurmstepd's PATH_MAX buffer (it truncates silently)."""
    raw = os.fsencode(text)
    if len(raw) <= limit:
        return text
    return os.fsdecode(raw[:limit])


def build_path(name: str, env: Mapping[str, str], cwd: str,
               budget: Budget | None = None, files: fsprobe.Files = fsprobe.HOST) -> str | None:
    """The file slurmstepd's ``_build_path`` + execve will run, as a path on
    this host (relative results joined to ``cwd``); None only for an empty
    name. The file need not exist: a name not found in PATH is what execve
    gets, relative to the cwd."""
    if not name:
        return None
    if name.startswith("/"):
        return _c_cut(name)
    if name.startswith("."):
        return _c_cut(os.path.join(cwd, name))
    path_env = env.get("PATH")
    if path_env:
        for directory in path_env.split(":"):
            if budget is not None:
                budget.tick()
            if not directory:
                continue
            candidate = _c_cut(f"{directory}/{name}")
            host = candidate if candidate.startswith("/") else os.path.join(cwd, candidate)
            try:
                st = files.stat(host)
            except (OSError, ValueError):
                continue
            if not stat.S_ISDIR(st.st_mode):
                return host
    # Not found: execve gets the (cut) name and resolves it against the cwd,
    # also when it has no "/" at all.
    return os.path.join(cwd, _c_cut(name))


def which(name: str, path: str | None, cwd: str, budget: Budget | None = None,
          files: fsprobe.Files = fsprobe.HOST) -> str | None:
    """``execvp`` as ``/usr/bin/env`` uses it: a name with ``/`` as is, else
    the first PATH entry holding an executable regular file (entries that
    fail with EACCES are passed over); empty entries mean the cwd."""
    if not name:
        return None
    if "/" in name:
        return name if name.startswith("/") else os.path.join(cwd, name)
    for directory in (EXECVP_DEFAULT_PATH if path is None else path).split(":"):
        if budget is not None:
            budget.tick()
        candidate = os.path.join(directory or cwd, name)
        if not candidate.startswith("/"):
            candidate = os.path.join(cwd, candidate)
        try:
            if files.isfile(candidate) and files.executable(candidate):
                return candidate
        except ValueError:
            continue
    return None


def _spacetab(byte: int) -> bool:
    return byte in (0x20, 0x09)


def _next_non_spacetab(buf: bytes, start: int, end: int) -> int | None:
    for i in range(start, end):
        if not _spacetab(buf[i]):
            return i
    return None


def _next_terminator(buf: bytes, start: int, end: int) -> int | None:
    for i in range(start, end):
        if _spacetab(buf[i]) or buf[i] == 0:
            return i
    return None


def parse_shebang(head: bytes) -> tuple[str, str | None] | None:
    """Interpreter and optional argument, exactly as ``load_script`` splits
    them; None when the kernel would refuse the line (ENOEXEC).

    Only spaces and tabs separate (a CRLF script asks for ``/bin/sh\\r``);
    a NUL ends the name; the argument is the rest of the line, one word;
    with no newline in the first 256 bytes the interpreter name must end
    before the buffer does, else it would be cut and the kernel refuses.
    """
    if not head.startswith(b"#!"):
        return None
    buf = head[:SHEBANG_BYTES].ljust(SHEBANG_BYTES, b"\0")
    buf_end = SHEBANG_BYTES - 1
    i_end = buf.find(b"\n")
    if i_end < 0:
        start = _next_non_spacetab(buf, 2, buf_end)
        if start is None or _next_terminator(buf, start, buf_end) is None:
            return None
        i_end = buf_end
    while i_end > 2 and _spacetab(buf[i_end - 1]):
        i_end -= 1
    i_name = _next_non_spacetab(buf, 2, i_end)
    if i_name is None:
        return None
    i_sep = _next_terminator(buf, i_name, i_end)
    name = buf[i_name:i_sep if i_sep is not None else i_end]
    arg: bytes | None = None
    if i_sep is not None and buf[i_sep] != 0:
        i_arg = _next_non_spacetab(buf, i_sep, i_end)
        if i_arg is not None:
            arg = buf[i_arg:i_end].split(b"\0", 1)[0]
    interp = name.decode("utf-8", "surrogateescape")
    return interp, (arg.decode("utf-8", "surrogateescape") if arg is not None else None)


def _split_string(text: str, env: Mapping[str, str], files: fsprobe.Files) -> list[str]:
    """``env -S``: split like coreutils (quotes, backslashes, ``#`` comments,
    ``${VAR}``); on a syntax error env fails, here: plain whitespace split."""
    import re
    import shlex

    def expand(match: re.Match[str]) -> str:
        value = env.get(match.group(1))
        files.note_env(match.group(1), value)  # an input of the verdict too
        return value or ""

    text = re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", expand, text)
    try:
        return shlex.split(text, comments=True)
    except ValueError:
        return text.split()


def env_command(arg: str | None, script: str, env: Mapping[str, str],
                files: fsprobe.Files = fsprobe.HOST) -> tuple[str | None, str | None]:
    """What ``/usr/bin/env`` started from ``#!/usr/bin/env [ARG]`` runs.

    The kernel passes ``ARG`` as one word and the script's path after it, so
    ``#!/usr/bin/env VAR=1 prog`` sets ``VAR`` to ``"1 prog"`` and runs the
    script itself again (only ``-S`` splits). Returns ``(command, PATH)``:
    the command word (None: env would only print the environment) and the
    PATH its execvp searches (None when unset by ``-i``/``-u PATH``).
    """
    args = ([arg] if arg is not None else []) + [script]
    path = env.get("PATH")
    i = 0
    while i < len(args):
        word = args[i]
        if word == "--":
            i += 1
            break
        if word == "-":
            path = None
            i += 1
            continue
        if word.startswith("--"):
            name, eq, value = word[2:].partition("=")
            takes = name in ("unset", "chdir", "split-string")
            if takes and not eq:
                value = args[i + 1] if i + 1 < len(args) else ""
                i += 1
            i += 1
            if name == "ignore-environment":
                path = None
            elif name == "unset" and value == "PATH":
                path = None
            elif name == "split-string":
                args[i:i] = _split_string(value, env, files)
            continue
        if word.startswith("-") and len(word) > 1:
            inserted: list[str] = []
            j = 1
            step = 1
            while j < len(word):
                flag = word[j]
                if flag in "CSu":
                    value = word[j + 1:]
                    if not value:
                        value = args[i + 1] if i + 1 < len(args) else ""
                        step = 2
                    if flag == "u" and value == "PATH":
                        path = None
                    elif flag == "S":
                        inserted = _split_string(value, env, files)
                    break
                if flag == "i":
                    path = None
                j += 1
            i += step
            args[i:i] = inserted
            continue
        break
    while i < len(args) and "=" in args[i]:
        key, _, value = args[i].partition("=")
        if key == "PATH":
            path = value
        i += 1
    return (args[i] if i < len(args) else None), path


def env_target(arg: str | None, rest: list[str]) -> str | None:
    """The command word alone (kept for callers that know no script path)."""
    command, _ = env_command(arg, rest[0] if rest else "", {})
    return command or None


def follow(path: str, env: Mapping[str, str], cwd: str,
           budget: Budget | None = None, files: fsprobe.Files = fsprobe.HOST) -> list[Hop]:
    """The chain of files execve opens for ``path``: scripts, then the ELF
    (or the hop that ends it: missing, unreadable, format, loop)."""
    hops: list[Hop] = []
    seen: set[str] = set()
    current = path
    depth = 0
    while len(hops) < _MAX_HOPS:
        if budget is not None:
            budget.tick()
        hop = _classify(current, budget, files)
        hops.append(hop)
        if hop.kind != "script":
            return hops
        if current in seen:
            hops.append(Hop(current, "loop", detail="#! interpreters form a loop"))
            return hops
        seen.add(current)
        depth += 1
        target = hop.interp or ""
        if not target:
            hops.append(Hop("", "missing", detail="empty interpreter name"))
            return hops
        if not target.startswith("/"):
            target = os.path.join(cwd, target)
        if os.path.basename(target) == "env":
            command, lookup_path = env_command(hop.interp_arg, current, env, files)
            if command is not None:
                # env is itself a program execve must run: it has to be an
                # ELF file of the node before the command it starts matters.
                env_hop = _classify(target, budget, files)
                if env_hop.kind != "elf":
                    hops.append(env_hop)
                    return hops
                hops.append(Hop(target, "env"))
                found = which(command, lookup_path, cwd, budget, files)
                if found is None:
                    hops.append(Hop(command, "missing", detail="not found in PATH by env"))
                    return hops
                # env itself must run; we judge the program it starts, which
                # env starts with an execve of its own: the #! count restarts.
                target = found
                depth = 0
        if depth > MAX_DEPTH:
            hops.append(Hop(target, "loop",
                            detail=f"more than {MAX_DEPTH} levels of #! interpreters"))
            return hops
        current = target
    hops.append(Hop(current, "loop", detail="#! chain too long"))
    return hops


def _classify(path: str, budget: Budget | None = None, files: fsprobe.Files = fsprobe.HOST) -> Hop:
    if budget is not None:
        budget.take_file()
    try:
        fh, st = open_regular(path, files)
    except FileNotFoundError:
        return Hop(path, "missing", detail="No such file or directory")
    except NotADirectoryError:
        return Hop(path, "missing", detail="Not a directory")
    except PermissionError:
        return Hop(path, "unreadable", detail="Permission denied")
    except OSError as exc:
        if exc.errno is not None and files.isdir(path):
            return Hop(path, "unreadable", detail="Is a directory")
        return Hop(path, "unreadable", detail=exc.strerror or "cannot open")
    except (ElfError, ValueError):  # FIFO, device, directory; NUL in the path
        # execve refuses anything but a regular file with EACCES.
        kind = "directory" if files.isdir(path) else "not a regular file"
        return Hop(path, "not-regular", detail=f"Permission denied ({kind})")
    try:
        if budget is not None:
            budget.spend_bytes(SHEBANG_BYTES)
        head = fh.pread(SHEBANG_BYTES, 0)
    except OSError as exc:
        return Hop(path, "unreadable", detail=exc.strerror or "cannot read")
    finally:
        fh.close()
    if not st.st_mode & 0o111 or not files.executable(path):
        return Hop(path, "not-executable", detail="Permission denied")
    if head.startswith(b"\x7fELF"):
        return Hop(path, "elf")
    shebang = parse_shebang(head)
    if shebang is not None:
        return Hop(path, "script", interp=shebang[0], interp_arg=shebang[1])
    if head.startswith(b"#!"):
        return Hop(path, "format",
                   detail="#! line names no interpreter the kernel accepts "
                          "(none, or cut off at 255 bytes)")
    return Hop(path, "format", detail="neither an ELF file nor a #! script")
