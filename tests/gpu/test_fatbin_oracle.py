"""The fat binary reader against cuobjdump, on every file of the corpus.

The corpus: the nvcc fixtures (programs, libraries, Python extensions;
x86_64 and aarch64; every kind of target; -rdc; compressed and not), the
CUDA runtime libraries of the toolchain, cuRAND for CUDA 12 (both
architectures) and the torch 2.14.1 CUDA wheel's libtorch_cuda.so. For each
file, every entry must agree with cuobjdump in order: kind, target with its
a/f variant, version, compression; the PTX text's ``.version`` must be the
version the header gives; and the default selection (executable fat
binaries, else relocatable) must be what ``--list-elf --list-ptx`` lists.
Agreement must be total: one differing entry fails the file.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from grace_policy import fsprobe
from grace_policy.cuda.fatbin import read_fatbins

from .fixtures import build_fixtures
from .oracle import dump, listed
from .toolchain import curand_lib, toolchain, torch_cuda_lib

pytestmark = pytest.mark.network


def _corpus() -> list[tuple[str, object]]:
    """(id, zero-argument path getter): the ids are known without building."""
    from .fixtures import ARM_PROGRAMS, PY_EXTENSIONS, VARIANTS

    items: list[tuple[str, object]] = []
    names = []
    for v in VARIANTS:
        names += [f"x86_64/lib{v}.so", f"x86_64/{v}", f"aarch64/lib{v}.so"]
        if v in ARM_PROGRAMS:
            names.append(f"aarch64/{v}")
    names += [f"x86_64/py-{v}" for v in PY_EXTENSIONS] + ["x86_64/sm80_static"]
    for name in names:
        items.append((name, lambda name=name: _fixture(name)))
    for arch in ("x86_64", "aarch64"):
        items.append((f"libcudart.so.13-{arch}", lambda arch=arch: _cudart(arch)))
        items.append((f"libcurand.so.10-{arch}", lambda arch=arch: curand_lib(arch)))
    items.append(("libtorch_cuda.so-2.14.1", torch_cuda_lib))
    return items


def _fixture(name: str) -> Path:
    for f in build_fixtures(toolchain()):
        if f.name == name or (name.startswith("x86_64/py-") and f.name.startswith(name + "/")):
            return f.path
    raise AssertionError(f"no fixture {name}")


def _cudart(arch: str) -> Path:
    tc = toolchain()
    lib = tc.x86_lib if arch == "x86_64" else tc.arm_lib
    return lib / "libcudart.so.13"


CORPUS = _corpus()


def ours(path: Path):  # type: ignore[no-untyped-def]
    info = read_fatbins(str(path), fsprobe.HOST)
    assert info.problems == (), info.problems
    return info


@pytest.mark.parametrize("getter", [g for _, g in CORPUS], ids=[i for i, _ in CORPUS])
def test_reader_agrees_with_cuobjdump(getter) -> None:  # type: ignore[no-untyped-def]
    path = getter()
    tool = toolchain().cuobjdump
    info = ours(path)
    judge = dump(tool, path)
    mine = [(e.kind, e.arch, e.version, bool(e.compression)) for e in info.entries]
    theirs = [(d.kind, d.arch, d.version, d.compressed) for d in judge]
    assert mine == theirs
    for e, d in zip(info.entries, judge):
        if e.kind == "ptx":
            assert d.text_version == e.version, (e, d)
    # The default selection, as cuobjdump lists it (its cubin names drop f).
    default = [(e.kind, f"sm_{e.sm}{'' if e.kind == 'cubin' and e.variant == 'f' else e.variant}")
               for e in info.loadable()]
    assert default == listed(tool, path)


def test_corpus_covers_every_kind_of_entry() -> None:
    """The agreement means something only if the corpus holds each case."""
    seen = set()
    for _, getter in CORPUS:
        for e in read_fatbins(str(getter()), fsprobe.HOST).entries:
            seen.add((e.kind, e.variant, bool(e.compression), e.relocatable))
    for case in [("cubin", "", False, False), ("cubin", "", True, False),
                 ("cubin", "a", False, False), ("cubin", "f", False, False),
                 ("ptx", "", True, False), ("ptx", "", False, False),
                 ("ptx", "a", True, False), ("ptx", "f", True, False),
                 ("cubin", "", True, True), ("ptx", "", True, True)]:
        assert case in seen, case
