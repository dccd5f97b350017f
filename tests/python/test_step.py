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
from roomy import ROOMY

from grace_policy.decide import StepRequest, decide
from grace_policy.node import NodeProfile
from grace_policy.policy import Policy
from python import envs
from python.wheels import wheel_site

pytestmark = pytest.mark.cross

GRACE = NodeProfile(machine="aarch64", page_size=65536, glibc=(2, 36), root="/",
                    root_is_native=False)


def _decide(argv: list[str], cwd: Path, env: dict[str, str] | None = None):
    return decide(ROOMY, StepRequest(partition=None, argv=[str(a) for a in argv],
                                     env={"PATH": "/usr/bin:/bin", "HOME": str(cwd), **(env or {})},
                                     cwd=str(cwd), node=GRACE))


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


def test_a_pth_import_line_makes_its_distribution_used(grace_venv: Path,
                                                       elf_builder: ElfBuilder,
                                                       tmp_path: Path) -> None:
    """site.py runs a .pth import line at every start: a broken package it
    imports fails every step of the environment, whatever the step imports."""
    site = envs.site_packages(grace_venv.parent.parent)
    hook = _ext_wheel(elf_builder, tmp_path, "hookpkg", "x86_64", "_core.abi3.so")
    envs.pip_install(hook, site)
    # installed but imported by nobody: one warning
    assert _decide([grace_venv, "-c", "import json"], tmp_path).action == "warn"
    # not at column 0: a path line, never run
    (site / "hookpkg.pth").write_text("  import hookpkg\n#import hookpkg\n")
    assert _decide([grace_venv, "-c", "import json"], tmp_path).action == "warn"
    (site / "hookpkg.pth").write_text("import hookpkg\n")
    verdict = _decide([grace_venv, "-c", "import json"], tmp_path)
    assert verdict.action == "reject", verdict
    assert [f.rule for f in verdict.findings if f.severity == "error"] == ["py-ext-arch"]
    # distutils-precedence.pth's shape: the import after the first statement
    (site / "hookpkg.pth").write_text(
        "import os; var = 'HOOK_SWITCH'; enabled = os.environ.get(var, 'local') == 'local';"
        " enabled and __import__('hookpkg').install()\n")
    assert _decide([grace_venv, "-c", "import json"], tmp_path).action == "reject"
    # -S: site.py does not run, nor the line
    assert _decide([grace_venv, "-S", "-c", "import json"], tmp_path).action != "reject"


def test_pth_import_lines_are_parsed_within_a_bound(grace_venv: Path,
                                                    elf_builder: ElfBuilder,
                                                    tmp_path: Path) -> None:
    """A site directory is the user's: a megabyte of .pth import lines is not
    parsed whole on the launch path (seconds of compile on a loaded node).
    A long line keeps the imports that open it; lines past the total name
    nothing, so their packages stay warnings."""
    from grace_policy.python.step import PTH_LINE_BYTES, PTH_TOTAL_BYTES

    site = envs.site_packages(grace_venv.parent.parent)
    envs.pip_install(_ext_wheel(elf_builder, tmp_path, "hookpkg", "x86_64", "_core.abi3.so"),
                     site)
    long_line = "import hookpkg; " + "a = 1; " * (4 * PTH_LINE_BYTES)
    (site / "hookpkg.pth").write_text(long_line + "\n")
    assert _decide([grace_venv, "-c", "import json"], tmp_path).action == "reject"
    filler = "import json; " + "a = 1; " * 250 + "\n"
    count = PTH_TOTAL_BYTES // len(filler) + 1
    (site / "hookpkg.pth").write_text(filler * count + "import hookpkg\n")
    assert _decide([grace_venv, "-c", "import json"], tmp_path).action == "warn"


def test_module_only_built_for_another_platform_is_not_found(
        grace_venv: Path, elf_builder: ElfBuilder, tmp_path: Path) -> None:
    site = envs.site_packages(grace_venv.parent.parent)
    envs.pip_install(_ext_wheel(elf_builder, tmp_path, "tagged", "x86_64",
                                "_core.cpython-38-x86_64-linux-gnu.so"), site)
    verdict = _decide([grace_venv, "-c", "import tagged"], tmp_path)
    (finding,) = [f for f in verdict.findings if f.rule == "py-ext-foreign"]
    # A submodule: the package may fall back to pure Python (files cannot tell).
    assert finding.severity == "warning" and verdict.action == "warn"
    assert "ModuleNotFoundError: No module named 'tagged._core'" in finding.predicted_error
    assert "x86_64" in finding.predicted_error
    # A top-level extension module that exists only for x86_64: certain.
    so = elf_builder.compile("int f(void) { return 1; }\n", "x/fastjson.so", shared=True)
    (site / "fastjson.cpython-38-x86_64-linux-gnu.so").write_bytes(so.read_bytes())
    verdict = _decide([grace_venv, "-c", "import fastjson"], tmp_path)
    (finding,) = [f for f in verdict.findings if f.rule == "py-ext-foreign"]
    assert finding.severity == "error" and verdict.action == "reject"


@pytest.mark.network
def test_user_site_filled_on_the_x86_64_login_node(elf_builder: ElfBuilder,
                                                   tmp_path: Path) -> None:
    # pip install --user on the login node: ~/.local is shared with the node.
    base = envs.base_python(elf_builder, "base311", "3.11")
    home = tmp_path / "home"
    user_site = home / ".local" / "lib" / "python3.11" / "site-packages"
    user_site.mkdir(parents=True)
    envs.copy_site(wheel_site("bcrypt-4.1.2-abi3-x86_64"), user_site)
    envs.copy_site(wheel_site("markupsafe-2.1.5-x86_64"), user_site)
    env = {"HOME": str(home)}
    verdict = _decide([base, "-c", "import bcrypt"], tmp_path, env=env)
    assert verdict.action == "reject"
    (finding,) = [f for f in verdict.findings if f.rule == "py-ext-arch"]
    assert finding.path.endswith("bcrypt/_bcrypt.abi3.so")
    assert "~/.local" in finding.remediation and "x86_64" in finding.remediation
    # MarkupSafe's speedups exist only as an x86_64 build; it falls back to
    # pure Python, so this is a warning, not a rejection.
    verdict = _decide([base, "-c", "import markupsafe"], tmp_path, env=env)
    assert verdict.action == "warn", verdict.findings
    assert {f.rule for f in verdict.findings} == {"py-ext-foreign", "py-dist-broken"}
    # -s (no user site): nothing from ~/.local is imported or judged.
    assert _decide([base, "-s", "-c", "import bcrypt"], tmp_path, env=env).action == "allow"


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


def test_cpu_only_torch_on_a_gpu_step_is_warned_with_the_partition_index(
        grace_venv: Path, tmp_path: Path) -> None:
    from grace_policy.policy import PartitionPolicy
    from python import torch_layouts

    site = envs.site_packages(grace_venv.parent.parent)
    cpu = torch_layouts.cpu_files()
    torch_layouts.copy_tree(cpu, site)
    policy = Policy(partitions=(PartitionPolicy(name="gb200", cuda_index="cu130"),))

    def judge(env: dict[str, str]):
        return decide(policy, StepRequest(partition="gb200",
                                          argv=[str(grace_venv), "-c", "import torch"],
                                          env={"PATH": "/usr/bin", "HOME": str(tmp_path), **env},
                                          cwd=str(tmp_path), node=GRACE))

    gpu = judge({"SLURM_GPUS_ON_NODE": "4"})
    (finding,) = [f for f in gpu.findings if f.rule == "torch-cpu-only"]
    assert finding.severity == "warning" and gpu.action == "warn"
    assert "cu130" in finding.remediation
    # No GPUs asked for: a CPU build is what the step needs.
    assert not [f for f in judge({}).findings if f.rule == "torch-cpu-only"]


def test_shell_step_in_an_active_env_gets_it_judged_as_warnings(
        elf_builder: ElfBuilder, tmp_path: Path) -> None:
    # An aarch64 shell stand-in and a venv with a foreign module, as seen on
    # Grace: bash job.sh with VIRTUAL_ENV set by 'source venv/bin/activate'.
    base = envs.base_python(elf_builder, "base", "3.8")
    venv = tmp_path / "venv"
    envs.make_venv(base, venv)
    site = envs.site_packages(venv)
    envs.pip_install(_ext_wheel(elf_builder, tmp_path, "fastthing", "x86_64",
                                "_core.abi3.so"), site)
    shell = elf_builder.compile("int main(void) { return 0; }\n", "sbin/bash", arch="aarch64",
                                page_size=65536)
    script = tmp_path / "job.sh"
    script.write_text(f"#!{shell}\npython -c 'import fastthing'\n")
    script.chmod(0o755)
    env = {"VIRTUAL_ENV": str(venv), "PATH": f"{venv}/bin:/usr/bin"}
    verdict = _decide([script], tmp_path, env=env)
    assert verdict.action == "warn", verdict.findings
    assert [f.rule for f in verdict.findings] == ["py-dist-broken"]
    assert "fastthing" in verdict.findings[0].remediation
    # Without an active environment the shell step is what it was.
    assert _decide([script], tmp_path).action == "allow"


@pytest.mark.network
def test_a_huge_environment_ends_in_check_limit_never_a_hang(grace_venv: Path,
                                                             tmp_path: Path) -> None:
    from grace_policy.budget import Budget
    from grace_policy.check import check_step

    py = _with(grace_venv, "numpy-1.19.0-aarch64")
    env = {"PATH": "/usr/bin", "HOME": str(tmp_path)}
    for budget in (Budget(max_files=12), Budget(max_bytes=50_000), Budget(deadline_ms=0)):
        report = check_step([str(py), "-c", "import numpy"], env, str(tmp_path), GRACE,
                            budget=budget)
        assert report.limit is not None, budget
    # And decide() turns that into check-limit under the site's on_error.
    from grace_policy.policy import Limits

    verdict = decide(Policy(limits=Limits(max_files=12)),
                     StepRequest(partition=None, argv=[str(py), "-c", "import numpy"], env=env,
                                 cwd=str(tmp_path), node=GRACE))
    assert "check-limit" in verdict.rule_ids


@pytest.mark.network
def test_extension_with_a_4k_jemalloc_is_rejected_on_64k(elf_builder: ElfBuilder,
                                                         tmp_path: Path) -> None:
    # polars 0.14.8's aarch64 wheel embeds a jemalloc built for 4 KiB pages:
    # on a 64 KiB node 'import polars' prints jemalloc's message and aborts.
    from corpus import POLARS_4K, wheel_or_skip

    corpus = wheel_or_skip(POLARS_4K)
    base = envs.base_python(elf_builder, "base311", "3.11")
    py = envs.make_venv(base, tmp_path / "venv")
    pkg = envs.site_packages(tmp_path / "venv") / "polars"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from .polars import *\n")
    (pkg / "polars.abi3.so").write_bytes(corpus.find("polars.abi3.so").read_bytes())
    verdict = _decide([py, "-c", "import polars"], tmp_path)
    assert verdict.action == "reject", verdict.findings
    assert "page-size-compiled" in verdict.rule_ids
    four_k = NodeProfile(machine="aarch64", page_size=4096, glibc=(2, 36), root="/",
                         root_is_native=False)
    assert decide(ROOMY, StepRequest(partition=None, argv=[str(py), "-c", "import polars"],
                                     env={"PATH": "/usr/bin", "HOME": str(tmp_path)},
                                     cwd=str(tmp_path), node=four_k)).action == "allow"


@pytest.mark.network
def test_bundled_library_remedy_names_the_installed_package(grace_venv: Path,
                                                            tmp_path: Path) -> None:
    py = _with(grace_venv, "numpy-1.19.0-aarch64")
    verdict = _decide([py, "-c", "import numpy"], tmp_path)
    (blas,) = [f for f in verdict.findings if "libopenblas" in f.path]
    assert blas.cause == "bundled-lib"
    assert "Upgrade numpy 1.19.0" in blas.remediation


@pytest.mark.network
def test_torchcodec_without_ffmpeg_and_a_foreign_jit_cache(elf_builder: ElfBuilder,
                                                          tmp_path: Path) -> None:
    # The real torchcodec 0.11.0 aarch64 wheel: its cores need FFmpeg 4..8,
    # which this "node" (its system judged by name, no FFmpeg on
    # LD_LIBRARY_PATH) does not have for aarch64.
    from python import torch_layouts

    base = envs.base_python(elf_builder, "base311", "3.11")
    py = envs.make_venv(base, tmp_path / "venv")
    site = envs.site_packages(tmp_path / "venv")
    torch_layouts.copy_tree(torch_layouts.torchcodec_site(), site)
    verdict = _decide([py, "-c", "import torchcodec"], tmp_path)
    assert "torchcodec-no-ffmpeg" in verdict.rule_ids, verdict.findings
    # The per-major core libraries it tries one by one are not each an error.
    assert "lib-not-found" not in verdict.rule_ids
    # Nobody imports it: one warning for the package, nothing more.
    quiet = _decide([py, "-c", "import json"], tmp_path)
    assert "torchcodec-no-ffmpeg" not in quiet.rule_ids

    # torch in use, and a Triton cache shared with an x86_64 machine.
    torch_layouts.copy_tree(torch_layouts.cpu_files(), site)
    cache = tmp_path / "triton-cache" / "abc123"
    cache.mkdir(parents=True)
    so = elf_builder.compile("int k(void) { return 0; }\n", "x/kernel.so", shared=True)
    (cache / "kernel.so").write_bytes(so.read_bytes())
    verdict = _decide([py, "-c", "import torch"], tmp_path,
                      env={"TRITON_CACHE_DIR": str(tmp_path / "triton-cache")})
    (finding,) = [f for f in verdict.findings if f.rule == "jit-cache-foreign"]
    assert finding.severity == "warning"


def test_uv_run_judges_the_project_environment_as_warnings(grace_venv: Path,
                                                           elf_builder: ElfBuilder,
                                                           tmp_path: Path) -> None:
    # uv run python train.py: uv (a Rust binary) runs the project's .venv.
    project = tmp_path / "proj"
    (project / "src").mkdir(parents=True)
    (project / "pyproject.toml").write_text("[project]\nname = 'p'\n")
    (project / ".venv").symlink_to(grace_venv.parent.parent)
    site = envs.site_packages(grace_venv.parent.parent)
    envs.pip_install(_ext_wheel(elf_builder, tmp_path, "fastthing", "x86_64",
                                "_core.abi3.so"), site)
    uv = elf_builder.compile("int main(void) { return 0; }\n", "bin/uv", arch="aarch64",
                             page_size=65536)
    verdict = _decide([uv, "run", "python", "train.py"], project / "src")
    assert verdict.action == "warn", verdict.findings
    assert [f.rule for f in verdict.findings] == ["py-dist-broken"]
    # Outside a project, or another uv command: nothing to judge.
    assert _decide([uv, "run", "python", "x.py"], tmp_path).action == "allow"
    assert _decide([uv, "pip", "list"], project).action == "allow"


def test_a_pth_file_that_stops_python_before_it_runs(grace_venv: Path, tmp_path: Path) -> None:
    # CPython 3.7-3.13 abort at start-up on a .pth that is not UTF-8
    # (held to the real interpreters in test_sitepath.py).
    site = envs.site_packages(grace_venv.parent.parent)
    (site / "broken.pth").write_bytes(b"/opt/\xff\xfe\n")
    verdict = _decide([grace_venv, "-c", "pass"], tmp_path)
    assert verdict.action == "reject"
    (finding,) = verdict.findings
    assert finding.rule == "py-startup-error" and "Fatal Python error" in finding.predicted_error


def test_the_distributions_extension_modules_are_judged_under_ld_library_path(
        elf_builder: ElfBuilder, tmp_path: Path) -> None:
    """On its own node the distribution Python's lib-dynload is not read for
    a clean step (its files are built for the node); a LD_LIBRARY_PATH can
    make their libraries resolve elsewhere, and then they are judged: a
    stand-in libffi there breaks _ctypes, as the real interpreter shows."""
    import glob
    import subprocess

    from grace_policy.elf import read_elf
    from grace_policy.node import detect

    found = glob.glob("/usr/lib/python3*/lib-dynload/_ctypes.*.so")
    if not found or not Path("/usr/bin/python3").exists():
        pytest.skip("no Debian python3 with lib-dynload/_ctypes here")
    [ffi] = [n for n in read_elf(found[0]).needed if n.startswith("libffi.so")]
    stub = elf_builder.library(f"llp/{ffi}", source="int not_ffi(void) { return 0; }\n")
    llp = str(stub.parent)
    # The oracle: the distribution's interpreter itself, under that path.
    real = subprocess.run(["/usr/bin/python3", "-c", "import ctypes"], capture_output=True,
                          text=True, env={"LD_LIBRARY_PATH": llp}, check=False)
    assert real.returncode != 0 and found[0] in real.stderr, real.stderr

    def judged(env: dict[str, str]) -> tuple[list[tuple[str, str]], bool]:
        """The findings, and whether _ctypes' file was read at all."""
        probes: list[tuple[str, str, str]] = []
        v = decide(ROOMY, StepRequest(partition=None, argv=["/usr/bin/python3", "-c", "pass"],
                                      env={"PATH": "/usr/bin:/bin", **env}, cwd=str(tmp_path),
                                      node=detect()), probes=probes)
        return [(f.rule, f.path) for f in v.findings], any(found[0] in p for p in probes)

    assert judged({}) == ([], False)
    findings, read = judged({"LD_LIBRARY_PATH": llp})
    assert read and ("lib-version-missing", found[0]) in findings, findings
