"""The node's GPUs and its driver's CUDA version, from NVML.

NVML (``libnvidia-ml.so.1``, installed with the driver) answers without a
CUDA context and without touching the GPUs' memory: each device's compute
capability (``nvmlDeviceGetCudaComputeCapability``), its minor number (the
N of ``/dev/nvidiaN``, which Slurm's GPU indices follow) and the CUDA
version the driver supports (``nvmlSystemGetCudaDriverVersion_v2``, what
``nvidia-smi`` prints as "CUDA Version"). The node checker asks once at its
start, never per step.

Bounded and never raising: a missing library, a missing symbol, an NVML
error or a call that does not return within the timeout (a wedged driver)
give a :class:`NodeGpus` whose ``error`` says why and whose ``gpus`` is
empty. The calls run in a daemon thread so a hung driver call cannot hold
the caller; such a thread is left behind, never joined again.
"""

from __future__ import annotations

import threading

from .._record import dataclass

LIBRARY = "libnvidia-ml.so.1"
#: NVML reports this many devices at most here (a node has 4-16).
MAX_DEVICES = 64
TIMEOUT_S = 5.0

NVML_SUCCESS = 0


@dataclass(frozen=True)
class Gpu:
    index: int
    #: /dev/nvidiaN's N (-1 when NVML did not say).
    minor: int
    capability: tuple[int, int]


@dataclass(frozen=True)
class NodeGpus:
    gpus: tuple[Gpu, ...] = ()
    #: The CUDA version the driver supports, e.g. (13, 0); None if unknown.
    driver_cuda: tuple[int, int] | None = None
    #: Why NVML gave no answer (or an incomplete one); "" when it answered.
    error: str = ""

    @property
    def available(self) -> bool:
        return not self.error and bool(self.gpus)


def _query(lib_path: str, max_devices: int) -> NodeGpus:
    import ctypes

    try:
        lib = ctypes.CDLL(lib_path)
    except OSError as exc:
        return NodeGpus(error=f"{lib_path} not loaded: {exc}")
    try:
        init = lib.nvmlInit_v2
        shutdown = lib.nvmlShutdown
        count_fn = lib.nvmlDeviceGetCount_v2
        handle_fn = lib.nvmlDeviceGetHandleByIndex_v2
        cc_fn = lib.nvmlDeviceGetCudaComputeCapability
        driver_fn = lib.nvmlSystemGetCudaDriverVersion_v2
    except AttributeError as exc:
        return NodeGpus(error=f"{lib_path} lacks an NVML function: {exc}")
    minor_fn = getattr(lib, "nvmlDeviceGetMinorNumber", None)
    error_string = getattr(lib, "nvmlErrorString", None)
    if error_string is not None:
        error_string.restype = ctypes.c_char_p

    def why(call: str, rc: int) -> str:
        text = ""
        if error_string is not None:
            try:
                raw = error_string(ctypes.c_int(rc))
                text = raw.decode("ascii", "replace")[:200] if raw else ""
            except Exception:  # a broken library: the code alone
                text = ""
        return f"{call} returned {rc}" + (f" ({text})" if text else "")

    rc = init()
    if rc != NVML_SUCCESS:
        return NodeGpus(error=why("nvmlInit_v2", rc))
    try:
        version = ctypes.c_int(0)
        rc = driver_fn(ctypes.byref(version))
        driver = None
        problems = []
        if rc == NVML_SUCCESS and 0 < version.value < 1_000_000:
            driver = (version.value // 1000, (version.value % 1000) // 10)
        else:
            problems.append(why("nvmlSystemGetCudaDriverVersion_v2", rc))
        count = ctypes.c_uint(0)
        rc = count_fn(ctypes.byref(count))
        if rc != NVML_SUCCESS:
            return NodeGpus(driver_cuda=driver, error=why("nvmlDeviceGetCount_v2", rc))
        gpus = []
        for i in range(min(count.value, max_devices)):
            handle = ctypes.c_void_p()
            rc = handle_fn(ctypes.c_uint(i), ctypes.byref(handle))
            if rc != NVML_SUCCESS:
                problems.append(why(f"nvmlDeviceGetHandleByIndex_v2({i})", rc))
                continue
            major, minor = ctypes.c_int(0), ctypes.c_int(0)
            rc = cc_fn(handle, ctypes.byref(major), ctypes.byref(minor))
            if rc != NVML_SUCCESS or not (0 < major.value < 1000 and 0 <= minor.value < 10):
                problems.append(why(f"nvmlDeviceGetCudaComputeCapability({i})", rc))
                continue
            dev_minor = -1
            if minor_fn is not None:
                number = ctypes.c_uint(0)
                if minor_fn(handle, ctypes.byref(number)) == NVML_SUCCESS:
                    dev_minor = number.value
            gpus.append(Gpu(index=i, minor=dev_minor, capability=(major.value, minor.value)))
        if count.value > max_devices:
            problems.append(f"NVML reports {count.value} devices; the first {max_devices} read")
        return NodeGpus(gpus=tuple(gpus), driver_cuda=driver, error="; ".join(problems))
    finally:
        shutdown()


def read_node_gpus(lib_path: str = LIBRARY, timeout_s: float = TIMEOUT_S,
                   max_devices: int = MAX_DEVICES) -> NodeGpus:
    """The node's GPUs as NVML reports them; never raises."""
    result: list[NodeGpus] = []

    def run() -> None:
        try:
            result.append(_query(lib_path, max_devices))
        except Exception as exc:  # ctypes errors of a broken library, never the caller's
            result.append(NodeGpus(error=f"NVML query failed: {type(exc).__name__}: {exc}"))

    worker = threading.Thread(target=run, name="grace-nvml", daemon=True)
    try:
        worker.start()
    except RuntimeError as exc:  # no thread can be started (limits)
        return NodeGpus(error=f"cannot start the NVML query: {exc}")
    worker.join(timeout_s)
    if not result:
        return NodeGpus(error=f"NVML did not answer within {timeout_s:g} s")
    return result[0]
