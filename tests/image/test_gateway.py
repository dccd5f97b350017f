"""Every reader reads through fsprobe's Files (the one view of the files).

A raw ``os.stat``/``open`` in a reader would read the *host* while the step
runs in an image (a host file shadowing the image's program would decide the
verdict). This test reads the readers' source and fails on any filesystem
call that bypasses :mod:`grace_policy.fsprobe`; the few that must read the
host on purpose are listed with why.
"""

from __future__ import annotations

import ast
from pathlib import Path

import grace_policy

PKG = Path(grace_policy.__file__).resolve().parent
READERS = ["launch.py", "elf.py", "loader.py", "ldcache.py", "layout.py", "pagecode.py",
           "node.py", "envleak.py", "causes.py", "check.py", "a64.py",
           *sorted(str(p.relative_to(PKG)) for p in (PKG / "python").glob("*.py"))]
#: os / os.path functions that touch the filesystem.
FS_CALLS = {"stat", "lstat", "open", "listdir", "scandir", "access", "readlink", "walk",
            "exists", "lexists", "isfile", "isdir", "islink", "realpath", "getsize",
            "fstat", "pread", "read"}
#: (module, function) that read the host on purpose.
ALLOWED = {
    # The node's CPU, not a file of the step (loader._host_cpu).
    ("loader.py", "_host_cpu"),
}


def _calls(tree: ast.AST, where: str = "<module>"):  # type: ignore[no-untyped-def]
    """(innermost function name, call) for every call."""
    for node in ast.iter_child_nodes(tree):
        inner = node.name if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) \
            else where
        if isinstance(node, ast.Call):
            yield where, node
        yield from _calls(node, inner)


def test_readers_use_the_gateway() -> None:
    bad = []
    for rel in READERS:
        tree = ast.parse((PKG / rel).read_text())
        for func, call in _calls(tree):
            target = call.func
            hit = None
            if isinstance(target, ast.Name) and target.id == "open":
                hit = "open"
            elif isinstance(target, ast.Attribute) and target.attr in FS_CALLS:
                base = target.value
                if isinstance(base, ast.Name) and base.id == "os":
                    hit = f"os.{target.attr}"
                elif (isinstance(base, ast.Attribute) and base.attr == "path"
                      and isinstance(base.value, ast.Name) and base.value.id == "os"):
                    hit = f"os.path.{target.attr}"
            if hit and (rel, func) not in ALLOWED:
                bad.append(f"{rel}:{call.lineno} {func}: {hit}")
    assert not bad, "filesystem calls outside fsprobe:\n" + "\n".join(bad)
