"""The GPU-architecture judgement inside the check (issue 26, the integration).

Real parts only: the nvcc-built fixtures of tests/gpu (cuobjdump agrees with
the reader on every entry there), host programs gcc links against them here,
the pinned CUDA 13.5 and 12.9 runtime wheels' libcudart, a venv CPython
imports a real nvcc-built extension module from, and the CLI as users run
it. The node's GPUs come from the config or the command line (this machine
has none); where NVML's answer is the point (the verdict cache), the node
gets one through :func:`grace_policy.cuda.nodegpus.set_for_tests`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from gpu.fixtures import build_fixtures
from gpu.toolchain import cudart12_lib, toolchain
from image.budgets import roomy

from grace_policy import verdict_cache
from grace_policy.decide import StepRequest, decide
from grace_policy.findings import Verdict
from grace_policy.node import NodeProfile, detect
from grace_policy.policy import Policy

pytestmark = pytest.mark.network

REPO = Path(__file__).resolve().parents[1]
MAIN = "extern int grace_probe(char *, int);\nint main(void) { char m[128]; " \
       "return grace_probe(m, 128); }\n"


@pytest.fixture(scope="module")
def fx() -> dict[str, Path]:
    return {f.name: f.path for f in build_fixtures(toolchain())}


@pytest.fixture(scope="module")
def cudart13() -> Path:
    return toolchain().x86_lib


@pytest.fixture(scope="module")
def progs(fx: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A host program (gcc, no device code of its own) per fixture library."""
    out = tmp_path_factory.mktemp("cuda-progs")
    (out / "main.c").write_text(MAIN)
    built = {}
    for variant in ("sm80_sm90", "ptx90", "sm100_ptx100", "sm90"):
        lib = fx[f"x86_64/lib{variant}.so"]
        exe = out / f"uses-{variant}"
        subprocess.run(["gcc", str(out / "main.c"), "-o", str(exe), f"-L{lib.parent}",
                        f"-l{variant}", f"-Wl,-rpath,{lib.parent}"], check=True, timeout=120)
        built[variant] = exe
    return built


def _env(cudart: Path, gpus: int | None = 1, **extra: str) -> dict[str, str]:
    env = {"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": str(cudart), "HOME": "/nonexistent"}
    if gpus is not None:
        env["SLURM_GPUS_ON_NODE"] = str(gpus)
    env.update(extra)
    return env


def _node(gpu: str | None, driver: str | None) -> NodeProfile:
    from grace_policy.node import parse_cuda_version, parse_gpu_arch

    return detect().with_overrides(gpu_arch=parse_gpu_arch(gpu) if gpu else None,
                                   cuda_driver=parse_cuda_version(driver) if driver else None)


def _decide(argv: list[str], env: dict[str, str], node: NodeProfile, *,
            probes: list[tuple[str, str, str]] | None = None, **kw: object) -> Verdict:
    return decide(Policy(mode="enforce"), StepRequest(partition=None, argv=argv, env=env, cwd="/",
                                                      node=node, **kw),  # type: ignore[arg-type]
                  probes=probes)


def _rules(v: Verdict) -> list[tuple[str, str, str]]:
    return [(f.rule, f.severity, os.path.basename(f.path)) for f in v.findings]


def test_sm80_sm90_library_on_sm100_is_refused(progs: dict[str, Path], cudart13: Path) -> None:
    v = _decide([str(progs["sm80_sm90"])], _env(cudart13), _node("sm_100", "13.5"))
    assert v.action == "reject", v
    assert _rules(v) == [("gpu-arch-missing", "error", "libsm80_sm90.so")]
    text = v.findings[0].remediation
    assert "holds kernels for sm_80 sm_90 only" in text and "are sm_100" in text
    assert 'TORCH_CUDA_ARCH_LIST="10.0"' in text
    assert "no kernel image is available" in v.findings[0].predicted_error
    # The same program on an H100 node: its sm_90 cubin runs.
    ok = _decide([str(progs["sm80_sm90"])], _env(cudart13), _node("sm_90", "13.5"))
    assert ok.action == "allow" and not ok.findings, ok


def test_ptx_only_warns_of_the_jit(progs: dict[str, Path], cudart13: Path) -> None:
    v = _decide([str(progs["ptx90"])], _env(cudart13), _node("sm_100", "13.5"))
    assert v.action == "warn", v
    assert _rules(v) == [("gpu-ptx-jit", "warning", "libptx90.so")]
    assert "compute_90" in v.findings[0].remediation and "CUDA_CACHE_PATH" in \
        v.findings[0].remediation


def test_ptx_newer_than_the_driver_is_refused(progs: dict[str, Path], cudart13: Path) -> None:
    # The fixtures' PTX is ISA 9.5 (CUDA 13.5); a 13.0 driver cannot JIT it.
    v = _decide([str(progs["ptx90"])], _env(cudart13), _node("sm_100", "13.0"))
    assert v.action == "reject", v
    assert _rules(v) == [("cuda-driver-too-old", "error", "libptx90.so")]
    assert "unsupported toolchain" in v.findings[0].predicted_error
    assert "needs a driver for CUDA 13.5" in v.findings[0].remediation


def test_cuda13_runtime_on_a_cuda12_driver_is_refused(progs: dict[str, Path],
                                                      cudart13: Path) -> None:
    v = _decide([str(progs["sm100_ptx100"])], _env(cudart13), _node("sm_100", "12.8"))
    assert v.action == "reject", v
    assert _rules(v) == [("cuda-driver-too-old", "error", "libcudart.so.13")]
    assert "supports CUDA 12.8" in v.findings[0].remediation
    # ... and runs on 13.0: a cubin for sm_100 and a runtime of the driver's major.
    ok = _decide([str(progs["sm100_ptx100"])], _env(cudart13), _node("sm_100", "13.0"))
    assert ok.action == "allow" and not ok.findings, ok


def test_a_cuda12_runtime_on_a_cuda13_driver_is_allowed(tmp_path: Path) -> None:
    """The second seed's harmless case: vLLM built for CUDA 12 on a CUDA 13
    node. The program links libcudart.so.12 of the pinned 12.9 wheel."""
    lib = cudart12_lib()
    (tmp_path / "main.c").write_text("int main(void) { return 0; }\n")
    exe = tmp_path / "cuda12"
    subprocess.run(["gcc", str(tmp_path / "main.c"), "-o", str(exe), "-Wl,--no-as-needed",
                    f"-L{lib.parent}", "-l:libcudart.so.12", f"-Wl,-rpath,{lib.parent}"],
                   check=True, timeout=120)
    env = _env(lib.parent)
    ok = _decide([str(exe)], env, _node("sm_100", "13.0"))
    assert ok.action == "allow" and not ok.findings, ok
    old = _decide([str(exe)], env, _node("sm_100", "11.8"))
    assert _rules(old) == [("cuda-driver-too-old", "error", "libcudart.so.12")]


@pytest.mark.parametrize("env_extra", [{"SLURM_GPUS_ON_NODE": "0"}, {}])
def test_a_step_without_gpus_is_not_judged_for_them(progs: dict[str, Path], cudart13: Path,
                                                    env_extra: dict[str, str]) -> None:
    """``--gpus 0`` and a step with no GRES: nothing judged, and (in a fresh
    interpreter) nothing of grace_policy.cuda imported."""
    env = _env(cudart13, gpus=None, **env_extra)
    code = ("import sys, json; sys.path.insert(0, sys.argv[1]);"
            "from grace_policy.decide import StepRequest, decide;"
            "from grace_policy.policy import Policy;"
            "from grace_policy.node import detect;"
            "n = detect().with_overrides(gpu_arch=(10, 0), cuda_driver=(13, 5));"
            "v = decide(Policy(), StepRequest(partition=None, argv=[sys.argv[2]],"
            " env=json.loads(sys.argv[3]), cwd='/', node=n));"
            "print(v.action, len(v.findings),"
            " sorted(m for m in sys.modules if m.startswith('grace_policy.cuda')))")
    out = subprocess.run([sys.executable, "-S", "-E", "-c", code, str(REPO),
                          str(progs["sm80_sm90"]), json.dumps(env)],
                         capture_output=True, text=True, check=True, timeout=120).stdout
    assert out.split() == ["allow", "0", "[]"], out


def _venv_with(tmp_path: Path, ext: Path) -> Path:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    site = next((venv / "lib").glob("python3*/site-packages"))
    shutil.copy(ext, site / ext.name)
    return venv / "bin" / "python"


@pytest.mark.parametrize(("variant", "expected"), [
    ("sm80_sm90", [("gpu-arch-missing", "error", "_graceprobe")]),
    ("sm100_ptx100", []),
])
def test_an_extension_module_in_a_venv(fx: dict[str, Path], cudart13: Path, tmp_path: Path,
                                       variant: str, expected: list[tuple[str, str, str]]
                                       ) -> None:
    ext = next(p for n, p in fx.items() if n.startswith(f"x86_64/py-{variant}/"))
    python = _venv_with(tmp_path, ext)
    v = _decide([str(python), "-c", "import _graceprobe"], _env(cudart13),
                _node("sm_100", "13.5"))
    got = [(r, s, name.split(".")[0]) for r, s, name in _rules(v)]
    assert got == expected, v
    if expected:
        assert v.action == "reject"
        assert v.findings[0].path.endswith(ext.name)
        assert "/site-packages/" in v.findings[0].path


def test_an_unused_extension_is_a_warning_of_its_distribution(fx: dict[str, Path],
                                                              cudart13: Path,
                                                              tmp_path: Path) -> None:
    """Installed but not imported: the environment's usual "broken
    distribution" warning, not a refusal (the step may never load it)."""
    ext = fx[next(n for n in fx if n.startswith("x86_64/py-sm80_sm90/"))]
    python = _venv_with(tmp_path, ext)
    v = _decide([str(python), "-c", "pass"], _env(cudart13), _node("sm_100", "13.5"))
    assert v.action in ("allow", "warn"), v
    assert all(f.severity != "error" for f in v.findings), v


def test_runtime_sonames_start_as_the_check_expects() -> None:
    """The check asks the soname table only of names with these prefixes."""
    from grace_policy.cuda.arch import tables
    from grace_policy.cuda.stepcheck import RUNTIME_PREFIXES

    names = tables().runtime_sonames
    assert names and all(n.startswith(RUNTIME_PREFIXES) for n in names), names


# -- the command line and the config ---------------------------------------------


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "grace_policy", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)


def test_check_gpu_arch_and_cuda_driver_options(progs: dict[str, Path], cudart13: Path
                                                ) -> None:
    env = {**_env(cudart13, gpus=None), "PYTHONPATH": str(REPO)}
    prog = str(progs["sm80_sm90"])
    refused = _cli("check", "--gpu-arch", "sm_100", "--cuda-driver", "13.0", "--json", "--",
                   prog, env=env)
    assert refused.returncode == 2, refused.stderr
    doc = json.loads(refused.stdout)
    assert doc["node"]["gpu_arch"] == "sm_100" and doc["node"]["cuda_driver"] == "13.0"
    assert [f["rule"] for f in doc["findings"]] == ["gpu-arch-missing"]
    # --gpus 0: a step without GPUs, whatever the node has.
    assert _cli("check", "--gpu-arch", "sm_100", "--gpus", "0", "--", prog,
                env=env).returncode == 0
    assert _cli("check", "--gpu-arch", "sm_90", "--cuda-driver", "13.0", "--", prog,
                env=env).returncode == 0
    bad = _cli("check", "--gpu-arch", "sm_90a", "--", prog, env=env)
    assert bad.returncode == 64 and "--gpu-arch" in bad.stderr and "sm_100" in bad.stderr


def test_partition_config_gives_the_gpus(progs: dict[str, Path], cudart13: Path,
                                         tmp_path: Path) -> None:
    config = tmp_path / "grace-policy.toml"
    config.write_text('mode = "enforce"\n[partitions.gb200]\ngpu_arch = "sm_100"\n'
                      'cuda_driver = "13.0"\ncuda_index = "cu130"\n'
                      '[partitions.h100]\ngpu_arch = "9.0"\ncuda_driver = "13.0"\n')
    env = {**_env(cudart13, gpus=None), "PYTHONPATH": str(REPO)}
    prog = str(progs["sm80_sm90"])
    gb200 = _cli("check", "--config", str(config), "--partition", "gb200", "--gpus", "1",
                 "--", prog, env=env)
    assert gb200.returncode == 2, gb200.stderr
    assert "gpu-arch-missing" in gb200.stdout and "cu130" in gb200.stdout
    assert _cli("check", "--config", str(config), "--partition", "h100", "--gpus", "1",
                "--", prog, env=env).returncode == 0
    # A typo in the config names the key and its line.
    config.write_text('[node]\ngpu_arch = "sm100"\ncuda_driver = "13"\n')
    broken = _cli("check", "--config", str(config), "--", "/bin/true", env=env)
    assert broken.returncode == 78
    assert f"{config}:2: node.gpu_arch" in broken.stderr, broken.stderr
    assert f"{config}:3: node.cuda_driver" in broken.stderr, broken.stderr


def test_env_judges_the_packages_kernels(fx: dict[str, Path], cudart13: Path,
                                         tmp_path: Path) -> None:
    ext = fx[next(n for n in fx if n.startswith("x86_64/py-sm80_sm90/"))]
    python = _venv_with(tmp_path, ext)
    env = {**_env(cudart13, gpus=None), "PYTHONPATH": str(REPO)}
    gb200 = _cli("env", "--gpu-arch", "sm_100", "--cuda-driver", "13.0", str(python), env=env)
    assert gb200.returncode == 1, gb200.stdout + gb200.stderr
    assert "gpu-arch-missing" in gb200.stdout and ext.name in gb200.stdout
    h100 = _cli("env", "--gpu-arch", "9.0", "--cuda-driver", "13.0", str(python), env=env)
    assert h100.returncode == 0 and "gpu-arch" not in h100.stdout, h100.stdout


def test_explain_and_report_know_the_rules(progs: dict[str, Path], cudart13: Path,
                                          tmp_path: Path) -> None:
    """``explain`` has the three rules; ``report`` counts the decision lines
    of GPU refusals and warnings (rendered by the audit code from real
    verdicts) like any other rule's."""
    from grace_policy.audit import render_decision

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for rule in ("gpu-arch-missing", "gpu-ptx-jit", "cuda-driver-too-old"):
        out = _cli("explain", rule, env=env)
        assert out.returncode == 0 and rule in out.stdout, out.stderr
    log = tmp_path / "audit.log"
    lines = []
    for i, (variant, driver) in enumerate((("sm80_sm90", "13.5"), ("ptx90", "13.5"),
                                           ("ptx90", "13.0"), ("sm80_sm90", "13.5"))):
        v = _decide([str(progs[variant])], _env(cudart13), _node("sm_100", driver))
        lines.append(render_decision(v, job_id=100 + i, step_id="0", uid=os.getuid(),
                                     node="n1", elapsed_ms=3.0))
    log.write_text("".join(lines))
    done = _cli("report", "--json", str(log), env=env)
    assert done.returncode == 0, done.stderr
    rules = json.loads(done.stdout)["rules"]
    assert rules == {"gpu-arch-missing": 2, "gpu-ptx-jit": 1, "cuda-driver-too-old": 1}, rules


# -- the verdict cache ------------------------------------------------------------


@pytest.fixture
def nvml_answer() -> Iterator[None]:
    """An NVML answer for this GPU-less machine: one sm_90 GPU, CUDA 13.5."""
    from grace_policy.cuda import nodegpus
    from grace_policy.cuda.nvml import Gpu, NodeGpus

    nodegpus.set_for_tests(NodeGpus(gpus=(Gpu(index=0, minor=0, capability=(9, 0)),),
                                    driver_cuda=(13, 5)))
    try:
        yield
    finally:
        nodegpus.set_for_tests(None)


def _entry(argv: list[str], env: dict[str, str], node: NodeProfile
           ) -> tuple[str | None, list[tuple[str, str]]]:
    probes: list[tuple[str, str, str]] = []
    v = _decide(argv, env, node, probes=probes)
    assert verdict_cache.cacheable(v), v
    ins = verdict_cache.inputs(argv0=argv[0], cwd="/", partition=None, user_mode=None,
                               env=env, env_names=("PATH", "LD_LIBRARY_PATH"))
    return verdict_cache.entry(verdict_cache.read_inputs(ins, probes), v.mode, probes), ins


def test_a_clean_verdict_on_nvmls_gpus_is_never_replayed(progs: dict[str, Path],
                                                         cudart13: Path,
                                                         nvml_answer: None) -> None:
    """Clean on NVML's sm_90 in a process that published no facts (the
    ``checker=step`` helper, the CLI): the entry records the GPUs as an
    input no lookup can give, so the same step on a node that became sm_100
    (or got another driver) is judged again, never replayed. (Published
    facts: tests/test_gpu_cache.py.)"""
    env = _env(cudart13, SLURM_STEP_GPUS="0")
    text, ins = _entry([str(progs["sm80_sm90"])], env, _node(None, None))
    assert text is not None and "I nvml =sm_90%20cuda%2013.5" in text, text
    assert "I gpus " not in text
    assert verdict_cache.lookup(text, ins, env) is None


def test_a_step_without_gpus_does_not_replay_for_one_with_gpus(progs: dict[str, Path],
                                                               cudart13: Path) -> None:
    env = _env(cudart13, gpus=None)
    text, ins = _entry([str(progs["sm80_sm90"])], env, _node("sm_100", "13.5"))
    assert text is not None
    assert verdict_cache.lookup(text, ins, env) == "enforce"  # the same step: a hit
    with_gpu = {**env, "SLURM_GPUS_ON_NODE": "1"}
    assert verdict_cache.lookup(text, ins, with_gpu) is None


def test_stated_gpus_are_keyed_by_the_config(progs: dict[str, Path], cudart13: Path,
                                             tmp_path: Path) -> None:
    """The config's gpu_arch: a clean entry for sm_90 stops matching when the
    config says sm_100 (the entry holds the config file's identity, as
    slurm_bridge writes every entry)."""
    from grace_policy.config import load_config
    from grace_policy.decide import node_for

    config = tmp_path / "grace-policy.toml"
    config.write_text('[node]\ngpu_arch = "sm_90"\ncuda_driver = "13.5"\n')
    env = _env(cudart13)
    node = node_for(load_config(str(config)), None)
    probes: list[tuple[str, str, str]] = []
    v = _decide([str(progs["sm80_sm90"])], env, node, probes=probes)
    assert verdict_cache.cacheable(v), v
    assert not any(op == "i" and name == "gpus" for op, name, _ in probes)
    probes += verdict_cache.config_probes([str(config)])
    ins = verdict_cache.inputs(argv0=str(progs["sm80_sm90"]), cwd="/", partition=None,
                               user_mode=None, env=env, env_names=("PATH", "LD_LIBRARY_PATH"))
    text = verdict_cache.entry(verdict_cache.read_inputs(ins, probes), v.mode, probes)
    assert text is not None and verdict_cache.lookup(text, ins, env) == "enforce"
    config.write_text('[node]\ngpu_arch = "sm_100"\ncuda_driver = "13.5"\n')
    assert verdict_cache.lookup(text, ins, env) is None
    refused = _decide([str(progs["sm80_sm90"])], env, node_for(load_config(str(config)), None))
    assert refused.action == "reject"


# -- inside an image ---------------------------------------------------------------


@pytest.mark.cross
@pytest.mark.skipif(shutil.which("mksquashfs") is None,
                    reason="mksquashfs not installed (squashfs-tools)")
def test_inside_an_aarch64_image(fx: dict[str, Path], tmp_path: Path) -> None:
    """An aarch64 squashfs image (the real cross glibc, the aarch64 runtime
    wheel's libcudart, the aarch64 sm_80+sm_90 fixture library and a program
    cross-linked to it), read without mounting, on a GB200 node: refused,
    and the finding names the file inside the image."""
    from fixtures.build import AARCH64_SYSROOT
    from image.roots import make_root, mksquashfs

    from grace_policy.image.open import open_image

    root = make_root(tmp_path / "root", "aarch64")
    lib = root / "opt/cuda/lib"
    lib.mkdir(parents=True)
    shutil.copy(fx["aarch64/libsm80_sm90.so"], lib / "libsm80_sm90.so")
    shutil.copy(toolchain().arm_lib / "libcudart.so.13", lib / "libcudart.so.13")
    trip = root / "lib/aarch64-linux-gnu"
    for name in ("libstdc++.so.6", "libgcc_s.so.1", "libm.so.6", "libdl.so.2",
                 "libpthread.so.0", "librt.so.1"):
        shutil.copy(os.path.realpath(f"{AARCH64_SYSROOT}/lib/{name}"), trip / name)
    (tmp_path / "main.c").write_text(MAIN)
    subprocess.run(["aarch64-linux-gnu-gcc", str(tmp_path / "main.c"), "-o",
                    str(root / "opt/app/uses-gpu"), f"-L{lib}", "-lsm80_sm90",
                    f"-Wl,-rpath-link,{lib}", "-Wl,--disable-new-dtags,-rpath,/opt/cuda/lib"],
                   check=True, timeout=120)
    image = open_image(str(mksquashfs(root, tmp_path / "gpu.sqsh", "gzip")), budget=roomy())
    env = image.step_env({"SLURM_GPUS_ON_NODE": "1"})
    gb200 = NodeProfile("aarch64", 4096, (2, 36), gpu_arch=(10, 0), cuda_driver=(13, 0))
    v = _decide(["uses-gpu"], env, gb200, image=image)
    assert v.action == "reject", v
    assert [(f.rule, f.path) for f in v.findings] == [
        ("gpu-arch-missing", f"{tmp_path / 'gpu.sqsh'}:/opt/cuda/lib/libsm80_sm90.so")]
    print(v.findings[0].remediation)
    assert "Use an image built for sm_100" in v.findings[0].remediation
    h100 = NodeProfile("aarch64", 4096, (2, 36), gpu_arch=(9, 0), cuda_driver=(13, 0))
    ok = _decide(["uses-gpu"], env, h100, image=image)
    assert ok.action == "allow" and not ok.findings, ok


@pytest.mark.parametrize("stated", [False, True])
def test_the_bridge_writes_no_entry_that_could_never_hit(progs: dict[str, Path],
                                                         cudart13: Path, tmp_path: Path,
                                                         nvml_answer: None,
                                                         stated: bool) -> None:
    """A clean GPU step judged on NVML's answer hands C no cache entry (it
    would only take room from entries that can hit); judged on the config's
    gpu_arch/cuda_driver, it does."""
    from grace_policy import slurm_bridge

    config = tmp_path / "grace-policy.toml"
    config.write_text('mode = "enforce"\n' + (
        '[node]\ngpu_arch = "sm_90"\ncuda_driver = "13.5"\n' if stated else ""))
    out = slurm_bridge.run_step(slurm_bridge.StepInput(
        config=str(config), on_error="deny", partition=None, cwd="/", user_mode=None,
        node="n1", argv=(str(progs["sm80_sm90"]),), env=_env(cudart13, SLURM_STEP_GPUS="0"),
        job_id=1, step_id=0, uid=os.geteuid(), batch=False, code="test|-"))
    assert out.action == "allow" and not out.user, out
    if stated:
        assert out.cache and "I env:SLURM_GPUS_ON_NODE =1" in out.cache, out.cache
    else:
        assert out.cache is None


NVML_CHILD = r"""
import json, os, sys
sys.path.insert(0, sys.argv[1])
from grace_policy.cuda import nodegpus
from grace_policy.decide import StepRequest, decide
from grace_policy.policy import Policy
nodegpus.preload()  # as the node checker does when it starts, before it forks
os.environ["GRACE_NVML_MAJOR"] = sys.argv[4]  # what NVML would answer from now on
r, w = os.pipe()
pid = os.fork()
if pid == 0:  # a child judging a step, as the checker's spare does
    v = decide(Policy(), StepRequest(partition=None, argv=[sys.argv[2]],
                                     env=json.loads(sys.argv[3]), cwd="/", node=None))
    os.write(w, json.dumps([v.action, [(f.rule, f.remediation) for f in v.findings]]).encode())
    os._exit(0)
os.close(w)
os.waitpid(pid, 0)
print(os.read(r, 65536).decode())
"""


@pytest.mark.parametrize(("major", "later", "action"), [("10", "9", "reject"),
                                                          ("9", "10", "allow")])
def test_nvml_is_read_once_before_the_fork(progs: dict[str, Path], cudart13: Path,
                                           tmp_path: Path, major: str, later: str,
                                           action: str) -> None:
    """No config value: the node's GPUs are NVML's (the ABI stand-in of
    tests/gpu/test_nvml.py, installed as libnvidia-ml.so.1), read once by the
    parent; the forked child judges with that answer, even though NVML would
    now say otherwise. SLURM_STEP_GPUS=4 is the stand-in's first device."""
    from gpu.test_nvml import STANDIN

    (tmp_path / "nvml.c").write_text(STANDIN)
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(tmp_path / "libnvidia-ml.so.1"),
                    str(tmp_path / "nvml.c")], check=True, timeout=120)
    step_env = _env(cudart13, SLURM_STEP_GPUS="4")
    proc = subprocess.run(
        [sys.executable, "-c", NVML_CHILD, str(REPO), str(progs["sm80_sm90"]),
         json.dumps(step_env), later], capture_output=True, text=True, timeout=120,
        env={**os.environ, "LD_LIBRARY_PATH": str(tmp_path), "GRACE_NVML_MAJOR": major,
             "GRACE_NVML_DRIVER": "13050"}, check=True)
    got, findings = json.loads(proc.stdout)
    assert got == action, findings
    if action == "reject":
        [(rule, text)] = findings
        assert rule == "gpu-arch-missing" and "are sm_100" in text, findings
