"""Leaked conda/venv variables: judged by the interpreter they lead to (a real
compiled aarch64 ELF, the machine's real python), stripped per policy."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from fixtures.build import ElfBuilder, src

from grace_policy.budget import Budget, BudgetExceeded
from grace_policy.envleak import judge_prefix, plan
from grace_policy.node import NodeProfile, detect

HOST = detect()
AARCH64 = NodeProfile(machine="aarch64", page_size=65536, glibc=(2, 34), root_is_native=False)


def real_python() -> str:
    return os.path.realpath(sys.executable)


def make_venv(root: Path, python_target: str | Path | None, *, symlink: bool = True) -> Path:
    (root / "bin").mkdir(parents=True)
    (root / "lib").mkdir()
    (root / "pyvenv.cfg").write_text("home = /usr/bin\n")
    if python_target is not None:
        if symlink:
            (root / "bin" / "python").symlink_to(python_target)
        else:
            os.link(python_target, root / "bin" / "python")
    return root


@pytest.fixture
def foreign_venv(tmp_path: Path, elf_builder: ElfBuilder, have_cross: str) -> Path:
    """A venv made on another machine: its python is an aarch64 ELF."""
    py = elf_builder.compile(src("hello.c"), "aarch64-python", arch="aarch64")
    py.chmod(0o755)
    return make_venv(tmp_path / "venv", py, symlink=False)


def test_foreign_venv_is_stripped(foreign_venv: Path, tmp_path: Path) -> None:
    env = {
        "VIRTUAL_ENV": str(foreign_venv), "VIRTUAL_ENV_PROMPT": "(venv)",
        "PATH": f"{foreign_venv}/bin:{tmp_path}/venv2/bin:/usr/bin:/bin",
        "LD_LIBRARY_PATH": f"{foreign_venv}/lib:/opt/lib",
        "HOME": str(tmp_path),
    }
    p = plan(env, HOST)
    assert set(p.changes.unset) == {"VIRTUAL_ENV", "VIRTUAL_ENV_PROMPT"}
    changed = dict(p.changes.set)
    # Only entries under the prefix go; a look-alike sibling stays.
    assert changed["PATH"] == f"{tmp_path}/venv2/bin:/usr/bin:/bin"
    assert changed["LD_LIBRARY_PATH"] == "/opt/lib"
    (issue,) = p.issues
    assert issue.rule == "env-leak" and issue.fact("cleaned") == "yes"
    assert "aarch64" in issue.fact("reason")
    assert p.foreign_prefixes == (str(foreign_venv),)


def test_native_venv_stays(tmp_path: Path) -> None:
    venv = make_venv(tmp_path / "venv", real_python())
    env = {"VIRTUAL_ENV": str(venv), "PATH": f"{venv}/bin:/usr/bin"}
    p = plan(env, HOST)
    assert p.changes.empty and p.issues == () and p.foreign_prefixes == ()


def test_host_python_is_foreign_on_an_aarch64_node(tmp_path: Path) -> None:
    """The same native venv, judged for a Grace partition from this host."""
    if HOST.machine == "aarch64":
        pytest.skip("host is aarch64: its python is native there")
    venv = make_venv(tmp_path / "venv", real_python())
    reason = judge_prefix(str(venv), AARCH64, {})
    assert reason is not None and HOST.machine in reason


def test_missing_conda_prefix_strips_the_conda_group_only(tmp_path: Path) -> None:
    venv = make_venv(tmp_path / "venv", real_python())
    gone = tmp_path / "miniconda3" / "envs" / "torch"
    env = {
        "CONDA_PREFIX": str(gone), "CONDA_DEFAULT_ENV": "torch", "CONDA_SHLVL": "2",
        "CONDA_EXE": f"{tmp_path}/miniconda3/bin/conda", "_CE_M": "", "_CE_CONDA": "",
        "VIRTUAL_ENV": str(venv),
        "PATH": f"{gone}/bin:{tmp_path}/miniconda3/condabin:{venv}/bin:/usr/bin",
    }
    p = plan(env, HOST)
    assert set(p.changes.unset) == {"CONDA_PREFIX", "CONDA_DEFAULT_ENV", "CONDA_SHLVL",
                                    "CONDA_EXE", "_CE_M", "_CE_CONDA"}
    assert dict(p.changes.set)["PATH"] == f"{venv}/bin:/usr/bin"
    (issue,) = p.issues
    assert issue.fact("group") == "conda" and "does not exist" in issue.fact("reason")


def test_strip_never_reports_but_keeps(foreign_venv: Path) -> None:
    env = {"VIRTUAL_ENV": str(foreign_venv), "PATH": f"{foreign_venv}/bin:/usr/bin"}
    p = plan(env, HOST, strip="never")
    assert p.changes.empty
    (issue,) = p.issues
    assert issue.fact("cleaned") == "no"


def test_strip_always_removes_even_a_native_venv(tmp_path: Path) -> None:
    venv = make_venv(tmp_path / "venv", real_python())
    env = {"VIRTUAL_ENV": str(venv), "PATH": f"{venv}/bin:/usr/bin"}
    p = plan(env, HOST, strip="always")
    assert p.changes.unset == ("VIRTUAL_ENV",)
    assert dict(p.changes.set)["PATH"] == "/usr/bin"
    (issue,) = p.issues
    assert "strips" in issue.fact("reason")


def test_ld_library_path_emptied_is_unset(foreign_venv: Path) -> None:
    env = {"VIRTUAL_ENV": str(foreign_venv), "LD_LIBRARY_PATH": f"{foreign_venv}/lib"}
    p = plan(env, HOST)
    assert "LD_LIBRARY_PATH" in p.changes.unset


def test_venv_python_that_is_a_fifo_does_not_block(tmp_path: Path) -> None:
    venv = make_venv(tmp_path / "venv", None)
    os.mkfifo(venv / "bin" / "python")
    p = plan({"VIRTUAL_ENV": str(venv)}, HOST)
    assert p.changes.empty  # not judged foreign: nothing known against it


def test_python_link_to_a_missing_file_is_foreign(tmp_path: Path) -> None:
    venv = make_venv(tmp_path / "venv", "/login-node-only/python3.11")
    p = plan({"VIRTUAL_ENV": str(venv)}, HOST)
    assert p.changes.unset == ("VIRTUAL_ENV",)


def test_judging_looks_at_the_budget(foreign_venv: Path) -> None:
    with pytest.raises(BudgetExceeded):
        plan({"VIRTUAL_ENV": str(foreign_venv)}, HOST, budget=Budget(max_bytes=10))


def test_a_big_endian_venv_is_foreign_on_a_little_endian_node(tmp_path: Path,
                                                              elf_builder: ElfBuilder,
                                                              have_cross: str) -> None:
    """The node's kernel reads e_machine in its own byte order: an aarch64
    interpreter built big-endian does not start on a Grace node, so its venv
    is stripped like an x86_64 one (the old test compared machine and class
    only, and kept it)."""
    py = elf_builder.library("be/python", source=src("freestanding.c"), arch="aarch64",
                             extra_flags=("-mbig-endian", "-nostdlib"))
    py.chmod(0o755)
    venv = make_venv(tmp_path / "venv", py, symlink=False)
    reason = judge_prefix(str(venv), AARCH64, {})
    assert reason is not None and "aarch64 (big-endian)" in reason
