"""What a Python step is known to use: the top-level modules its command names.

Why: a broken package the step imports must reject the step; one it never
imports is a warning. What is certain before launch is what the command line
names: ``-m MODULE``, the imports of ``-c CODE``, and the imports a script
makes when it starts -- its module-level ``import`` statements, including
those under ``if``/``try``/``with``/``for``/``while``/``match`` at module level
(``if __name__ == "__main__":`` bodies run for a script), but not those inside
functions or classes, which may never run. ``importlib.import_module("x")``
and ``__import__("x")`` with a literal name at module level count too.
Relative imports name the script's own package and are left out.

Parsing uses ``compile(..., PyCF_ONLY_AST)``, which builds the syntax tree in C
without importing :mod:`ast`. A file that does not parse (binary, another
language, syntax newer than the checker's Python) is cut before the error
line and parsed again, a few times: imports are nearly always at the top.
What still does not parse yields nothing -- unknown use, never an error.

``-m pkg.sub`` gives ``pkg`` only: the module file is found by the finder
(on the node's ``sys.path``), and the caller may pass its path back here as
a ``"script"`` to read what it imports (a console-script wrapper such as
``torchrun`` is a plain script: the same function covers it).
"""

from __future__ import annotations

import os

from .. import fsprobe
from ..budget import Budget, BudgetExceeded
from ..node import NodeProfile
from .nodepath import host_path, read_small

_PYCF_ONLY_AST = 0x400
#: Statement bodies that run when the module runs.
_BODIES = ("body", "orelse", "finalbody", "handlers", "cases")
#: Nodes whose bodies do not run at import time.
_DEFERRED = frozenset({"FunctionDef", "AsyncFunctionDef", "ClassDef", "Lambda"})
_RETRIES = 3
#: Sources longer than this are first parsed with their def/class bodies stubbed.
_REDUCE_ABOVE = 8 * 1024
_DEFS = (b"def ", b"async def ", b"class ")
_NOT_A_START = frozenset({b"", b" ", b"\t", b"\r", b"\f", b"#", b")", b"]", b"}"})
_MAX_NODES = 200_000


def _top(name: object) -> str | None:
    if not isinstance(name, str) or not name or name.startswith("."):
        return None
    first = name.split(".", 1)[0]
    return first if first.isidentifier() else None


def _call_target(node: object) -> str | None:
    """``import_module("x")`` / ``importlib.import_module("x")`` / ``__import__("x")``."""
    func = getattr(node, "func", None)
    kind = type(func).__name__
    if kind == "Name":
        fname = getattr(func, "id", "")
    elif kind == "Attribute":
        fname = getattr(func, "attr", "")
    else:
        return None
    if fname not in ("import_module", "__import__"):
        return None
    args = getattr(node, "args", None) or []
    if not args or type(args[0]).__name__ != "Constant":
        return None
    if fname == "import_module" and len(args) > 1:
        value = getattr(args[0], "value", None)
        if isinstance(value, str) and value.startswith("."):
            return None
    return _top(getattr(args[0], "value", None))


def _walk_expr(node: object, out: dict[str, None], budget: list[int]) -> None:
    """Calls anywhere in an expression that is evaluated now (not in lambdas)."""
    stack = [node]
    while stack:
        cur = stack.pop()
        budget[0] -= 1
        if budget[0] < 0:
            return
        kind = type(cur).__name__
        if kind in _DEFERRED:
            continue
        if kind == "Call":
            name = _call_target(cur)
            if name:
                out[name] = None
        for field in getattr(cur, "_fields", ()):
            value = getattr(cur, field, None)
            if isinstance(value, list):
                stack.extend(v for v in reversed(value) if hasattr(v, "_fields"))
            elif hasattr(value, "_fields"):
                stack.append(value)


def _module_imports(tree: object) -> tuple[str, ...]:
    out: dict[str, None] = {}
    left = [_MAX_NODES]
    stmts = list(reversed(getattr(tree, "body", []) or []))
    while stmts:
        stmt = stmts.pop()
        left[0] -= 1
        if left[0] < 0:
            break
        kind = type(stmt).__name__
        if kind in _DEFERRED:
            # decorators and base classes run now; the body later
            for expr in (getattr(stmt, "decorator_list", None) or []) + \
                    (getattr(stmt, "bases", None) or []):
                _walk_expr(expr, out, left)
            continue
        if kind == "Import":
            for alias in getattr(stmt, "names", []):
                name = _top(getattr(alias, "name", None))
                if name:
                    out[name] = None
            continue
        if kind == "ImportFrom":
            if not getattr(stmt, "level", 0):
                name = _top(getattr(stmt, "module", None))
                if name:
                    out[name] = None
            continue
        nested: list[object] = []
        for field in getattr(stmt, "_fields", ()):
            value = getattr(stmt, field, None)
            if field in _BODIES and isinstance(value, list):
                nested.extend(value)
            elif isinstance(value, list):
                for v in value:
                    if hasattr(v, "_fields"):
                        _walk_expr(v, out, left)
            elif hasattr(value, "_fields"):
                _walk_expr(value, out, left)
        # ExceptHandler / match_case are not statements: their bodies are.
        expanded: list[object] = []
        for item in nested:
            if type(item).__name__ in ("ExceptHandler", "match_case"):
                expanded.extend(getattr(item, "body", []) or [])
            else:
                expanded.append(item)
        stmts.extend(reversed(expanded))     # popped in source order
    return tuple(out)


def _reduced(text: bytes | str) -> bytes | str | None:
    """The source with each top-level ``def``/``class`` body replaced by a stub.

    Why: parsing is what costs (about 0.5 ms per KiB of source, in C), and in
    a long module most of the text is function and class bodies, which hold
    no import that runs at start. A top-level statement starts at column 0
    outside a triple-quoted string (tracked by counting triple quotes: a
    heuristic). When the guess is wrong the stubbed text no longer parses and
    the caller parses the whole file instead; the reference tests compare
    both ways on real files.
    """
    raw = text.encode("utf-8", "surrogateescape") if isinstance(text, str) else text
    lines = raw.split(b"\n")
    out: list[bytes] = []
    skipping = False
    dq = sq = 0
    for line in lines:
        if not (dq & 1 or sq & 1) and line[:1] not in _NOT_A_START:
            if line.startswith(_DEFS):
                if not skipping:
                    out.append(b"def _():\n pass")
                skipping = True
            else:
                skipping = False
        if not skipping:
            out.append(line)
        if b"\"\"\"" in line:
            dq += line.count(b"\"\"\"")
        if b"\'\'\'" in line:
            sq += line.count(b"\'\'\'")
    if len(out) == len(lines):
        return None
    return b"\n".join(out)


def _parse(text: bytes | str, filename: str) -> object:
    return compile(text, filename, "exec", _PYCF_ONLY_AST, dont_inherit=True)


def source_imports(source: bytes | str, filename: str = "<string>") -> tuple[str, ...]:
    """Top-level names a module's source imports when it runs (see the module
    docstring). Never raises."""
    if len(source) > _REDUCE_ABOVE:
        small = _reduced(source)
        if small is not None:
            try:
                return _module_imports(_parse(small, filename))
            except Exception:      # the guess was wrong: parse it all
                pass
    text = source
    for _ in range(_RETRIES + 1):
        try:
            tree = _parse(text, filename)
        except SyntaxError as exc:
            line = exc.lineno or 0
            if line <= 1:
                return ()
            text = _first_lines(text, line - 1)
            continue
        except (ValueError, TypeError, MemoryError, RecursionError, OverflowError):
            return ()
        try:
            return _module_imports(tree)
        except (RecursionError, MemoryError):
            return ()
    return ()


def _first_lines(text: bytes | str, count: int) -> bytes | str:
    nl = b"\n" if isinstance(text, bytes) else "\n"
    pos = -1
    for _ in range(count):
        pos = text.find(nl, pos + 1)   # type: ignore[arg-type]
        if pos < 0:
            return text
    return text[:pos + 1]


#: The most of a script :func:`command_imports` reads.
SCRIPT_BYTES = 256 * 1024


def read_script(path: str, *, cwd: str, node: NodeProfile, budget: Budget,
                max_bytes: int = SCRIPT_BYTES,
                files: fsprobe.Files = fsprobe.HOST) -> bytes | None:
    """The first ``max_bytes`` of a script (node path, relative to ``cwd``),
    stat'ed in ``files`` and charged to the budget; None if unreadable."""
    node_path = path if path.startswith("/") else os.path.join(cwd or "/", path)
    return read_small(host_path(node_path, node, cwd, files), max_bytes, budget, files)


def command_imports(kind: str, value: str, *, cwd: str, node: NodeProfile, budget: Budget,
                    files: fsprobe.Files = fsprobe.HOST) -> tuple[str, ...]:
    """Top-level module names the command is known to import (in first-use order).

    ``kind``/``value`` as in ``interp.PyCommand``: ``"module"`` -> the first
    component of the module name; ``"code"`` -> the imports of the ``-c``
    text; ``"script"`` -> the script file's (read in ``files``, at most
    :data:`SCRIPT_BYTES`: a longer file is cut at its last complete line);
    ``"stdin"``/``"none"`` -> nothing. Never raises, except BudgetExceeded.
    """
    max_bytes = SCRIPT_BYTES
    try:
        if kind == "module":
            name = _top(value)
            return (name,) if name else ()
        if kind == "code":
            return source_imports(value, "<string>")
        if kind == "script":
            data = read_script(value, cwd=cwd, node=node, budget=budget, max_bytes=max_bytes,
                               files=files)
            if not data:
                return ()
            if len(data) >= max_bytes:
                cut = data.rfind(b"\n")
                data = data[:cut + 1] if cut > 0 else data
            return source_imports(data, value)
    except BudgetExceeded:
        raise
    except Exception:       # the checker must never fail on a user's file
        return ()
    return ()
