"""Python steps end to end: real wheels in environments shaped like real ones,
judged for a Grace node (aarch64, 64 KiB pages) as ``decide`` would.

The interpreter stand-ins are compiled here for aarch64 (:mod:`python.envs`);
the packages are real wheels installed by pip (numpy 1.19.0, whose
``_multiarray_umath`` is congruent only modulo 4 KiB, numpy issue 16677, and
its fixed 1.19.5) or packages built here from C, installed by pip from a
wheel made in the test.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from fixtures.build import ElfBuilder
from python import envs
from python.wheels import wheel_site

from grace_policy.decide import decide
from grace_policy.node import NodeProfile
from grace_policy.policy import Policy

pytestmark = pytest.mark.cross

GRACE = NodeProfile(machine="aarch64", page_size=65536, glibc=(2, 36), root="/",
                    root_is_native=False)


def _decide(argv: list[str], cwd: Path, env: dict[str, str] | None = None):
    return decide(Policy(), partition=None, argv=[str(a) for a in argv],
                  env={"PATH": "/usr/bin:/bin", "HOME": str(cwd), **(env or {})},
                  cwd=str(cwd), node=GRACE)


@pytest.fixture
def grace_venv(elf_builder: ElfBuilder, tmp_path: Path) -> Path:
    base = envs.base_python(elf_builder, "base", "3.8")
    return envs.make_venv(base, tmp_path / "venv")


def _with(venv_python: Path, key: str) -> Path:
    venv = venv_python.parent.parent
    envs.copy_site(wheel_site(key), envs.site_packages(venv))
    return venv_python


@pytest.mark.network
def test_numpy_1_19_0_import_is_rejected_on_64k(grace_venv: Path, tmp_path: Path) -> None:
    py = _with(grace_venv, "numpy-1.19.0-aarch64")
    verdict = _decide([py, "-c", "import numpy"], tmp_path)
    assert verdict.action == "reject", verdict
    bad = [f for f in verdict.findings if f.severity == "error"]
    assert bad and all(f.rule.startswith("page-") for f in bad), bad
    assert any("/numpy" in f.path for f in bad)
    assert all(f.predicted_error.startswith("ImportError: ") for f in bad), bad


@pytest.mark.network
def test_numpy_1_19_5_is_clean(grace_venv: Path, tmp_path: Path) -> None:
    py = _with(grace_venv, "numpy-1.19.5-aarch64")
    verdict = _decide([py, "-c", "import numpy"], tmp_path)
    assert verdict.action == "allow", verdict.findings


@pytest.mark.network
def test_unused_broken_numpy_is_one_warning(grace_venv: Path, tmp_path: Path) -> None:
    py = _with(grace_venv, "numpy-1.19.0-aarch64")
    verdict = _decide([py, "-c", "import json"], tmp_path)
    assert verdict.action == "warn", verdict
    assert [f.rule for f in verdict.findings] == ["py-dist-broken"]
    assert "numpy 1.19.0" in verdict.findings[0].remediation


@pytest.mark.network
def test_script_and_console_script_imports_count(grace_venv: Path, tmp_path: Path) -> None:
    py = _with(grace_venv, "numpy-1.19.0-aarch64")
    script = tmp_path / "train.py"
    script.write_text("import os\ntry:\n    import numpy as np\nexcept ImportError:\n"
                      "    np = None\n\ndef main():\n    import json\n")
    assert _decide([py, script], tmp_path).action == "reject"
    tool = py.parent / "np-tool"
    tool.write_text(f"#!{py}\nfrom numpy.linalg import norm\nnorm([1])\n")
    tool.chmod(0o755)
    verdict = _decide([tool], tmp_path)
    assert verdict.action == "reject", verdict
    # Imports inside a function are not "known to be used".
    lazy = tmp_path / "lazy.py"
    lazy.write_text("def main():\n    import numpy\n")
    assert _decide([py, lazy], tmp_path).action == "warn"


def _ext_wheel(b: ElfBuilder, tmp: Path, name: str, arch: str, module_file: str,
               requires: tuple[str, ...] = ()) -> Path:
    so = b.compile("int answer(void) { return 42; }\n", f"build-{name}/{module_file}",
                   shared=True, arch=arch, page_size=65536)
    files = {f"{name}/__init__.py": b"from . import _core\n",
             f"{name}/{module_file}": so.read_bytes()}
    return envs.build_wheel(tmp / "wheels", name, "1.0", files, requires=requires)


def test_foreign_abi3_module_fails_the_import(grace_venv: Path, elf_builder: ElfBuilder,
                                              tmp_path: Path) -> None:
    site = envs.site_packages(grace_venv.parent.parent)
    envs.pip_install(_ext_wheel(elf_builder, tmp_path, "fastthing", "x86_64",
                                "_core.abi3.so"), site)
    verdict = _decide([grace_venv, "-c", "import fastthing"], tmp_path)
    assert verdict.action == "reject"
    (finding,) = [f for f in verdict.findings if f.rule == "py-ext-arch"]
    assert finding.path.endswith("fastthing/_core.abi3.so")
    assert "cannot open shared object file" in finding.predicted_error
    assert "x86_64" in finding.remediation


def test_requires_dist_closure_makes_a_dependency_used(grace_venv: Path,
                                                       elf_builder: ElfBuilder,
                                                       tmp_path: Path) -> None:
    site = envs.site_packages(grace_venv.parent.parent)
    envs.pip_install(_ext_wheel(elf_builder, tmp_path, "lowlevel", "x86_64",
                                "_core.abi3.so"), site)
    envs.pip_install(envs.build_wheel(tmp_path / "wheels", "highlevel", "2.0",
                                      {"highlevel/__init__.py": b"import lowlevel\n"},
                                      requires=("lowlevel>=1",)), site)
    assert _decide([grace_venv, "-c", "import highlevel"], tmp_path).action == "reject"
    assert _decide([grace_venv, "-c", "import json"], tmp_path).action == "warn"


def test_module_only_built_for_another_platform_is_not_found(
        grace_venv: Path, elf_builder: ElfBuilder, tmp_path: Path) -> None:
    site = envs.site_packages(grace_venv.parent.parent)
    envs.pip_install(_ext_wheel(elf_builder, tmp_path, "tagged", "x86_64",
                                "_core.cpython-38-x86_64-linux-gnu.so"), site)
    verdict = _decide([grace_venv, "-c", "import tagged"], tmp_path)
    (finding,) = [f for f in verdict.findings if f.rule == "py-ext-foreign"]
    assert finding.severity == "error"
    assert "ModuleNotFoundError" in finding.predicted_error
    assert "x86_64" in finding.predicted_error


def test_native_build_next_to_a_foreign_one_is_fine(grace_venv: Path, elf_builder: ElfBuilder,
                                                    tmp_path: Path) -> None:
    # One shared site dir installed from both machines keeps both tagged files.
    site = envs.site_packages(grace_venv.parent.parent)
    envs.pip_install(_ext_wheel(elf_builder, tmp_path, "both", "x86_64",
                                "_core.cpython-38-x86_64-linux-gnu.so"), site)
    native = elf_builder.compile("int answer(void) { return 42; }\n", "native/_core.so",
                                 shared=True, arch="aarch64", page_size=65536)
    (site / "both" / "_core.cpython-38-aarch64-linux-gnu.so").write_bytes(native.read_bytes())
    assert _decide([grace_venv, "-c", "import both"], tmp_path).action == "allow"


def test_pythonpath_dir_of_another_machine(grace_venv: Path, elf_builder: ElfBuilder,
                                           tmp_path: Path) -> None:
    shared = tmp_path / "shared-py"
    pkg = shared / "mylib"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("from ._fast import *\n")
    so = elf_builder.compile("int f(void) { return 1; }\n", "x/_fast.so", shared=True)
    (pkg / "_fast.so").write_bytes(so.read_bytes())
    verdict = _decide([grace_venv, "-c", "import mylib"], tmp_path,
                      env={"PYTHONPATH": str(shared)})
    assert verdict.action == "reject"
    (finding,) = [f for f in verdict.findings if f.rule == "py-ext-arch"]
    assert "PYTHONPATH" in finding.remediation
    # -E: PYTHONPATH is ignored, so mylib is not even found: nothing to judge.
    assert _decide([grace_venv, "-E", "-c", "import mylib"], tmp_path,
                   env={"PYTHONPATH": str(shared)}).action == "allow"
