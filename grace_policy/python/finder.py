"""Which file the node's importer picks for a module: importlib's PathFinder
and FileFinder, run on the node's suffixes instead of ours.

Modelled on CPython's ``importlib._bootstrap_external`` (3.8-3.14 agree on
this part):

- ``PathFinder`` walks the ``sys.path`` entries in order; the first entry
  whose finder returns a loader wins; namespace portions (directories without
  ``__init__``) are collected and only become a namespace package when no
  entry has a real module. ``''`` is the current directory. Entries that are
  not directories (zip files, missing paths) have no ``FileFinder``; zip
  imports are not modelled (they hold no extension modules that can load).
- ``FileFinder.find_spec`` lists its directory once; a name that is listed
  there is tried as a package first (``name/__init__`` + each suffix, in
  loader order: extension suffixes, ``.py``, ``.pyc``), then as a module
  file (``name`` + each suffix); a listed directory without ``__init__`` is a
  namespace portion. Only names the listing holds are stat'ed.

A module whose only files carry another platform's or Python's tag is exactly
what the node's importer cannot see: it answers ModuleNotFoundError. Those
files are returned as ``foreign`` so the message can say which build is there.

Paths are node paths; with a node image (``node.root`` not ``/``) each is read
at its place in the image when it exists there, else at the same path here
(shared storage), by the loader's own rule (``nodepath.host_path``).
"""

from __future__ import annotations

import os
import stat as _stat
from collections.abc import Sequence

from .. import fsprobe
from .._record import dataclass, field
from ..budget import Budget
from ..node import NodeProfile
from .nodepath import host_path
from .nodepath import listdir as _listdir
from .nodepath import scandir as _scandir
from .suffixes import split_extension

SOURCE_SUFFIXES = (".py",)
BYTECODE_SUFFIXES = (".pyc",)
#: Directories no import reaches (bytecode caches).
_SKIP_DIRS = frozenset({"__pycache__"})
#: Directories of headers and build data inside packages (torch/include,
#: torch/share/cmake): importable in theory (as namespace packages), never in
#: practice. For ``package_extensions(skip_dirs=DATA_DIRS)``.
DATA_DIRS = frozenset({"include", "share"})
#: Bounds for hostile trees: a package deeper than this is not walked further.
MAX_DEPTH = 64


@dataclass(frozen=True)
class Located:
    name: str                 # the module name asked for (top-level, or dotted: find_module)
    #: "package" | "extension" | "source" | "bytecode" | "namespace" | "missing"
    kind: str
    path: str                 # package dir / module file / "" when missing (node path)
    entry: str                # the sys.path entry it was found in ("" when missing)
    #: Extension files for this name carrying a tag the node does not accept,
    #: in entries searched before the module was found (all entries when it
    #: was not): what the user installed instead of a build for the node.
    foreign: tuple[str, ...] = ()
    #: For a namespace package: all its portions, in order (its ``__path__``).
    portions: tuple[str, ...] = ()


# -- the filesystem, through the search's files ---------------------------------


class _Dir:
    """One directory's listing, as ``FileFinder._fill_cache`` keeps it."""

    __slots__ = ("names", "so_files")

    def __init__(self, names: list[str]) -> None:
        self.names = frozenset(names)
        self.so_files: dict[str, list[str]] | None = None

    def tagged(self, name: str) -> list[str]:
        """Files ``name.<tag>.so`` of any CPython tag (computed once per dir)."""
        if self.so_files is None:
            found: dict[str, list[str]] = {}
            for fname in self.names:
                if fname.endswith(".so"):
                    split = split_extension(fname)
                    if split is not None:
                        found.setdefault(split[0], []).append(fname)
            self.so_files = found
        return self.so_files.get(name, [])


def _dir_listing(host: str, scope: Scope, listings: dict[str, _Dir | None],
                 budget: Budget) -> _Dir | None:
    if host in listings:
        return listings[host]
    budget.tick()
    listing: _Dir | None = None
    if scope.files.isdir(host):
        try:
            listing = _Dir(_listdir(host, scope.files))
        except (OSError, ValueError):
            listing = _Dir([])      # FileFinder: an unreadable dir lists as empty
    listings[host] = listing
    return listing


def _valid_name(name: str) -> bool:
    return bool(name) and "." not in name and "/" not in name and "\0" not in name


@dataclass(frozen=True)
class Scope:
    """Where a search runs: the node whose paths are looked up (None: this
    host), the working directory ``''`` and relative entries are against,
    and the directory listings shared by several searches (pass the same
    dict to list each directory once, as ``sys.path_importer_cache`` does
    for the real importer), and the check's files (host or image) and record
    the search reads."""

    node: NodeProfile | None = None
    cwd: str = "/"
    listings: dict[str, _Dir | None] | None = field(default=None, compare=False)
    files: fsprobe.Files = field(default=fsprobe.HOST, compare=False)


def find_top_level(name: str, entries: Sequence[str], suffixes: Sequence[str], budget: Budget,
                   scope: Scope | None = None) -> Located:
    """Where the node's ``import name`` (a top-level name) is found.

    ``entries``: sys.path in order (node paths). ``suffixes``: the node's
    extension suffixes (:func:`suffixes.extension_suffixes`).
    """
    scope = scope or Scope()
    node, cwd, files = scope.node, scope.cwd, scope.files
    listings = scope.listings if scope.listings is not None else {}
    if not _valid_name(name):
        return Located(name=name, kind="missing", path="", entry="")
    loaders = [(s, "extension") for s in suffixes]
    loaders += [(s, "source") for s in SOURCE_SUFFIXES]
    loaders += [(s, "bytecode") for s in BYTECODE_SUFFIXES]
    foreign: list[str] = []
    portions: list[str] = []
    first_portion_entry = ""
    accepted = set(suffixes)
    for entry in entries:
        budget.tick()
        if not isinstance(entry, str):
            continue
        node_dir = entry if entry.startswith("/") else os.path.join(cwd or "/", entry)
        host_dir = host_path(node_dir, node, cwd, files)
        listing = _dir_listing(host_dir, scope, listings, budget)
        if listing is None:
            continue
        is_namespace = False
        if name in listing.names:
            base_host = os.path.join(host_dir, name)
            for suffix, _kind in loaders:
                if files.isfile(os.path.join(base_host, "__init__" + suffix)):
                    return Located(name=name, kind="package", path=os.path.join(node_dir, name),
                                   entry=entry, foreign=tuple(foreign))
            is_namespace = files.isdir(base_host)
        for suffix, kind in loaders:
            fname = name + suffix
            if fname in listing.names and files.isfile(os.path.join(host_dir, fname)):
                return Located(name=name, kind=kind, path=os.path.join(node_dir, fname),
                               entry=entry, foreign=tuple(foreign))
        for fname in sorted(listing.tagged(name)):
            if fname[len(name):] not in accepted:
                foreign.append(os.path.join(node_dir, fname))
        if is_namespace:
            if not portions:
                first_portion_entry = entry
            portions.append(os.path.join(node_dir, name))
    if portions:
        return Located(name=name, kind="namespace", path=portions[0], entry=first_portion_entry,
                       foreign=tuple(foreign), portions=tuple(portions))
    return Located(name=name, kind="missing", path="", entry="", foreign=tuple(foreign))


def find_module(dotted: str, entries: Sequence[str], suffixes: Sequence[str], budget: Budget,
                scope: Scope | None = None) -> Located:
    """Where the node's ``import a.b.c`` finds ``a.b.c`` (e.g. for ``-m a.b.c``).

    The top-level name on ``entries``, then each further name in its
    parent's directories: a regular package's own directory, a namespace
    package's portions. A parent that is a plain module is no package
    (ModuleNotFoundError: "... is not a package") -> ``missing``. Not
    modelled: ``__init__`` code that changes ``__path__`` (pkgutil-style
    namespaces). ``entry`` is the sys.path entry of the top-level package.
    """
    if scope is None or scope.listings is None:
        scope = Scope(scope.node, scope.cwd, {}, scope.files) if scope else Scope(listings={})
    parts = dotted.split(".")
    if not all(_valid_name(p) for p in parts):
        return Located(name=dotted, kind="missing", path="", entry="")
    loc = find_top_level(parts[0], entries, suffixes, budget, scope)
    entry = loc.entry
    for part in parts[1:]:
        if loc.kind == "package":
            dirs: Sequence[str] = (loc.path,)
        elif loc.kind == "namespace":
            dirs = loc.portions
        else:
            return Located(name=dotted, kind="missing", path="", entry=entry,
                           foreign=loc.foreign)
        loc = find_top_level(part, dirs, suffixes, budget, scope)
    return Located(name=dotted, kind=loc.kind, path=loc.path, entry=entry if loc.path else "",
                   foreign=loc.foreign, portions=loc.portions)


# -- every extension module of a package tree ---------------------------------


def package_extensions(pkg_dir: str, suffixes: Sequence[str], budget: Budget, *,
                       scope: Scope | None = None, prefix: str | None = None,
                       skip_dirs: frozenset[str] = frozenset(),
                       ) -> tuple[list[tuple[str, str]], list[tuple[str, tuple[str, ...]]]]:
    """The extension modules under a package directory, as the node would see them.

    Returns ``(loaded, foreign)``: ``loaded`` = ``[(dotted name, file)]`` the
    node's importer would load for each module name (per directory, the first
    of ``suffixes`` that exists; an ``__init__`` extension is the package
    itself); ``foreign`` = ``[(dotted name, files)]`` for names that exist
    only as extension files with tags the node does not accept (and no
    ``.py``/``.pyc``: a pure-Python fallback imports fine). A name that is
    also a regular package directory is the package (FileFinder tries the
    directory first), so its extension files are neither.

    One ``scandir`` per directory and no per-file stat (``DirEntry.is_dir()``
    comes with the listing); symlinked directories are followed as the
    importer does, once each (loops end). ``__pycache__`` and directories
    whose names hold a dot (``foo.libs``, ``x.dist-info``: no import name can
    reach them) are not walked. Paths returned are node paths under
    ``pkg_dir``; ``prefix`` is the dotted name of ``pkg_dir`` (default: its
    base name). ``prefix=""`` walks a whole site directory: its top-level
    extension modules and every package in it (``*.dist-info``, ``*.libs``
    are skipped by the dot rule), for the environment-wide warnings.
    ``skip_dirs``: directory names not to walk at any depth -- an opt-in
    trade of exactness for cost (:data:`DATA_DIRS`: torch's ``include/``
    alone is about 10,000 header files no import reaches in practice).
    ``scope``: the node whose paths these are and the files they are read
    in (its cwd and listings are not used); default this host.
    """
    scope = scope or Scope()
    node, files = scope.node, scope.files
    loaded: list[tuple[str, str]] = []
    foreign: list[tuple[str, tuple[str, ...]]] = []
    pkg_dir = pkg_dir.rstrip("/") or "/"
    top = prefix if prefix is not None else os.path.basename(pkg_dir)
    host_top = host_path(pkg_dir, node, "/", files)
    ext = tuple(suffixes)
    # Each suffix's rank, and the longest first so "x.abi3.so" is not read as "x.abi3" + ".so".
    rank = {s: i for i, s in enumerate(ext)}
    by_length = sorted(ext, key=len, reverse=True)
    seen: set[tuple[int, int]] = set()
    try:
        st = files.stat(host_top)
    except OSError:
        return loaded, foreign
    if not _stat.S_ISDIR(st.st_mode):
        return loaded, foreign
    seen.add((st.st_dev, st.st_ino))
    # (host dir, node dir, dotted name, depth)
    stack: list[tuple[str, str, str, int]] = [(host_top, pkg_dir, top, 0)]
    while stack:
        host_dir, node_dir, dotted, depth = stack.pop()
        budget.tick()
        try:
            items = _scandir(host_dir, files)
        except (OSError, ValueError):
            continue
        best: dict[str, tuple[int, str]] = {}     # stem -> (suffix rank, file name)
        tagged: dict[str, list[str]] = {}          # stem -> foreign extension files
        pure: set[str] = set()
        packages: set[str] = set()
        subdirs: list[tuple[str, str, bool]] = []
        for i, item in enumerate(items):
            if not i & 1023:
                budget.tick()      # a directory of a million names is still bounded
            fname = item.name
            try:
                is_dir = item.is_dir()
            except OSError:
                continue
            if is_dir:
                if fname in _SKIP_DIRS or "." in fname or depth >= MAX_DEPTH \
                        or fname in skip_dirs:
                    continue
                try:
                    link = item.is_symlink()
                except OSError:
                    continue
                subdirs.append((fname, item.path, link))
                continue
            if fname.endswith(".py") or fname.endswith(".pyc"):
                stem = fname[:fname.rindex(".")]
                if "." not in stem:
                    pure.add(stem)
                continue
            if not fname.endswith(".so"):
                continue
            matched = False
            for suffix in by_length:
                if fname.endswith(suffix):
                    stem = fname[:-len(suffix)]
                    if stem and "." not in stem:
                        r = rank[suffix]
                        old = best.get(stem)
                        if old is None or r < old[0]:
                            best[stem] = (r, fname)
                        matched = True
                        break
            if matched:
                continue
            split = split_extension(fname)
            if split is not None:
                tagged.setdefault(split[0], []).append(fname)
        for sub, sub_host, link in subdirs:
            budget.tick()
            if link:
                # Followed as the importer follows it, but each real directory once.
                try:
                    sst = files.stat(sub_host)
                except OSError:
                    continue
                key = (sst.st_dev, sst.st_ino)
                if key in seen:
                    continue
                seen.add(key)
            stack.append((sub_host, os.path.join(node_dir, sub), _dot(dotted, sub), depth + 1))
            packages.add(sub)
        for stem, (_r, fname) in best.items():
            if stem in packages and _is_regular_package(os.path.join(host_dir, stem), ext, files):
                continue
            name = dotted if stem == "__init__" else _dot(dotted, stem)
            loaded.append((name, os.path.join(node_dir, fname)))
        for stem, tagged_files in tagged.items():
            if stem in best or stem in pure:
                continue
            if stem in packages and _is_regular_package(os.path.join(host_dir, stem), ext, files):
                continue
            name = dotted if stem == "__init__" else _dot(dotted, stem)
            foreign.append((name, tuple(os.path.join(node_dir, f)
                                        for f in sorted(tagged_files))))
    loaded.sort()
    foreign.sort()
    return loaded, foreign


def _dot(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _is_regular_package(host_dir: str, suffixes: Sequence[str], files: fsprobe.Files) -> bool:
    """``FileFinder``'s package test (rare: only when a module file and a
    directory share a name)."""
    for suffix in (*suffixes, *SOURCE_SUFFIXES, *BYTECODE_SUFFIXES):
        if files.isfile(os.path.join(host_dir, "__init__" + suffix)):
            return True
    return False
