"""torch_build / torch_issues on torch layouts made from real wheels' files
(tests/python/torch_layouts.py): the 2.13.0+cpu wheel on this disk, PyPI's
aarch64 2.10.0 (CPU) and 2.11.0 (CUDA 13) METADATA, and version.py in the
forms torch's own build scripts write."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from grace_policy import fsprobe
from grace_policy.budget import Budget, BudgetExceeded
from grace_policy.context import StepContext
from grace_policy.node import NodeProfile
from grace_policy.python.torch_build import (
    _marker_applies,
    parse_metadata,
    parse_version_py,
    public_version,
    torch_build,
    torch_issues,
)
from grace_policy.rules import Catalogue

from .torch_layouts import CUDA_ONLY_LIBS, aarch64_metadata, cpu_files, install_torch

GRACE = NodeProfile(machine="aarch64", page_size=65536, glibc=(2, 34), root_is_native=False)
GPU_ENV = {"SLURM_GPUS_ON_NODE": "4", "HOME": "/home/u"}

#: torch 1.x (setup.py's create_version_file), as in the 1.8.0 wheels.
V1_CPU = "__version__ = '1.8.0'\ndebug = False\ncuda = None\ngit_version = 'abc'\nhip = None\n"
V1_CUDA = V1_CPU.replace("cuda = None", "cuda = '10.2'").replace("'1.8.0'", "'1.8.0+cu102'")


@pytest.fixture(scope="session")
def torch_cpu_files() -> Path:
    return cpu_files()


@pytest.fixture(scope="session")
def torch_aarch64_metadata() -> dict[str, Path]:
    return aarch64_metadata()


def real_cpu_version_py(files: Path) -> str:
    return (files / "torch" / "version.py").read_text()


def real_cpu_libs(files: Path) -> list[str]:
    return sorted(os.listdir(files / "torch" / "lib"))


def real_cpu_metadata(files: Path) -> str:
    meta = next(files.glob("torch-*.dist-info"))
    return (meta / "METADATA").read_text()


def cuda_version_py(files: Path, cuda: str = "13.0") -> str:
    """What generate_torch_version.py writes for a CUDA build: the real file
    with its cuda value set."""
    text = real_cpu_version_py(files)
    assert "cuda: Optional[str] = None" in text  # the form this test relies on
    return (text.replace("cuda: Optional[str] = None", f"cuda: Optional[str] = {cuda!r}")
            .replace("2.13.0+cpu", "2.13.0+cu130"))


@pytest.mark.network
def test_the_real_cpu_wheel_is_a_cpu_build(torch_cpu_files: Path, tmp_path: Path) -> None:
    torch_dir, meta = install_torch(tmp_path, version_py=real_cpu_version_py(torch_cpu_files),
                                    libs=real_cpu_libs(torch_cpu_files),
                                    metadata=real_cpu_metadata(torch_cpu_files))
    build = torch_build(str(torch_dir), str(meta), Budget(), node=GRACE)
    assert build is not None
    assert (build.version, build.cuda) == ("2.13.0+cpu", None)
    assert build.evidence == "torch/version.py: cuda = None"
    assert "libtorch_cpu.so" in real_cpu_libs(torch_cpu_files)
    assert not set(CUDA_ONLY_LIBS) & set(real_cpu_libs(torch_cpu_files))


@pytest.mark.network
def test_a_cuda_layout_is_a_cuda_build(torch_cpu_files: Path, tmp_path: Path) -> None:
    torch_dir, meta = install_torch(tmp_path, version_py=cuda_version_py(torch_cpu_files),
                                    libs=[*real_cpu_libs(torch_cpu_files), *CUDA_ONLY_LIBS],
                                    metadata=None)
    build = torch_build(str(torch_dir), str(meta), Budget(), node=GRACE)
    assert build is not None
    assert (build.version, build.cuda) == ("2.13.0+cu130", "13.0")
    assert issues_for(torch_dir, meta) == []


@pytest.mark.network
@pytest.mark.parametrize(("version", "cuda"), [("2.10.0", None), ("2.11.0", "unknown")])
def test_pypi_aarch64_metadata_without_version_py(
        torch_aarch64_metadata: dict[str, Path], torch_cpu_files: Path, tmp_path: Path,
        version: str, cuda: str | None) -> None:
    """With no version.py to read, the dist-info decides: 2.10's nvidia-*
    requirements are for x86_64 only (a CPU build on aarch64), 2.11's apply."""
    text = torch_aarch64_metadata[version].read_text()
    assert "nvidia-" in text  # both list nvidia packages; only the markers differ
    torch_dir, meta = install_torch(tmp_path, version_py=None,
                                    libs=real_cpu_libs(torch_cpu_files), metadata=text,
                                    dist_version=version)
    build = torch_build(str(torch_dir), str(meta), Budget(), node=GRACE)
    assert build is not None
    assert (build.version, build.cuda) == (version, cuda)
    if cuda:
        assert "Requires-Dist" in build.evidence
    # The same 2.10 METADATA on an x86_64 node means CUDA.
    x86 = NodeProfile(machine="x86_64", page_size=4096, glibc=(2, 36))
    on_x86 = torch_build(str(torch_dir), str(meta), Budget(), node=x86)
    assert on_x86 is not None and on_x86.cuda == "unknown"


@pytest.mark.network
def test_real_cpu_wheel_metadata_alone_says_cpu(torch_cpu_files: Path, tmp_path: Path) -> None:
    torch_dir, meta = install_torch(tmp_path, version_py=None, libs=[],
                                    metadata=real_cpu_metadata(torch_cpu_files))
    build = torch_build(str(torch_dir), str(meta), Budget(), node=GRACE)
    assert build is not None and build.cuda is None
    assert build.evidence.endswith("METADATA: Version 2.13.0+cpu")


@pytest.mark.parametrize(
    ("version_py", "libs", "cuda", "evidence"),
    [
        (V1_CPU, (), None, "torch/version.py: cuda = None"),
        (V1_CUDA, (), "10.2", "torch/version.py: cuda = '10.2'"),
        ("cuda = \"12.4\"  # double quotes\n", (), "12.4", "torch/version.py: cuda = '12.4'"),
        ("cuda: Optional[str] = None\nhip: Optional[str] = '6.2.41133'\n", (), None,
         "torch/version.py: cuda = None, hip = '6.2.41133' (a ROCm build)"),
        # No cuda line: the library decides.
        ("__version__ = '2.1.0'\n", ("libtorch_cuda.so",), "unknown", "torch/lib/libtorch_cuda.so"),
        ("__version__ = '2.1.0'\n", ("libtorch_cpu.so",), None, "no torch/lib/libtorch_cuda.so"),
        # version.py wins over a stray library (what torch.version.cuda reports).
        (V1_CPU, ("libtorch_cuda.so",), None, "torch/version.py: cuda = None"),
        # Only a name bound at module level counts; an indented one is not it.
        ("if True:\n    cuda = '12.1'\ncuda = None\n", (), None, "torch/version.py: cuda = None"),
        ("cuda = get_cuda()\n", ("libtorch_cuda.so",), "unknown", "torch/lib/libtorch_cuda.so"),
    ],
)
def test_version_py_forms(tmp_path: Path, version_py: str, libs: tuple[str, ...],
                          cuda: str | None, evidence: str) -> None:
    torch_dir, meta = install_torch(tmp_path, version_py=version_py, libs=libs, metadata=None)
    build = torch_build(str(torch_dir), str(meta), Budget(), node=GRACE)
    assert build is not None
    assert (build.cuda, build.evidence) == (cuda, evidence)


def test_not_a_torch_package(tmp_path: Path) -> None:
    (tmp_path / "torch").mkdir()
    assert torch_build(str(tmp_path / "torch"), None, Budget(), node=GRACE) is None
    assert torch_build(str(tmp_path / "absent"), None, Budget(), node=GRACE) is None


def test_hostile_files_never_raise(tmp_path: Path) -> None:
    torch_dir = tmp_path / "torch"
    torch_dir.mkdir()
    (torch_dir / "version.py").write_bytes(b"\xff\xfe\x00junk\n" * 10 + b"cuda = '\xff'\n")
    build = torch_build(str(torch_dir), None, Budget(), node=GRACE)
    assert build is not None and build.cuda == "\ufffd"
    (torch_dir / "version.py").unlink()
    os.mkfifo(torch_dir / "version.py")  # opening it must not block
    (tmp_path / "m.dist-info").mkdir()
    (tmp_path / "m.dist-info" / "METADATA").mkdir()  # a directory, not a file
    assert torch_build(str(torch_dir), str(tmp_path / "m.dist-info"), Budget(),
                       node=GRACE) is None
    (torch_dir / "version.py").unlink()
    (torch_dir / "version.py").symlink_to("version.py")  # a loop
    assert torch_build(str(torch_dir), None, Budget(), node=GRACE) is None


def test_a_huge_version_py_is_read_only_up_to_its_limit(tmp_path: Path) -> None:
    torch_dir = tmp_path / "torch"
    torch_dir.mkdir()
    with open(torch_dir / "version.py", "w") as fh:
        fh.write("cuda = None\n")
        fh.write("x = 1\n" * 2_000_000)
    budget = Budget()
    assert torch_build(str(torch_dir), None, budget, node=GRACE) is not None
    assert budget.bytes_read <= 16 * 1024


def test_budget_exhaustion_propagates(tmp_path: Path) -> None:
    torch_dir, meta = install_torch(tmp_path, version_py=V1_CPU, libs=(), metadata=None)
    with pytest.raises(BudgetExceeded):
        torch_build(str(torch_dir), str(meta), Budget(max_files=0), node=GRACE)


def test_node_image_root_is_read_first(tmp_path: Path) -> None:
    image = tmp_path / "image"
    install_torch(image / "opt" / "site", version_py=V1_CPU, libs=(),
                                 metadata=None)
    node = NodeProfile(machine="aarch64", page_size=65536, glibc=(2, 34), root=str(image))
    build = torch_build("/opt/site/torch", None, Budget(), node=node)
    assert build is not None and build.cuda is None and build.path == "/opt/site/torch"


def test_reads_are_recorded_for_the_verdict_cache(tmp_path: Path) -> None:
    torch_dir, meta = install_torch(tmp_path, version_py=V1_CPU, libs=(), metadata=None)
    files = fsprobe.Files.recorded()
    torch_issues(str(torch_dir), str(meta), _ctx(GPU_ENV, "cu130", files))
    record = files.records()
    paths = {path for _op, path, _answer in record}
    assert str(torch_dir / "version.py") in paths
    assert ("v", "SLURM_GPUS_ON_NODE", "=4") in record


def test_parsers_on_odd_input() -> None:
    assert parse_version_py(b"cuda==None\n= 3\n1x = '2'\ncuda = None # c\n") == {"cuda": None}
    assert parse_version_py(b"cuda = 'a\\'b'\n") == {}
    version, reqs = parse_metadata(
        b"Name: torch\nVersion: 2.5.1\n"
        b"Requires-Dist: nvidia-cuda-nvrtc-cu12 (==12.4.127) ; platform_machine == \"x86_64\"\n"
        b"Requires-Dist: Nvidia_Cudnn_Cu12>=9\n\nRequires-Dist: in-the-description\n")
    assert version == "2.5.1"
    assert [name for name, _ in reqs] == ["nvidia-cuda-nvrtc-cu12", "nvidia-cudnn-cu12"]
    assert public_version("2.13.0+cpu") == "2.13.0" and public_version("") == ""


def _ctx(env: dict[str, str], cuda_index: str | None,
         files: fsprobe.Files = fsprobe.HOST) -> StepContext:
    return StepContext(node=GRACE, env=env, cwd="/", budget=Budget(), cuda_index=cuda_index,
                       files=files)


def issues_for(torch_dir: Path, meta: Path | None, env: dict[str, str] | None = None,
               cuda_index: str | None = "cu130",
               files: fsprobe.Files = fsprobe.HOST) -> list:
    return torch_issues(str(torch_dir), str(meta) if meta else None,
                        _ctx(GPU_ENV if env is None else env, cuda_index, files))


def test_cpu_torch_on_a_gpu_step_is_a_warning_with_the_remedy(tmp_path: Path) -> None:
    site = tmp_path / "home" / "u" / "venv" / "lib" / "python3.11" / "site-packages"
    (tmp_path / "home" / "u" / "venv" / "pyvenv.cfg").parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / "home" / "u" / "venv" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    torch_dir, meta = install_torch(site, version_py=V1_CPU.replace("1.8.0", "2.10.0"),
                                    libs=("libtorch_cpu.so",), metadata=None)
    issues = issues_for(torch_dir, meta)
    assert [i.rule for i in issues] == ["torch-cpu-only"]
    assert "venv" in issues[0].causes
    finding = Catalogue.load().finding(issues[0], {"partition": "gb200", "node_arch": "aarch64"})
    assert finding is not None
    assert finding.severity == "warning"
    assert "torch.cuda.is_available()" in finding.predicted_error
    text = finding.remediation
    for word in ("SLURM_GPUS_ON_NODE=4", "/whl/cu130", "torch==2.10.0", "pip install",
                 "[[tool.uv.index]]", "[tool.uv.sources]", "uv run", "uv.lock", str(torch_dir)):
        assert word in text, (word, text)
    assert "{" not in text.replace("{ index", "")  # every field filled


def test_without_a_cuda_index_the_remedy_says_how_to_pick_one(tmp_path: Path) -> None:
    torch_dir, meta = install_torch(tmp_path, version_py=V1_CPU, libs=(), metadata=None)
    issues = issues_for(torch_dir, meta, cuda_index=None)
    finding = Catalogue.load().finding(issues[0], {"node_arch": "aarch64"})
    assert finding is not None
    assert "/whl/cuXYZ" in finding.remediation and "CUDA 13.0" in finding.remediation


@pytest.mark.parametrize("env", [{}, {"SLURM_JOB_GPUS": "0,1"}, {"CUDA_VISIBLE_DEVICES": "0"}])
def test_no_finding_without_step_gpus_and_nothing_read(tmp_path: Path,
                                                       env: dict[str, str]) -> None:
    torch_dir, meta = install_torch(tmp_path, version_py=V1_CPU, libs=(), metadata=None)
    files = fsprobe.Files.recorded()
    assert issues_for(torch_dir, meta, env=env, files=files) == []
    record = files.records()
    assert all(op == "v" for op, _path, _answer in record)


def test_no_finding_for_a_cuda_build(tmp_path: Path) -> None:
    torch_dir, meta = install_torch(tmp_path, version_py=V1_CUDA, libs=(), metadata=None)
    assert issues_for(torch_dir, meta) == []


def test_parsers_never_raise_on_any_bytes() -> None:
    from hypothesis import given, settings
    from hypothesis import strategies as st

    lines = st.lists(st.one_of(
        st.binary(max_size=30),
        st.sampled_from([b"cuda = None", b"cuda: Optional[str] = '1", b"cuda = '12.4'",
                         b"__version__ = \"2", b"Requires-Dist: nvidia-x ; (", b"Version:",
                         b"Requires-Dist: ;", b"Requires-Dist: cuda-toolkit[a] ; extra ==",
                         b""])), max_size=12)

    @settings(max_examples=200, deadline=None, database=None)
    @given(lines)
    def check(parts: list[bytes]) -> None:
        data = b"\n".join(parts)
        names = parse_version_py(data)
        assert all(v is None or isinstance(v, str) for v in names.values())
        version, reqs = parse_metadata(data)
        assert isinstance(version, str)
        for name, _marker in reqs:
            assert name and name == name.lower()
        for _name, marker in reqs:
            _marker_applies(marker, GRACE)

    check()


def test_metadata_is_read_up_to_its_headers(tmp_path: Path) -> None:
    body = "x" * 60_000
    torch_dir, meta = install_torch(tmp_path, version_py=None, libs=(), metadata=(
        "Metadata-Version: 2.1\nName: torch\nVersion: 2.13.0+cpu\n\n" + body))
    budget = Budget()
    build = torch_build(str(torch_dir), str(meta), budget, node=GRACE)
    assert build is not None and build.cuda is None
    assert budget.bytes_read <= 8192
