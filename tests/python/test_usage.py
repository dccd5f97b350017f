"""usage.py: what a command imports.

Oracles: (1) the real interpreter *running* scripts with a meta-path hook that
records each top-level import and hands back a stand-in module, for scripts
whose imports all run; (2) an independent reference walk written with the
:mod:`ast` module (which usage.py must not import), over every module of this
machine's standard library and site-packages.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from grace_policy.budget import Budget, BudgetExceeded
from grace_policy.node import NodeProfile
from grace_policy.python.usage import command_imports, source_imports

NODE = NodeProfile(machine="aarch64", page_size=65536, glibc=(2, 36))


def budget() -> Budget:
    return Budget(deadline_ms=60_000, max_files=100_000)


# -- (1) the real interpreter running the code -----------------------------------

_RECORDER = r"""
import importlib.abc, importlib.machinery, json, sys, types
seen = []
class Stub(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return Stub(self.__name__ + "." + name)
    def __call__(self, *a, **k):
        return Stub(self.__name__ + "()")
    __path__ = []
class Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in sys.stdlib_module_names and name.split(".")[0] != "json":
            return None
        top = name.split(".")[0]
        if top not in seen:
            seen.append(top)
        return importlib.machinery.ModuleSpec(name, self, is_package=True)
    def create_module(self, spec):
        return Stub(spec.name)
    def exec_module(self, module):
        pass
sys.meta_path.insert(0, Finder())
import importlib
src = open(sys.argv[1]).read()
exec(compile(src, sys.argv[1], "exec"), {"__name__": "__main__", "__file__": sys.argv[1]})
print("RECORDED" + json.dumps(seen))
"""

RUN_ALL = '''\
import importlib
import alpha, beta.sub as b
from gamma.x import y
import numpy.linalg
if True:
    import delta
try:
    import eps
except ImportError:
    pass
with open(__file__) as fh:
    from zeta import q
for _ in range(1):
    import eta
while True:
    import theta
    break
mod = importlib.import_module("iota.sub")
__import__("kappa")
if __name__ == "__main__":
    import lam
def later():
    import never_called
class K:
    def m(self):
        import never_either
'''


def test_real_interpreter_records_the_same(tmp_path: Path) -> None:
    script = tmp_path / "s.py"
    script.write_text(RUN_ALL)
    rec = tmp_path / "rec.py"
    rec.write_text(_RECORDER)
    out = subprocess.run([sys.executable, "-I", str(rec), str(script)], capture_output=True,
                         text=True, check=True, timeout=60).stdout
    ran = json.loads(out.split("RECORDED", 1)[1])
    got = command_imports("script", str(script), cwd="/", node=NODE, budget=budget())
    assert len(ran) == 12
    assert list(got) == ["importlib", *ran]     # stdlib's importlib is not recorded
    assert "never_called" not in got and "never_either" not in got


def test_branches_not_taken_count_too() -> None:
    got = source_imports("try:\n import fast\nexcept ImportError:\n import slow\n"
                         "if sys.version_info < (3,):\n import py2only\n")
    assert got == ("fast", "slow", "py2only")


@pytest.mark.parametrize(("code", "want"), [
    ("import numpy; numpy.zeros(3)", ("numpy",)),
    ("import os.path, torch.nn as nn", ("os", "torch")),
    ("from . import x\nfrom .a import b\nfrom __future__ import annotations", ("__future__",)),
    ("import_module('.rel', 'pkg')", ()),
    ("x = [__import__(n) for n in names]", ()),          # not a literal
    ("import importlib; importlib.import_module(f'{x}')", ("importlib",)),
    ("print(1", ()),                                      # does not parse at all
    ("import ok\n$$ not python\nimport after", ("ok",)),   # parsed up to the error
    ("", ()),
    ("\0import x", ()),
    ("@decorate(__import__('deco'))\ndef f():\n import inner\n", ("deco",)),
    ("match cmd:\n case 'a':\n  import m_a\n case _:\n  import m_b\n", ("m_a", "m_b")),
    ("try:\n import a\nexcept* ValueError:\n import b\n", ("a", "b")),
    ("async def f():\n import x\n", ()),
])
def test_code_cases(code: str, want: tuple[str, ...]) -> None:
    assert command_imports("code", code, cwd="/", node=NODE, budget=budget()) == want


def test_kinds() -> None:
    kw = {"cwd": "/", "node": NODE, "budget": budget()}
    assert command_imports("module", "torch.distributed.run", **kw) == ("torch",)
    assert command_imports("module", "", **kw) == ()
    assert command_imports("module", ".rel", **kw) == ()
    assert command_imports("module", "9bad", **kw) == ()
    assert command_imports("stdin", "", **kw) == ()
    assert command_imports("none", "", **kw) == ()
    assert command_imports("bogus", "x", **kw) == ()


def test_script_files(tmp_path: Path) -> None:
    kw = {"node": NODE, "budget": budget()}
    (tmp_path / "train.py").write_text("# -*- coding: latin-1 -*-\nimport torch\ns = '\xe9'\n",
                                       encoding="latin-1")
    assert command_imports("script", "train.py", cwd=str(tmp_path), **kw) == ("torch",)
    (tmp_path / "bin").write_bytes(b"\x7fELF\x02\x01\x01" + bytes(200))
    assert command_imports("script", str(tmp_path / "bin"), cwd="/", **kw) == ()
    assert command_imports("script", str(tmp_path / "absent.py"), cwd="/", **kw) == ()
    assert command_imports("script", str(tmp_path), cwd="/", **kw) == ()       # a directory
    (tmp_path / "bom.py").write_bytes(b"\xef\xbb\xbfimport bommod\n")
    assert command_imports("script", "bom.py", cwd=str(tmp_path), **kw) == ("bommod",)
    # a console script as pip writes it
    (tmp_path / "torchrun").write_text(
        "#!/home/u/venv/bin/python3\n# -*- coding: utf-8 -*-\nimport re\nimport sys\n"
        "from torch.distributed.run import main\nif __name__ == '__main__':\n"
        "    sys.argv[0] = re.sub(r'(-script\\.pyw|\\.exe)?$', '', sys.argv[0])\n"
        "    sys.exit(main())\n")
    assert command_imports("script", str(tmp_path / "torchrun"), cwd="/", **kw) == (
        "re", "sys", "torch")


def test_long_script_is_cut_and_bounded(tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from grace_policy.python import usage

    body = "import first\n" + "x = 1\n" * 100_000 + "import last\n"
    (tmp_path / "big.py").write_text(body)
    b = budget()
    monkeypatch.setattr(usage, "SCRIPT_BYTES", 64 * 1024)
    got = command_imports("script", str(tmp_path / "big.py"), cwd="/", node=NODE, budget=b)
    assert got == ("first",)
    assert b.bytes_read <= 64 * 1024
    tiny = Budget(deadline_ms=60_000, max_bytes=1000)
    with pytest.raises(BudgetExceeded):
        command_imports("script", str(tmp_path / "big.py"), cwd="/", node=NODE, budget=tiny)


def test_deeply_nested_source_does_not_raise() -> None:
    assert source_imports("x = " + "(" * 5000 + ")" * 5000) == ()
    assert source_imports("import a\n" + "if x:\n" * 90 + " " * 90 + "import b\n") in (
        ("a",), ("a", "b"))


def test_node_image(tmp_path: Path) -> None:
    image = tmp_path / "img"
    (image / "opt").mkdir(parents=True)
    (image / "opt" / "job.py").write_text("import inimage\n")
    node = NodeProfile(machine="aarch64", page_size=65536, glibc=(2, 36), root=str(image))
    assert command_imports("script", "/opt/job.py", cwd="/", node=node, budget=budget()) == (
        "inimage",)


# -- (2) against an ast-module reference walk, on real files -------------------------


def _reference(src: bytes) -> tuple[str, ...] | None:
    try:
        tree = ast.parse(src)
    except (SyntaxError, ValueError):
        return None
    out: dict[str, None] = {}

    def add(name: str | None) -> None:
        if name and not name.startswith("."):
            out[name.split(".")[0]] = None

    def calls(node: ast.AST) -> None:
        class V(ast.NodeVisitor):
            def visit_Lambda(self, n: ast.Lambda) -> None:
                return

            def visit_FunctionDef(self, n: ast.FunctionDef) -> None:
                return

            def visit_AsyncFunctionDef(self, n: ast.AsyncFunctionDef) -> None:
                return

            def visit_ClassDef(self, n: ast.ClassDef) -> None:
                return

            def visit_Call(self, n: ast.Call) -> None:
                f = n.func
                fname = f.id if isinstance(f, ast.Name) else (
                    f.attr if isinstance(f, ast.Attribute) else "")
                if fname in ("import_module", "__import__") and n.args and isinstance(
                        n.args[0], ast.Constant) and isinstance(n.args[0].value, str):
                    v = n.args[0].value
                    if not (fname == "import_module" and len(n.args) > 1 and v.startswith(".")):
                        if v and v.split(".")[0].isidentifier():
                            add(v)
                self.generic_visit(n)
        V().visit(node)

    def stmts(body: list[ast.stmt]) -> None:
        for s in body:
            if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                for d in s.decorator_list + list(getattr(s, "bases", [])):
                    calls(d)
                continue
            if isinstance(s, ast.Import):
                for a in s.names:
                    if a.name.split(".")[0].isidentifier():
                        add(a.name)
                continue
            if isinstance(s, ast.ImportFrom):
                if not s.level and s.module and s.module.split(".")[0].isidentifier():
                    add(s.module)
                continue
            sub: list[ast.stmt] = []
            for field, value in ast.iter_fields(s):
                if field in ("body", "orelse", "finalbody") and isinstance(value, list):
                    sub += value
                elif field == "handlers":
                    for h in value:
                        sub += h.body
                elif field == "cases":
                    for c in value:
                        sub += c.body
                elif isinstance(value, list):
                    for v in value:
                        if isinstance(v, ast.AST):
                            calls(v)
                elif isinstance(value, ast.AST):
                    calls(value)
            stmts(sub)

    stmts(tree.body)
    return tuple(out)


def _real_files(limit: int) -> list[str]:
    roots = [sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"]]
    files: list[str] = []
    for root in roots:
        for dirpath, dirs, names in os.walk(root):
            dirs.sort()
            files += [os.path.join(dirpath, n) for n in sorted(names) if n.endswith(".py")]
    step = max(1, len(files) // limit)
    return files[::step][:limit]


def test_matches_reference_walk_on_real_files() -> None:
    files = _real_files(1200)
    assert len(files) >= 300     # a minimal Debian stdlib has about 670 modules
    compared = 0
    for path in files:
        with open(path, "rb") as fh:
            src = fh.read()
        want = _reference(src)
        if want is None:
            continue
        assert set(source_imports(src, path)) == set(want), path
        compared += 1
    assert compared > 250


PAD = "x = 1\n" * 2000       # past the size where bodies are stubbed before parsing


@pytest.mark.parametrize("src", [
    'x = \'"""\'\nimport a\ndef f():\n    import no\n"""\nclass C:\n"""\nimport b\n',
    '"""doc\ndef fake():\n    import no\n"""\nimport a\n',
    "def f(a,\nb):\n    import no\nimport a\n",
    "@deco\ndef f():\n    import no\n@deco2\nclass K:\n    import no2\nimport a\n",
    "if x:\n    def f():\n        import no\n    import a\nelse:\n    import b\n",
    "s = '''\nclass X:\n'''\nimport a\n",
    "def f():\n    s = '''\nimport no\n'''\nimport a\n",
    "class A(\n    Base):\n    import no\n\n\n# comment\nimport a\n",
])
def test_stubbing_bodies_never_changes_the_answer(src: str) -> None:
    """The fast path (def/class bodies stubbed) gives what a full parse gives."""
    for text in (PAD + src, src + PAD):
        assert set(source_imports(text)) == set(_reference(text.encode()) or ()), text[-200:]


# -- generated sources ------------------------------------------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_NAMES = st.sampled_from(["a", "b", "c", "np", "torch"])
_STRING_BODIES = ["def fake():", "import no", "class X:", "    import no2", "@deco", ""]


def _leaf() -> st.SearchStrategy[list[tuple[str, object]]]:
    return st.one_of(
        _NAMES.map(lambda n: [("import", n)]),
        _NAMES.map(lambda n: [("from", n)]),
        _NAMES.map(lambda n: [("dyn", n)]),
        st.just([("assign", None)]),
        st.lists(st.sampled_from(_STRING_BODIES), min_size=1, max_size=3).map(
            lambda body: [("doc", body)]),
    )


_BLOCK = st.recursive(_leaf(), lambda inner: st.one_of(
    inner,
    st.tuples(st.sampled_from(["if x:", "def f():", "class K:", "with w:", "try:",
                               "async def g():", "for i in y:"]), inner).map(
        lambda t: [("block", t)]),
    st.tuples(inner, inner).map(lambda t: t[0] + t[1]),
), max_leaves=12)


def _render(stmts: list[tuple[str, object]], indent: str = "") -> list[str]:
    out: list[str] = []
    for kind, arg in stmts:
        if kind == "import":
            out.append(f"{indent}import {arg}")
        elif kind == "from":
            out.append(f"{indent}from {arg} import x")
        elif kind == "dyn":
            out.append(f"{indent}__import__('{arg}')")
        elif kind == "assign":
            out.append(f"{indent}x = 1")
        elif kind == "doc":
            out.append(f'{indent}s = """')
            out.extend(arg)               # type: ignore[arg-type]  (column 0: inside the string)
            out.append('"""')
        else:
            header, body = arg            # type: ignore[misc]
            if header == "try:":
                out += [f"{indent}try:", *_render(body, indent + "    "),
                        f"{indent}except E:", f"{indent}    import handler"]
            else:
                if header in ("def f():", "class K:", "async def g():") and indent == "":
                    out.append("@deco")
                out += [f"{indent}{header}", *_render(body, indent + "    ")]
    return out


@settings(max_examples=200, deadline=None)
@given(_BLOCK, st.booleans())
def test_generated_sources(stmts: list[tuple[str, object]], pad_first: bool) -> None:
    """Stubbed fast path == full parse == the ast reference, on generated
    programs whose strings hold column-0 'def'/'class'/'import' lines."""
    body = "\n".join(_render(stmts)) + "\n"
    pad = "#" + "x" * 9000 + "\n"       # past the stub threshold, cheap to parse
    text = pad + body if pad_first else body + pad
    want = _reference(text.encode())
    assert want is not None, body
    assert set(source_imports(text)) == set(want), body
