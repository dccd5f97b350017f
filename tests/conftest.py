"""Shared pytest fixtures: real ELF builds (gcc, aarch64 cross gcc) and tool checks.

Fixtures:

- ``elf_builder``: :class:`fixtures.build.ElfBuilder` writing under ``tmp_path``.
- ``session_elf_builder``: the same, one directory for the whole session (for
  corpora that many tests read and nobody modifies).
- ``compile_cache``: the :class:`fixtures.build.CompileCache` behind both, kept across
  runs under ``~/.cache/grace-policy-tests/compile``.
- ``debian_arm64`` / ``aarch64_wheel`` (session, from :mod:`corpus`): real
  aarch64 files downloaded once into ``~/.cache/grace-policy-tests``; skipped
  with the reason when offline. Mark such tests ``network``.
- ``have_cross`` / ``have_qemu``: path of ``aarch64-linux-gnu-gcc`` /
  ``qemu-aarch64``; the test is *skipped with the reason* when missing.

Tests marked ``cross`` or ``qemu`` are skipped the same way without asking for
the fixture. The tests directory and the repository root are put on
``sys.path`` so ``from fixtures.build import ...`` and ``import grace_policy``
work however pytest was started (rootdir, import mode, cwd).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

TESTS_DIR = Path(__file__).resolve().parent
REPO_ROOT = TESTS_DIR.parent
for _p in (str(TESTS_DIR), str(REPO_ROOT)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

from corpus import (  # noqa: E402, F401  (fixtures)
    aarch64_wheel,
    cache_root,
    debian_arm64,
    node_exporter,
    prune_unused,
)
from fixtures.build import (  # noqa: E402
    AARCH64_LOADER,
    CompileCache,
    ElfBuilder,
    compiler_for,
    qemu_aarch64,
)

if TYPE_CHECKING:
    from vm.demo_run import DemoNode


def _cross_missing() -> str | None:
    if compiler_for("aarch64") is None:
        return "aarch64-linux-gnu-gcc not installed (apt-get install gcc-aarch64-linux-gnu)"
    return None


def _qemu_missing() -> str | None:
    if qemu_aarch64() is None:
        return "qemu-aarch64 not installed (apt-get install qemu-user)"
    if not os.path.exists(AARCH64_LOADER):
        return f"{AARCH64_LOADER} missing (apt-get install libc6-arm64-cross)"
    return None


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Skip ``cross``/``qemu``-marked tests visibly when the tool is absent,
    instead of letting them fail with a compiler-not-found error."""
    if item.get_closest_marker("cross") is not None:
        reason = _cross_missing()
        if reason:
            pytest.skip(reason)
    if item.get_closest_marker("qemu") is not None:
        reason = _qemu_missing()
        if reason:
            pytest.skip(reason)


@pytest.fixture(scope="session")
def compile_cache() -> CompileCache:
    directory = cache_root() / "compile"
    directory.mkdir(parents=True, exist_ok=True)
    prune_unused(directory)
    return CompileCache(directory)


@pytest.fixture
def elf_builder(tmp_path: Path, compile_cache: CompileCache) -> ElfBuilder:
    return ElfBuilder(tmp_path, compile_cache)


@pytest.fixture(scope="session")
def session_elf_builder(tmp_path_factory: pytest.TempPathFactory,
                        compile_cache: CompileCache) -> ElfBuilder:
    return ElfBuilder(tmp_path_factory.mktemp("elf-session"), compile_cache)


@pytest.fixture(scope="session")
def have_cross() -> str:
    reason = _cross_missing()
    if reason:
        pytest.skip(reason)
    path = compiler_for("aarch64")
    assert path is not None
    return path


@pytest.fixture(scope="session")
def have_qemu() -> str:
    reason = _qemu_missing()
    if reason:
        pytest.skip(reason)
    path = qemu_aarch64()
    assert path is not None
    return path


@pytest.fixture
def foreign_padding(elf_builder: ElfBuilder, have_cross: str):
    """``make(soname, count)``: an LD_LIBRARY_PATH of ``count`` directories,
    each holding an aarch64 build named ``soname``. The loader opens every one
    (and skips it), so a check spends one file of its cap per directory:
    the honest way to exhaust ``max_files`` (absent paths do not count)."""

    def make(soname: str, count: int) -> str:
        foreign = elf_builder.library(f"foreign-pad/src/{soname}", arch="aarch64")
        dirs = []
        for i in range(count):
            d = foreign.parent.parent / f"pad{i}"
            d.mkdir()
            os.link(foreign, d / soname)
            dirs.append(str(d))
        return ":".join(dirs)

    return make


@pytest.fixture(scope="module")
def enroot_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A site's install of the real enroot 4.1.2 (built from the pinned
    tarball, tests/slurm/containers.py; its configuration in
    ``etc/enroot``): ``bin/enroot`` for tests without Slurm."""
    from slurm.containers import site_enroot_or_skip

    return site_enroot_or_skip(tmp_path_factory.mktemp("site"))


@pytest.fixture(scope="session")
def demo_node(tmp_path_factory: pytest.TempPathFactory) -> DemoNode:
    """``make demo-node`` once per session, its guest's files kept: what it
    showed (tests/test_demos.py) and what the node decided
    (tests/test_grace_node.py) come from one boot (tests/vm/demo_run.py)."""
    from corpus import _give_up
    from vm.demo_run import run_demo_node
    from vm.qemu import qemu_binary

    if qemu_binary() is None:
        _give_up("qemu-system-aarch64 not installed (make deps: qemu-system-arm)")
    return run_demo_node(tmp_path_factory.mktemp("demo-node"))
