"""Which torch a step would import: a CUDA build or a CPU-only one.

A CPU-only torch on a GPU step does not fail: ``torch.cuda.is_available()``
is False and the job trains on the CPU, holding GPUs it never uses. PyPI's
aarch64 torch wheels were CPU-only up to 2.10, so this is the usual state of
a venv made with plain ``pip install torch`` on a Grace node.

What the installed files say, in the order they are trusted:

1. ``torch/version.py``, which ``torch.version.cuda`` reads: ``cuda = None``
   (torch 1.x), ``cuda: Optional[str] = None`` (2.x) in a CPU build, a
   version string (``'12.4'``) in a CUDA build. ``hip`` set and ``cuda`` None
   is a ROCm build: no CUDA either.
2. ``torch/lib/libtorch_cuda.so``, present only in CUDA builds.
3. The dist-info: a ``+cpu`` local version, or ``Requires-Dist`` on
   ``nvidia-*`` / ``cuda-toolkit`` packages that apply to the node. The
   markers (markers.py) matter: PyPI's aarch64 torch 2.10 lists ``nvidia-*-cu12`` for
   ``platform_machine == "x86_64"`` only and is a CPU build, 2.11 lists
   ``cuda-toolkit[...]`` and ``nvidia-*-cu13`` for all of Linux.
"""

from __future__ import annotations

from .. import fsprobe
from .._record import dataclass
from ..findings import Issue
from .dists import requirement_name
from .gpus import step_gpus
from .markers import evaluate, node_environment
from .nodepath import host_path, read_small, read_until

TYPE_CHECKING = False
if TYPE_CHECKING:

    from ..budget import Budget
    from ..context import StepContext
    from ..node import NodeProfile

#: version.py is a few hundred bytes; more is not a torch version file.
VERSION_PY_LIMIT = 16 * 1024
#: METADATA headers come first; the long description after them is not read.
METADATA_LIMIT = 64 * 1024

#: Requirement names that only a CUDA build of torch has.
_CUDA_REQUIREMENT_PREFIXES = ("nvidia-", "cuda-toolkit", "cuda-bindings")

_UNSET = object()


@dataclass(frozen=True)
class TorchBuild:
    path: str            # the torch package directory (node path)
    version: str         # torch/version.py __version__, or the dist-info's
    cuda: str | None     # CUDA version ("unknown" when only a library says so); None: CPU-only
    evidence: str        # which file told it


def _literal(text: str) -> object:
    """The value of a ``NAME = VALUE`` right-hand side that version.py uses:
    None or a quoted string; anything else is ``_UNSET``."""
    text = text.strip()
    if text.startswith("None") and (len(text) == 4 or text[4] in " \t#;"):
        return None
    if text[:1] in ("'", '"'):
        quote = text[0]
        end = text.find(quote, 1)
        if end > 0 and "\\" not in text[1:end]:
            return text[1:end]
    return _UNSET


def parse_version_py(data: bytes) -> dict[str, object]:
    """``{name: None | str}`` for the simple assignments of torch/version.py
    (``cuda = None``, ``cuda: Optional[str] = '12.4'``, ``__version__ = '...'``).
    Line-based on purpose: no ``ast`` on the launch path, and a file torch's
    build did not write simply yields fewer names."""
    out: dict[str, object] = {}
    text = data.decode("utf-8", "replace")
    for line in text.splitlines()[:200]:
        if not line or line[0] in " \t#":
            continue  # only module-level statements, as torch writes them
        name, sep, value = line.partition("=")
        if not sep or value.startswith("="):
            continue
        name = name.split(":", 1)[0].strip()
        if not name.isidentifier():
            continue
        parsed = _literal(value)
        if parsed is not _UNSET:
            out[name] = parsed
    return out


def _marker_applies(marker: str | None, node: NodeProfile) -> bool:
    """Whether a requirement's marker can hold on the node (markers.py, the
    evaluator dists.py uses). The interpreter's version is not known here, so
    markers on it stay undecided, which counts as applying."""
    if not marker or not marker.strip():
        return True
    env = node_environment(node, (3, 0))
    for name in ("python_version", "python_full_version", "implementation_version"):
        env.pop(name, None)
    return evaluate(marker, env) is not False


def parse_metadata(data: bytes) -> tuple[str, list[tuple[str, str | None]]]:
    """(Version, [(requirement name, marker)]) from a METADATA file's headers."""
    version = ""
    reqs: list[tuple[str, str | None]] = []
    text = data.decode("utf-8", "replace")
    for line in text.splitlines():
        if not line.strip():
            break  # end of the headers; the description follows
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key = key.strip().lower()
        value = value.strip()
        if key == "version" and not version:
            version = value
        elif key == "requires-dist":
            name, marker = requirement_name(value)
            if name:
                reqs.append((name, marker))
    return version, reqs


def torch_build(torch_dir: str, dist_meta_dir: str | None, budget: Budget, *,
                node: NodeProfile | None = None,
                files: fsprobe.Files = fsprobe.HOST) -> TorchBuild | None:
    """What build of torch ``torch_dir`` holds, or None when none of its files
    says (not a torch package). ``node`` (keyword, optional) maps node paths
    into an image root and tells the markers' ``platform_machine``; without
    it paths are read as given and the host's machine is assumed. ``files``:
    the check's."""
    if node is None:
        from ..node import detect

        node = detect()
    base = torch_dir.rstrip("/") or "/"
    version = ""
    data = read_small(host_path(base + "/version.py", node, "/", files), VERSION_PY_LIMIT,
                      budget, files)
    if data is not None:
        names = parse_version_py(data)
        raw_version = names.get("__version__")
        version = raw_version if isinstance(raw_version, str) else ""
        if "cuda" in names:
            cuda = names["cuda"]
            if isinstance(cuda, str) and cuda:
                return TorchBuild(torch_dir, version, cuda, f"torch/version.py: cuda = {cuda!r}")
            hip = names.get("hip")
            if isinstance(hip, str) and hip:
                return TorchBuild(torch_dir, version, None,
                                  f"torch/version.py: cuda = None, hip = {hip!r} (a ROCm build)")
            return TorchBuild(torch_dir, version, None, "torch/version.py: cuda = None")
    if files.isfile(host_path(base + "/lib/libtorch_cuda.so", node, "/", files)):
        return TorchBuild(torch_dir, version, "unknown", "torch/lib/libtorch_cuda.so")
    meta = None
    if dist_meta_dir:
        # Headers end at the first blank line; the README after it is not read.
        meta = read_until(host_path(dist_meta_dir.rstrip("/") + "/METADATA", node, "/", files),
                          METADATA_LIMIT, budget, b"\n\n", files=files)
    if meta is not None:
        meta_version, reqs = parse_metadata(meta)
        version = version or meta_version
        for name, marker in reqs:
            if name.startswith(_CUDA_REQUIREMENT_PREFIXES) and _marker_applies(marker, node):
                return TorchBuild(torch_dir, version, "unknown",
                                  f"{_meta_name(dist_meta_dir)}: Requires-Dist {name}")
        if meta_version:
            label = meta_version.partition("+")[2]
            why = (f"Version {meta_version}" if label else
                   "no nvidia-*/cuda-toolkit requirement for this machine")
            return TorchBuild(torch_dir, version, None, f"{_meta_name(dist_meta_dir)}: {why}")
    if data is not None or files.isdir(host_path(base + "/lib", node, "/", files)):
        # version.py without a cuda line, or a torch/lib without the CUDA library.
        return TorchBuild(torch_dir, version, None, "no torch/lib/libtorch_cuda.so")
    return None


def _meta_name(dist_meta_dir: str | None) -> str:
    return (dist_meta_dir or "").rstrip("/").rsplit("/", 1)[-1] + "/METADATA"


def public_version(version: str) -> str:
    """``2.13.0+cpu`` -> ``2.13.0``: what to pin on the CUDA index."""
    return version.partition("+")[0].strip()


def torch_issues(torch_dir: str, dist_meta_dir: str | None, ctx: StepContext) -> list[Issue]:
    """torch-cpu-only when the step (``ctx``: its environment, node, files
    and the partition's package index) has GPUs and this torch cannot use
    them. The GPU variables are looked at first: a step without GPUs costs
    no read."""
    env, files, cuda_index = ctx.env, ctx.files, ctx.cuda_index
    gpus = step_gpus(env, files)
    if gpus is None:
        return []
    build = torch_build(torch_dir, dist_meta_dir, ctx.budget, node=ctx.node, files=files)
    if build is None or build.cuda is not None:
        return []
    index = (cuda_index or "").strip()
    pin = public_version(build.version) or "VERSION"
    if index:
        note = ""
    else:
        index = "cuXYZ"
        note = (" (XYZ: the node's CUDA version without the dot, e.g. cu130 for CUDA 13.0;"
                " the cluster admins know which one)")
    from ..causes import path_causes

    return [Issue(
        "torch-cpu-only", torch_dir, "",
        causes=path_causes(torch_dir, env, (), files),
        facts=(("version", build.version or "(unknown version)"), ("pin", pin),
               ("gpus", gpus), ("cuda_index", index), ("index_note", note),
               ("detail", build.evidence)),
    )]
