"""torchcodec without a usable FFmpeg on the node.

torchcodec's wheels carry one ``libtorchcodec_core<N>.so`` per FFmpeg major
N; ``_internally_replaced_utils.load_torchcodec_shared_libraries`` loads them
with ``torch.ops.load_library`` (dlopen) newest first, and the first variant
whose FFmpeg libraries all load wins. The libraries have no RPATH (seen in the
0.11.0 aarch64 wheel), so their ``libavutil.so.N`` & co. come from the step's
LD_LIBRARY_PATH, ld.so.cache or the system directories, and a copy of another
architecture is passed over. If no variant finds its FFmpeg, ``import
torchcodec`` raises "Could not load libtorchcodec".

Only the FFmpeg names of each variant are resolved: its other DT_NEEDED
(libtorch.so, libc10.so, CUDA's libraries) are already loaded by ``import
torch`` when torchcodec's loader runs, and whether torch itself loads is
judged elsewhere. What the FFmpeg libraries need in turn is followed, since
dlopen fails on those too.
"""

from __future__ import annotations

from .. import fsprobe
from .._record import replace
from ..elf import ElfError, read_elf
from ..findings import Issue
from ..loader import Loading, resolve
from .nodepath import host_path, listdir

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

    from ..budget import Budget
    from ..node import NodeProfile

#: Sonames of the FFmpeg libraries start with these.
FFMPEG_PREFIXES = ("libavutil.", "libavcodec.", "libavformat.", "libavdevice.",
                   "libavfilter.", "libswscale.", "libswresample.", "libpostproc.")

_CORE = "libtorchcodec_core"


def core_variants(names: list[str]) -> list[tuple[int, str]]:
    """``[(major, file name)]`` of the ``libtorchcodec_core<N>.so`` in a listing,
    newest major first (the order torchcodec tries them)."""
    out = []
    for name in names:
        if name.startswith(_CORE) and name.endswith(".so"):
            digits = name[len(_CORE):-3]
            if digits.isascii() and digits.isdigit() and len(digits) <= 3:
                out.append((int(digits), name))
    out.sort(reverse=True)
    return out


def torchcodec_issues(pkg_dir: str, env: Mapping[str, str], cwd: str, node: NodeProfile,
                      budget: Budget, files: fsprobe.Files = fsprobe.HOST) -> list[Issue]:
    """torchcodec-no-ffmpeg when none of the package's core variants finds all
    of its FFmpeg libraries on the node; [] when one does, or when there is
    nothing to judge (no variants, or only variants of another machine: those
    fail for a reason other rules report)."""
    base = pkg_dir.rstrip("/") or "/"
    try:
        names = listdir(host_path(base, node, cwd, files), files)
    except (OSError, ValueError):
        return []
    variants = core_variants(names)
    majors: list[str] = []
    missing: list[str] = []
    foreign: list[str] = []
    for major, name in variants:
        budget.tick()
        path = f"{base}/{name}"
        try:
            info = read_elf(host_path(path, node, cwd, files), budget=budget, files=files)
        except (OSError, ElfError):
            continue  # unreadable or not ELF: not this rule's finding
        budget.take_file()
        if not node.runs(info):
            continue
        ffmpeg = tuple(n for n in info.needed if n.startswith(FFMPEG_PREFIXES))
        if not ffmpeg:
            return []  # FFmpeg linked in statically: this variant loads
        tree = resolve(path, replace(info, needed=ffmpeg), node, env,
                       Loading(cwd=cwd, budget=budget, exec_origin=False, files=files))
        if not tree.missing and not tree.fatal:
            return []
        majors.append(str(major))
        # The first failure in the variant's own DT_NEEDED order is what
        # dlopen reports; else one of the FFmpeg libraries' dependencies.
        failed = [m.name for m in tree.missing] + [f.name for f in tree.fatal]
        first = next((n for n in ffmpeg if n in failed), failed[0])
        missing.append(f"{first} (FFmpeg {major})")
        for miss in tree.missing:
            for cand in miss.foreign:
                shown_cand = f"{cand.path} ({cand.machine})"
                if shown_cand not in foreign:
                    foreign.append(shown_cand)
        for fatal in tree.fatal:
            shown_fatal = f"{fatal.path} ({fatal.reason})"
            if shown_fatal not in foreign:
                foreign.append(shown_fatal)
    if not majors:
        return []
    from ..causes import path_causes

    first_name = missing[0].split(" ", 1)[0]
    shown = ", ".join(foreign[:4]) + (f" and {len(foreign) - 4} more" if len(foreign) > 4 else "")
    return [Issue(
        "torchcodec-no-ffmpeg", pkg_dir, "",
        causes=path_causes(pkg_dir, env, (), files),
        facts=(("majors", ", ".join(majors)), ("missing", ", ".join(missing)),
               ("name", first_name), ("candidates", shown)),
    )]
