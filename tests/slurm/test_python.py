"""Python steps on the real Slurm: what the interpreter will import is judged
before the step starts (issue 8).

The environment is a real venv of the system python (``python3 -m venv``);
packages are wheels built here from C (one with an aarch64 extension module,
which this x86_64 node cannot load) and installed by the real pip. Whether a
step ran is shown by a file its code writes before any import.
"""

from __future__ import annotations

import functools
import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from .harness import SlurmEnv

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from python import envs

pytestmark = pytest.mark.slurm

PREFIX = "grace-policy: "


def _compile_so(tmp: Path, name: str, cc: str) -> bytes:
    src = tmp / f"{name}.c"
    src.write_text("int answer(void) { return 42; }\n")
    out = tmp / f"{name}.so"
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(out), str(src)], check=True,
                   capture_output=True, timeout=120)
    return out.read_bytes()


@pytest.fixture(scope="module")
def pyenv(slurm: SlurmEnv) -> Iterator[Path]:
    """A venv in the cluster's shared dir with: ``brokenpkg`` (an aarch64
    ``_core.abi3.so``), ``cleanpkg`` (pure Python)."""
    root = slurm.cluster.shared / "pyenv"
    if root.exists():
        shutil.rmtree(root)
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", str(root / "venv")],
                   check=True, timeout=120)
    site = envs.site_packages(root / "venv")
    work = root / "build"
    work.mkdir()
    foreign = _compile_so(work, "core-aarch64", "aarch64-linux-gnu-gcc")
    envs.pip_install(envs.build_wheel(work, "brokenpkg", "1.0", {
        "brokenpkg/__init__.py": b"from . import _core\n",
        "brokenpkg/_core.abi3.so": foreign}), site)
    envs.pip_install(envs.build_wheel(work, "cleanpkg", "1.0", {
        "cleanpkg/__init__.py": b"VALUE = 1\n"}), site)
    subprocess.run(["chmod", "-R", "a+rX", str(root)], check=True)
    yield root / "venv" / "bin" / "python"
    slurm.use("base")


def _step(env: SlurmEnv, python: Path, code: str, *, partition: str = "enforce",
          marker: str, srun_args: tuple[str, ...] = ()
          ) -> tuple[subprocess.CompletedProcess[str], Path, list[dict[str, object]]]:
    out = env.side_file(marker)
    before = len(env.audit_lines())
    res = env.cluster.srun([*srun_args, "-p", partition, str(python), "-c",
                            f"open({str(out)!r}, 'w').write('ran'); {code}"], user="nobody")
    records = [json.loads(line) for line in env.audit_lines()[before:]]
    return res, out, records


def test_broken_imported_package_is_rejected_before_start(grace: SlurmEnv, pyenv: Path
                                                          ) -> None:
    res, out, records = _step(grace, pyenv, "import brokenpkg", marker="py-broken.out")
    assert res.returncode != 0
    assert not out.exists(), "the step ran although its import was judged broken"
    assert f"{PREFIX}ERROR py-ext-arch:" in res.stderr
    assert "brokenpkg/_core.abi3.so" in res.stderr
    assert "cannot open shared object file" in res.stderr
    assert "Traceback" not in res.stderr
    [record] = records
    assert record["action"] == "reject" and "py-ext-arch" in record["rules"]


def test_broken_package_nobody_imports_only_warns(grace: SlurmEnv, pyenv: Path) -> None:
    res, out, records = _step(grace, pyenv, "import cleanpkg", marker="py-unused.out")
    assert res.returncode == 0, res.stderr
    assert out.read_text() == "ran"
    assert f"{PREFIX}WARNING py-dist-broken:" in res.stderr
    assert "brokenpkg" in res.stderr
    [record] = records
    assert record["action"] == "warn"


def test_warn_partition_lets_the_broken_import_run(grace: SlurmEnv, pyenv: Path) -> None:
    res, out, _records = _step(grace, pyenv, "import cleanpkg", partition="warnp",
                               marker="py-warnp.out")
    assert out.exists()
    res, out, records = _step(grace, pyenv, "import brokenpkg", partition="warnp",
                              marker="py-warnp2.out")
    assert out.exists(), "warn mode must let the step start"
    assert f"{PREFIX}ERROR py-ext-arch:" in res.stderr  # and the import then fails
    assert records[0]["action"] == "warn"


def test_clean_python_step_is_cached_and_a_new_package_is_a_miss(slurm: SlurmEnv, tmp_path: Path
                                                                 ) -> None:
    cache = slurm.cluster.root.parent / "cache-python"
    if cache.exists():
        shutil.rmtree(cache)
    root = slurm.cluster.shared / "pyenv-clean"
    if root.exists():
        shutil.rmtree(root)
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", str(root)], check=True,
                   timeout=120)
    site = envs.site_packages(root)
    envs.pip_install(envs.build_wheel(tmp_path, "cleanpkg", "1.0", {
        "cleanpkg/__init__.py": b"VALUE = 1\n"}), site)
    subprocess.run(["chmod", "-R", "a+rX", str(root)], check=True)
    python = root / "bin" / "python"
    slurm.use("base", f"cache_dir={cache}")
    # -c puts the step's directory first on sys.path, so the check lists
    # it: run the steps in one they do not write to (the venv), not in the
    # shared directory where each step leaves its marker (a changed
    # listing is rightly a miss).
    step = functools.partial(_step, slurm, python, srun_args=(f"--chdir={root}",))
    try:
        hits = []
        for _ in range(2):  # the same step twice (same arguments)
            res, out, records = step("import cleanpkg", marker="py-cache.out")
            assert res.returncode == 0 and out.exists(), res.stderr
            assert PREFIX not in res.stderr, res.stderr
            hits.append(records[0].get("cache") == "hit")
        assert hits == [False, True]
        # Other arguments: another step, judged again.
        res, out, records = step("import json", marker="py-cache2.out")
        assert records[0].get("cache") != "hit"
        # A package installed after the clean verdict: the listing changed.
        envs.pip_install(envs.build_wheel(tmp_path, "laterpkg", "1.0", {
            "laterpkg/__init__.py": b""}), site)
        subprocess.run(["chmod", "-R", "a+rX", str(root)], check=True)
        res, out, records = step("import cleanpkg", marker="py-cache.out")
        assert out.exists() and records[0].get("cache") != "hit"
        res, out, records = step("import cleanpkg", marker="py-cache.out")
        assert records[0].get("cache") == "hit"
        # The imported package replaced by pip (same name, new files): a miss.
        envs.pip_install(envs.build_wheel(tmp_path / "v2", "cleanpkg", "1.0", {
            "cleanpkg/__init__.py": b"VALUE = 2\n"}), site)
        subprocess.run(["chmod", "-R", "a+rX", str(root)], check=True)
        res, out, records = step("import cleanpkg", marker="py-cache.out")
        assert records[0].get("cache") != "hit"
    finally:
        slurm.use("base")
