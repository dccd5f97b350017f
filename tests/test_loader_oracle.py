"""The loader model against the real glibc loader, file by file, on real corpora.

Why: the model decides whether a job step may start; a single wrong search
step means a false "library not found" (a blocked job) or a missed one (a job
that dies on the node). The real ``ld.so`` is the only authority, so for every
dynamically linked ELF file (one with DT_NEEDED) we compare the model's
``{name: path}`` with what the loader prints in trace mode:

* this host: ``/usr/bin``, ``/usr/sbin``, ``/usr/lib/x86_64-linux-gnu`` (walked
  recursively, symlinks skipped: each file once);
* aarch64 through ``qemu-aarch64 -L``: the cross glibc in
  ``/usr/aarch64-linux-gnu/lib`` and the Debian arm64 packages of
  ``tests/corpus.py`` (their own image root, with its own ld.so).

``make test`` checks a deterministic sample of the host corpus (:data:`SAMPLE`
files chosen by a hash of the path, so the same files every run);
``GRACE_VERIFY_FULL=1`` (``make verify-loader``) checks all of them. Files the
loader itself refuses to list are compared on the model's fatal verdict.
"""

from __future__ import annotations

import functools
import hashlib
import os
import subprocess
from pathlib import Path

import pytest
from fixtures.build import (
    AARCH64_SYSROOT,
    LoaderListing,
    loader_list,
    parse_loader_list,
    qemu_aarch64,
)

from grace_policy import loader
from grace_policy.elf import ElfError, ElfInfo, read_elf
from grace_policy.node import NodeProfile, detect, host_machine

HOST_DIRS = ("/usr/bin", "/usr/sbin", "/usr/lib/x86_64-linux-gnu")
FULL = os.environ.get("GRACE_VERIFY_FULL") == "1"
SAMPLE = 150

pytestmark = pytest.mark.skipif(host_machine() != "x86_64",
                                reason="the host corpus and its oracle are x86_64")


def dynamic_elf_files(tops: tuple[str, ...], machine: int) -> list[tuple[str, ElfInfo]]:
    """Regular files under ``tops`` that are ELF for ``machine`` with DT_NEEDED,
    sorted; the loader prints "statically linked" for the others."""
    found: list[tuple[str, ElfInfo]] = []
    for top in tops:
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames.sort()
            for name in sorted(filenames):
                path = os.path.join(dirpath, name)
                if os.path.islink(path) or not os.path.isfile(path):
                    continue
                try:
                    info = read_elf(path)
                except (ElfError, OSError):
                    continue
                if info.machine == machine and info.needed:
                    found.append((path, info))
    return found


@functools.lru_cache(maxsize=1)
def host_corpus() -> tuple[tuple[str, ElfInfo], ...]:
    return tuple(dynamic_elf_files(HOST_DIRS, 62))


def sample(files: tuple[tuple[str, ElfInfo], ...], n: int) -> list[tuple[str, ElfInfo]]:
    """Deterministic spread over the whole corpus: the n smallest path hashes."""
    if FULL or len(files) <= n:
        return list(files)
    ranked = sorted(files, key=lambda f: hashlib.sha256(f[0].encode()).hexdigest())
    return sorted(ranked[:n])


def compare(files: list[tuple[str, ElfInfo]], node: NodeProfile,
            listing_of, to_node=lambda p: p) -> tuple[int, int, list[str]]:
    """(agreed, refused by the loader, differences) over ``files``."""
    agreed = refused = 0
    diffs: list[str] = []
    for path, info in files:
        listing: LoaderListing = listing_of(path)
        tree = loader.resolve(to_node(path), info, node, {}, loader.Loading(exec_origin=False))
        if listing.returncode != 0:
            refused += 1
            if not tree.fatal and not tree.missing:
                diffs.append(f"{path}: loader refused ({listing.stderr.strip()}), model did not")
            continue
        got = tree.resolved()
        want = listing.normalized()
        got = {k: (os.path.normpath(v) if v else v) for k, v in got.items()}
        if got != want:
            delta = {k: (got.get(k), want.get(k)) for k in sorted(set(got) | set(want))
                     if got.get(k) != want.get(k)}
            diffs.append(f"{path}: model vs loader {delta}")
        else:
            agreed += 1
    return agreed, refused, diffs


def test_host_corpus_matches_the_loader() -> None:
    files = host_corpus()
    assert len(files) > 300, f"only {len(files)} dynamic ELF files under {HOST_DIRS}?"
    chosen = sample(files, SAMPLE)
    agreed, refused, diffs = compare(chosen, detect(),
                                     lambda p: loader_list(p, check=False))
    assert not diffs, f"{len(diffs)} of {len(chosen)} differ:\n" + "\n".join(diffs[:20])
    assert agreed + refused == len(chosen)
    assert agreed >= len(chosen) * 0.95, f"loader refused {refused} of {len(chosen)}"


def test_sample_is_deterministic_and_spread() -> None:
    """The make-test sample must be the same files every run and reach into
    every corpus directory, or a regression could hide in an unsampled part."""
    files = host_corpus()
    first, second = sample(files, SAMPLE), sample(files, SAMPLE)
    assert [p for p, _ in first] == [p for p, _ in second]
    if not FULL:
        assert len(first) == min(SAMPLE, len(files))
    for top in HOST_DIRS:
        if any(p.startswith(top + "/") for p, _ in files):
            assert any(p.startswith(top + "/") for p, _ in first), top


# -- aarch64 through qemu ------------------------------------------------------

AARCH64_NODE = NodeProfile("aarch64", 65536, (2, 36), root=AARCH64_SYSROOT)


@pytest.mark.qemu
def test_aarch64_cross_glibc_matches_qemu_loader() -> None:
    files = dynamic_elf_files((f"{AARCH64_SYSROOT}/lib",), 183)
    assert len(files) >= 10, f"only {len(files)} aarch64 libraries in {AARCH64_SYSROOT}/lib"
    agreed, refused, diffs = compare(files, AARCH64_NODE,
                                     lambda p: loader_list(p, arch="aarch64", check=False))
    assert not diffs, "\n".join(diffs[:20])
    assert agreed == len(files), f"qemu loader refused {refused}"


def qemu_list(root: Path, node_path: str) -> LoaderListing:
    """The image's own aarch64 ld.so under ``qemu-aarch64 -L root``, in trace
    mode (``loader_list`` is fixed to the cross sysroot)."""
    qemu = qemu_aarch64()
    assert qemu is not None
    cmd = [qemu, "-E", "LD_TRACE_LOADED_OBJECTS=1", "-L", str(root),
           str(root / "lib/ld-linux-aarch64.so.1"), node_path]
    proc = subprocess.run(cmd, capture_output=True, text=True, errors="surrogateescape",
                          env={"PATH": "/usr/bin:/bin"}, timeout=60, check=False)
    if proc.returncode != 0:
        return LoaderListing({}, None, None, proc.returncode, proc.stdout, proc.stderr,
                             str(root))
    return parse_loader_list(proc.stdout, returncode=0, stderr=proc.stderr,
                             sysroot=str(root))


@pytest.mark.qemu
@pytest.mark.network
def test_debian_arm64_image_matches_its_own_loader(debian_arm64) -> None:
    """``--root`` image mode on real distribution files: every path is a node
    path looked up in the image first, as qemu -L does."""
    root = debian_arm64.root
    if not (root / "lib/ld-linux-aarch64.so.1").exists():
        pytest.skip("the debian-arm64 corpus has no lib/ld-linux-aarch64.so.1")
    files = [(str(p), read_elf(str(p))) for p in debian_arm64.elf_files]
    files = [(p, i) for p, i in files if i.machine == 183 and i.needed]
    assert len(files) >= 50
    files = sample(tuple(files), 60)  # ~30 ms a file under qemu; all with FULL
    node = NodeProfile("aarch64", 65536, (2, 36), root=str(root))
    prefix = str(root)

    def to_node(path: str) -> str:
        return path[len(prefix):]

    agreed, refused, diffs = compare(files, node, lambda p: qemu_list(root, to_node(p)),
                                     to_node)
    assert not diffs, "\n".join(diffs[:20])
    assert agreed == len(files), f"qemu loader refused {refused}"
