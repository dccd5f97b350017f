"""Editable installs and sitecustomize/usercustomize, held to real CPythons.

A real ``pip install -e`` (pinned setuptools, :mod:`python.editables`) of two
projects with C extensions built in place, in a venv of each interpreter of
the sys.path oracle (:mod:`python.sitepath_oracle`, the release roots' 3.14
and 3.13 included): the model must give the same ``sys.path`` and find the
same module file for every name as ``importlib.util.find_spec`` does in the
real interpreter, the aarch64 build of a module included (the x86_64
interpreter does not see it, the model does not either). Then the same
environment seen by a simulated aarch64 node: the in-place x86_64 builds
are judged (py-ext-foreign, py-ext-arch) and the aarch64 build is clean.

sitecustomize and usercustomize: which file the real interpreter imported
(``sys.modules[...].__file__``) and what it imported, against the model's
``Environment.startup_modules``/``startup_imports``, under the flags and
variables that turn the user site (and site) off.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from fixtures.build import ElfBuilder
from roomy import ROOMY

from grace_policy import elf, fsprobe, loader
from grace_policy.budget import Budget
from grace_policy.context import StepContext
from grace_policy.decide import StepRequest, decide
from grace_policy.node import NodeProfile
from grace_policy.python import interp, step
from grace_policy.python.finder import Scope, find_top_level
from python import envs

from . import sitepath_oracle as oracle
from .editables import MIN_PYTHON, editable_venv

INTERPRETERS = [(label, exe) for label, exe in oracle.oracles()
                if oracle.version_of(label) >= MIN_PYTHON]
#: Interpreters that get the sitecustomize matrix (every one: venvs are cheap).
ALL = oracle.oracles()

NAMES = ("edpkg", "edpkg._speed", "edpkg._arm", "edmod", "edfast", "edabi", "edsrc",
         "edsrc._c", "edflit", "edflit._native", "edflit._arm", "edns", "edns.sub",
         "edns.sub._k")
MARK = "GRACE-EDITABLE "
PROBE = (
    "import sys, json, importlib.util as u\n"
    "def origin(n):\n"
    "    try:\n"
    "        s = u.find_spec(n)\n"
    "    except ImportError:\n"
    "        return None\n"
    "    return None if s is None else s.origin\n"
    "mods = {n: getattr(sys.modules.get(n), '__file__', None)"
    " for n in ('sitecustomize', 'usercustomize')}\n"
    "print(" + repr(MARK) + " + json.dumps({'path': sys.path, 'mods': mods,"
    " 'marks': sorted(n for n in ('colorsys', 'sched', 'netrc', 'tabnanny')"
    " if n in sys.modules),"
    " 'origins': {n: origin(n) for n in sys.argv[1:]}}))\n"
)
GRACE = NodeProfile(machine="aarch64", page_size=65536, glibc=(2, 36), root="/",
                    root_is_native=False)


def _real(runner: oracle.Runner, argv: list[str], env: dict[str, str], cwd: str) -> dict:
    proc = runner.run(argv, env, cwd)
    for line in proc.stdout.splitlines():
        if line.startswith(MARK):
            return json.loads(line[len(MARK):])
    raise AssertionError(f"probe printed nothing: {argv}\n{proc.stdout}\n{proc.stderr}")


def _environment(runner: oracle.Runner, exe: str, args: list[str], env: dict[str, str],
                 cwd: str) -> tuple[step.Environment, interp.PyFlags]:
    return oracle.environment(runner, exe, args, env, cwd)


def _model_origin(e: step.Environment, dotted: str) -> tuple[str | None, tuple[str, ...]]:
    """The file the model says ``import dotted`` loads (find_spec's origin),
    and the foreign builds it saw when it found none."""
    from grace_policy.python import editable

    top, _, rest = dotted.partition(".")
    loc = e.locate(top, e.search_path())
    name = top
    for part in rest.split(".") if rest else ():
        if loc.kind not in ("package", "namespace"):
            return None, ()
        name = f"{name}.{part}"
        dirs = [loc.path] if loc.kind == "package" else list(loc.portions)
        loc = find_top_level(part, dirs, e.suffixes, e.budget, Scope(e.node, e.cwd))
        if loc.kind == "missing" and e.paths.editables:
            # sys.meta_path goes on to the editable finder (MAPPING holds 'ns.sub')
            loc = editable.locate(name, e.paths.editables, e.suffixes, e.budget,
                                  Scope(e.node)) or loc
    if loc.kind == "missing":
        return None, loc.foreign
    if loc.kind == "namespace":
        return None, ()
    if loc.kind == "package":
        host = loader.host_path(e.node, loc.path)
        for suffix in (*e.suffixes, ".py", ".pyc"):
            if os.path.isfile(f"{host}/__init__{suffix}"):
                return f"{loc.path}/__init__{suffix}", ()
    return loc.path, ()


_WORLDS: dict[str, object] = {}


def _editable_world(label: str, exe: str, tmp_path_factory: pytest.TempPathFactory,
                    elf_builder: ElfBuilder):
    if label not in _WORLDS:
        runner = oracle.runner(label)
        root = Path(runner.world_dir(tmp_path_factory.mktemp(f"ed-{label}")))
        xy = "{}.{}".format(*oracle.version_of(label))
        w = editable_venv(runner.run_plain, exe, root, xy)
        # the aarch64 builds, as a cross build on the login node leaves them
        tag = f"cpython-{xy.replace('.', '')}-aarch64-linux-gnu.so"
        for name, dest in (("_arm", w.flat / "edpkg"), ("_arm", w.flit / "edflit")):
            so = elf_builder.compile("int answer(void) { return 42; }\n",
                                     f"{label}/{name}.so", shared=True, arch="aarch64",
                                     page_size=65536)
            shutil.copy2(so, dest / f"{name}.{tag}")
        # an x86_64 module in the flit project, as build_ext --inplace leaves it
        so = elf_builder.compile("int answer(void) { return 42; }\n", f"{label}/_native.so",
                                 shared=True, arch="x86_64")
        shutil.copy2(so, w.flit / "edflit" / f"_native.{tag.replace('aarch64', 'x86_64')}")
        _WORLDS[label] = (runner, w)
    return _WORLDS[label]


@pytest.mark.network
@pytest.mark.cross
@pytest.mark.parametrize(("label", "exe"), [oracle.param(i, i[0]) for i in INTERPRETERS],
                         ids=[lab for lab, _ in INTERPRETERS])
def test_editable_install_matches_real_cpython(label: str, exe: str, elf_builder: ElfBuilder,
                                               tmp_path_factory: pytest.TempPathFactory
                                               ) -> None:
    runner, w = _editable_world(label, exe, tmp_path_factory, elf_builder)
    finder = next(w.site.glob("__editable___edpkg_*_finder.py"))
    assert "MAPPING" in finder.read_text()  # setuptools chose the finder, not a path .pth
    env = {"PATH": "/usr/bin:/bin", "HOME": str(w.venv), "LC_ALL": "C.UTF-8"}
    cwd = str(w.venv)
    args = ["-c", PROBE, *NAMES]
    real = _real(runner, [w.python, *args], env, cwd)
    e, _ = _environment(runner, w.python, args, env, cwd)
    assert e.paths.paths == real["path"], "\n".join(e.paths.notes)
    (ed,) = e.paths.editables
    assert ed.module == str(finder)
    assert dict(ed.mapping) == {**{n: str(w.flat / n) for n in ("edabi", "edfast", "edmod",
                                                                "edpkg")},
                                "edns.sub": str(w.flat / "edns" / "sub")}
    assert dict(ed.namespaces) == {"edns": ()}
    # install() appended the placeholder where sys.path then ended (the
    # whole-path comparison above holds its place)
    assert ed.hook in real["path"]
    assert str(w.srclay / "src") in e.paths.paths   # the src layout's path .pth
    assert str(w.flit) in e.paths.paths             # flit's path .pth
    for name in NAMES:
        got, _foreign = _model_origin(e, name)
        assert got == real["origins"][name], name
    # the aarch64 builds are what this interpreter cannot see
    assert real["origins"]["edpkg._arm"] is None
    assert _model_origin(e, "edpkg._arm")[1] == (
        str(w.flat / "edpkg" / f"_arm.cpython-{w.xy.replace('.', '')}-aarch64-linux-gnu.so"),)
    # the in-place builds are real modules to the real interpreter
    assert real["origins"]["edfast"].endswith("x86_64-linux-gnu.so")
    assert real["origins"]["edabi"].endswith(".abi3.so")


@pytest.mark.network
@pytest.mark.cross
def test_a_namespace_portion_on_sys_path_shadows_the_editable_finder(
        elf_builder: ElfBuilder, tmp_path_factory: pytest.TempPathFactory) -> None:
    """install() appends to sys.meta_path, after the path finder: a directory
    ``edpkg`` without __init__ in the working directory wins (as a namespace
    package) over the mapping, in the real interpreter and in the model."""
    if not INTERPRETERS:
        pytest.skip("no CPython >= 3.9 here")
    label, exe = INTERPRETERS[0]
    runner, w = _editable_world(label, exe, tmp_path_factory, elf_builder)
    work = Path(runner.host(str(w.venv))) / "shadow"
    (work / "edpkg").mkdir(parents=True, exist_ok=True)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(w.venv), "LC_ALL": "C.UTF-8"}
    cwd = str(w.venv / "shadow")
    args = ["-c", PROBE, "edpkg", "edfast"]
    real = _real(runner, [w.python, *args], env, cwd)
    e, _ = _environment(runner, w.python, args, env, cwd)
    assert real["origins"]["edpkg"] is None          # a namespace package: no origin
    assert _model_origin(e, "edpkg") == (None, ())
    assert e.locate("edpkg", e.search_path()).kind == "namespace"
    assert _model_origin(e, "edfast")[0] == real["origins"]["edfast"]


# -- the same environment on a simulated Grace node ------------------------------

def _grace_venv(elf_builder: ElfBuilder, w, tmp: Path) -> Path:
    """An aarch64 interpreter stand-in whose venv holds what pip installed
    (the .pth files, the finder, the metadata): MAPPING still points at the
    projects, with their in-place x86_64 builds."""
    base = envs.base_python(elf_builder, "grace-base", w.xy)
    py = envs.make_venv(base, tmp / "grace-venv")
    site = envs.site_packages(py.parent.parent)
    for entry in w.site.iterdir():
        if entry.name.startswith(("__editable__", "edpkg-", "edsrc-", "edflit")):
            if entry.is_dir():
                shutil.copytree(entry, site / entry.name)
            else:
                shutil.copy2(entry, site / entry.name)
    return py


@pytest.mark.network
@pytest.mark.cross
def test_in_place_builds_are_judged_on_an_aarch64_node(
        elf_builder: ElfBuilder, tmp_path: Path,
        tmp_path_factory: pytest.TempPathFactory) -> None:
    host = [(lab, exe) for lab, exe in INTERPRETERS if oracle.runner(lab).chroot is None]
    if not host:
        pytest.skip("no CPython >= 3.9 on this machine")
    label, exe = host[0]
    _runner, w = _editable_world(label, exe, tmp_path_factory, elf_builder)
    py = _grace_venv(elf_builder, w, tmp_path)

    def verdict(code: str):
        return decide(ROOMY, StepRequest(partition=None, argv=[str(py), "-c", code],
                                         env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
                                         cwd=str(tmp_path), node=GRACE))

    # a top-level extension built only for x86_64: ModuleNotFoundError
    v = verdict("import edfast")
    assert v.action == "reject", v
    (bad,) = [f for f in v.findings if f.severity == "error"]
    assert bad.rule == "py-ext-foreign"
    assert bad.path == str(w.flat / f"edfast.cpython-{w.xy.replace('.', '')}"
                                    "-x86_64-linux-gnu.so")
    # an x86_64 .abi3.so the aarch64 importer accepts by name: the load fails
    v = verdict("import edabi")
    assert v.action == "reject", v
    (bad,) = [f for f in v.findings if f.severity == "error"]
    assert (bad.rule, bad.path) == ("py-ext-arch", str(w.flat / "edabi.abi3.so"))
    # a package whose compiled submodule is x86_64 only: a warning (it may
    # have a pure fallback); its aarch64 _arm build is fine
    v = verdict("import edpkg")
    speed = [f for f in v.findings if f.path.endswith("edpkg/_speed.cpython-"
                                                      f"{w.xy.replace('.', '')}"
                                                      "-x86_64-linux-gnu.so")]
    assert speed and speed[0].rule == "py-ext-foreign" and speed[0].severity == "warning"
    assert not any("_arm." in f.path for f in v.findings), v.findings
    # nothing of it imported: one py-dist-broken warning per mapped module, no error
    v = verdict("import json")
    assert v.action == "warn", v
    assert {f.rule for f in v.findings} == {"py-dist-broken"}
    assert any("edfast" in f.path for f in v.findings)
    # the src layout and flit (path .pth files): their builds are judged as any package's
    v = verdict("import edsrc")
    assert any(f.rule == "py-ext-foreign" and "edsrc/_c.cpython-" in f.path
               for f in v.findings), v.findings
    v = verdict("import edflit")
    assert [f.path for f in v.findings if "edflit" in f.path] == [
        str(w.flit / "edflit" / f"_native.cpython-{w.xy.replace('.', '')}-x86_64-linux-gnu.so")]
    # edns is a namespace package of the finder: what it maps below counts as used
    v = verdict("import edns.sub")
    assert [(f.rule, f.severity) for f in v.findings if "edns/sub/_k" in f.path] == [
        ("py-ext-foreign", "warning")], v.findings
    # a sitecustomize that imports the broken module: every start imports it
    site = envs.site_packages(py.parent.parent)
    (site / "sitecustomize.py").write_text("import edfast\n")
    v = verdict("pass")
    assert v.action == "reject", v
    assert [f.rule for f in v.findings if f.severity == "error"] == ["py-ext-foreign"]
    v = decide(ROOMY, StepRequest(partition=None, argv=[str(py), "-S", "-c", "pass"],
                                  env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
                                  cwd=str(tmp_path), node=GRACE))
    assert v.action == "allow", v   # -S: no site, no .pth, no sitecustomize


@pytest.mark.network
@pytest.mark.cross
@pytest.mark.qemu
def test_the_aarch64_importer_finds_what_the_model_finds(
        elf_builder: ElfBuilder, tmp_path: Path,
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """A real aarch64 CPython 3.11 (Debian's, under qemu-aarch64) as the
    node's importer: with the editable installs' .pth files processed
    (``site.addsitedir``), ``find_spec`` finds the aarch64 builds and the
    ``.abi3.so``, and not the x86_64-only ones, as the model on an aarch64
    node does."""
    import ast
    import subprocess

    from python.arm64_python import arm64_python

    cmd = arm64_python()
    host = [(lab, exe) for lab, exe in INTERPRETERS if oracle.version_of(lab) == (3, 11)
            and oracle.runner(lab).chroot is None]
    if not host:
        pytest.skip("no CPython 3.11 on this machine to build the 3.11 extensions")
    label, exe = host[0]
    _runner, w = _editable_world(label, exe, tmp_path_factory, elf_builder)
    py = _grace_venv(elf_builder, w, tmp_path)
    site = envs.site_packages(py.parent.parent)
    code = ("import site, sys, importlib.util as u\n"
            f"site.addsitedir({str(site)!r})\n"
            "def origin(n):\n"
            "    try:\n"
            "        s = u.find_spec(n)\n"
            "    except ImportError:\n"
            "        return None\n"
            "    return None if s is None else s.origin\n"
            "print(repr({n: origin(n) for n in sys.argv[1:]}))\n")
    done = subprocess.run([*cmd, "-I", "-S", "-c", code, *NAMES], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    real = ast.literal_eval(done.stdout.strip().splitlines()[-1])
    assert real["edpkg._arm"] and real["edpkg._arm"].endswith("aarch64-linux-gnu.so")
    assert real["edpkg._speed"] is None and real["edfast"] is None
    assert real["edabi"] == str(w.flat / "edabi.abi3.so")
    # the model, on an aarch64 node, of the same venv (.pth files and finder)
    from grace_policy.python import sitepath

    found = interp.identify(str(py), elf.read_elf(os.path.realpath(py)), GRACE, Budget())
    assert found is not None
    flags, command = interp.parse_python_argv(["-c", "pass"], found.version)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    sp = sitepath.sys_path(found, flags, command, StepContext(node=GRACE, env=env,
                                                              cwd=str(tmp_path), budget=Budget()))
    info = elf.read_elf(os.path.realpath(py))
    process = loader.Process(str(py), info, GRACE, env,
                             loader.Loading(cwd=str(tmp_path), budget=Budget()))
    ctx = StepContext(node=GRACE, env=env, cwd=str(tmp_path), budget=Budget())
    e = step.Environment(found.version, sp, process, ctx, lambda p: ())
    for name in NAMES:
        assert _model_origin(e, name)[0] == real[name], name


def test_an_unreadable_finder_is_a_note_never_a_guess(tmp_path: Path) -> None:
    from grace_policy.python import editable

    good = ("MAPPING: dict[str, str] = {'a': '/src/a'}\nNAMESPACES = {}\n"
            "PATH_PLACEHOLDER = 'x' + '.__path_hook__'\nclass _EditableFinder: pass\n"
            "def install(): pass\n")
    assert editable.parse_finder(good.encode()) == ((("a", "/src/a"),), (), "x.__path_hook__")
    for bad in (good.replace("{'a': '/src/a'}", "dict(a='/src/a')"),
                good.replace("{'a': '/src/a'}", "{'a': '/src/' + X}"),
                good + "MAPPING['b'] = '/src/b'\n",
                good + "MAPPING = compute()\n",
                good.replace("def install", "def other"),
                good[:40],
                "\xff\xfe garbage"):
        assert isinstance(editable.parse_finder(bad.encode("utf-8", "surrogateescape")), str)
    # hostile sources: deep nesting, NUL bytes, a huge literal are notes, not errors
    for bad in (b"MAPPING = " + b"[" * 200_000, b"MAPPING = {'a': '/x\0'}\0",
                good.replace("{'a': '/src/a'}", "{" + "(" * 5000 + "1" + ")" * 5000 + ": 1}")
                .encode()):
        assert isinstance(editable.parse_finder(bad), str)
    assert editable.finder_name("import __editable___a_finder; "
                                "__editable___a_finder.install()") == "__editable___a_finder"
    assert editable.finder_name("import __editable___a_finder") is None
    assert editable.finder_name("import os; __editable___a_finder.install()") is None
    # a finder that is bytecode only, or cut, is "unknown": a note in sys.path's notes
    it, site = _fake(tmp_path)
    (site / "e.pth").write_text("import __editable___e_finder; __editable___e_finder.install()\n")
    (site / "__editable___e_finder.py").write_text(good.replace("{'a'", "{**X, 'a'"))
    sp = _sys_path(it, tmp_path)
    assert sp.editables == () and any("__editable___e_finder" in n for n in sp.notes)
    (site / "__editable___e_finder.py").write_text(good)
    sp = _sys_path(it, tmp_path)
    assert [f.mapping for f in sp.editables] == [(("a", "/src/a"),)]
    # a FIFO in its place is never opened (a step launch must not block on it)
    (site / "__editable___e_finder.py").unlink()
    os.mkfifo(site / "__editable___e_finder.py")
    sp = _sys_path(it, tmp_path)
    assert sp.editables == () and any("__editable___e_finder" in n for n in sp.notes)


def test_what_the_editable_model_read_is_recorded(tmp_path: Path) -> None:
    """The verdict cache must see a changed finder or mapped directory."""
    from grace_policy.python import editable

    it, site = _fake(tmp_path)
    src = tmp_path / "src" / "a"
    src.mkdir(parents=True)
    (src / "__init__.py").write_text("")
    (site / "e.pth").write_text("import __editable___e_finder; __editable___e_finder.install()\n")
    finder = site / "__editable___e_finder.py"
    finder.write_text(f"MAPPING = {{'a': {str(src)!r}}}\nNAMESPACES = {{}}\n"
                      "class _EditableFinder: pass\ndef install(): pass\n")
    files = fsprobe.Files.recorded()
    sp = _sys_path(it, tmp_path, files)
    from grace_policy import node
    hit = editable.locate("a", sp.editables, (".so",), Budget(),
                          Scope(node.detect(), files=files))
    records = files.records()
    assert hit is not None and (hit.kind, hit.path) == ("package", str(src))
    seen = {(op, p) for op, p, _ in records}
    assert ("s", str(finder)) in seen
    assert any(p == str(src / "__init__.py") for _op, p in seen)


def test_namespaces_add_the_placeholder_entry(tmp_path: Path) -> None:
    it, site = _fake(tmp_path)
    (site / "e.pth").write_text("import __editable___e_finder; __editable___e_finder.install()\n")
    (site / "__editable___e_finder.py").write_text(
        "MAPPING = {'ns.a': '/src/ns/a'}\nNAMESPACES = {'ns': ['/src/ns']}\n"
        "PATH_PLACEHOLDER = '__editable__.e-1.finder' + '.__path_hook__'\n"
        "class _EditableFinder: pass\ndef install(): pass\n")
    sp = _sys_path(it, tmp_path)
    assert sp.entries[-1].path == "__editable__.e-1.finder.__path_hook__"
    assert sp.entries[-1].kind == "editable-hook"


def _fake(tmp_path: Path):
    prefix = tmp_path / "prefix"
    std = prefix / "lib" / "python3.11"
    (std / "lib-dynload").mkdir(parents=True)
    (std / "os.py").write_text("")
    site = std / "site-packages"
    site.mkdir()
    exe = prefix / "bin" / "python3.11"
    exe.parent.mkdir()
    exe.write_bytes(b"")
    return interp.Interpreter(str(exe), str(exe), (3, 11), "test"), site


def _sys_path(it: interp.Interpreter, tmp_path: Path, files: fsprobe.Files = fsprobe.HOST):
    from grace_policy import node
    from grace_policy.python import sitepath

    return sitepath.sys_path(it, interp.PyFlags(no_user_site=True),
                             interp.PyCommand("code", "pass"), StepContext(node=node.detect(),
                                                                           env={},
                                                                           cwd=str(tmp_path),
                                                                           budget=Budget(),
                                                                           files=files))


# -- sitecustomize / usercustomize -----------------------------------------------

_CUSTOM_CASES = ("plain", "s", "I", "S", "nousersite", "pythonpath", "script-dir")


@pytest.mark.parametrize("case", _CUSTOM_CASES)
@pytest.mark.parametrize(("label", "exe"), [oracle.param(i, i[0]) for i in ALL],
                         ids=[lab for lab, _ in ALL])
def test_sitecustomize_and_usercustomize_match_real_cpython(
        label: str, exe: str, case: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    runner = oracle.runner(label)
    w = _custom_world(label, exe, runner, tmp_path_factory)
    env = {"PATH": "/usr/bin:/bin", "HOME": w["home"], "LC_ALL": "C.UTF-8"}
    flags = {"s": ["-s"], "I": ["-I"], "S": ["-S"]}.get(case, [])
    if case == "nousersite":
        env["PYTHONNOUSERSITE"] = "1"
    if case == "pythonpath":
        env["PYTHONPATH"] = w["pp"]
    cwd = w["work"]
    args = [*flags, "probe.py"] if case == "script-dir" else [*flags, "-c", PROBE]
    real = _real(runner, [w["python"], *args], env, cwd)
    e, pflags = _environment(runner, w["python"], args, env, cwd)
    got = {n: None for n in ("sitecustomize", "usercustomize")}
    if not pflags.no_site:
        for name, loc in e.startup_modules():
            got[name] = loc.path if loc.kind != "package" else f"{loc.path}/__init__.py"
    assert got == real["mods"]
    imports = set(e.startup_imports()) if not pflags.no_site else set()
    marks = {"colorsys", "sched", "netrc", "tabnanny"}
    assert sorted(imports & marks) == real["marks"]


def _custom_world(label: str, exe: str, runner: oracle.Runner,
                  tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    key = f"custom-{label}"
    if key in _WORLDS:
        return _WORLDS[key]  # type: ignore[return-value]
    root = Path(runner.world_dir(tmp_path_factory.mktemp(key)))
    host_root = Path(runner.host(str(root)))
    venv = root / "venv"
    # system site packages: the user site stays on, so usercustomize is looked for
    done = runner.run_plain([exe, "-m", "venv", "--without-pip", "--system-site-packages",
                             str(venv)], str(root))
    assert done.returncode == 0, done.stderr
    xy = "{}.{}".format(*oracle.version_of(label))
    site = host_root / "venv" / "lib" / f"python{xy}" / "site-packages"
    user = host_root / "home" / ".local" / "lib" / f"python{xy}" / "site-packages"
    user.mkdir(parents=True)
    (site / "sitecustomize.py").write_text(
        "import colorsys\ntry:\n    import sched\nexcept ImportError:\n    pass\n"
        "def later():\n    import tabnanny\n")
    (user / "usercustomize.py").write_text("from netrc import netrc\n")
    # a sitecustomize earlier on PYTHONPATH (a package), and one in the
    # script's directory, which is not on sys.path yet when site runs
    pp = host_root / "pp" / "sitecustomize"
    pp.mkdir(parents=True)
    (pp / "__init__.py").write_text("import tabnanny\n")
    work = host_root / "work"
    work.mkdir()
    (work / "sitecustomize.py").write_text("import sched\n")
    (work / "probe.py").write_text(PROBE)
    w = {"python": str(venv / "bin" / "python"), "home": str(root / "home"),
         "pp": str(root / "pp"), "work": str(root / "work")}
    _WORLDS[key] = w
    return w


def test_a_clean_python_step_imports_no_editable_code(tmp_path: Path) -> None:
    """Following editables costs nothing where there are none: the module
    is imported only when a .pth line names a finder."""
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    code = ("import sys; sys.path.insert(0, sys.argv[1]);"
            "from grace_policy.decide import StepRequest, decide;"
            "from grace_policy.policy import Policy;"
            "v = decide(Policy(), StepRequest(partition=None, argv=sys.argv[2:],"
            " env={'PATH': '/usr/bin', 'HOME': '/nonexistent'}, cwd='/', node=None));"
            "print('grace_policy.python.editable' in sys.modules, "
            "'grace_policy.python.sitepath' in sys.modules)")
    venv = tmp_path / "v"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    py = str(venv / "bin" / "python")
    out = subprocess.run([sys.executable, "-S", "-E", "-c", code, str(repo), py, "-c",
                          "import json"], capture_output=True, text=True, check=True,
                         timeout=60).stdout.split()
    assert out == ["False", "True"]
    site = next(venv.glob("lib/python3*/site-packages"))
    (site / "e.pth").write_text("import __editable___e_finder; __editable___e_finder.install()\n")
    out = subprocess.run([sys.executable, "-S", "-E", "-c", code, str(repo), py, "-c",
                          "import json"], capture_output=True, text=True, check=True,
                         timeout=60).stdout.split()
    assert out == ["True", "True"]
