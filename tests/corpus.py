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
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import time
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


def mark_used(entry: Path) -> None:
    """A run used this entry of a cache kept across runs (:func:`prune_unused`)."""
    try:
        os.utime(entry)
    except OSError:
        pass


def prune_unused(directory: Path, pattern: str = "*", days: float = 14) -> None:
    """Remove the entries of a cache kept across runs (tests/squash.py's
    images, the compile cache) that no run used for ``days``: their keys
    change with the code, so old entries would otherwise pile up."""
    old = time.time() - days * 86400
    for entry in directory.glob(pattern):
        try:
            if entry.stat().st_mtime < old:
                entry.unlink()
        except OSError:
            pass


def sha256_file(path: Path) -> str:
    """A downloaded file's sha256, read in blocks (wheels and .debs are pinned by it)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


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


#: node_exporter, the consumer of the metrics file (its textfile collector
#: is the oracle for the format), from Debian 12's archive, pinned.
NODE_EXPORTER = ("prometheus-node-exporter", "1.5.0-1+b6",
                 "8cb5b39627595ea2cf3cd27be593e0e9af87023d29e1c5b8487e2f9510097e09")
#: Where the pinned version lives, named explicitly: the running system's
#: own apt sources are another suite inside the matrix's Debian 13/sid roots
#: (and on a host that is not Debian 12), which have no such version.
NODE_EXPORTER_SOURCE = "deb http://deb.debian.org/debian bookworm main\n"


def fetch_node_exporter(pin: tuple[str, str, str] = NODE_EXPORTER) -> Path:
    """Download the pinned node_exporter .deb for this machine's architecture
    from Debian 12 (private sources list and apt state: nothing is installed,
    no service is started, whatever release runs this), check its sha256 and
    unpack it once; return the executable."""
    import hashlib

    name, version, digest = pin

    def build(work: Path) -> Path:
        lists, cache, debs, unpack, etc = (
            work / n for n in ("lists", "cache", "debs", "root", "etc"))
        for d in (lists / "partial", cache / "archives" / "partial", debs, unpack, etc):
            d.mkdir(parents=True)
        (etc / "sources.list").write_text(NODE_EXPORTER_SOURCE)
        apt = ["apt-get", "-q", f"-oDir::Etc::SourceList={etc / 'sources.list'}",
               "-oDir::Etc::SourceParts=/nonexistent",
               f"-oDir::State::Lists={lists}", f"-oDir::Cache={cache}",
               "-oDir::State::status=/dev/null", "-oAcquire::Retries=1",
               f"-oAcquire::http::Timeout={NET_TIMEOUT}", "-oAPT::Sandbox::User=root"]
        _run([*apt, "update"])
        _run([*apt, "download", f"{name}={version}"], cwd=debs)
        [deb] = sorted(debs.glob("*.deb")) or [None]
        if deb is None:
            raise CorpusUnavailable(f"apt-get download {name}={version} gave no .deb")
        got = hashlib.sha256(deb.read_bytes()).hexdigest()
        if got != digest:
            raise CorpusUnavailable(f"{deb.name}: sha256 {got}, pinned {digest}")
        _run(["dpkg-deb", "-x", str(deb), str(unpack)])
        return unpack

    root = _cached_tree("node-exporter", {"package": name, "version": version,
                                          "sha256": digest}, build)
    return root / "usr" / "bin" / "prometheus-node-exporter"


@dataclass(frozen=True)
class PinnedWheel:
    """One real wheel, pinned by version and sha256 (pip checks the hash), of
    which only ``members`` are unpacked (big wheels: keep the cache small)."""

    requirement: str
    sha256: str
    python: str
    #: Paths in the wheel; one ending in "/" stands for everything under it.
    members: tuple[str, ...]

    @property
    def name(self) -> str:
        """Cache name; the member list is part of it, so two selections of
        one wheel (older checkouts unpack fewer members) never rebuild each
        other's tree."""
        digest = hashlib.sha256("\0".join(self.members).encode()).hexdigest()[:8]
        return f"{self.requirement.replace('==', '-').lower()}-{digest}"


#: Wheels with an embedded jemalloc built for small pages (issue 11), and one
#: whose auditwheel/patchelf repair overwrote .bss on 64 KiB pages.
POLARS_4K = PinnedWheel(  # the smallest aarch64 polars wheel before the fix (0.20.21)
    "polars==0.14.8", "22ad73753a766455b47353f6da42c2d12350538f92848205b3a93e2109204006",
    "3.11", ("polars/",))
DUCKDB_16K = PinnedWheel(
    "duckdb==0.9.2", "b14d98d26bab139114f62ade81350a5342f60a168d94b27ed2c706838f949eda",
    "3.11", ("duckdb/",))
PYARROW_4K = PinnedWheel(
    "pyarrow==5.0.0", "1d9485741e497ccc516cb0a0c8f56e22be55aea815be185c3f9a681323b0e614",
    "3.9", ("pyarrow/libarrow.so.500", "pyarrow/libparquet.so.500"))
PILLOW_BSS = PinnedWheel(
    "Pillow==7.2.0", "5e51ee2b8114def244384eda1c82b10e307ad9778dac5c83fb0943775a653cd8",
    "3.8", ("PIL/_imaging.cpython-38-aarch64-linux-gnu.so",
            "PIL/_webp.cpython-38-aarch64-linux-gnu.so",
            "PIL/_imagingmath.cpython-38-aarch64-linux-gnu.so"))


def fetch_pinned_wheel(wheel: PinnedWheel) -> Path:
    """Download ``wheel`` once (hash-checked by pip) and unpack its members
    under ``root/site-packages/``, as an installed package would lie."""

    def build(work: Path) -> Path:
        req = work / "requirements.txt"
        req.write_text(f"{wheel.requirement} --hash=sha256:{wheel.sha256}\n")
        _run(["python3", "-m", "pip", "download", "-q", "--only-binary=:all:", "--no-deps",
              "--require-hashes", "--platform", "manylinux2014_aarch64",
              "--python-version", wheel.python, "--implementation", "cp",
              "--timeout", str(NET_TIMEOUT), "-d", str(work / "dl"), "-r", str(req)])
        wheels = sorted((work / "dl").glob("*.whl"))
        if len(wheels) != 1:
            raise CorpusUnavailable(f"pip download gave {len(wheels)} wheels for {wheel}")
        unpack = work / "root"
        with zipfile.ZipFile(wheels[0]) as zf:
            names = zf.namelist()
            for member in wheel.members:
                wanted = [n for n in names if n.startswith(member)] if member.endswith("/") \
                    else [member]
                for name in wanted:
                    zf.extract(name, unpack / "site-packages")
        return unpack

    return _cached_tree(f"wheel-{wheel.name}", {"requirement": wheel.requirement,
                                                "sha256": wheel.sha256,
                                                "members": list(wheel.members)}, build)


#: jemalloc as Debian 12 ships its source (the same 5.3.0 as the arm64
#: libjemalloc2 in the corpus), cross-built here with a chosen page size.
JEMALLOC_SOURCE = "jemalloc=5.3.0-1"
JEMALLOC_ORIG_SHA256 = "2db82d1e7119df3e71b7640219b6dfe84789bc0537983c3b7ac4f7189aecfeaa"
#: What configure is given besides the page size: Debian's fixed huge page
#: (debian/rules) and only what keeps the build short (no C++ wrapper, no
#: stats); the start-up check does not depend on those.
JEMALLOC_CONFIGURE = ("--host=aarch64-linux-gnu", "--with-lg-hugepage=21", "--disable-cxx",
                      "--disable-stats", "--disable-libdl")


def fetch_jemalloc_source() -> Path:
    """``apt-get source`` of Debian's jemalloc (private sources list and
    state, so the machine's apt setup is untouched), unpacked once."""

    def build(work: Path) -> Path:
        lists, cache, etc = (work / n for n in ("lists", "cache", "etc"))
        for d in (lists / "partial", cache / "archives" / "partial", etc):
            d.mkdir(parents=True)
        (etc / "sources.list").write_text(
            "deb-src http://deb.debian.org/debian bookworm main\n")
        apt = [
            "apt-get", "-q", f"-oDir::Etc::SourceList={etc / 'sources.list'}",
            "-oDir::Etc::SourceParts=/nonexistent",
            f"-oDir::State::Lists={lists}", f"-oDir::Cache={cache}",
            "-oDir::State::status=/dev/null", "-oAPT::Sandbox::User=root",
            "-oAcquire::Retries=1", f"-oAcquire::http::Timeout={NET_TIMEOUT}",
        ]
        _run([*apt, "update"])
        _run([*apt, "source", "--download-only", JEMALLOC_SOURCE], cwd=work)
        origs = sorted(work.glob("jemalloc_*.orig.tar.*"))
        if len(origs) != 1:
            raise CorpusUnavailable(f"apt-get source gave {origs}")
        digest = hashlib.sha256(origs[0].read_bytes()).hexdigest()
        if digest != JEMALLOC_ORIG_SHA256:
            raise CorpusUnavailable(f"{origs[0].name} has sha256 {digest}, pinned "
                                    f"{JEMALLOC_ORIG_SHA256}")
        dsc = sorted(work.glob("jemalloc_*.dsc"))
        _run(["dpkg-source", "-x", str(dsc[0]), str(work / "src")], cwd=work)
        return work / "src"

    return _cached_tree("jemalloc-source", {"source": JEMALLOC_SOURCE,
                                            "orig_sha256": JEMALLOC_ORIG_SHA256}, build)


def build_jemalloc(lg_page: int) -> Path:
    """``lib/libjemalloc.a`` of Debian's jemalloc configured with
    ``--with-lg-page=lg_page`` for aarch64; built once (about a minute on two
    busy cores) and cached with the configure line as its key."""
    source = fetch_jemalloc_source()
    args = (*JEMALLOC_CONFIGURE, f"--with-lg-page={lg_page}")

    def build(work: Path) -> Path:
        out = work / "build"
        out.mkdir()
        _run([str(source / "configure"), *args], cwd=out, timeout=600)
        _run(["make", f"-j{min(os.cpu_count() or 1, 4)}", "lib/libjemalloc.a"], cwd=out,
             timeout=1200)
        return out

    return _cached_tree(f"jemalloc-lg{lg_page}", {"source": JEMALLOC_SOURCE,
                                                  "configure": list(args)}, build)


#: Debian 12's aarch64 CPython and what ``import polars``/``import duckdb``
#: need of it, to import real wheels under qemu-aarch64 with a chosen page.
DEBIAN_ARM64_PYTHON: tuple[str, ...] = (
    "libc6", "libgcc-s1", "libstdc++6", "python3.11-minimal", "libpython3.11-minimal",
    "libpython3.11-stdlib", "libexpat1", "zlib1g", "libffi8", "libbz2-1.0", "liblzma5",
)


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


def wheel_or_skip(wheel: PinnedWheel) -> Corpus:
    """The unpacked members of ``wheel`` (skip offline, fail in CI)."""
    return _corpus_or_skip(wheel.name, lambda: fetch_pinned_wheel(wheel))


def debian_arm64_python_or_skip() -> Path:
    """Root of :data:`DEBIAN_ARM64_PYTHON` unpacked (skip offline, fail in CI)."""
    # Not tests/python/arm64_python.py's "debian-arm64-python": another
    # package set in the same directory would rebuild it on every switch.
    kind = "debian-arm64-python-stdlib"
    if kind in _failures:
        _give_up(_failures[kind])
    try:
        root = fetch_debian_arm64(DEBIAN_ARM64_PYTHON, name=kind)
    except CorpusUnavailable as exc:
        _failures[kind] = f"{kind} unavailable (network?): {exc}"
        _give_up(_failures[kind])
    if not (root / "usr" / "bin" / "python3.11").is_file():
        pytest.fail(f"{root} has no usr/bin/python3.11; delete it to refetch")
    return root


def jemalloc_or_skip(lg_page: int) -> Path:
    """``libjemalloc.a`` built for ``1 << lg_page`` pages (skip offline, fail in CI)."""
    kind = f"jemalloc-lg{lg_page}"
    if kind in _failures:
        _give_up(_failures[kind])
    try:
        lib = build_jemalloc(lg_page) / "lib" / "libjemalloc.a"
    except CorpusUnavailable as exc:
        _failures[kind] = f"jemalloc build unavailable: {exc}"
        _give_up(_failures[kind])
    if not lib.is_file():
        pytest.fail(f"{lib} missing after the build; delete its cache dir to rebuild")
    return lib


@pytest.fixture(scope="session")
def debian_arm64() -> Corpus:
    """Unpacked Debian arm64 packages (see :data:`DEBIAN_PACKAGES`)."""
    return _corpus_or_skip("debian-arm64", fetch_debian_arm64)


@pytest.fixture(scope="session")
def node_exporter() -> Path:
    """The pinned node_exporter executable (see :data:`NODE_EXPORTER`)."""
    if "node-exporter" in _failures:
        _give_up(_failures["node-exporter"])
    try:
        return fetch_node_exporter()
    except CorpusUnavailable as exc:
        _failures["node-exporter"] = f"node_exporter unavailable (network?): {exc}"
        _give_up(_failures["node-exporter"])
        raise


@pytest.fixture(scope="session")
def aarch64_wheel() -> Corpus:
    """An unpacked manylinux2014 aarch64 wheel (:data:`WHEEL_REQUIREMENT`)."""
    return _corpus_or_skip("aarch64-wheel", fetch_aarch64_wheel)
