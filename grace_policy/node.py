"""The node a step runs on: what its loader accepts and where its libraries live.

Detected from the running host by default; every field can be overridden so a
user on an x86_64 login node can ask about a Grace partition, and tests can
simulate a 64 KiB-page node on a 4 KiB machine.
"""

from __future__ import annotations

import os

from ._record import dataclass, replace
from .elf import ELFCLASS32, ELFCLASS64, ELFDATA2LSB, ELFDATA2MSB, MACHINE_NUMBERS, machine_name

#: uname machine strings that mean the same loader target.
_ARCH_ALIASES = {
    "amd64": "x86_64",
    "x86-64": "x86_64",
    "arm64": "aarch64",
    "i686": "i386",
    "i586": "i386",
    "i486": "i386",
    "ppc64le": "ppc64",
}

#: Per architecture: ELF class, byte order, the $LIB expansion, the multiarch
#: triplet of Debian-style systems, and the system directories glibc searches
#: last (its ``SYSTEM_DIRS``), in its order.
_ARCH_FACTS: dict[str, tuple[int, int, str, str, tuple[str, ...]]] = {
    "x86_64": (ELFCLASS64, ELFDATA2LSB, "lib64", "x86_64-linux-gnu", ("lib64", "usr/lib64")),
    "aarch64": (ELFCLASS64, ELFDATA2LSB, "lib64", "aarch64-linux-gnu", ("lib64", "usr/lib64")),
    "ppc64": (ELFCLASS64, ELFDATA2LSB, "lib64", "powerpc64le-linux-gnu", ("lib64", "usr/lib64")),
    "s390x": (ELFCLASS64, ELFDATA2MSB, "lib64", "s390x-linux-gnu", ("lib64", "usr/lib64")),
    "riscv64": (ELFCLASS64, ELFDATA2LSB, "lib64", "riscv64-linux-gnu", ("lib64", "usr/lib64")),
    "i386": (ELFCLASS32, ELFDATA2LSB, "lib", "i386-linux-gnu", ("lib", "usr/lib")),
    "arm": (ELFCLASS32, ELFDATA2LSB, "lib", "arm-linux-gnueabihf", ("lib", "usr/lib")),
}

#: The ld.so.cache entry flags glibc accepts on each architecture
#: (``_DL_CACHE_DEFAULT_ID`` in sysdeps/*/dl-cache.h).
CACHE_FLAGS = {
    "x86_64": 0x0303,
    "aarch64": 0x0A03,
    "i386": 0x0003,
    "ppc64": 0x0503,
    "s390x": 0x0403,
    "riscv64": 0x1103,
    "arm": 0x0903,
}

#: What $PLATFORM expands to (AT_PLATFORM) on each architecture.
_PLATFORMS = {"x86_64": "x86_64", "aarch64": "aarch64", "i386": "i686"}


TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs ms to import; annotations are strings anyway
    from typing import Protocol

    from .fsprobe import Files

    class ElfIdent(Protocol):
        """What a loader reads first of an ELF file: an
        :class:`~grace_policy.elf.ElfInfo`, or :class:`Ident` from a bare
        header."""

        @property
        def machine(self) -> int: ...
        @property
        def elf_class(self) -> int: ...
        @property
        def data(self) -> int: ...


@dataclass(frozen=True)
class Ident:
    """The three identity fields of an ELF header read without parsing the
    rest (a cache scan reads 20 bytes of each file)."""

    machine: int
    elf_class: int
    data: int


def normalize_arch(name: str) -> str:
    name = name.strip().lower()
    return _ARCH_ALIASES.get(name, name)


def valid_page_size(value: int) -> int:
    """The bounds the config and the command line share, so neither can
    describe a node the other would refuse. Raises ValueError."""
    if value < 4096 or value > 1 << 20 or value & (value - 1):
        raise ValueError(f"must be a power of two from 4096 to 1048576, got {value}")
    return value


def valid_arch(text: str) -> str:
    """The normalized name of an architecture we know. Raises ValueError."""
    name = normalize_arch(text)
    if name not in MACHINE_NUMBERS:
        known = ", ".join(sorted(MACHINE_NUMBERS))
        raise ValueError(f"unknown architecture {text!r} (known: {known})")
    return name


def parse_glibc(text: str | None) -> tuple[int, int] | None:
    """``"glibc 2.36"`` or ``"2.36"`` → ``(2, 36)``; anything else → None."""
    if not text:
        return None
    word = text.split()[-1]
    parts = word.split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return None


@dataclass(frozen=True)
class NodeProfile:
    machine: str
    page_size: int
    glibc: tuple[int, int] | None
    #: The node image the loader searches: "/" for this host, or a mounted image.
    root: str = "/"
    #: True when the files under ``root`` are of this machine (this host, or an
    #: image of the target); False when we judge a foreign node from here, where
    #: system libraries count as present by name.
    root_is_native: bool = True
    #: The compute capability of the node's GPUs as the admin (config
    #: ``gpu_arch``) or the user (``check --gpu-arch``) states it, e.g.
    #: (10, 0); None: ask NVML (:mod:`grace_policy.cuda.nodegpus`). A stated
    #: value wins over NVML's (docs/CUDA.md says why).
    gpu_arch: tuple[int, int] | None = None
    #: The CUDA version the node's driver supports (config ``cuda_driver``),
    #: e.g. (13, 0); None: ask NVML.
    cuda_driver: tuple[int, int] | None = None
    #: The files judged are an image's (:func:`grace_policy.image.step.image_node`):
    #: its system paths are the image's, built wherever the image was built.
    in_image: bool = False

    @property
    def machine_number(self) -> int:
        return MACHINE_NUMBERS.get(self.machine, -1)

    @property
    def elf_class(self) -> int:
        return _ARCH_FACTS.get(self.machine, (ELFCLASS64,))[0]

    @property
    def data(self) -> int:
        return _ARCH_FACTS.get(self.machine, (ELFCLASS64, ELFDATA2LSB))[1]

    @property
    def lib(self) -> str:
        return _ARCH_FACTS.get(self.machine, (0, 0, "lib64"))[2]

    @property
    def multiarch(self) -> str:
        facts = _ARCH_FACTS.get(self.machine)
        return facts[3] if facts else f"{self.machine}-linux-gnu"

    @property
    def platform(self) -> str:
        return _PLATFORMS.get(self.machine, self.machine)

    @property
    def cache_flags(self) -> int | None:
        return CACHE_FLAGS.get(self.machine)

    def runs(self, elf: ElfIdent) -> bool:
        """Whether this node's kernel and loader take ``elf`` as their own:
        the same machine, ELF class and byte order. The one test every reader
        asks (the kernel reads e_machine in the node's byte order, so a
        big-endian aarch64 file is as foreign to a Grace node as x86_64 is).
        The OS/ABI byte is not asked: the kernel ignores it and ld.so's own
        refusal of it is the loader model's (:mod:`grace_policy.loader`)."""
        return (elf.machine == self.machine_number and elf.elf_class == self.elf_class
                and elf.data == self.data)

    def arch_of(self, elf: ElfIdent) -> str:
        """``elf``'s machine as a user reads it, with its byte order when it
        is not the node's (``aarch64 (big-endian)``)."""
        name = machine_name(elf.machine)
        if elf.data == self.data:
            return name
        return name + (" (big-endian)" if elf.data == ELFDATA2MSB else " (little-endian)")

    def in_root(self, path: str) -> str:
        """Map an absolute node path into the image under ``root``."""
        if self.root in ("", "/"):
            return path
        return os.path.join(self.root, path.lstrip("/"))

    def describe(self) -> str:
        glibc = f"glibc {self.glibc[0]}.{self.glibc[1]}" if self.glibc else "glibc unknown"
        gpu = ""
        if self.gpu_arch is not None:
            gpu += f", GPU sm_{self.gpu_arch[0]}{self.gpu_arch[1]}"
        if self.cuda_driver is not None:
            gpu += f", CUDA driver {self.cuda_driver[0]}.{self.cuda_driver[1]}"
        return f"{self.machine}, {self.page_size // 1024} KiB pages, {glibc}{gpu}"

    def with_overrides(
        self,
        *,
        machine: str | None = None,
        page_size: int | None = None,
        glibc: tuple[int, int] | None = None,
        root: str | None = None,
        gpu_arch: tuple[int, int] | None = None,
        cuda_driver: tuple[int, int] | None = None,
    ) -> NodeProfile:
        new = self
        if gpu_arch is not None:
            new = replace(new, gpu_arch=gpu_arch)
        if cuda_driver is not None:
            new = replace(new, cuda_driver=cuda_driver)
        if machine is not None:
            new = replace(new, machine=normalize_arch(machine))
        if page_size is not None:
            new = replace(new, page_size=page_size)
        if glibc is not None:
            new = replace(new, glibc=glibc)
        if root is not None:
            new = replace(new, root=root)
        host = host_machine()
        native = new.root not in ("", "/") or new.machine == host
        return replace(new, root_is_native=native)


def parse_gpu_arch(text: str) -> tuple[int, int]:
    """``"sm_100"`` or ``"10.0"`` -> (10, 0), the compute capability of a GPU
    (``sm_90a`` names a build target, not a GPU). Raises ValueError. Kept
    here, not in :mod:`grace_policy.cuda`, so a step without GPUs never
    imports that package to read the config."""
    raw = text.strip().lower()
    if raw.startswith("sm_"):
        digits = raw[3:]
        if digits.isascii() and digits.isdigit() and 2 <= len(digits) <= 4:
            return divmod(int(digits), 10)
    else:
        major, dot, minor = raw.partition(".")
        if (dot and major.isascii() and major.isdigit() and minor.isascii()
                and minor.isdigit() and len(major) <= 3 and len(minor) == 1):
            return int(major), int(minor)
    raise ValueError(f'must name a GPU architecture such as "sm_100" or "10.0", got {text!r}')


def parse_cuda_version(text: str) -> tuple[int, int]:
    """``"13.0"`` -> (13, 0): the CUDA version a driver supports (what
    ``nvidia-smi`` prints as "CUDA Version"). Raises ValueError."""
    major, dot, minor = text.strip().partition(".")
    if (dot and major.isascii() and major.isdigit() and minor.isascii() and minor.isdigit()
            and 1 <= len(major) <= 3 and 1 <= len(minor) <= 2):
        return int(major), int(minor)
    raise ValueError(f'must be a CUDA version such as "13.0", got {text!r}')


def version_text(value: tuple[int, int] | None) -> str | None:
    return f"{value[0]}.{value[1]}" if value is not None else None


def host_machine() -> str:
    return normalize_arch(os.uname().machine)


def detect() -> NodeProfile:
    """The running host as a node profile."""
    try:
        libc = os.confstr("CS_GNU_LIBC_VERSION")
    except (ValueError, OSError):
        libc = None
    return NodeProfile(
        machine=host_machine(),
        page_size=os.sysconf("SC_PAGE_SIZE"),
        glibc=parse_glibc(libc),
    )


#: Where distributions install their programs and libraries; a node of another
#: architecture holds its own builds at the same paths.
SYSTEM_PREFIXES = ("/usr/bin/", "/usr/sbin/", "/bin/", "/sbin/", "/usr/lib/", "/usr/lib64/",
                   "/usr/libexec/", "/lib/", "/lib64/")


def is_system_path(path: str) -> bool:
    return path.startswith(SYSTEM_PREFIXES)


def node_owns(node: NodeProfile, path: str, files: Files | None = None) -> bool:
    """Whether the node has its own build at ``path``: a system path, or a
    link into one (a venv's ``bin/python`` made from the system python).
    Never inside an image (``node.in_image``): its system files are the
    image's, built wherever the image was built, and they are what the step
    runs. ``files``: the check's (None: this host, unrecorded)."""
    if node.in_image:
        return False
    if is_system_path(path):
        return True
    if files is None:
        from .fsprobe import HOST as files
    return is_system_path(files.realpath(path))
