"""No function of the policy core takes more than six parameters of its own.

Why: the facts a check reads travel together (the node, the files, the
environment, the budget: :class:`grace_policy.context.StepContext`; a
container step's :class:`grace_policy.container.Plan`); a function that
needs more than a handful of loose ones is taking apart a record that
should have been passed whole, and every new fact would grow every
signature again (issue 28). ``self``/``cls`` do not count; ``*args`` and
``**kwargs`` count as one each, so packing does not hide parameters.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "grace_policy"
LIMIT = 6


def _count(fn: ast.FunctionDef | ast.AsyncFunctionDef, in_class: bool) -> int:
    a = fn.args
    names = [*a.posonlyargs, *a.args, *a.kwonlyargs]
    n = len(names) + (a.vararg is not None) + (a.kwarg is not None)
    if in_class and names and names[0].arg in ("self", "cls", "mcs") and not any(
            isinstance(d, ast.Name) and d.id == "staticmethod" for d in fn.decorator_list):
        n -= 1
    return n


def over_limit(root: Path = PACKAGE) -> list[str]:
    """``path:line name (count)`` of every function over :data:`LIMIT`."""
    out: list[str] = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        stack: list[tuple[ast.AST, bool]] = [(tree, False)]
        while stack:
            node, in_class = stack.pop()
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    n = _count(child, in_class)
                    if n > LIMIT:
                        rel = path.relative_to(root.parent)
                        out.append(f"{rel}:{child.lineno} {child.name} ({n})")
                    stack.append((child, False))
                else:
                    stack.append((child, isinstance(child, ast.ClassDef)))
    return sorted(out)


def test_the_counter_counts(tmp_path: Path) -> None:
    """The walk finds what it must: methods without self, nested functions,
    star parameters, and nothing at the limit."""
    pkg = tmp_path / "grace_policy"
    pkg.mkdir()
    (pkg / "m.py").write_text(
        "def ok(a, b, c, d, e, f): pass\n"
        "def seven(a, b, c, d, e, f, *, g): pass\n"
        "def packed(a, b, c, d, e, *args, **kw): pass\n"
        "class C:\n"
        "    def m(self, a, b, c, d, e, f): pass\n"
        "    def n(self, a, b, c, d, e, f, g): pass\n"
        "    @staticmethod\n"
        "    def s(self, a, b, c, d, e, f): pass\n"
        "def outer():\n"
        "    def inner(a, b, c, d, e, f, g): pass\n")
    assert over_limit(pkg) == ["grace_policy/m.py:10 inner (7)", "grace_policy/m.py:2 seven (7)",
                               "grace_policy/m.py:3 packed (7)", "grace_policy/m.py:6 n (7)",
                               "grace_policy/m.py:8 s (7)"]


def test_no_function_takes_more_than_six_parameters() -> None:
    over = over_limit()
    assert not over, "more than 6 parameters (pass the record they belong to):\n" + "\n".join(
        over)


# -- the files a check reads travel as an object (issue 28 item 1) ------------

#: What a module-level file view or read log would be called: the check's
#: :class:`grace_policy.fsprobe.Files` is passed down in its records, never
#: swapped in a module (two checks, or an image and the host, would read
#: through each other's).
STATE_WORDS = ("view", "log", "probe", "files")


def module_state(root: Path = PACKAGE) -> list[str]:
    """``path:line what`` of every ``global`` statement on such a name and
    every module-level assignment to one whose value is not a constant
    (``_MAX_FILES = 64`` is a number; ``_view = None`` or ``_log = []`` is
    state)."""
    out: list[str] = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent)
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Global):
                out += [f"{rel}:{node.lineno} global {name}" for name in node.names
                        if any(w in name.lower() for w in STATE_WORDS)]
        for node in tree.body:
            targets = node.targets if isinstance(node, ast.Assign) else (
                [node.target] if isinstance(node, ast.AnnAssign) else [])
            value = getattr(node, "value", None)
            constant = isinstance(value, ast.Constant) and value.value is not None
            for target in targets:
                if isinstance(target, ast.Name) and not constant and any(
                        w in target.id.lower() for w in STATE_WORDS):
                    out.append(f"{rel}:{node.lineno} module-level {target.id}")
    return sorted(out)


def test_the_state_finder_finds_the_old_gateway(tmp_path: Path) -> None:
    """The shape fsprobe had before issue 28 (a view and a log swapped with
    ``global``) is what the walk reports; constants and locals are not."""
    pkg = tmp_path / "grace_policy"
    pkg.mkdir()
    (pkg / "m.py").write_text(
        "_log = None\n"
        "_view = None\n"
        "_MAX_FILES = 64\n"
        "def start():\n"
        "    global _log\n"
        "    _log = []\n"
        "def use(view):\n"
        "    files = view\n"
        "    return files\n")
    assert module_state(pkg) == ["grace_policy/m.py:1 module-level _log",
                                 "grace_policy/m.py:2 module-level _view",
                                 "grace_policy/m.py:5 global _log"]


def test_no_module_holds_a_file_view_or_a_read_log() -> None:
    state = module_state()
    assert not state, ("module-level file view or read log (pass the check's "
                       "fsprobe.Files in its records):\n" + "\n".join(state))
