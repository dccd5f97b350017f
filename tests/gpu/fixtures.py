"""CUDA fixtures built with the pinned nvcc: programs, shared libraries and a
Python extension, each with chosen ``-gencode`` targets, for x86_64 and
aarch64 (``-ccbin aarch64-linux-gnu-g++`` against the aarch64 runtime
wheel: nvcc's device side does not depend on the host compiler, so the same
x86_64 nvcc cross-builds). Built once, cached under the toolchain's pins
and this module's recipe.

Every program launches one kernel and prints what happened (``kernel ran
binary=SM``, or the runtime's error name): ``make verify-gpu`` runs them on
a machine with a GPU and holds each to the prediction. ``binary`` is the
SM of the image the driver used (``cudaFuncGetAttributes``): the cubin's
own for a cubin, the device's for PTX compiled at load time.
"""

from __future__ import annotations

import hashlib
import json
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from corpus import CorpusUnavailable, _cached_tree, _run

from .toolchain import ARM_RUNTIME, NVCC_WHEELS, Toolchain, _or_skip

PROGRAM = r"""
#include <cstdio>
__global__ void probe(int *out) { out[threadIdx.x] = threadIdx.x + 1; }

extern "C" int grace_probe(char *msg, int len) {
  int *d = nullptr, h[4] = {0, 0, 0, 0};
  cudaError_t e = cudaMalloc(&d, sizeof h);
  if (e == cudaSuccess) { probe<<<1, 4>>>(d); e = cudaGetLastError(); }
  if (e == cudaSuccess) e = cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost);
  cudaFuncAttributes attr = {};
  if (e == cudaSuccess) e = cudaFuncGetAttributes(&attr, probe);
  if (e != cudaSuccess) { snprintf(msg, len, "%s", cudaGetErrorName(e)); return 1; }
  if (h[3] != 4) { snprintf(msg, len, "wrong result"); return 3; }
  snprintf(msg, len, "kernel ran binary=%d", attr.binaryVersion);
  return 0;
}
#ifdef GRACE_MAIN
int main() { char msg[128]; int rc = grace_probe(msg, sizeof msg); puts(msg); return rc; }
#endif
"""

PYEXT = r"""
#include <Python.h>
extern "C" int grace_probe(char *msg, int len);
static PyObject *run(PyObject *, PyObject *) {
  char msg[128]; grace_probe(msg, sizeof msg); return PyUnicode_FromString(msg);
}
static PyMethodDef methods[] = {{"run", run, METH_NOARGS, nullptr}, {nullptr, nullptr, 0, nullptr}};
static struct PyModuleDef mod = {PyModuleDef_HEAD_INIT, "_graceprobe", nullptr, -1, methods};
PyMODINIT_FUNC PyInit__graceprobe(void) { return PyModule_Create(&mod); }
"""


def _gen(arch: str, code: str) -> str:
    return f"-gencode=arch={arch},code={code}"


SM80 = _gen("compute_80", "sm_80")
SM90 = _gen("compute_90", "sm_90")
PTX90 = _gen("compute_90", "compute_90")

#: name -> nvcc arguments. What each holds is what cuobjdump says, not this.
VARIANTS: dict[str, tuple[str, ...]] = {
    "sm80": (SM80,),
    "sm90": (SM90,),
    "sm80_sm90": (SM80, SM90),  # torch's cu126 aarch64 list: nothing for 10.0
    "sm90a": (_gen("compute_90a", "sm_90a"),),
    "sm100_ptx100": (_gen("compute_100", "[sm_100,compute_100]"),),
    "ptx90": (PTX90,),
    "ptx90a": (_gen("compute_90a", "compute_90a"),),
    "sm100f": (_gen("compute_100f", "sm_100f"),),
    "ptx100f": (_gen("compute_100f", "compute_100f"),),
    "sm100a": (_gen("compute_100a", "sm_100a"),),
    "sm103a": (_gen("compute_103a", "sm_103a"),),
    "sm120_ptx120": (_gen("compute_120", "[sm_120,compute_120]"),),
    "rdc_sm80_ptx90": ("-rdc=true", SM80, PTX90),
    "zip_sm80_ptx90": ("-Xfatbin=-compress-all", SM80, PTX90),
    "raw_sm80_ptx90": ("--no-compress", SM80, PTX90),
}
#: aarch64 programs (every variant is also built as an aarch64 library).
ARM_PROGRAMS = ("sm80_sm90", "sm100_ptx100", "ptx90", "rdc_sm80_ptx90")
#: x86_64 Python extensions (for this interpreter's tag).
PY_EXTENSIONS = ("sm80_sm90", "sm100_ptx100")

RECIPE = hashlib.sha256(json.dumps([PROGRAM, PYEXT, VARIANTS, ARM_PROGRAMS, PY_EXTENSIONS, 2])
                        .encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Fixture:
    name: str
    variant: str
    arch: str
    #: "exe" (also the static-runtime program), "lib" or "pyext".
    kind: str
    path: Path

    @property
    def gencode(self) -> tuple[str, ...]:
        return VARIANTS[self.variant]


def _builds(tc: Toolchain, out: Path) -> list[tuple[str, str, str, str, list[str]]]:
    """(name, variant, arch, kind, nvcc command) for every fixture."""
    src, ext = out / "probe.cu", out / "pyext.cu"
    jobs = []
    py_inc = sysconfig.get_paths()["include"]
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    for variant, flags in VARIANTS.items():
        for arch in ("x86_64", "aarch64"):
            host = ["-ccbin", "aarch64-linux-gnu-g++", "-L", str(tc.arm_lib)] \
                if arch == "aarch64" else []
            base = [str(tc.nvcc), *host, *flags, "-cudart", "shared"]
            lib = f"{arch}/lib{variant}.so"
            jobs.append((lib, variant, arch, "lib",
                         [*base, "-shared", "-Xcompiler", "-fPIC", "-o", str(out / lib),
                          str(src)]))
            if arch == "x86_64" or variant in ARM_PROGRAMS:
                exe = f"{arch}/{variant}"
                jobs.append((exe, variant, arch, "exe",
                             [*base, "-DGRACE_MAIN", "-o", str(out / exe), str(src)]))
        if variant in PY_EXTENSIONS:
            name = f"x86_64/py-{variant}/_graceprobe{suffix}"
            jobs.append((name, variant, "x86_64", "pyext",
                         [str(tc.nvcc), *flags, "-cudart", "shared", "-shared", "-Xcompiler",
                          "-fPIC", "-I", py_inc, "-o", str(out / name), str(src), str(ext)]))
    # The runtime linked in statically (nvcc's default): the program then
    # carries the runtime's own fat binaries too.
    jobs.append(("x86_64/sm80_static", "sm80", "x86_64", "exe",
                 [str(tc.nvcc), SM80, "-DGRACE_MAIN", "-o", str(out / "x86_64/sm80_static"),
                  str(src)]))
    return jobs


def build_fixtures(tc: Toolchain) -> list[Fixture]:
    """Every fixture, built once (about a minute and a half on two cores)."""

    def build(work: Path) -> Path:
        out = work / "root"
        for d in ("x86_64", "aarch64", *(f"x86_64/py-{v}" for v in PY_EXTENSIONS)):
            (out / d).mkdir(parents=True, exist_ok=True)
        (out / "probe.cu").write_text(PROGRAM)
        (out / "pyext.cu").write_text(PYEXT)
        manifest = []
        for name, variant, arch, kind, cmd in _builds(tc, out):
            _run(cmd, cwd=out, timeout=600)
            manifest.append({"name": name, "variant": variant, "arch": arch, "kind": kind})
        (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
        return out

    def make() -> list[Fixture]:
        want = {"toolchain": [w.sha256 for w in (*NVCC_WHEELS, ARM_RUNTIME)],
                "recipe": RECIPE, "python": sysconfig.get_config_var("EXT_SUFFIX")}
        root = _cached_tree("cuda-fixtures", want, build)
        try:
            manifest = json.loads((root / "manifest.json").read_text())
        except (OSError, ValueError) as exc:
            raise CorpusUnavailable(f"{root}/manifest.json unreadable: {exc}") from exc
        return [Fixture(m["name"], m["variant"], m["arch"], m["kind"], root / m["name"])
                for m in manifest]

    return _or_skip("cuda-fixtures", make)  # type: ignore[no-any-return]
