"""A step inside an image: the node as seen from the container, the image's
own architecture, and issues that name the image.

Used by :func:`grace_policy.check.check_step` (``image=``) with the
image's files (``files.inside(image.view)``): every path here is a path in
the image.
"""

from __future__ import annotations

from collections.abc import Sequence

from .._record import replace
from ..findings import Issue
from ..fsprobe import HOST, Files
from . import Image

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ..budget import Budget
    from ..node import NodeProfile

#: Where the image's own architecture shows when it does not declare one:
#: the shell every container runtime starts first (enroot's switchroot runs
#: /bin/sh, Apptainer its /.singularity.d scripts through it).
ARCH_WITNESSES = ("/bin/sh", "/usr/bin/sh", "/bin/busybox")

#: What each runtime prints when the image's programs are foreign.
_RUNTIME_ERROR = {
    "squashfs": "enroot-switchroot: failed to execute: /bin/sh: Exec format error",
    "dir": "enroot-switchroot: failed to execute: /bin/sh: Exec format error",
    # runc (1.1 on): the program as it looked it up in the container's PATH
    # ("exec %s: %w", libcontainer/standard_init_linux.go); see _runtime_error.
    "oci": "exec {program}: exec format error",
    "sif": "apptainer: FATAL: exec failed: exec format error",
}


#: Container platform names (OCI ``os/architecture``) of the node machines.
PLATFORMS = {"aarch64": "linux/arm64", "x86_64": "linux/amd64", "ppc64": "linux/ppc64le",
             "s390x": "linux/s390x", "riscv64": "linux/riscv64", "i386": "linux/386",
             "arm": "linux/arm"}


#: The most of ld.so read for its version string (glibc's is ~200-250 KiB).
MAX_LDSO_BYTES = 1 << 20
_VERSION_MARK = b"stable release version "


def image_node(node: NodeProfile, budget: Budget | None = None, files: Files = HOST) -> NodeProfile:
    """The node for files in an image: the node's CPU and page size, the
    image's own glibc (the loader that runs is the image's: ``ld.so``
    announces its version, "... release version 2.36."; unknown when it does
    not, which the page rules treat as the older, stricter loader); the
    files are all the image's own (no host root, no by-name system files:
    ``root_is_native``), and the loader reads the image's ld.so.cache.
    ``files``: the image's."""
    return replace(node, root="/", root_is_native=True, glibc=image_glibc(node, budget, files),
                   in_image=True)


def image_glibc(node: NodeProfile, budget: Budget | None = None,
                files: Files = HOST) -> tuple[int, int] | None:
    from ..elf import ElfError, open_regular
    from ..loader import CANONICAL_INTERP

    for interp in CANONICAL_INTERP.get(node.machine, ()):
        try:
            fh, st = open_regular(interp, files)
        except (OSError, ElfError):
            continue
        try:
            size = min(st.st_size, MAX_LDSO_BYTES)
            if budget is not None:
                budget.spend_bytes(size)
            data = fh.pread(size, 0)
        except OSError:
            continue
        finally:
            fh.close()
        at = data.rfind(_VERSION_MARK)
        if at < 0:
            return None
        words = data[at + len(_VERSION_MARK):at + len(_VERSION_MARK) + 16].split(b".")
        try:
            return int(words[0]), int(bytes(c for c in words[1] if 48 <= c <= 57))
        except (IndexError, ValueError):
            return None
    return None


def image_arch(image: Image, argv: Sequence[str], env: dict[str, str] | None = None,
               budget: Budget | None = None, files: Files = HOST) -> tuple[str, str] | None:
    """(architecture, where it shows) of the image: its declaration, else
    the ELF machine of its shell; None when neither says. ``files``: the
    image's."""
    if image.arch:
        return image.arch, "the image's header" if image.kind == "sif" else "the image's config"
    from ..elf import ElfError, read_elf
    from ..launch import build_path, c_string

    witnesses = list(ARCH_WITNESSES)
    if argv:
        # An image without a shell (distroless): the step's own program.
        name = c_string(argv[0])
        if image.kind == "oci":
            from .runc import look_path

            program = (look_path(name, env or {}, image.cwd or "/", budget, files)[0]
                       if name else None)
        else:
            program = build_path(name, env or {}, "/", budget, files)
        if program is not None:
            witnesses.append(program)
    for path in witnesses:
        try:
            info = read_elf(path, budget=budget, files=files)
        except (ElfError, OSError):
            continue
        from ..node import normalize_arch

        return normalize_arch(info.machine_name), path
    return None


def arch_issue(image: Image, argv: Sequence[str], env: dict[str, str], node: NodeProfile,
               budget: Budget, files: Files) -> Issue | None:
    """``image-arch-mismatch`` when the image is for another machine
    (``files``: the image's)."""
    found = image_arch(image, argv, env, budget, files)
    if found is None:
        return None
    arch, where = found
    if arch == node.machine or (arch == "i386" and node.machine == "x86_64"):
        return None
    return Issue(
        "image-arch-mismatch", image.path,
        _runtime_error(image, argv, env, budget, files),
        causes=("image",),
        facts=(("image", image.path), ("image_arch", arch), ("file_arch", arch),
               ("node_platform", PLATFORMS.get(node.machine, f"linux/{node.machine}")),
               ("inner", where), ("detail", f"{where} is {arch}")),
    )


def _runtime_error(image: Image, argv: Sequence[str], env: dict[str, str],
                   budget: Budget, files: Files) -> str:
    """What the runtime prints; runc names the program it failed to exec,
    found as it finds it (the container's PATH), else as given."""
    text = _RUNTIME_ERROR.get(image.kind, "Exec format error")
    if "{program}" not in text:
        return text
    from ..launch import c_string

    given = c_string(argv[0]) if argv else ""
    if not given:
        return text.replace("{program}", "/bin/sh")
    from .runc import look_path

    found, error = look_path(given, env, image.cwd or "/", budget, files)
    # runc's lookup fails before any exec when it finds nothing.
    return error if found is None and error else text.replace("{program}", found or given)


def image_issues(issues: Sequence[Issue], image: Image) -> tuple[Issue, ...]:
    """Every issue names the image and the path inside it
    (``IMAGE:/inner/path``); its first cause is ``image``, whose remedies
    say to fix the image."""
    out = []
    for issue in issues:
        if issue.rule == "image-arch-mismatch":
            out.append(issue)
            continue
        inner = issue.path
        path = f"{image.path}:{inner}" if inner else image.path
        causes = issue.causes if "image" in issue.causes else ("image", *issue.causes)
        facts = (*issue.facts, ("image", image.path), ("inner", inner or "the image"))
        out.append(Issue(issue.rule, path, issue.predicted_error, causes, facts))
    return tuple(out)
