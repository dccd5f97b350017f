"""torch install layouts for tests, made from real torch wheels' files.

A CUDA torch wheel is several GB, so no test downloads one. What the checks
read is small: ``torch/version.py``, the names in ``torch/lib`` and the
dist-info's ``METADATA``. Taken from real wheels:

- the CPU wheel ``torch==2.13.0+cpu`` that pip finds on this machine's disk
  (pinned by sha256; a ``+cpu`` version exists on no index pip reaches here, so
  a missing file can never turn into a multi-GB download): its version.py,
  METADATA and the names of its torch/lib files;
- the METADATA of PyPI's torch 2.10.0 (CPU-only on aarch64) and 2.11.0 (CUDA
  13 on aarch64) aarch64 wheels, read by ``pip install --dry-run --report``,
  which fetches only the wheel's metadata file (PEP 658); pinned by the
  wheels' sha256 as the index lists them.

CUDA builds' version.py is what torch's ``tools/generate_torch_version.py``
writes (``cuda: Optional[str] = '13.0'``), made here from the real CPU file
by changing that one value; torch 1.x's setup.py wrote ``cuda = '10.2'``.
"""

from __future__ import annotations

import json
import shutil
import zipfile
from pathlib import Path

from corpus import NET_TIMEOUT, CorpusUnavailable, _cached_tree, _give_up, _run, sha256_file

#: The CPU wheel on this machine's disk (/work/.library/env/machines/python.md).
CPU_WHEEL = ("torch==2.13.0+cpu",
             "6746dbcbeb526eb61330b76b41ff1b4eb848951103a892eeb080dfa2b264667b")

#: PyPI aarch64 wheels whose METADATA is read (version -> wheel sha256).
AARCH64_METADATA = {
    "2.10.0": "3282d9febd1e4e476630a099692b44fdc214ee9bf8ee5377732d9d9dfe5712e4",
    "2.11.0": "d91aac77f24082809d2c5a93f52a5f085032740a1ebc9252a7b052ef5a4fddc6",
}

#: Libraries of a CUDA build that a CPU build lacks; both names are DT_NEEDED
#: of torchcodec's aarch64 libtorchcodec_core*.so (a CUDA 13 build).
CUDA_ONLY_LIBS = ("libtorch_cuda.so", "libc10_cuda.so")



def _download_pinned(work: Path, requirement: str, sha: str, *pip_args: str) -> Path:
    """The one wheel ``pip download`` gives for ``requirement``, checked
    against its pinned sha256."""
    _run(["python3", "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
          *pip_args, "--timeout", str(NET_TIMEOUT), "-d", str(work / "dl"), requirement])
    wheels = sorted((work / "dl").glob("*.whl"))
    if len(wheels) != 1:
        raise CorpusUnavailable(f"pip download gave {len(wheels)} wheels for {requirement}")
    got = sha256_file(wheels[0])
    if got != sha:
        raise CorpusUnavailable(f"{wheels[0].name}: sha256 {got}, pinned {sha}")
    return wheels[0]


def fetch_cpu_files() -> Path:
    requirement, sha = CPU_WHEEL

    def build(work: Path) -> Path:
        wheel = _download_pinned(work, requirement, sha)
        out = work / "root"
        with zipfile.ZipFile(wheel) as zf:
            for name in zf.namelist():
                keep = (name == "torch/version.py" or name.endswith(".dist-info/METADATA")
                        or name.endswith(".dist-info/WHEEL"))
                if keep:
                    zf.extract(name, out)
                elif name.startswith("torch/lib/") and name.count("/") == 2:
                    # The names only: nothing reads these files' content.
                    (out / "torch" / "lib").mkdir(parents=True, exist_ok=True)
                    (out / name).write_bytes(b"")
        return out

    return _cached_tree("torch-cpu-wheel-files", {"wheel": requirement, "sha256": sha}, build)


def _fetch_metadata(version: str) -> Path:
    sha = AARCH64_METADATA[version]

    def build(work: Path) -> Path:
        report = work / "report.json"
        _run(["python3", "-m", "pip", "install", "-q", "--dry-run", "--no-deps",
              "--ignore-installed", "--only-binary=:all:", "--platform",
              "manylinux_2_28_aarch64", "--python-version", "3.11", "--implementation", "cp",
              "--target", str(work / "unused"), "--timeout", str(NET_TIMEOUT),
              "--report", str(report), f"torch=={version}"])
        item = json.loads(report.read_text())["install"][0]
        got = item["download_info"].get("archive_info", {}).get("hashes", {}).get("sha256")
        if got != sha:
            raise CorpusUnavailable(f"torch {version} aarch64: index sha256 {got}, pinned {sha}")
        meta = item["metadata"]
        lines = [f"Metadata-Version: {meta.get('metadata_version', '2.1')}",
                 f"Name: {meta['name']}", f"Version: {meta['version']}"]
        lines += [f"Requires-Dist: {r}" for r in meta.get("requires_dist", [])]
        out = work / "root"
        out.mkdir()
        (out / "METADATA").write_text("\n".join(lines) + "\n")
        return out

    return _cached_tree(f"torch-{version}-aarch64-metadata", {"version": version, "sha256": sha},
                        build)


_failures: dict[str, str] = {}


def _or_skip(key: str, fetch) -> Path:  # type: ignore[no-untyped-def]
    if key in _failures:
        _give_up(_failures[key])
    try:
        return fetch()
    except CorpusUnavailable as exc:
        _failures[key] = f"{key} unavailable: {exc}"
        _give_up(_failures[key])
    raise AssertionError("unreachable")


def cpu_files() -> Path:
    """torch/version.py, torch/lib/* (empty) and the dist-info of the real
    2.13.0+cpu wheel (skips, or fails under CI, when unavailable)."""
    return _or_skip("torch-cpu-wheel", fetch_cpu_files)


def aarch64_metadata() -> dict[str, Path]:
    """version -> METADATA file of PyPI's aarch64 torch wheel."""
    return {v: _or_skip(f"torch-{v}-metadata", lambda v=v: _fetch_metadata(v)) / "METADATA"
            for v in AARCH64_METADATA}


def install_torch(site: Path, *, version_py: str | None, libs: tuple[str, ...] | list[str],
                  metadata: str | None, dist_version: str = "2.13.0") -> tuple[Path, Path]:
    """A site-packages/torch as pip lays it out: torch/version.py (when given),
    torch/lib/<libs>, torch-<dist_version>.dist-info/METADATA (when given).
    Returns (torch dir, dist-info dir)."""
    torch_dir = site / "torch"
    (torch_dir / "lib").mkdir(parents=True, exist_ok=True)
    (torch_dir / "__init__.py").write_text("")
    if version_py is not None:
        (torch_dir / "version.py").write_text(version_py)
    for lib in libs:
        (torch_dir / "lib" / lib).write_bytes(b"")
    meta = site / f"torch-{dist_version}.dist-info"
    meta.mkdir(exist_ok=True)
    if metadata is not None:
        (meta / "METADATA").write_text(metadata)
    return torch_dir, meta


def copy_tree(src: Path, dest: Path) -> None:
    shutil.copytree(src, dest, dirs_exist_ok=True)


#: The smallest torchcodec with aarch64 wheels (field notes §8: none before
#: 0.11): a CUDA 13 build with libtorchcodec_core{4..8}.so, 2.4 MB.
TORCHCODEC_WHEEL = ("torchcodec==0.11.0", "manylinux_2_28_aarch64", "3.11",
                    "5562c28dce8114597116f0884908745c29ce401e4a9d0ae46853cbcd858d4f52")
#: A current one (8.8 MB): 0.16 added a core for FFmpeg 9.
TORCHCODEC_WHEEL_NEW = ("torchcodec==0.17.0", "manylinux_2_28_aarch64", "3.11",
                        "b387f1d935d5a60ebad6de0144d728f5802de9253a65fb1570a6f2ad646c9d3b")


def _fetch_torchcodec(wheel: tuple[str, str, str, str] = TORCHCODEC_WHEEL) -> Path:
    requirement, platform, python, sha = wheel

    def build(work: Path) -> Path:
        found = _download_pinned(work, requirement, sha, "--platform", platform,
                                 "--python-version", python, "--implementation", "cp")
        out = work / "site-packages"
        with zipfile.ZipFile(found) as zf:
            zf.extractall(out)
        return out

    name = "torchcodec-aarch64-wheel" if wheel == TORCHCODEC_WHEEL else \
        f"torchcodec-{requirement.split('==')[1]}-aarch64-wheel"
    return _cached_tree(name, {"wheel": requirement, "platform": platform, "sha256": sha}, build)


def torchcodec_site(newest: bool = False) -> Path:
    """A site-packages holding the real torchcodec 0.11.0 (``newest``: 0.17.0)
    aarch64 wheel, unpacked."""
    wheel = TORCHCODEC_WHEEL_NEW if newest else TORCHCODEC_WHEEL
    return _or_skip(f"torchcodec-wheel-{wheel[0]}", lambda: _fetch_torchcodec(wheel))
