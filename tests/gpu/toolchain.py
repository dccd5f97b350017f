"""NVIDIA's compiler and cuobjdump from PyPI, pinned, for the CUDA tests.

No GPU and no CUDA installation are needed: the CUDA 13.5 wheels of nvcc,
cicc (nvidia-nvvm), the runtime, its headers (nvidia-cuda-crt, -cccl) and
cuobjdump, unpacked into one tree, give ``nvidia/cu13/bin/nvcc`` (its
``nvcc.profile`` finds cicc and the headers by relative path) that builds
with the system g++, or with ``aarch64-linux-gnu-g++`` against the aarch64
runtime wheel. Each wheel is pinned by version and sha256 (pip checks it),
downloaded once into ``~/.cache/grace-policy-tests`` with ``pip download``.

The real CUDA libraries of the corpus come the same way (nvidia-curand-cu12
for both architectures), and one torch CUDA wheel's ``libtorch_cuda.so`` is
read straight out of the wheel on this machine's disk (pip names the file;
its sha256 is checked), never installed.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from corpus import NET_TIMEOUT, CorpusUnavailable, _cached_tree, _give_up, _run, sha256_file


@dataclass(frozen=True)
class Wheel:
    requirement: str
    sha256: str
    #: pip --platform values (several: pip needs the wheel's own tag listed).
    platforms: tuple[str, ...]


X86 = ("manylinux2014_x86_64", "manylinux_2_17_x86_64", "manylinux_2_27_x86_64",
       "manylinux_2_28_x86_64", "manylinux2010_x86_64", "manylinux_2_12_x86_64")
ARM = ("manylinux2014_aarch64", "manylinux_2_17_aarch64", "manylinux_2_27_aarch64",
       "manylinux_2_28_aarch64")

#: The CUDA 13.5 compiler for x86_64 hosts (the build machine's side).
NVCC_WHEELS = (
    Wheel("nvidia-cuda-nvcc==13.5.37",
          "f5c4f7ead5d964fb4af42bbf1e6d3ec3c1e6e9d83b53749f691d387e7fcaa3a7", X86),
    Wheel("nvidia-nvvm==13.5.37",
          "c41bfa362e407405163f103c2229f0765f8cc2ed7d148b754dc77f228bf7e070", X86),
    Wheel("nvidia-cuda-crt==13.5.37",
          "e898b7f73d3035fa89915a3f7bf3b54a73e90249746111aed295822c4729bb29", X86),
    Wheel("nvidia-cuda-cccl==13.3.5.0.6",
          "d5230098fa2df5021e1a00c0c4eee41797671a91119d31e892463e5ccf3ee326", X86),
    Wheel("nvidia-cuda-runtime==13.5.37",
          "df2b79a8852f10d1fef8c848489c49eebb5754051bf870202a862831412b179d", X86),
    Wheel("nvidia-cuda-cuobjdump==13.5.37",
          "38780fee50863252a0b8926357faa91615ca1c8346490563f33a06100cd73f58", X86),
)
#: The aarch64 runtime (libcudart.so.13, libcudart_static.a) to link
#: aarch64 programs against.
ARM_RUNTIME = Wheel("nvidia-cuda-runtime==13.5.37",
                    "de2dc5a7367974228b0a69588a9acc9340d3768bef1bf38bf0801eb08497cd2d", ARM)
#: Real CUDA libraries: cuRAND for CUDA 12, both architectures.
CURAND = {
    "x86_64": Wheel("nvidia-curand-cu12==10.3.10.19",
                    "49b274db4780d421bd2ccd362e1415c13887c53c214f0d4b761752b8f9f6aa1e", X86),
    "aarch64": Wheel("nvidia-curand-cu12==10.3.10.19",
                     "de663377feb1697e1d30ed587b07d5721fdd6d2015c738d7528a6002a6134d37", ARM),
}
#: CUDA 12's runtime (the second seed's harmless case: CUDA 12 code on a
#: CUDA 13 driver).
CUDART12 = Wheel("nvidia-cuda-runtime-cu12==12.9.79",
                 "25bba2dfb01d48a9b59ca474a1ac43c6ebf7011f1b0b8cc44f54eb6ac48a96c3", X86)
#: The torch CUDA wheel that lies on this kind of machine's disk.
TORCH = ("torch==2.14.1", "305a61f61f35f128579f299c5bd33d475f6a01c6307336139632e30856c4854d")
TORCH_MEMBER = "torch/lib/libtorch_cuda.so"


def _download(wheel: Wheel, dest: Path) -> Path:
    req = dest / "requirements.txt"
    dest.mkdir(parents=True, exist_ok=True)
    req.write_text(f"{wheel.requirement} --hash=sha256:{wheel.sha256}\n")
    plats = [a for p in wheel.platforms for a in ("--platform", p)]
    out = dest / "dl"
    _run(["python3", "-m", "pip", "download", "-q", "--only-binary=:all:", "--no-deps",
          "--require-hashes", *plats, "--python-version", "3.11", "--implementation", "cp",
          "--timeout", str(NET_TIMEOUT), "-d", str(out), "-r", str(req)], timeout=900)
    wheels = sorted(out.glob("*.whl"))
    if len(wheels) != 1:
        raise CorpusUnavailable(f"pip download gave {len(wheels)} wheels for {wheel}")
    return wheels[0]


def _unpack(whl: Path, dest: Path, members: tuple[str, ...] = ()) -> None:
    with zipfile.ZipFile(whl) as zf:
        for info in zf.infolist():
            if members and not info.filename.startswith(members):
                continue
            if ".dist-info/" in info.filename:
                continue
            zf.extract(info, dest)
            mode = (info.external_attr >> 16) & 0o777
            if mode:
                os.chmod(dest / info.filename, mode)


@dataclass(frozen=True)
class Toolchain:
    root: Path
    #: The aarch64 runtime's lib directory (libcudart.so -> .so.13).
    arm_lib: Path

    @property
    def cu13(self) -> Path:
        return self.root / "nvidia" / "cu13"

    @property
    def nvcc(self) -> Path:
        return self.cu13 / "bin" / "nvcc"

    @property
    def cuobjdump(self) -> Path:
        return self.cu13 / "bin" / "cuobjdump"

    @property
    def x86_lib(self) -> Path:
        return self.cu13 / "lib"


def _build_toolchain(work: Path) -> Path:
    root = work / "root"
    for i, wheel in enumerate(NVCC_WHEELS):
        _unpack(_download(wheel, work / f"w{i}"), root / "x86_64")
    _unpack(_download(ARM_RUNTIME, work / "arm"), root / "aarch64")
    for arch in ("x86_64", "aarch64"):
        lib = root / arch / "nvidia" / "cu13" / "lib"
        # The wheel ships only the soname; -cudart shared links -lcudart.
        (lib / "libcudart.so").symlink_to("libcudart.so.13")
    bindir = root / "x86_64" / "nvidia" / "cu13"
    for sub in ("bin", "nvvm/bin"):
        for tool in (bindir / sub).iterdir():
            if tool.is_file():
                tool.chmod(tool.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return root


_failures: dict[str, str] = {}


def _or_skip(kind: str, make):  # type: ignore[no-untyped-def]
    """``make()``, or skip with the reason (fail under CI), remembered."""
    if kind in _failures:
        _give_up(_failures[kind])
    try:
        return make()
    except CorpusUnavailable as exc:
        _failures[kind] = f"{kind} unavailable: {exc}"
        _give_up(_failures[kind])
        raise


def toolchain() -> Toolchain:
    """The pinned nvcc/cuobjdump tree (skip offline, fail in CI)."""

    def make() -> Toolchain:
        want = {"wheels": [[w.requirement, w.sha256] for w in (*NVCC_WHEELS, ARM_RUNTIME)],
                "recipe": 1}
        root = _cached_tree("cuda-toolchain-13.5", want, _build_toolchain)
        tc = Toolchain(root / "x86_64", root / "aarch64" / "nvidia" / "cu13" / "lib")
        if not os.access(tc.nvcc, os.X_OK) or not os.access(tc.cuobjdump, os.X_OK):
            raise CorpusUnavailable(f"{tc.nvcc} or cuobjdump missing; delete {root} to refetch")
        return tc

    return _or_skip("cuda-toolchain", make)  # type: ignore[no-any-return]


def curand_lib(arch: str) -> Path:
    """``libcurand.so.10`` of the pinned cuRAND wheel for ``arch``."""
    wheel = CURAND[arch]

    def build(work: Path) -> Path:
        root = work / "root"
        _unpack(_download(wheel, work), root, ("nvidia/curand/lib/",))
        return root

    def make() -> Path:
        root = _cached_tree(f"cuda-curand-{arch}", {"wheel": [wheel.requirement, wheel.sha256]},
                            build)
        return root / "nvidia" / "curand" / "lib" / "libcurand.so.10"

    return _or_skip(f"curand-{arch}", make)  # type: ignore[no-any-return]


def cudart12_lib() -> Path:
    """``libcudart.so.12`` of the pinned CUDA 12.9 runtime wheel."""

    def build(work: Path) -> Path:
        root = work / "root"
        _unpack(_download(CUDART12, work), root, ("nvidia/cuda_runtime/lib/",))
        return root

    def make() -> Path:
        root = _cached_tree("cuda-cudart12", {"wheel": [CUDART12.requirement, CUDART12.sha256]},
                            build)
        return root / "nvidia" / "cuda_runtime" / "lib" / "libcudart.so.12"

    return _or_skip("cudart12", make)  # type: ignore[no-any-return]


def _torch_wheel_file() -> Path:
    """Where pip would take the pinned torch wheel from: ``pip install
    --dry-run --report`` resolves it (on this kind of machine a file on the
    local disk) without installing or copying anything."""
    requirement, digest = TORCH
    report = subprocess.run(
        ["python3", "-m", "pip", "install", "--dry-run", "--no-deps", "--ignore-installed",
         "--only-binary=:all:", "--quiet", "--report", "-", requirement],
        capture_output=True, text=True, timeout=900, check=False)
    if report.returncode != 0:
        raise CorpusUnavailable(f"pip could not resolve {requirement}: "
                                f"{report.stderr.strip().splitlines()[-1:]}")
    try:
        item = json.loads(report.stdout)["install"][0]
        url = item["download_info"]["url"]
        hashes = item["download_info"].get("archive_info", {}).get("hashes", {})
    except (ValueError, KeyError, IndexError) as exc:
        raise CorpusUnavailable(f"pip's report for {requirement} unreadable: {exc}") from exc
    if hashes.get("sha256") not in (None, digest):
        raise CorpusUnavailable(f"{url}: sha256 {hashes.get('sha256')}, pinned {digest}")
    if not url.startswith("file://"):
        raise CorpusUnavailable(f"{requirement} is not on this machine's disk ({url}); "
                                "this corpus reads the local wheel only")
    return Path(url[len("file://"):])


def torch_cuda_lib() -> Path:
    """``libtorch_cuda.so`` of the pinned torch CUDA wheel, copied out of the
    wheel into the cache once (the wheel's sha256 checked first)."""
    requirement, digest = TORCH

    def build(work: Path) -> Path:
        whl = _torch_wheel_file()
        got = sha256_file(whl)
        if got != digest:
            raise CorpusUnavailable(f"{whl}: sha256 {got}, pinned {digest}")
        root = work / "root"
        _unpack(whl, root, (TORCH_MEMBER,))
        return root

    def make() -> Path:
        root = _cached_tree("cuda-torch-2.14.1", {"wheel": [requirement, digest],
                                                  "member": TORCH_MEMBER}, build)
        return root / TORCH_MEMBER

    return _or_skip("torch-cuda", make)  # type: ignore[no-any-return]


@pytest.fixture(scope="session")
def cuda_toolchain() -> Toolchain:
    return toolchain()
