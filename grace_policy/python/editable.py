"""setuptools' editable installs (PEP 660), read from files, never run.

``pip install -e .`` with setuptools >= 64 writes, per project, either a
``.pth`` file with the project's source directory (a src layout: a plain path
line, which :mod:`.sitepath` already follows) or, for a flat layout, a
``.pth`` line ``import __editable___NAME_finder; __editable___NAME_finder
.install()`` and that module, whose literal ``MAPPING = {'pkg':
'/src/pkg', ...}`` names the top-level modules and the directories they come
from (``setuptools/command/editable_wheel.py``, ``_FINDER_TEMPLATE``).
``install()`` appends a finder to ``sys.meta_path`` -- *after* the path
finder, so a module of that name anywhere on ``sys.path`` (a namespace
portion too) wins -- and, when ``NAMESPACES`` is not empty, a path hook and
the ``PATH_PLACEHOLDER`` entry at the end of ``sys.path`` as it is then.

The finder's ``_find_spec`` tries ``PATH/__init__.py``, then ``PATH`` with
each of ``importlib.machinery.all_suffixes()`` (``.py``, ``.pyc``, then the
node's extension suffixes) as its suffix. Submodules are found by the path
finder in the package's directory, as for any package: an extension built
in place on the x86_64 login node lies there and is judged like any other.

Only a module that is the template's shape is believed: ``MAPPING`` and
``NAMESPACES`` assigned literal dicts of strings at module level, a class
``_EditableFinder`` and a function ``install``. Anything else (a cut or
unparsable file, a computed mapping, a ``.pyc``-only finder) is "unknown":
a note, never a guess. Reads are bounded and go through :mod:`.nodepath`, so
the verdict cache records them.

Imported only when a ``.pth`` line names such a finder: a clean step does
not pay for it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from .. import fsprobe
from .._record import dataclass
from ..budget import Budget
from ..node import NodeProfile
from .finder import Located, Scope, find_top_level
from .nodepath import host_path, listdir, read_small
from .suffixes import split_extension

#: A finder module lists one path per top-level name; far bigger is not setuptools'.
MAX_FINDER_BYTES = 512 * 1024
_PYCF_ONLY_AST = 0x400
_PREFIX = "__editable___"
_SUFFIX = "_finder"


@dataclass(frozen=True)
class EditableFinder:
    """One installed editable finder, as its module's literals say."""

    pth: str                      # the .pth file whose line installs it (node path)
    module: str                   # the finder module's file (node path)
    mapping: tuple[tuple[str, str], ...]
    namespaces: tuple[tuple[str, tuple[str, ...]], ...] = ()
    #: PATH_PLACEHOLDER, appended to sys.path when NAMESPACES is not empty
    hook: str | None = None

    @property
    def site_dir(self) -> str:
        return os.path.dirname(self.module)


def finder_name(line: str) -> str | None:
    """The module an ``import M; M.install()`` line installs, when ``M`` is
    named like setuptools' editable finder; else None."""
    parts = [p.strip() for p in line.split(";")]
    first = parts[0].split()
    if len(first) != 2 or first[0] != "import":
        return None
    name = first[1]
    if not (name.startswith(_PREFIX) and name.endswith(_SUFFIX) and name.isidentifier()):
        return None
    if f"{name}.install()" not in parts[1:]:
        return None
    return name


def read_finder(line: str, pth: str, entries: Sequence[str], suffixes: Sequence[str],
                scope: Scope, budget: Budget) -> EditableFinder | str | None:
    """What the ``.pth`` import ``line`` installs: an :class:`EditableFinder`,
    a note (str) when the finder cannot be read for sure, or None when the
    line is no editable finder. ``entries``: ``sys.path`` when site.py runs
    the line (the module is imported through it); ``suffixes``: the
    interpreter's extension suffixes; ``scope``: the node and cwd."""
    name = finder_name(line)
    if name is None:
        return None
    node, cwd, files = scope.node, scope.cwd, scope.files
    loc = find_top_level(name, entries, suffixes, budget, scope)
    if loc.kind != "source":
        what = "is not on sys.path" if loc.kind == "missing" else f"is a {loc.kind}"
        return f"editable finder {name} (from {pth}) {what}: what it maps was not followed"
    data = read_small(host_path(loc.path, node, cwd, files), MAX_FINDER_BYTES + 1, budget,
                      files)
    if data is None or len(data) > MAX_FINDER_BYTES:
        return f"editable finder {loc.path} is unreadable or too big: not followed"
    parsed = parse_finder(data, loc.path)
    if isinstance(parsed, str):
        return f"editable finder {loc.path}: {parsed}; what it maps was not followed"
    mapping, namespaces, hook = parsed
    return EditableFinder(pth=pth, module=loc.path, mapping=mapping, namespaces=namespaces,
                          hook=hook if namespaces else None)


def parse_finder(source: bytes, filename: str = "<finder>"
                 ) -> tuple[tuple[tuple[str, str], ...],
                            tuple[tuple[str, tuple[str, ...]], ...], str | None] | str:
    """``(MAPPING, NAMESPACES, PATH_PLACEHOLDER)`` of a finder module's source,
    or why it is not believed (str). Never raises."""
    try:
        tree = compile(source, filename, "exec", _PYCF_ONLY_AST, dont_inherit=True)
    except (SyntaxError, ValueError, TypeError, MemoryError, RecursionError, OverflowError):
        return "does not parse"
    values: dict[str, object] = {}
    defined: set[str] = set()
    for stmt in getattr(tree, "body", []):
        kind = type(stmt).__name__
        if kind in ("ClassDef", "FunctionDef"):
            defined.add(getattr(stmt, "name", ""))
            continue
        targets: list[object] = []
        if kind == "Assign":
            targets = list(getattr(stmt, "targets", []))
        elif kind == "AnnAssign":
            targets = [getattr(stmt, "target", None)]
        elif kind in ("AugAssign",):
            targets = [getattr(stmt, "target", None)]
        for target in targets:
            tname = getattr(target, "id", None) if type(target).__name__ == "Name" else None
            if tname in ("MAPPING", "NAMESPACES", "PATH_PLACEHOLDER"):
                value = getattr(stmt, "value", None)
                values[tname] = _literal(value) if kind != "AugAssign" else _UNKNOWN
            elif tname is None and kind != "AnnAssign":
                # a, b = ... or MAPPING[...] = ...: could touch the names
                if _mentions(target, ("MAPPING", "NAMESPACES", "PATH_PLACEHOLDER")):
                    return "its mapping is changed by code"
    if not {"_EditableFinder", "install"} <= defined:
        return "is not setuptools' finder (no _EditableFinder/install)"
    mapping = values.get("MAPPING", _UNKNOWN)
    if not isinstance(mapping, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in mapping.items()):
        return "MAPPING is not a literal dict of strings"
    namespaces = values.get("NAMESPACES", {})
    if not isinstance(namespaces, dict) or not all(
            isinstance(k, str) and isinstance(v, list) and all(isinstance(p, str) for p in v)
            for k, v in namespaces.items()):
        return "NAMESPACES is not a literal dict of string lists"
    hook = values.get("PATH_PLACEHOLDER")
    if namespaces and not isinstance(hook, str):
        return "PATH_PLACEHOLDER is not a literal string"
    return (tuple(mapping.items()), tuple((k, tuple(v)) for k, v in namespaces.items()),
            hook if isinstance(hook, str) else None)


class _Unknown:
    pass


_UNKNOWN = _Unknown()


def _literal(node: object) -> object:
    """A str / dict / list literal (and ``'a' + 'b'``, as the template writes
    PATH_PLACEHOLDER), else :data:`_UNKNOWN`."""
    kind = type(node).__name__
    if kind == "Constant":
        value = getattr(node, "value", None)
        return value if isinstance(value, str) else _UNKNOWN
    if kind == "Dict":
        keys = getattr(node, "keys", [])
        vals = getattr(node, "values", [])
        out: dict[object, object] = {}
        for k, v in zip(keys, vals):
            if k is None:
                return _UNKNOWN
            key, value = _literal(k), _literal(v)
            if key is _UNKNOWN or value is _UNKNOWN or not isinstance(key, str):
                return _UNKNOWN
            out[key] = value
        return out
    if kind in ("List", "Tuple"):
        items = [_literal(e) for e in getattr(node, "elts", [])]
        return _UNKNOWN if any(i is _UNKNOWN for i in items) else items
    if kind == "BinOp" and type(getattr(node, "op", None)).__name__ == "Add":
        left, right = _literal(getattr(node, "left", None)), _literal(getattr(node, "right",
                                                                               None))
        if isinstance(left, str) and isinstance(right, str):
            return left + right
    return _UNKNOWN


def _mentions(node: object, names: Sequence[str]) -> bool:
    stack = [node]
    while stack:
        cur = stack.pop()
        if type(cur).__name__ == "Name" and getattr(cur, "id", None) in names:
            return True
        for field in getattr(cur, "_fields", ()):
            value = getattr(cur, field, None)
            if isinstance(value, list):
                stack.extend(v for v in value if hasattr(v, "_fields"))
            elif hasattr(value, "_fields"):
                stack.append(value)
    return False


def _with_suffix(path: str, suffix: str) -> str:
    """``pathlib.PurePath.with_suffix``: the last ``.part`` of the name (not a
    leading dot) is replaced."""
    head, name = os.path.split(path)
    dot = name.rfind(".")
    if 0 < dot < len(name) - 1:
        name = name[:dot]
    return os.path.join(head, name + suffix)


def locate(name: str, finders: Sequence[EditableFinder], suffixes: Sequence[str],
           budget: Budget, scope: Scope) -> Located | None:
    """What the editable finders answer for ``name`` (a top-level name, or a
    dotted one the path finder did not find in its parent) when the path
    finder found nothing: the first finder mapping it, as its ``_find_spec``
    tries the candidates; a name of ``NAMESPACES`` is a namespace package
    whose portions are the listed directories (its path hook's answer).
    ``entry`` is the finder's site directory (its distribution lives there).
    A mapped name with no candidate is ``missing``, with the files of other
    platforms' builds as ``foreign``; None when no finder maps the name. A
    relative mapped path is against the scope's ``cwd`` (``pathlib.Path.exists``
    of it); paths are the scope's node's, read in its files."""
    from .finder import BYTECODE_SUFFIXES, SOURCE_SUFFIXES

    node, cwd, files = scope.node, scope.cwd, scope.files
    kinds = [(s, "source") for s in SOURCE_SUFFIXES] + [(s, "bytecode")
                                                        for s in BYTECODE_SUFFIXES]
    kinds += [(s, "extension") for s in suffixes]
    mapped = False
    foreign: list[str] = []
    for f in finders:
        target = dict(f.mapping).get(name)
        if target is None:
            continue
        mapped = True
        budget.tick()
        if not target.startswith("/"):
            target = os.path.join(cwd or "/", target)   # not normalised: the kernel resolves ..
        target = target.rstrip("/") or "/"
        if files.exists(host_path(f"{target}/__init__.py", node, "/", files)):
            return Located(name=name, kind="package", path=target, entry=f.site_dir)
        for suffix, kind in kinds:
            candidate = _with_suffix(target, suffix)
            if files.exists(host_path(candidate, node, "/", files)):
                return Located(name=name, kind=kind, path=candidate, entry=f.site_dir)
        foreign += _foreign_builds(target, suffixes, node, files)
    if not mapped:
        for f in finders:
            portions = dict(f.namespaces).get(name)
            if portions is not None:
                return Located(name=name, kind="namespace",
                               path=portions[0] if portions else (f.hook or ""),
                               entry=f.site_dir, portions=tuple(portions))
        return None
    return Located(name=name, kind="missing", path="", entry="", foreign=tuple(foreign))


def _foreign_builds(target: str, suffixes: Sequence[str], node: NodeProfile | None,
                    files: fsprobe.Files) -> list[str]:
    """Extension files next to a mapped module path that carry a tag the
    node does not accept (``edfast.cpython-311-x86_64-linux-gnu.so`` built
    in place on the login node)."""
    head, name = os.path.split(target)
    stem = _with_suffix(name, "")
    try:
        names = listdir(host_path(head or "/", node, "/", files), files)
    except (OSError, ValueError):
        return []
    out = []
    for fname in sorted(names):
        split = split_extension(fname)
        if split and split[0] == stem and split[1] not in suffixes:
            out.append(os.path.join(head, fname))
    return out
