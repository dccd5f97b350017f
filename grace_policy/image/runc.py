"""How runc finds the program of an OCI container, and what it prints when
it cannot.

runc 1.1.5 (``libcontainer/standard_init_linux.go``) calls Go's
``exec.LookPath(process.args[0])`` in the container's init, after it has
cleared its own environment, set ``process.env`` in order (so the last
definition of a name wins) and changed to ``process.cwd`` inside the root;
it is not slurmstepd's ``_build_path``. Go 1.19's ``LookPath`` (Debian 12's
runc is built with go1.19.8, ``runc --version``):

- a name with a ``/`` is used as given, if ``stat`` finds a non-directory
  with any execute bit; else ``exec: "NAME": stat NAME: <errno>`` or
  ``exec: "NAME": permission denied``;
- any other name is tried in each PATH entry (``filepath.Join``; an empty
  entry means ``.``; no PATH: nothing is searched), the first such file
  wins; a hit through a relative entry is refused (``ErrDot``, Go 1.19 on);
  none: ``exec: "NAME": executable file not found in $PATH``.

Call inside the image's view: every path is a path in the container.
"""

from __future__ import annotations

import errno
import os
import posixpath
import stat
from collections.abc import Mapping

from .. import fsprobe

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ..budget import Budget

NOT_FOUND = "executable file not found in $PATH"
#: How ``runc run`` reports an error its init sent back before the exec
#: (``utils_linux.go``, ``process_linux.go``), logged through logrus as
#: ``time=... level=error msg="<this, Go-quoted>"``.
RUN_FAILED = "runc run failed: unable to start container process: "
ERR_DOT = "cannot run executable found relative to current directory"


def go_quote(text: str) -> str:
    """Go's ``strconv.Quote`` of ``text`` (the name in runc's error), so the
    prediction matches byte for byte and control characters stay escaped."""
    out = ['"']
    named = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r",
             "\t": "\\t", "\v": "\\v", '"': '\\"', "\\": "\\\\"}
    for ch in text:
        code = ord(ch)
        if ch in named:
            out.append(named[ch])
        elif 0xDC80 <= code <= 0xDCFF:  # a byte that was not UTF-8 (surrogateescape)
            out.append(f"\\x{code - 0xDC00:02x}")
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\x{code:02x}")
        elif code < 0x7F or ch.isprintable():
            out.append(ch)
        elif code <= 0xFFFF:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    out.append('"')
    return "".join(out)


def _find_executable(path: str, cwd: str, files: fsprobe.Files) -> str | None:
    """Go's ``findExecutable``: None when usable, else the error's text."""
    full = path if path.startswith("/") else posixpath.join(cwd, path)
    try:
        st = files.stat(full)
    except OSError as exc:
        code = exc.errno or errno.ENOENT
        return f"stat {path}: {os.strerror(code).lower()}"
    except ValueError:
        return f"stat {path}: {os.strerror(errno.ENOENT).lower()}"
    if not stat.S_ISDIR(st.st_mode) and st.st_mode & 0o111:
        return None
    return "permission denied"


def look_path(name: str, env: Mapping[str, str], cwd: str, budget: Budget | None = None,
              files: fsprobe.Files = fsprobe.HOST) -> tuple[str | None, str | None]:
    """(the path runc will exec, as a path in the container (``files``: the
    container's), or None; runc's error when it finds nothing). ``name`` is
    non-empty."""
    if "/" in name:
        err = _find_executable(name, cwd, files)
        if err is not None:
            return None, f"{RUN_FAILED}exec: {go_quote(name)}: {err}"
        return (name if name.startswith("/") else posixpath.join(cwd, name)), None
    for directory in env.get("PATH", "").split(":") if env.get("PATH") else ():
        if budget is not None:
            budget.tick()
        candidate = posixpath.normpath(posixpath.join(directory or ".", name))
        if candidate.startswith("//"):  # Go's Clean keeps one leading slash
            candidate = "/" + candidate.lstrip("/")
        if _find_executable(candidate, cwd, files) is None:
            if not candidate.startswith("/"):
                return None, f"{RUN_FAILED}exec: {go_quote(name)}: {ERR_DOT}"
            return candidate, None
    return None, f"{RUN_FAILED}exec: {go_quote(name)}: {NOT_FOUND}"
