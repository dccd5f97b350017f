"""Real editable installs: ``pip install -e`` with a pinned setuptools, made in the test.

    from python.editables import setuptools_wheel, editable_venv
    ed = editable_venv(runner, "/usr/bin/python3.11", tmp_path)   # an EditableWorld

Two projects with C extensions, built in place by setuptools' editable
``build_ext`` (with the machine's gcc, against the interpreter's headers):

- ``flat`` (flat layout: setuptools writes ``__editable__.edpkg-0.1.pth`` with
  ``import __editable___edpkg_0_1_finder; ...install()`` and that finder,
  whose ``MAPPING`` names ``edpkg`` (a package with the extension
  ``edpkg._speed``), ``edmod`` (pure), ``edfast`` (a top-level extension)
  ``edabi`` (a top-level ``py_limited_api`` extension: ``edabi.abi3.so``)
  and ``edns.sub`` (under the namespace package ``edns``: ``NAMESPACES``, and
  the finder's placeholder entry at the end of ``sys.path``), with
  ``edns.sub._k``;
- ``srclay`` (src layout, ``package_dir={'': 'src'}``): a plain path line
  ``.pth``, the ``edsrc`` package with ``edsrc._c``;
- ``flitproj`` (flit_core, which builds no extensions: ``edflit.pth`` names
  the project directory): the pure ``edflit`` package, into which the test
  puts compiled files by hand, as a ``build_ext --inplace`` would.

The build backends' wheels are fetched once from PyPI with
``--require-hashes`` (:data:`SETUPTOOLS`, :data:`FLIT_CORE`) and installed
into the venv from those files; the editable installs run with
``--no-build-isolation --no-index``, so nothing else is downloaded. Skips
when offline (fails under ``CI``), like the wheels.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from corpus import NET_TIMEOUT, CorpusUnavailable, _cached_tree, _give_up, _run, sha256_file

#: setuptools >= 64 writes PEP 660 finders; 80.9.0 needs Python >= 3.9.
SETUPTOOLS = ("setuptools==80.9.0", "setuptools-80.9.0-py3-none-any.whl",
              "062d34222ad13e0cc312a4c02d73f059e86a4acbfbdea8f8f76b28c99f306922")
FLIT_CORE = ("flit_core==3.9.0", "flit_core-3.9.0-py3-none-any.whl",
             "7aada352fb0c7f5538c4fafeddf314d3a6a92ee8e2b1de70482329e42de70301")
MIN_PYTHON = (3, 9)

_MODULE_C = """#include <Python.h>
static struct PyModuleDef def = {{PyModuleDef_HEAD_INIT, "{name}", NULL, -1, NULL}};
PyMODINIT_FUNC PyInit_{name}(void) {{ return PyModule_Create(&def); }}
"""

_FLAT_SETUP = """from setuptools import Extension, setup
setup(name="edpkg", version="0.1", packages=["edpkg", "edns.sub"], py_modules=["edmod"],
      ext_modules=[Extension("edpkg._speed", ["edpkg/_speed.c"]),
                   Extension("edns.sub._k", ["edns/sub/_k.c"]),
                   Extension("edfast", ["edfast.c"]),
                   Extension("edabi", ["edabi.c"], py_limited_api=True)])
"""
_SRC_SETUP = """from setuptools import Extension, setup
setup(name="edsrc", version="0.1", packages=["edsrc"], package_dir={"": "src"},
      ext_modules=[Extension("edsrc._c", ["src/edsrc/_c.c"])])
"""
_PYPROJECT = """[build-system]
requires = ["setuptools==80.9.0"]
build-backend = "setuptools.build_meta"
"""
_FLIT_PYPROJECT = """[build-system]
requires = ["flit_core==3.9.0"]
build-backend = "flit_core.buildapi"

[project]
name = "edflit"
version = "0.1"
description = "an editable flit project"
"""

_failure: list[str] = []


def setuptools_wheel() -> Path:
    """The pinned setuptools wheel (downloaded once, hash-checked)."""
    return _pinned_wheel(SETUPTOOLS)


def flit_core_wheel() -> Path:
    return _pinned_wheel(FLIT_CORE)


def _pinned_wheel(pin: tuple[str, str, str]) -> Path:
    requirement, filename, sha = pin
    if _failure:
        _give_up(_failure[0])

    def build(work: Path) -> Path:
        req = work / "requirements.txt"
        req.write_text(f"{requirement} --hash=sha256:{sha}\n")
        out = work / "root"
        out.mkdir()
        _run(["python3", "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
              "--require-hashes", "--timeout", str(NET_TIMEOUT), "-d", str(out), "-r",
              str(req)])
        if sha256_file(out / filename) != sha:
            raise CorpusUnavailable(f"{filename}: sha256 differs from the pin")
        return out

    try:
        return _cached_tree(f"{requirement.replace('==', '-')}-wheel", {"pin": list(pin)},
                            build) / filename
    except CorpusUnavailable as exc:
        _failure.append(f"{requirement} wheel unavailable (network?): {exc}")
        _give_up(_failure[0])
        raise


@dataclass
class EditableWorld:
    venv: Path          # the venv (a node path; the same on this host, see Runner)
    flat: Path          # the flat-layout project
    srclay: Path        # the src-layout project
    flit: Path          # the flit project
    site: Path          # the venv's site-packages
    xy: str

    @property
    def python(self) -> str:
        return str(self.venv / "bin" / "python")


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _projects(root: Path) -> tuple[Path, Path, Path]:
    flat, srclay, flit = root / "flat", root / "srclay", root / "flitproj"
    _write(flit / "pyproject.toml", _FLIT_PYPROJECT)
    _write(flit / "edflit" / "__init__.py", "")
    _write(flat / "pyproject.toml", _PYPROJECT)
    _write(flat / "setup.py", _FLAT_SETUP)
    _write(flat / "edpkg" / "__init__.py", "")
    _write(flat / "edpkg" / "_speed.c", _MODULE_C.format(name="_speed"))
    _write(flat / "edmod.py", "")
    _write(flat / "edns" / "sub" / "__init__.py", "")   # edns: a namespace package
    _write(flat / "edns" / "sub" / "_k.c", _MODULE_C.format(name="_k"))
    _write(flat / "edfast.c", _MODULE_C.format(name="edfast"))
    _write(flat / "edabi.c", _MODULE_C.format(name="edabi"))
    _write(srclay / "pyproject.toml", _PYPROJECT)
    _write(srclay / "setup.py", _SRC_SETUP)
    _write(srclay / "src" / "edsrc" / "__init__.py", "")
    _write(srclay / "src" / "edsrc" / "_c.c", _MODULE_C.format(name="_c"))
    return flat, srclay, flit


def editable_venv(run, base_exe: str, root: Path, xy: str) -> EditableWorld:
    """A venv of ``base_exe`` with both projects installed editable (``run``:
    how to run a command for this interpreter, ``run(argv, cwd)``)."""
    wheels = (setuptools_wheel(), flit_core_wheel())
    root.mkdir(parents=True, exist_ok=True)
    local = root / "wheels"
    local.mkdir(exist_ok=True)
    for wheel in wheels:
        shutil.copy2(wheel, local / wheel.name)
    venv = root / "venv"
    flat, srclay, flit = _projects(root)

    def step(argv: list[str], cwd: Path = root) -> None:
        done = run(argv, str(cwd))
        if done.returncode != 0:
            raise AssertionError(f"{argv} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")

    step([base_exe, "-m", "venv", str(venv)])
    py = str(venv / "bin" / "python")
    step([py, "-m", "pip", "install", "-q", "--no-index",
          *(str(local / wheel.name) for wheel in wheels)])
    for project in (flat, srclay, flit):
        step([py, "-m", "pip", "install", "-q", "--no-index", "--no-build-isolation",
              "--no-deps", "-e", str(project)])
    site = next((venv / "lib").glob("python3*/site-packages"))
    return EditableWorld(venv=venv, flat=flat, srclay=srclay, flit=flit, site=site, xy=xy)


def host_run(argv: list[str], cwd: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "HOME": cwd, "LC_ALL": "C.UTF-8",
           "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
