"""The ``sys.path`` the node's CPython would start with, computed from files.

Which extension module a step imports depends on the order of ``sys.path``:
a venv, the user site of ``pip install --user`` on the login node, a
``PYTHONPATH`` directory on shared storage, the directories ``.pth`` files
add. This module replays what CPython does at start-up, without running it
(the interpreter may be of another machine):

* ``getpath`` (``Modules/getpath.py`` in 3.11+, ``Modules/getpath.c``
  before): ``PYTHONHOME``, else ``pyvenv.cfg``'s ``home`` (one directory above
  the executable first, then next to it), else the executable's real
  directory, searched upwards for the landmarks ``lib/pythonXY.zip`` (3.11+)
  and ``lib/pythonX.Y/os.py`` (prefix) and ``lib/pythonX.Y/lib-dynload``
  (exec_prefix); then PYTHONPATH, the stdlib zip, the stdlib, lib-dynload.
* ``site`` (``Lib/site.py``): duplicates removed and paths made absolute,
  the venv (``pyvenv.cfg`` next to the executable first, then one up;
  ``include-system-site-packages``), the user site (``PYTHONUSERBASE`` or
  ``~/.local`` from the step's ``HOME``; off with ``-s``/``-I``,
  ``PYTHONNOUSERSITE`` or a venv without system site), the site-packages of
  each prefix, and per site directory its ``.pth`` files in sorted order
  (``import`` lines are recorded, never executed). Debian's patched site.py
  (``dist-packages``) is recognised from the stdlib's own ``site.py``.
* ``sys.path[0]``: the script's real directory, ``''`` for ``-c`` and stdin,
  the working directory for ``-m``; none with ``-P``/``PYTHONSAFEPATH``/``-I``.

setuptools' editable finders (a ``.pth`` line ``import __editable___NAME_finder;
...install()``) are read from their module's literals by :mod:`.editable`
(imported only then): ``SysPath.editables``, and the finder's
``PATH_PLACEHOLDER`` entry (kind ``editable-hook``) when it has namespaces.
What ``sitecustomize``/``usercustomize`` import is the step's business
(``step.Environment.startup_modules``).

Not modelled (named in ``notes`` where it is seen): ``._pth`` files
(Windows-style embedding), Fedora's ``/usr/local`` patch to site.py, the
compiled-in PREFIX fallback when no landmark is found, build-directory
interpreters, ``.pth`` import lines that fail (site.py skips the rest of
that file).
"""

from __future__ import annotations

import os
import stat as _stat
from collections.abc import Callable

from .._record import dataclass
from ..budget import BudgetExceeded
from ..context import StepContext
from ..elf import ElfError, open_regular
from ..loader import host_path
from .interp import (
    Interpreter,
    PyCommand,
    PyFlags,
    abi_thread,
    cfg_pairs,
    has_stdlib,
    listdir,
    node_realpath,
    read_small,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ..node import NodeProfile
    from .editable import EditableFinder

#: pyvenv.cfg and .pth files are small; a bigger one is read up to this.
MAX_CFG_BYTES = 64 * 1024
MAX_PTH_BYTES = 1024 * 1024
#: Lines of all .pth files together (a hostile site dir cannot make us loop).
MAX_PTH_LINES = 100_000

#: Where a distribution's own Python lives: the node has its own build of
#: these files, as it has of /usr/lib. /usr/local/lib/python* counts too: it
#: is node-local (the admin's ``pip install`` on each machine), never the
#: login node's copy.
SYSTEM_PYTHON_DIRS = ("/usr/lib/python", "/usr/lib64/python", "/usr/local/lib/python",
                      "/usr/local/lib64/python", "/lib/python", "/lib64/python")


def is_system(path: str, node: NodeProfile) -> bool:
    """Whether ``path`` is the node's own distribution Python. Never inside
    an image (``node.in_image``): there these directories are the image's,
    where ``pip install`` and apt put what the step imports, and nothing
    else judges them."""
    return not node.in_image and path.startswith(SYSTEM_PYTHON_DIRS)


@dataclass(frozen=True)
class PathEntry:
    #: as it will appear in sys.path (CPython's normalisation)
    path: str
    #: "script-dir" | "cwd" | "pythonpath" | "stdlib-zip" | "stdlib" |
    #: "lib-dynload" | "user-site" | "site-packages" | "pth" | "editable-hook"
    #: (setuptools' PATH_PLACEHOLDER: a path hook's key, no directory)
    kind: str
    #: what put it there: "PYTHONPATH", the .pth file's path, "pyvenv.cfg",
    #: "prefix", "PYTHONHOME", "venv", "PYTHONUSERBASE", "HOME", "-c", "-m",
    #: "stdin", the script path
    origin: str
    #: part of the node's distribution Python (see SYSTEM_PYTHON_DIRS)
    system: bool


@dataclass(frozen=True)
class SysPath:
    entries: tuple[PathEntry, ...]
    prefix: str
    base_prefix: str
    exec_prefix: str
    venv: str | None
    system_site: bool
    user_site: str | None
    site_dirs: tuple[str, ...]
    pth_imports: tuple[tuple[str, str], ...]
    notes: tuple[str, ...] = ()
    #: the error this interpreter would stop with before running anything
    #: (a PYTHONHOME without a stdlib, a .pth or pyvenv.cfg that is not
    #: UTF-8), or None. An addition to the shared interface (defaulted).
    startup_error: str | None = None
    #: setuptools' editable finders the .pth lines install, in order
    #: (``editable.EditableFinder``); defaulted like startup_error.
    editables: tuple[EditableFinder, ...] = ()

    @property
    def paths(self) -> list[str]:
        return [e.path for e in self.entries]


def abspath(path: str, cwd: str) -> str:
    """os.path.abspath against the step's (real) working directory."""
    if not path.startswith("/"):
        path = cwd.rstrip("/") + "/" + path if path else cwd
    return os.path.normpath(path)


class _Model:
    def __init__(self, interp: Interpreter, flags: PyFlags, command: PyCommand,
                 ctx: StepContext) -> None:
        env, cwd, node, budget = ctx.env, ctx.cwd, ctx.node, ctx.budget
        self.interp = interp
        self.version = interp.version
        self.flags = flags
        self.command = command
        self.env = env
        self.node = node
        self.budget = budget
        #: The step's files (host or image) and the record of what is read.
        self.files = ctx.files
        self.use_env = not (flags.ignore_env or flags.isolated)
        self.notes: list[str] = []
        self.entries: list[PathEntry] = []
        self.known: set[str] = set()
        self.pth_imports: list[tuple[str, str]] = []
        self.site_dirs: list[str] = []
        self.pth_lines = 0
        self.pth_cache: dict[str, list[str]] = {}
        self.startup_error: str | None = None
        self.editables: list[EditableFinder] = []
        try:
            self.cwd = (node_realpath(node, cwd, files=ctx.files) if cwd.startswith("/")
                        else "/")
        except (OSError, ValueError):
            self.cwd = cwd
        self.abi_thread = abi_thread(interp)

    # -- small helpers --------------------------------------------------------

    def getenv(self, name: str, always: bool = False) -> str | None:
        """A variable CPython reads (``always``: site reads it from os.environ
        even under -E). Empty counts as unset, as in config_get_env."""
        if not (self.use_env or always):
            return None
        value = self.env.get(name)
        self.files.note_env(name, value)
        return value or None

    def isdir(self, path: str) -> bool:
        self.budget.tick()
        return self.files.isdir(host_path(self.node, path, self.cwd, self.files))

    def exists(self, path: str) -> bool:
        self.budget.tick()
        return self.files.exists(host_path(self.node, path, self.cwd, self.files))

    def isfile(self, path: str) -> bool:
        self.budget.tick()
        return self.files.isfile(host_path(self.node, path, self.cwd, self.files))

    def fail(self, error: str) -> None:
        if self.startup_error is None:
            self.startup_error = error

    def decode(self, data: bytes, path: str, encoding: str) -> str:
        """Text as site.py decodes it; bytes it cannot decode stop CPython at
        start-up (site.py reads .pth files in the locale's encoding, UTF-8
        or ASCII on a node; pyvenv.cfg as UTF-8), so that is recorded and
        the rest read leniently."""
        try:
            return data.decode(encoding)
        except UnicodeDecodeError as exc:
            self.fail(f"{_fatal_site(self.version)} (UnicodeDecodeError: {exc.reason} at "
                      f"byte {exc.start} of {path})")
            return data.decode("utf-8", "surrogateescape")

    def add(self, path: str, kind: str, origin: str) -> None:
        self.entries.append(PathEntry(path, kind, origin, is_system(path, self.node)))

    @property
    def xy(self) -> str:
        return f"{self.version[0]}.{self.version[1]}{self.abi_thread}"

    # -- getpath --------------------------------------------------------------

    def getpath(self) -> None:
        v = self.version
        exe = self.interp.executable
        if not exe.startswith("/"):
            exe = abspath(exe, self.cwd)
        self.executable = exe
        platlibdir = (self.getenv("PYTHONPLATLIBDIR") if v >= (3, 9) else None)
        home = self.getenv("PYTHONHOME")
        home_origin = "PYTHONHOME"
        exe_dir = os.path.dirname(exe)
        search_dir = None
        if home is None:
            if v >= (3, 11):
                cfg_dirs = (os.path.dirname(exe_dir), exe_dir)
            else:  # getpath.c: next to the resolved executable, then one up
                real_dir = os.path.dirname(self.interp.real)
                cfg_dirs = (real_dir, os.path.dirname(real_dir))
            for d in cfg_dirs:
                data = read_small(self.node, _join(d, "pyvenv.cfg"), self.budget,
                                  MAX_CFG_BYTES, self.files)
                if data is not None:
                    search_dir = next((val for key, val in cfg_pairs(data) if key == "home"),
                                      None)
                    break
        self.search_origin = "pyvenv.cfg" if search_dir is not None else "prefix"
        if search_dir is None:
            search_dir = os.path.dirname(self.interp.real)
        if platlibdir is None:
            platlibdir = self.guess_platlibdir(home, search_dir)
        self.platlibdir = platlibdir
        stdlib_sub = f"{platlibdir}/python{self.xy}"
        zip_name = f"{platlibdir}/python{v[0]}{v[1]}{self.abi_thread}.zip"
        dynload_sub = f"{stdlib_sub}/lib-dynload"
        if home is not None:
            prefix, had, exec_prefix = home.partition(":")
            if not had:
                exec_prefix = prefix
            if not self.isdir(prefix):
                self.notes.append(f"PYTHONHOME={home} does not exist on the node: "
                                  "the interpreter would fail to start")
            if not has_stdlib(self.node, prefix, v, self.abi_thread, self.files) \
                    and not self.isfile(_join(prefix, zip_name)):
                self.fail(f"{_fatal_encodings(v)} (ModuleNotFoundError: No module named "
                          f"'encodings'): PYTHONHOME={home} holds no standard library")
            origin = home_origin
        else:
            origin = self.search_origin
            prefix = None
            if v >= (3, 11):
                prefix = self.search_up(search_dir, lambda d: self.isfile(_join(d, zip_name)))
            if prefix is None:
                prefix = self.search_up(search_dir, lambda d: any(
                    self.isfile(_join(d, f"{stdlib_sub}/{lm}")) for lm in ("os.py", "os.pyc")))
            if prefix is None:
                prefix = os.path.dirname(search_dir.rstrip("/")) or "/"
                self.notes.append(
                    f"no standard library (lib/python{self.xy}/os.py) above {search_dir}: "
                    f"CPython would fall back to its compiled-in prefix; assumed {prefix}")
            exec_prefix = self.search_up(
                search_dir, lambda d: self.isdir(_join(d, dynload_sub))) or prefix
        self.prefix = self.base_prefix = prefix
        self.exec_prefix = self.base_exec_prefix = exec_prefix
        self.stdlib = _join(prefix, stdlib_sub)
        if v >= (3, 14):
            # 3.14's getpath finds the venv itself (site.py only checks it):
            # sys.prefix is the directory holding pyvenv.cfg (one above the
            # executable's first, then next to it), even under -S and with
            # PYTHONHOME set (checked against Debian's 3.14)
            for d in (os.path.dirname(exe_dir), exe_dir):
                self.budget.tick()
                if self.files.isfile(host_path(self.node, _join(d, "pyvenv.cfg"), "/", self.files)):
                    self.prefix = self.exec_prefix = self.venv = d
                    break

        pythonpath = self.getenv("PYTHONPATH")
        if pythonpath is not None:
            for p in pythonpath.split(":"):
                if v >= (3, 11):
                    p = abspath(p, self.cwd)
                self.add(p, "pythonpath", "PYTHONPATH")
        self.add(_join(prefix, zip_name), "stdlib-zip", origin)
        self.add(self.stdlib, "stdlib", origin)
        self.add(_join(exec_prefix, dynload_sub), "lib-dynload", origin)

    def guess_platlibdir(self, home: str | None, search_dir: str) -> str:
        """sys.platlibdir is compiled in ("lib", or "lib64" on Fedora/SUSE
        builds); tell it from where the stdlib is."""
        if self.version < (3, 9):
            return "lib"
        start = home.partition(":")[0] if home else search_dir
        for d in _parents(start):
            self.budget.tick()
            if has_stdlib(self.node, d, self.version, self.abi_thread, self.files):
                for landmark in ("os.py", "os.pyc"):
                    lib = f"{d.rstrip('/')}/lib/python{self.xy}/{landmark}"
                    if self.files.isfile(host_path(self.node, lib, "/", self.files)):
                        return "lib"
                return "lib64"
            if home:
                break
        return "lib"

    def search_up(self, start: str, test: Callable[[str], bool]) -> str | None:
        """getpath's search_up: ``start`` and its parents, first that passes."""
        for d in _parents(start):
            self.budget.tick()
            if test(d):
                return d
        return None

    # -- site -----------------------------------------------------------------

    def site(self) -> None:
        v = self.version
        # removeduppaths: absolute, normalised, first occurrence kept
        kept: list[PathEntry] = []
        for e in self.entries:
            p = abspath(e.path, self.cwd)
            if p not in self.known:
                self.known.add(p)
                kept.append(PathEntry(p, e.kind, e.origin, is_system(p, self.node)))
        self.entries = kept
        self.debian = self.is_debian_site()
        prefixes = [self.prefix, self.exec_prefix]
        enable_user: bool | None = None
        if v < (3, 14):
            self.venv = None
        self.system_site = True
        # venv(): pyvenv.cfg next to sys.executable first, then one up;
        # sys.prefix is always the directory above the executable's.
        exe_dir = os.path.dirname(self.executable)
        site_prefix = os.path.dirname(exe_dir)
        for conf in (_join(exe_dir, "pyvenv.cfg"), _join(site_prefix, "pyvenv.cfg")):
            self.budget.tick()
            if not self.files.isfile(host_path(self.node, conf, "/", self.files)):
                continue
            data = read_small(self.node, conf, self.budget, MAX_CFG_BYTES, self.files) or b""
            self.decode(data, conf, "utf-8")  # site.py opens it as UTF-8
            system_site = "true"
            for key, value in cfg_pairs(data):
                if key == "include-system-site-packages":
                    system_site = value.lower()
            if v >= (3, 14):
                # sys.prefix came from getpath; PREFIXES = [prefix,
                # exec_prefix] (+ the base ones with system site packages)
                site_prefix = self.prefix
                if system_site == "true":
                    prefixes += [self.base_prefix, self.base_exec_prefix]
            else:
                self.venv = site_prefix
                self.prefix = self.exec_prefix = site_prefix
                if system_site == "true":
                    prefixes.insert(0, site_prefix)
            self.add_site_packages([site_prefix], "venv")
            if system_site != "true":
                prefixes = [site_prefix]
                enable_user = False
                self.system_site = False
            break
        if enable_user is None:
            enable_user = not self.flags.no_user_site and not self.flags.isolated and (
                self.getenv("PYTHONNOUSERSITE") is None)
        self.user_site = None
        base = self.getenv("PYTHONUSERBASE", always=True)
        base_origin = "PYTHONUSERBASE"
        if base is None:
            home = self.env.get("HOME")
            self.files.note_env("HOME", home)
            base_origin = "HOME"
            if home is None:
                if enable_user:
                    self.notes.append("HOME is not set in the step environment: the user "
                                      "site (~/.local) was not looked at")
                enable_user = False
            else:
                base = (home.rstrip("/") or "") + "/.local" if home else "/.local"
        if enable_user and base is not None:
            self.user_site = f"{base}/lib/python{self.xy}/site-packages"
            if self.isdir(self.user_site):
                self.addsitedir(self.user_site, "user-site", base_origin)
        self.add_site_packages(prefixes, "prefix" if self.venv is None else "base prefix")
        if v < (3, 8):
            self.notes.append(f"CPython {v[0]}.{v[1]} is modelled as 3.8")

    def is_debian_site(self) -> bool:
        """Debian and Ubuntu patch site.py to use dist-packages; the patched
        file says so, wherever the interpreter lives (a copy of Debian's
        python in another prefix keeps the patch)."""
        data = read_small(self.node, _join(self.stdlib, "site.py"), self.budget, 256 * 1024,
                          self.files)
        return bool(data) and b'"dist-packages"' in data

    def site_packages(self, prefixes: list[str]) -> list[str]:
        out: list[str] = []
        seen: set[str] = set()
        xy = self.xy
        libdirs = [self.platlibdir] if self.version >= (3, 9) else ["lib"]
        if libdirs[0] != "lib":
            libdirs.append("lib")
        in_venv = self.venv is not None
        for prefix in prefixes:
            if not prefix or prefix in seen:
                continue
            seen.add(prefix)
            if self.debian:
                if in_venv:
                    out.append(f"{prefix}/lib/python{xy}/site-packages")
                out.append(f"{prefix}/local/lib/python{xy}/dist-packages")
                out.append(f"{prefix}/lib/python3/dist-packages")
                out.extend(f"{prefix}/{lib}/python{xy}/dist-packages" for lib in libdirs)
            else:
                out.extend(f"{prefix}/{lib}/python{xy}/site-packages" for lib in libdirs)
        return out

    def add_site_packages(self, prefixes: list[str], origin: str) -> None:
        for d in self.site_packages(prefixes):
            if self.isdir(d):
                self.addsitedir(d, "site-packages", origin)

    def addsitedir(self, sitedir: str, kind: str, origin: str) -> None:
        sitedir = abspath(sitedir, self.cwd)
        if sitedir not in self.known:
            self.known.add(sitedir)
            self.add(sitedir, kind, origin)
        if sitedir not in self.site_dirs:
            self.site_dirs.append(sitedir)
        try:
            names = listdir(host_path(self.node, sitedir, "/", self.files), self.files)
        except OSError:
            return
        pths = [n for n in names if n.endswith(".pth")]
        if self.version >= (3, 13):
            pths = [n for n in pths if not n.startswith(".")]
        for name in sorted(pths):
            self.budget.tick()
            self.addpackage(sitedir, name)

    def addpackage(self, sitedir: str, name: str) -> None:
        fullname = _join(sitedir, name)
        # site.py reads a venv's site-packages twice (venv() and again as a
        # PREFIXES entry); its lines are read once here
        lines = self.pth_cache.get(fullname)
        if lines is None:
            lines = self.pth_cache[fullname] = self.pth_file_lines(fullname)
        for line in lines:
            if line.startswith("#") or not line.strip():
                continue
            if line.startswith(("import ", "import\t")):
                self.pth_imports.append((fullname, line.rstrip("\n")))
                if "__editable__" in line:
                    self.editable_finder(fullname, line.rstrip())
                continue
            line = line.rstrip()
            if "\0" in line:
                continue  # os.path.exists is False for it
            d = abspath(_join(sitedir, line) if not line.startswith("/") else line, self.cwd)
            if d not in self.known and self.exists(d):
                self.known.add(d)
                self.add(d, "pth", fullname)

    def editable_finder(self, fullname: str, line: str) -> None:
        """A setuptools editable finder the line installs: read (never run)
        through sys.path as it stands now, as site.py's exec would import it."""
        from .editable import read_finder
        from .finder import Scope
        from .suffixes import extension_suffixes

        suffixes = extension_suffixes(self.version, self.node.machine,
                                      free_threaded=bool(self.abi_thread))
        found = read_finder(line, fullname, [e.path for e in self.entries
                                             if e.kind != "editable-hook"], suffixes,
                            Scope(self.node, self.cwd, files=self.files), self.budget)
        if found is None:
            return
        if isinstance(found, str):
            self.notes.append(found)
            return
        if any(f.module == found.module for f in self.editables):
            return  # install() again (a venv's site dir is read twice): nothing new
        self.editables.append(found)
        if found.hook is not None and all(e.path != found.hook for e in self.entries):
            self.add(found.hook, "editable-hook", fullname)

    def pth_file_lines(self, fullname: str) -> list[str]:
        data = read_small(self.node, fullname, self.budget, MAX_PTH_BYTES, self.files)
        if data is None:
            return []
        if self.version >= (3, 13):
            if data.startswith(b"\xef\xbb\xbf"):
                data = data[3:]
            lines = self.decode(data, fullname, "utf-8").splitlines()
        else:
            # text-mode iteration: universal newlines, lines keep no ending
            # after rstrip, which is all site.py looks at
            text = self.decode(data, fullname, "utf-8")
            lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
        self.pth_lines += len(lines)
        if self.pth_lines > MAX_PTH_LINES:
            self.notes.append(f"more than {MAX_PTH_LINES} .pth lines; {fullname} not read")
            return []
        return lines

    # -- sys.path[0] ----------------------------------------------------------

    def path0(self) -> None:
        v = self.version
        cmd = self.command
        if cmd.kind == "none":
            return
        if cmd.kind == "script":
            script = cmd.value
            full = script if script.startswith("/") else (
                self.cwd.rstrip("/") + "/" + script)
            if self.is_importable_main(full):
                # a directory or zip with __main__ is its own sys.path[0],
                # even under -I/-P (pymain_run_python adds the importer's
                # path first); as given before 3.9, made absolute after
                p = script if v < (3, 9) else full
                self.entries.insert(0, PathEntry(p, "script-dir", script, is_system(p, self.node)))
                return
        if self.flags.isolated:
            return
        if v >= (3, 11) and (self.flags.safe_path or self.getenv("PYTHONSAFEPATH")):
            return
        if cmd.kind in ("code", "stdin"):
            entry = PathEntry("", "cwd", "-c" if cmd.kind == "code" else "stdin",
                              is_system(self.cwd, self.node))
        elif cmd.kind == "module":
            entry = PathEntry(self.cwd, "cwd", "-m", is_system(self.cwd, self.node))
        else:
            p = os.path.dirname(node_realpath(self.node, full, files=self.files))
            entry = PathEntry(p, "script-dir", script, is_system(p, self.node))
        self.entries.insert(0, entry)

    def is_importable_main(self, path: str) -> bool:
        """Whether CPython runs ``path`` through an importer (a directory, or
        a zip file: its end-of-central-directory record) instead of as a
        script. Zips with a long archive comment are taken for scripts."""
        host = host_path(self.node, path, "/", self.files)
        try:
            st = self.files.stat(host)
        except OSError:
            return False
        if _stat.S_ISDIR(st.st_mode):
            return True
        if st.st_size < 22:
            return False
        tail = min(st.st_size, 1024)
        self.budget.take_file(tail)
        try:
            fh, st = open_regular(host, self.files)
        except (OSError, ElfError, ValueError):
            return False
        try:
            return b"PK\x05\x06" in fh.pread(tail, max(st.st_size - tail, 0))
        except OSError:
            return False
        finally:
            fh.close()


def _fatal_encodings(v: tuple[int, int]) -> str:
    """What CPython prints when it finds no ``encodings`` (pylifecycle.c)."""
    if v < (3, 8):  # the rest of 3.7's line depends on the locale
        return "Fatal Python error: initfsencoding"
    if v < (3, 13):
        return ("Fatal Python error: init_fs_encoding: failed to get the Python codec of the "
                "filesystem encoding")
    return "Fatal Python error: Failed to import encodings module"


def _fatal_site(v: tuple[int, int]) -> str:
    """What CPython prints when ``import site`` raises (3.8 really says
    "init_import_size")."""
    name = "initsite" if v < (3, 8) else "init_import_size" if v < (3, 9) else "init_import_site"
    return f"Fatal Python error: {name}: Failed to import the site module"


def _join(directory: str, name: str) -> str:
    return directory.rstrip("/") + "/" + name if directory else name


def _parents(directory: str) -> list[str]:
    out = []
    d = directory
    while d and len(out) < 256:
        out.append(d)
        up = os.path.dirname(d)
        if up == d:
            break
        d = up
    return out


def sys_path(interp: Interpreter, flags: PyFlags, command: PyCommand,
             ctx: StepContext) -> SysPath:
    """The interpreter's sys.path for this command, in order, in the step's
    environment, working directory and node (``ctx``). Never raises on odd
    files; BudgetExceeded propagates."""
    m = _Model(interp, flags, command, ctx)
    m.venv = None
    m.system_site = True
    m.user_site = None
    try:
        m.getpath()
        if not flags.no_site:
            m.site()
        m.path0()
    except BudgetExceeded:
        raise
    except Exception as exc:  # odd input must not break the step launch
        m.notes.append(f"the path model stopped: {exc!r}")
    return SysPath(
        entries=tuple(m.entries),
        prefix=getattr(m, "prefix", ""),
        base_prefix=getattr(m, "base_prefix", ""),
        exec_prefix=getattr(m, "exec_prefix", ""),
        venv=m.venv,
        system_site=m.system_site,
        user_site=m.user_site,
        site_dirs=tuple(m.site_dirs),
        pth_imports=tuple(m.pth_imports),
        notes=tuple(m.notes),
        startup_error=m.startup_error,
        editables=tuple(m.editables),
    )
