"""The first executable of a step, found the way slurmstepd and the kernel will.

slurmstepd (``_build_path`` in ``src/slurmd/slurmstepd/task.c``) resolves
argv[0] after ``task_init``: a leading ``/`` is absolute, a leading ``.`` is
relative to the cwd, anything else is searched in the job's PATH with
``stat()`` and "not a directory" (no exec-bit test, empty PATH elements are
skipped by ``strtok``); a name not found is passed to execve as it is. The
kernel then follows ``#!`` lines, here at most :data:`MAX_DEPTH` deep.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass

from .elf import open_regular

MAX_DEPTH = 4
#: The kernel reads this much of a script to find its interpreter line.
SHEBANG_BYTES = 256


@dataclass(frozen=True)
class Hop:
    """One file execve would open: the step's command or an interpreter."""

    path: str
    #: "elf", "script", "missing", "unreadable", "format", "not-executable",
    #: "loop" (too many #! levels)
    kind: str
    #: For scripts: the interpreter path and optional argument from ``#!``.
    interp: str | None = None
    interp_arg: str | None = None
    detail: str = ""


def build_path(name: str, env: Mapping[str, str], cwd: str) -> str | None:
    """slurmstepd's ``_build_path``; None when nothing in PATH matched."""
    if not name:
        return None
    if name.startswith("/"):
        return name
    if name.startswith("."):
        return os.path.join(cwd, name)
    path_env = env.get("PATH")
    if path_env is None:
        return _relative(name, cwd)
    for directory in path_env.split(":"):
        if not directory:
            continue
        candidate = f"{directory}/{name}"
        host = candidate if candidate.startswith("/") else os.path.join(cwd, candidate)
        try:
            st = os.stat(host)
        except (OSError, ValueError):
            continue
        if not stat.S_ISDIR(st.st_mode):
            return host
    return _relative(name, cwd)


def _relative(name: str, cwd: str) -> str | None:
    """Not found in PATH: execve gets the bare name, which only works with a /."""
    if "/" in name:
        return os.path.join(cwd, name)
    return None


def which(name: str, env: Mapping[str, str], cwd: str) -> str | None:
    """``execvp`` semantics for ``/usr/bin/env NAME``: needs the exec bit."""
    if "/" in name:
        return name if name.startswith("/") else os.path.join(cwd, name)
    for directory in env.get("PATH", "/usr/local/bin:/usr/bin:/bin").split(":"):
        candidate = os.path.join(directory or cwd, name)
        if not candidate.startswith("/"):
            candidate = os.path.join(cwd, candidate)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def parse_shebang(head: bytes) -> tuple[str, str | None] | None:
    """Interpreter and optional argument, split like ``binfmt_script``."""
    if not head.startswith(b"#!"):
        return None
    line = head[2:SHEBANG_BYTES].split(b"\n", 1)[0]
    line = line.strip(b" \t")
    if not line:
        return None
    parts = line.split(None, 1)
    interp = parts[0].decode("utf-8", "surrogateescape")
    arg = parts[1].strip(b" \t").decode("utf-8", "surrogateescape") if len(parts) > 1 else None
    return interp, arg or None


def env_target(arg: str | None, rest: list[str]) -> str | None:
    """The command ``/usr/bin/env`` would run, from its ``#!`` argument (which
    the kernel passes as one word) or, without one, the script's own argv."""
    words: list[str] = []
    if arg is not None:
        words = arg.split() if arg.startswith("-S") or " " in arg else [arg]
    words += rest
    i = 0
    while i < len(words):
        word = words[i]
        if word in ("-S", "--split-string"):
            i += 1
            continue
        if word.startswith("-S") and len(word) > 2:
            words[i:i + 1] = word[2:].split()
            continue
        if word in ("-u", "--unset", "-C", "--chdir"):
            i += 2
            continue
        if word.startswith("-") or ("=" in word and not word.startswith("/")):
            i += 1
            continue
        return word
    return None


def follow(path: str, env: Mapping[str, str], cwd: str) -> list[Hop]:
    """The chain of files execve opens for ``path``: scripts, then the ELF."""
    hops: list[Hop] = []
    seen: set[str] = set()
    current = path
    for _ in range(MAX_DEPTH + 1):
        hop = _classify(current)
        if hop.kind != "script":
            hops.append(hop)
            return hops
        assert hop.interp is not None
        target = hop.interp
        if os.path.basename(target) == "env":
            named = env_target(hop.interp_arg, [])
            if named is not None:
                found = which(named, env, cwd)
                hops.append(hop)
                if found is None:
                    hops.append(Hop(named, "missing", detail="not found in PATH by env"))
                    return hops
                # env itself must run; we judge the program it starts.
                target = found
            else:
                hops.append(hop)
        else:
            hops.append(hop)
        if not target.startswith("/"):
            target = os.path.join(cwd, target)
        if target in seen:
            hops.append(Hop(target, "loop", detail="#! interpreters form a loop"))
            return hops
        seen.add(current)
        current = target
    hops.append(Hop(current, "loop", detail=f"more than {MAX_DEPTH} levels of #! interpreters"))
    return hops


def _classify(path: str) -> Hop:
    try:
        fd, st = open_regular(path)
    except FileNotFoundError:
        return Hop(path, "missing", detail="No such file or directory")
    except NotADirectoryError:
        return Hop(path, "missing", detail="Not a directory")
    except PermissionError:
        return Hop(path, "unreadable", detail="Permission denied")
    except OSError as exc:
        if exc.errno is not None and os.path.isdir(path):
            return Hop(path, "unreadable", detail="Is a directory")
        return Hop(path, "unreadable", detail=exc.strerror or "cannot open")
    except Exception:  # ElfError: FIFO, device, directory...
        return Hop(path, "unreadable", detail="not a regular file")
    try:
        head = os.pread(fd, SHEBANG_BYTES, 0)
    except OSError as exc:
        return Hop(path, "unreadable", detail=exc.strerror or "cannot read")
    finally:
        os.close(fd)
    if not os.access(path, os.X_OK) or not st.st_mode & 0o111:
        return Hop(path, "not-executable", detail="Permission denied")
    if head.startswith(b"\x7fELF"):
        return Hop(path, "elf")
    shebang = parse_shebang(head)
    if shebang is not None:
        return Hop(path, "script", interp=shebang[0], interp_arg=shebang[1])
    if head.startswith(b"#!"):
        return Hop(path, "format", detail="#! line names no interpreter")
    return Hop(path, "format", detail="neither an ELF file nor a #! script")
