"""The judgement on every nvcc fixture, held to the driver's documented rules.

The table below is written from NVIDIA's rules (docs/CUDA.md), not from the
code: for each fixture variant, what the driver does on each GPU when its
driver reads the fixtures' PTX (CUDA 13.5, PTX ISA 9.5). With a CUDA 13.0
driver every "jit" becomes "too-new" (PTX 9.5 needs CUDA 13.5's driver).
Every fixture file (program, library, Python extension; x86_64 and aarch64)
of a variant must get the same verdicts, read by the real reader.
"""

from __future__ import annotations

import pytest

from grace_policy import fsprobe
from grace_policy.cuda import judge as judge_mod
from grace_policy.cuda.fatbin import read_fatbins
from grace_policy.cuda.judge import StepGpus, judge, judge_kernels
from grace_policy.elf import read_elf
from grace_policy.rules import Catalogue

from .fixtures import VARIANTS, build_fixtures
from .toolchain import cudart12_lib, curand_lib, toolchain, torch_cuda_lib

pytestmark = pytest.mark.network

GPUS = ((8, 0), (8, 6), (9, 0), (10, 0), (10, 3), (12, 0))
#: A100, A40, H100/GH200, B200/GB200, B300, RTX PRO 6000 Blackwell.
C, J, N = "cubin", "jit", "none"
EXPECTED = {
    "sm80":           (C, C, N, N, N, N),
    "sm90":           (N, N, C, N, N, N),
    "sm80_sm90":      (C, C, C, N, N, N),
    "sm90a":          (N, N, C, N, N, N),
    "sm100_ptx100":   (N, N, N, C, C, J),
    "ptx90":          (N, N, J, J, J, J),
    "ptx90a":         (N, N, J, N, N, N),
    "sm100f":         (N, N, N, C, C, N),
    "ptx100f":        (N, N, N, J, J, N),
    "sm100a":         (N, N, N, C, N, N),
    "sm103a":         (N, N, N, N, C, N),
    "sm120_ptx120":   (N, N, N, N, N, C),
    # -rdc: only the device-linked cubin loads; the relocatable PTX feeds
    # nvlink and is not registered with the runtime.
    "rdc_sm80_ptx90": (C, C, N, N, N, N),
    "zip_sm80_ptx90": (C, C, J, J, J, J),
    "raw_sm80_ptx90": (C, C, J, J, J, J),
}
RULE = {C: None, J: "gpu-ptx-jit", N: "gpu-arch-missing", "too-new": "cuda-driver-too-old"}


def test_every_variant_has_a_documented_outcome() -> None:
    assert set(EXPECTED) == set(VARIANTS)


def _fixtures():  # type: ignore[no-untyped-def]
    return build_fixtures(toolchain())


@pytest.mark.parametrize("driver", [(13, 5), (13, 0)], ids=["driver-13.5", "driver-13.0"])
def test_fixture_verdicts_follow_the_documented_rules(driver: tuple[int, int]) -> None:
    checked = 0
    for fx in _fixtures():
        info = read_fatbins(str(fx.path), fsprobe.HOST)
        for gpu, outcome in zip(GPUS, EXPECTED[fx.variant]):
            if outcome == J and driver < (13, 5):
                outcome = "too-new"
            issue = judge_kernels(info, StepGpus((gpu,), driver))
            got = issue.rule if issue else None
            assert got == RULE[outcome], (fx.name, gpu, driver, info.holds())
            checked += 1
    assert checked >= 49 * len(GPUS)


def test_a_gpu_step_needs_every_gpu_served() -> None:
    """On a node with two kinds of GPU, the worst of the two counts."""
    [fx] = [f for f in _fixtures() if f.name == "x86_64/libsm80_sm90.so"]
    info = read_fatbins(str(fx.path), fsprobe.HOST)
    assert judge_kernels(info, StepGpus(((9, 0),), (13, 5))) is None
    mixed = judge_kernels(info, StepGpus(((9, 0), (10, 0)), (13, 5)))
    assert mixed is not None and mixed.rule == "gpu-arch-missing"
    assert mixed.fact("gpu_arch") == "sm_100" and mixed.fact("holds") == "sm_80 sm_90"


def test_no_gpus_no_judgement() -> None:
    [fx] = [f for f in _fixtures() if f.name == "x86_64/libsm80.so"]
    info = read_fatbins(str(fx.path), fsprobe.HOST)
    assert judge([info], [("libcudart.so.13", "/x")], StepGpus((), (12, 8))) == ()


def test_message_names_file_holdings_gpu_error_and_fix() -> None:
    [fx] = [f for f in _fixtures() if f.name == "aarch64/libsm80_sm90.so"]
    info = read_fatbins(str(fx.path), fsprobe.HOST)
    [issue] = judge([info], [], StepGpus(((10, 0),), (13, 0)), cuda_index="cu130")
    finding = Catalogue.load().finding(issue, {"partition": "gb200", "node_arch": "aarch64"})
    assert finding is not None and finding.severity == "error"
    assert "no kernel image is available for execution on the device" in \
        finding.predicted_error
    for word in (str(fx.path), "sm_80 sm_90", "sm_100", 'TORCH_CUDA_ARCH_LIST="10.0"',
                 "cu130", "srun -p gb200"):
        assert word in finding.remediation, word
    assert "{" not in finding.remediation


def test_jit_and_too_new_ptx_messages() -> None:
    [fx] = [f for f in _fixtures() if f.name == "x86_64/libptx90.so"]
    info = read_fatbins(str(fx.path), fsprobe.HOST)
    cat = Catalogue.load()
    ctx = {"partition": "gb200"}
    [jit] = judge([info], [], StepGpus(((10, 0),), (13, 5)))
    f = cat.finding(jit, ctx)
    assert f is not None and f.severity == "warning" and f.rule == "gpu-ptx-jit"
    assert "CUDA_CACHE_MAXSIZE" in f.remediation and "compute_90" in f.remediation
    assert "PTX ISA 9.5" in f.remediation and "{" not in f.remediation
    [old] = judge([info], [], StepGpus(((10, 0),), (13, 0)))
    f = cat.finding(old, ctx)
    assert f is not None and f.severity == "error" and f.rule == "cuda-driver-too-old"
    assert "cudaErrorUnsupportedPtxVersion" in f.predicted_error
    assert "CUDA 13.5" in f.remediation and "CUDA 13.0" in f.remediation
    assert "cuXYZ (XYZ: the node's CUDA version" in f.remediation and "{" not in f.remediation


def _needed(path) -> list[str]:  # type: ignore[no-untyped-def]
    return list(read_elf(str(path)).needed)


def test_runtime_major_against_the_driver() -> None:
    """A CUDA 13 program on a CUDA 12.8 driver fails at its first call; CUDA
    12's real runtime on a CUDA 13 driver is the seed's harmless case."""
    [exe] = [f for f in _fixtures() if f.name == "x86_64/sm80"]
    assert "libcudart.so.13" in _needed(exe.path)
    rt12 = cudart12_lib()
    soname12 = read_elf(str(rt12)).soname
    assert soname12 == "libcudart.so.12"
    info = read_fatbins(str(exe.path), fsprobe.HOST)
    sonames = [(n, str(exe.path)) for n in _needed(exe.path)]
    [issue] = judge([info], sonames, StepGpus(((8, 0),), (12, 8)))
    assert issue.rule == "cuda-driver-too-old" and issue.fact("name") == "libcudart.so.13"
    assert "insufficient for CUDA runtime version" in issue.predicted_error
    assert judge([info], sonames, StepGpus(((8, 0),), (13, 0))) == ()
    assert judge([], [(soname12, str(rt12))], StepGpus(((10, 0),), (13, 0))) == ()
    assert judge([], [(soname12, str(rt12))], StepGpus(((10, 0),), (12, 0))) == ()
    assert judge([], [(soname12, str(rt12))], StepGpus(((10, 0),), (11, 8)))[0].rule == \
        "cuda-driver-too-old"
    # Sonames not tied to the CUDA release say nothing about the driver.
    curand = read_elf(str(curand_lib("x86_64"))).soname
    assert curand == "libcurand.so.10"
    assert judge_mod.judge_runtime(curand, "/x", StepGpus(((10, 0),), (9, 0))) is None


def test_torch_2_14_1_runs_on_blackwell_and_not_on_volta() -> None:
    """The real torch CUDA library: sm_75..sm_120 cubins, no PTX."""
    info = read_fatbins(str(torch_cuda_lib()), fsprobe.HOST)
    for gpu in ((7, 5), (8, 0), (9, 0), (10, 0), (10, 3), (12, 0), (12, 1)):
        assert judge_kernels(info, StepGpus((gpu,), (13, 0))) is None, gpu
    issue = judge_kernels(info, StepGpus(((7, 0),), (13, 0)))
    assert issue is not None and issue.rule == "gpu-arch-missing"
    assert issue.fact("holds").startswith("sm_75 sm_80 sm_86 sm_89 sm_90 sm_90a sm_100")


def test_every_remedy_of_the_three_rules_is_filled() -> None:
    """Each cause's text, with the facts the judgement gives and what a
    container step's context adds, leaves no {field} unfilled."""
    fx = {f.name: f for f in _fixtures()}
    sm80 = read_fatbins(str(fx["x86_64/libsm80.so"].path), fsprobe.HOST)
    ptx = read_fatbins(str(fx["x86_64/libptx90.so"].path), fsprobe.HOST)
    issues = judge([sm80, ptx], [("libcudart.so.13", "/opt/x/libcudart.so.13")],
                   StepGpus(((10, 0),), (12, 8)), cuda_index="cu128")
    issues += judge([ptx], [], StepGpus(((10, 0),), (13, 5)))
    assert {i.rule for i in issues} == {"gpu-arch-missing", "gpu-ptx-jit", "cuda-driver-too-old"}
    cat = Catalogue.load()
    ctx = {"partition": "gb200", "node_arch": "aarch64", "image": "/img.sqsh",
           "inner": "/usr/lib/x.so"}
    for issue in issues:
        rule = cat.rule(issue.rule)
        assert rule is not None
        for cause in [c for c, _ in rule.remedies] + ["none"]:
            from dataclasses import replace

            f = cat.finding(replace(issue, causes=(cause,)), ctx)
            assert f is not None and "{" not in f.remediation, (issue.rule, cause, f.remediation)
