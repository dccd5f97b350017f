"""Which CPython a step runs, and what its command line asks of it.

A Python step is judged by what the node's interpreter would import, so the
check first has to know that the executable *is* a CPython, which X.Y it is
(the version names every directory of ``sys.path``), and which of the
interpreter's options change that path (``-I -E -s -S -P``) or what it runs
(``-c``, ``-m``, a script, stdin). Both are read from files and argv only:
nothing is executed, the executable may be of another machine.

The option parser follows CPython's own ``Python/getopt.c`` and
``config_parse_cmdline`` (``Python/initconfig.c``) rather than argparse
conventions: short options combine (``-Es``, ``-Ic CODE``, ``-cCODE``),
``-c``/``-m`` end option parsing, ``-`` means stdin, long options must match
exactly, and anything unknown makes CPython print its usage and exit 2.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from .. import fsprobe
from .._record import dataclass
from ..budget import Budget, BudgetExceeded
from ..elf import ElfInfo
from ..loader import host_path
from ..node import NodeProfile
from . import nodepath
from .nodepath import listdir

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator


@dataclass(frozen=True)
class PyFlags:
    isolated: bool = False      # -I (implies ignore_env, no_user_site, safe_path)
    ignore_env: bool = False    # -E
    no_user_site: bool = False  # -s
    no_site: bool = False       # -S
    safe_path: bool = False     # -P (3.11+); PYTHONSAFEPATH is read in sitepath (env)


@dataclass(frozen=True)
class PyCommand:
    #: "code" (-c) | "module" (-m) | "script" | "stdin" | "none" (nothing runs:
    #: -V, -h, --version, a usage error)
    kind: str
    #: the code, the module name, the script path as given, or ""
    value: str
    #: what follows (sys.argv[1:])
    args: tuple[str, ...] = ()


#: Options taking a value (``X:`` in CPython's SHORT_OPTS), and the others it
#: knows. ``J`` is listed by CPython but reserved (an error), so it is absent;
#: ``P`` exists from 3.11 on.
_SHORT_WITH_ARG = frozenset("cmWX")
_SHORT_FLAGS = frozenset("bBdEhiIOPqRsStuvVx?")
#: Long options that take a value; every other known long option prints help
#: and exits (``--help-env``, ``--help-xoptions``, ``--help-all``: 3.11+).
_LONG_WITH_ARG = frozenset({"check-hash-based-pycs"})
_LONG_EXIT = frozenset({"help", "version", "help-env", "help-xoptions", "help-all"})
_HASH_PYC_MODES = frozenset({"always", "never", "default"})

_NONE = PyCommand("none", "")


def parse_python_argv(args: Sequence[str], version: tuple[int, int] | None = None,
                      ) -> tuple[PyFlags, PyCommand]:
    """``args`` = the interpreter's argv[1:]. ``version`` (optional, an
    addition to the shared interface) makes options unknown to that CPython
    (``-P`` before 3.11, ``--help-env`` & co. before 3.11) a usage error, as
    that interpreter treats them. Never raises."""
    isolated = ignore_env = no_user_site = no_site = safe_path = False
    exits = False
    i, n = 0, len(args)
    try:
        while i < n:
            arg = args[i]
            if not isinstance(arg, str) or len(arg) < 2 or arg[0] != "-":
                break  # a script name, or "-" (stdin): options end
            i += 1
            if arg == "--":
                break
            if arg[1] == "-":
                name = arg[2:]
                if name in _LONG_WITH_ARG:
                    if i >= n or args[i] not in _HASH_PYC_MODES:
                        return _flags(isolated, ignore_env, no_user_site, no_site,
                                      safe_path), _NONE
                    i += 1
                    continue
                known = name in ("help", "version") or (
                    name in _LONG_EXIT and (version is None or version >= (3, 11)))
                if not known:
                    return _flags(isolated, ignore_env, no_user_site, no_site,
                                  safe_path), _NONE
                if name == "version":
                    exits = True  # CPython parses on, then prints the version
                    continue
                return _flags(isolated, ignore_env, no_user_site, no_site, safe_path), _NONE
            j = 1
            while j < len(arg):
                opt = arg[j]
                j += 1
                if opt in _SHORT_WITH_ARG:
                    if j < len(arg):
                        value = arg[j:]
                    elif i < n:
                        value = args[i]
                        i += 1
                    else:
                        return _flags(isolated, ignore_env, no_user_site, no_site,
                                      safe_path), _NONE
                    if opt in "cm":
                        flags = _flags(isolated, ignore_env, no_user_site, no_site, safe_path)
                        if exits:
                            return flags, _NONE
                        kind = "code" if opt == "c" else "module"
                        return flags, PyCommand(kind, value, tuple(args[i:]))
                    break  # -W / -X: the rest of this word was the value
                if opt not in _SHORT_FLAGS or (opt == "P" and version is not None
                                               and version < (3, 11)):
                    return _flags(isolated, ignore_env, no_user_site, no_site,
                                  safe_path), _NONE
                if opt in "h?":
                    return _flags(isolated, ignore_env, no_user_site, no_site,
                                  safe_path), _NONE
                if opt == "V":
                    exits = True
                elif opt == "I":
                    isolated = True
                elif opt == "E":
                    ignore_env = True
                elif opt == "s":
                    no_user_site = True
                elif opt == "S":
                    no_site = True
                elif opt == "P":
                    safe_path = True
        flags = _flags(isolated, ignore_env, no_user_site, no_site, safe_path)
        if exits:
            return flags, _NONE
        if i >= n:
            return flags, PyCommand("stdin", "", ())
        if args[i] == "-":
            return flags, PyCommand("stdin", "", tuple(args[i + 1:]))
        return flags, PyCommand("script", str(args[i]), tuple(args[i + 1:]))
    except Exception:  # odd argv objects: nothing is known to run
        return PyFlags(), _NONE


def _flags(isolated: bool, ignore_env: bool, no_user_site: bool, no_site: bool,
           safe_path: bool) -> PyFlags:
    if isolated:  # -I is -E -s -P in one (config_init_cmdline)
        ignore_env = no_user_site = safe_path = True
    return PyFlags(isolated=isolated, ignore_env=ignore_env, no_user_site=no_user_site,
                   no_site=no_site, safe_path=safe_path)


@dataclass(frozen=True)
class Interpreter:
    #: the node path execve'd (e.g. /home/u/venv/bin/python)
    executable: str
    #: its real path on the node
    real: str
    version: tuple[int, int]
    #: what told the version: "name python3.11", "DT_NEEDED libpython3.11.so.1.0",
    #: "lib/python3.11", "pyvenv.cfg version"
    evidence: str


def node_realpath(node: NodeProfile, path: str, cwd: str = "/",
                  files: fsprobe.Files = fsprobe.HOST) -> str:
    """The real path of a node path, as a node path (the loader's rule for
    ``$ORIGIN``: resolve on the host copy, strip the image root again)."""
    host = host_path(node, path, cwd, files)
    real = files.realpath(host)
    root = node.root.rstrip("/")
    if root and real.startswith(root + "/") and host != path:
        real = real[len(root):]
    return real


def read_small(node: NodeProfile, path: str, budget: Budget, limit: int,
               files: fsprobe.Files = fsprobe.HOST) -> bytes | None:
    """At most ``limit`` bytes of a regular file at a node path, or None when
    it is absent or unreadable (:func:`nodepath.read_small`)."""
    return nodepath.read_small(host_path(node, path, "/", files), limit, budget, files)


def cfg_pairs(data: bytes | None) -> list[tuple[str, str]]:
    """``key = value`` lines of a pyvenv.cfg, keys lowered, as getpath and
    site read them (a line without ``=`` is ignored)."""
    if not data:
        return []
    text = data.decode("utf-8", "surrogateescape")
    out = []
    for line in text.splitlines():
        key, eq, value = line.partition("=")
        if eq:
            out.append((key.strip().lower(), value.strip()))
    return out


def version_of_name(name: str) -> tuple[int, int] | None:
    """``python3.11`` / ``python3.6m`` / ``python3.13t`` -> (3, 11) ...;
    ``python``/``python3`` -> None."""
    if not name.startswith("python"):
        return None
    rest = name[6:]
    major, dot, minor = rest.partition(".")
    if not dot or not major.isdigit():
        return None
    digits = minor.rstrip("mdtu")
    if not digits.isdigit() or len(digits) > 3:
        return None
    return int(major), int(digits)


def looks_like_python(name: str) -> bool:
    """A name CPython installs its interpreter under: python, python3,
    python3.11, python3.6m, python3.13t (not python-config, python3-tool)."""
    if name in ("python", "python3", "python2"):
        return True
    return version_of_name(name) is not None


def _libpython_version(needed: Sequence[str]) -> tuple[tuple[int, int], str] | None:
    for soname in needed:
        if soname.startswith("libpython"):
            stem = soname[9:].split(".so", 1)[0]  # "3.11", "3.6m", "3.13t"
            got = version_of_name("python" + stem)
            if got is not None:
                return got, soname
    return None


def _parents(directory: str) -> Iterator[str]:
    """``directory`` and its ancestors up to "/" (getpath's search_up)."""
    d = directory
    while d:
        yield d
        up = os.path.dirname(d)
        if up == d:
            return
        d = up


def _evidence_dirs(start: str) -> Iterator[str]:
    """Where a stdlib above the executable counts as evidence: not "/", whose
    lib/python3.X is the system's on a merged-/usr system (/lib -> usr/lib),
    so that any program in /tmp/x/bin would look like a CPython."""
    for d in _parents(start):
        if d != "/":
            yield d


def stdlib_versions(node: NodeProfile, prefix: str, budget: Budget,
                    files: fsprobe.Files = fsprobe.HOST) -> list[tuple[int, int]]:
    """The X.Y of every ``lib/pythonX.Y/os.py`` (or lib64) under ``prefix``."""
    found: list[tuple[int, int]] = []
    for libdir in ("lib", "lib64"):
        d = f"{prefix.rstrip('/')}/{libdir}"
        try:
            names = listdir(host_path(node, d, "/", files), files)
        except OSError:
            continue
        for name in sorted(names):
            budget.tick()
            ver = version_of_name(name)
            if ver is None or ver[0] != 3 or ver in found:
                continue
            for landmark in ("os.py", "os.pyc"):
                if files.isfile(host_path(node, f"{d}/{name}/{landmark}", "/", files)):
                    found.append(ver)
                    break
    return found


def identify(exe_path: str, info: ElfInfo, node: NodeProfile, budget: Budget,
             files: fsprobe.Files = fsprobe.HOST) -> Interpreter | None:
    """The CPython 3 interpreter at ``exe_path``, or None when nothing says
    it is one. The name must be one CPython installs (python, python3,
    python3.X) — on the path or its real path — and something beyond the
    name must confirm it: DT_NEEDED libpython3.X, a stdlib landmark
    (lib/python3.X/os.py) above the real location or the pyvenv.cfg home,
    or a pyvenv.cfg next to it. A program merely named python3.11 is not
    taken for an interpreter."""
    try:
        return _identify(exe_path, info, node, budget, files)
    except BudgetExceeded:
        raise
    except Exception:  # odd files or names: not known to be a CPython
        return None


def _identify(exe_path: str, info: ElfInfo, node: NodeProfile, budget: Budget,
              files: fsprobe.Files) -> Interpreter | None:
    budget.tick()
    real = node_realpath(node, exe_path, files=files)
    names = (os.path.basename(exe_path), os.path.basename(real))
    if not any(looks_like_python(n) for n in names):
        return None
    by_name = version_of_name(names[1]) or version_of_name(names[0])
    if by_name is not None and by_name[0] != 3:
        return None
    linked = _libpython_version(info.needed)
    if linked is not None:
        if linked[0][0] != 3:
            return None
        return Interpreter(exe_path, real, linked[0], f"DT_NEEDED {linked[1]}")

    # pyvenv.cfg: one directory up from the executable first, then next to
    # it (getpath.py); its "home" is where the prefix search starts.
    exe_dir = os.path.dirname(exe_path)
    cfg: list[tuple[str, str]] = []
    for d in (os.path.dirname(exe_dir), exe_dir):
        data = read_small(node, f"{d.rstrip('/')}/pyvenv.cfg", budget, 64 * 1024, files)
        if data is not None:
            cfg = cfg_pairs(data)
            break
    home = next((v for k, v in cfg if k == "home"), None)
    cfg_version = None
    for key, value in cfg:
        if key in ("version", "version_info"):  # venv / uv & virtualenv
            parts = value.split(".")
            if len(parts) >= 2 and parts[0].isdigit() and parts[1].isdigit():
                cfg_version = (int(parts[0]), int(parts[1]))
    start = home if home else os.path.dirname(real)
    if by_name is not None:
        thread = "t" if any(n.startswith("python3.") and n.endswith("t") for n in names) else ""
        if cfg_version == by_name or _stdlib_above(node, start, by_name, budget, thread, files):
            return Interpreter(exe_path, real, by_name, f"name python{by_name[0]}.{by_name[1]}")
        return None
    if cfg_version is not None:
        if cfg_version[0] == 3 and _stdlib_above(node, start, cfg_version, budget, "", files):
            return Interpreter(exe_path, real, cfg_version, "pyvenv.cfg version")
        return None
    for d in _evidence_dirs(start):
        got = stdlib_versions(node, d, budget, files)
        if got:
            if len(got) == 1:
                return Interpreter(exe_path, real, got[0], f"lib/python{got[0][0]}.{got[0][1]}")
            return None  # several stdlibs, nothing to choose by: not sure
    return None


def has_stdlib(node: NodeProfile, prefix: str, version: tuple[int, int],
               abi_thread: str = "", files: fsprobe.Files = fsprobe.HOST) -> bool:
    """getpath's prefix landmark: ``lib/pythonX.Y/os.py`` (or .pyc, or lib64;
    ``pythonX.Yt`` for a free-threaded build)."""
    base = prefix.rstrip("/")
    for libdir in ("lib", "lib64"):
        for landmark in ("os.py", "os.pyc"):
            if files.isfile(host_path(node, f"{base}/{libdir}/python{version[0]}."
                                            f"{version[1]}{abi_thread}/{landmark}", "/", files)):
                return True
    return False


def abi_thread(interp: Interpreter) -> str:
    """"t" for a free-threaded build (python3.13t), whose directories carry
    the suffix too (lib/python3.13t, python313t.zip); else ""."""
    for path in (interp.real, interp.executable):
        name = os.path.basename(path)
        if name.startswith("python3.") and name.endswith("t"):
            return "t"
    return ""


def _stdlib_above(node: NodeProfile, start: str, version: tuple[int, int],
                  budget: Budget, thread: str, files: fsprobe.Files) -> bool:
    for d in _evidence_dirs(start):
        budget.tick()
        if has_stdlib(node, d, version, thread, files):
            return True
    return False
