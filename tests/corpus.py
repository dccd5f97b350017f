"""Real aarch64 binaries for tests: Debian arm64 packages and a manylinux wheel.

Compiled fixtures show what *our* toolchain writes; distribution binaries show
what users actually run (other linkers, flags, RELRO layouts, glibc's gconv
modules, jemalloc). They are downloaded with the ordinary clients (apt-get with
private state dirs, pip download), unpacked with ``dpkg -x``/``zipfile``, and
kept under ``~/.cache/grace-policy-tests`` (override: ``GRACE_TEST_CACHE``) so a
rerun is offline and fast. Nothing downloaded is ever written into the repo.

When the network or a tool is missing, the fixtures skip with the reason (the
failure is remembered for the session, so it is not retried per test). Mark
tests that use them ``@pytest.mark.network``.

Fixtures (imported into ``conftest.py``): ``debian_arm64`` and
``aarch64_wheel``, both :class:`Corpus`.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

#: Small packages with shared libraries, chosen for variety: libc6 (the loader,
#: gconv modules, many sonames), coreutils/bash (executables), jemalloc (the
#: page-size story), zstd/zlib (typical leaf libraries).
DEBIAN_PACKAGES: tuple[str, ...] = (
    "libc6", "coreutils", "bash", "libjemalloc2", "libzstd1", "zlib1g",
)
#: One real manylinux aarch64 wheel with a C extension (pinned: deterministic).
WHEEL_REQUIREMENT = "markupsafe==2.1.5"
WHEEL_PYTHON = "3.11"

NET_TIMEOUT = 30


def cache_root() -> Path:
    env = os.environ.get("GRACE_TEST_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "grace-policy-tests"


class CorpusUnavailable(Exception):
    """Why a corpus could not be fetched; becomes the skip reason."""


@dataclass(frozen=True)
class Corpus:
    """An unpacked tree of real files and the ELF files in it."""

    root: Path
    elf_files: tuple[Path, ...]
    source: str

    def find(self, name: str) -> Path:
        """The first ELF file whose name is ``name`` (e.g. ``libzstd.so.1.5.4``)."""
        for path in self.elf_files:
            if path.name == name:
                return path
        raise KeyError(f"{name} not in {self.source} corpus")

    def matching(self, prefix: str) -> list[Path]:
        return [p for p in self.elf_files if p.name.startswith(prefix)]


def list_elf_files(root: Path) -> tuple[Path, ...]:
    """Regular (non-symlink) files starting with the ELF magic, sorted, so every
    run sees the same corpus in the same order."""
    found: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            path = Path(dirpath) / name
            if path.is_symlink() or not path.is_file():
                continue
            with open(path, "rb") as fh:
                if fh.read(4) == b"\x7fELF":
                    found.append(path)
    return tuple(found)


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[None]:
    """Serialise downloads between concurrent pytest sessions (the team shares
    one machine and one cache)."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _run(cmd: list[str], cwd: Path | None = None, timeout: float = 300) -> None:
    try:
        proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True,
                              timeout=timeout, check=False)
    except FileNotFoundError as exc:
        raise CorpusUnavailable(f"{cmd[0]} not installed") from exc
    except subprocess.TimeoutExpired as exc:
        raise CorpusUnavailable(f"{' '.join(cmd[:3])}... timed out") from exc
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise CorpusUnavailable(f"{' '.join(cmd[:3])}... failed: {' | '.join(tail)}")


def _stamp_ok(stamp: Path, want: dict[str, object]) -> bool:
    try:
        return bool(json.loads(stamp.read_text()) == want)
    except (OSError, ValueError):
        return False


def _cached_tree(name: str, want: dict[str, object], build: Callable[[Path], Path]) -> Path:
    """``cache_root()/name/root``, built once by ``build(workdir)`` (which
    returns the unpacked tree) under a lock, and rebuilt when ``want`` (what
    the stamp records) changes."""
    base = cache_root() / name
    root, stamp = base / "root", base / "stamp.json"
    if _stamp_ok(stamp, want) and root.is_dir():
        return root
    with _locked(base):
        if _stamp_ok(stamp, want) and root.is_dir():
            return root
        with tempfile.TemporaryDirectory(dir=base, prefix="work-") as tmp:
            unpack = build(Path(tmp))
            if root.exists():
                shutil.rmtree(root)
            os.replace(unpack, root)
        stamp.write_text(json.dumps(want))
    return root


def fetch_debian_arm64(packages: tuple[str, ...] = DEBIAN_PACKAGES,
                       name: str = "debian-arm64") -> Path:
    """Download and unpack ``packages`` (arm64) once; return the unpacked root.
    Another package set needs its own ``name`` (its own cache directory), or
    the two sets would rebuild each other's tree."""

    def build(work: Path) -> Path:
        lists, cache, debs, unpack = (work / n for n in ("lists", "cache", "debs", "root"))
        for d in (lists / "partial", cache / "archives" / "partial", debs, unpack):
            d.mkdir(parents=True)
        apt = [
            "apt-get", "-q",
            "-oAPT::Architecture=arm64", "-oAPT::Architectures=arm64",
            f"-oDir::State::Lists={lists}", f"-oDir::Cache={cache}",
            "-oDir::State::status=/dev/null",
            "-oAcquire::Retries=1", f"-oAcquire::http::Timeout={NET_TIMEOUT}",
            # apt's _apt sandbox user cannot write into root's private dirs.
            "-oAPT::Sandbox::User=root",
        ]
        _run([*apt, "update"])
        _run([*apt, "download", *packages], cwd=debs)
        for deb in sorted(debs.glob("*.deb")):
            _run(["dpkg-deb", "-x", str(deb), str(unpack)])
        got = sorted(p.name.split("_", 1)[0] for p in debs.glob("*.deb"))
        (work.parent / "versions.json").write_text(
            json.dumps(sorted(p.name for p in debs.glob("*.deb")), indent=1))
        if got != sorted(packages):
            raise CorpusUnavailable(f"apt-get downloaded {got}, wanted {sorted(packages)}")
        return unpack

    return _cached_tree(name, {"packages": list(packages)}, build)


def fetch_aarch64_wheel(requirement: str = WHEEL_REQUIREMENT) -> Path:
    """Download one manylinux aarch64 wheel with pip and unzip it; return the root."""

    def build(work: Path) -> Path:
        _run(["python3", "-m", "pip", "download", "-q", "--only-binary=:all:", "--no-deps",
              "--platform", "manylinux2014_aarch64", "--python-version", WHEEL_PYTHON,
              "--implementation", "cp", "--timeout", str(NET_TIMEOUT),
              "-d", str(work / "dl"), requirement])
        wheels = sorted((work / "dl").glob("*.whl"))
        if len(wheels) != 1:
            raise CorpusUnavailable(f"pip download gave {len(wheels)} wheels for {requirement}")
        unpack = work / "root"
        with zipfile.ZipFile(wheels[0]) as zf:
            zf.extractall(unpack)
        return unpack

    return _cached_tree("wheel-aarch64", {"requirement": requirement, "python": WHEEL_PYTHON},
                        build)


_failures: dict[str, str] = {}


def _give_up(reason: str) -> None:
    """Offline on a laptop: skip, visibly. In CI (``CI`` set), which reaches
    the registries, a missing corpus is a failure: a silent skip would drop
    the real-aarch64-files requirement without anyone noticing."""
    if os.environ.get("CI"):
        pytest.fail(reason)
    pytest.skip(reason)


def _corpus_or_skip(kind: str, fetch: Callable[[], Path]) -> Corpus:
    if kind in _failures:
        _give_up(_failures[kind])
    try:
        root = fetch()
    except CorpusUnavailable as exc:
        _failures[kind] = f"{kind} corpus unavailable (network?): {exc}"
        _give_up(_failures[kind])
    files = list_elf_files(root)
    if not files:
        pytest.fail(f"{kind} corpus at {root} holds no ELF files; delete it to refetch")
    return Corpus(root=root, elf_files=files, source=kind)


@pytest.fixture(scope="session")
def debian_arm64() -> Corpus:
    """Unpacked Debian arm64 packages (see :data:`DEBIAN_PACKAGES`)."""
    return _corpus_or_skip("debian-arm64", fetch_debian_arm64)


@pytest.fixture(scope="session")
def aarch64_wheel() -> Corpus:
    """An unpacked manylinux2014 aarch64 wheel (:data:`WHEEL_REQUIREMENT`)."""
    return _corpus_or_skip("aarch64-wheel", fetch_aarch64_wheel)
