"""Every module of grace_policy sits above what it uses: no import circles.

A circle (``check`` importing ``python.step`` which imports ``check`` back,
even inside a function) means neither module can be read, tested or
imported alone in a known order, and a name moved between them can turn a
working lazy import into an ImportError at launch time. The graph counts
module-level and function-level imports alike, and a submodule's import of
its package (``python/__init__.py`` runs first).

The package itself keeps ``ast`` off the launch path; a test may use it.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "grace_policy"


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(REPO).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The grace_policy modules ``name`` imports, anywhere in its code."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            # ``from . import envleak`` imports a module; ``from .x import y``
            # imports x (y is then one of x's names).
            targets = [f"{stem}.{a.name}" if f"{stem}.{a.name}" in modules else stem
                       for a in node.names]
        else:
            continue
        for target in targets:
            # Importing a.b.c runs a/__init__ and a/b/__init__ first.
            parts = target.split(".")
            for i in range(1, len(parts) + 1):
                prefix = ".".join(parts[:i])
                if prefix in modules and prefix != name:
                    found.add(prefix)
    # A submodule's package is imported before it.
    parent = name.rpartition(".")[0]
    if parent in modules:
        found.add(parent)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_graph_sees_the_imports_it_must() -> None:
    # The control: the parser finds module-level, function-level, relative
    # and package imports, so an empty list of circles below means something.
    graph = _graph()
    assert "grace_policy.python.step" in graph["grace_policy.check"]  # in a function
    assert "grace_policy.envleak" in graph["grace_policy.check"]  # from . import envleak
    assert "grace_policy.budget" in graph["grace_policy.python.step"]  # from ..budget
    assert "grace_policy.python" in graph["grace_policy.python.names"]  # its package
    assert "grace_policy.config" in graph["grace_policy.compiled"]  # lazily, in a function
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_circles() -> None:
    graph = _graph()
    circles = _circles(graph)
    shown = ["; ".join(f"{m} -> {', '.join(sorted(graph[m] & set(c)))}" for m in c)
             for c in circles]
    assert not circles, shown


@pytest.mark.parametrize("module", sorted(m for m in _modules()
                                          if not m.endswith("__main__")))
def test_each_module_imports_alone(module: str) -> None:
    # Alone, in a fresh interpreter: a module that only works after another
    # one happened to be imported first fails here.
    subprocess.run([sys.executable, "-c", f"import {module}"], cwd=REPO, check=True,
                   timeout=60, capture_output=True)
