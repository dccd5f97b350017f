"""An Apptainer/Singularity SIF image: its header's architecture and the
squashfs of its primary system partition, read without mounting.

Layout (apptainer/sif ``pkg/sif``, all little-endian): a 128-byte global
header (launch line, ``SIF_MAGIC`` at 32, version at 42, the primary
architecture at 45 as two ASCII digits, the UUID, times, descriptor counts
and offsets), then ``Dtotal`` descriptors of 585 bytes at ``Descroff``
(data type, used flag, ids, the object's offset and size, times, a name and
384 bytes of type-specific data: for a partition its file system type,
partition type and architecture). The system the image runs is the
partition with type ``PartPrimSys``; its data is a squashfs image.
"""

from __future__ import annotations

import os
import struct

from . import Image, ImageError
from .squashfs import Span, SquashView
from .view import identity, parse_env_lines

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ..budget import Budget

HEADER = struct.Struct("<32s10s3s3s16sqqqqqqqq")
DESCRIPTOR = struct.Struct("<iBIIIqqqqqqq128s384s")
assert HEADER.size == 128 and DESCRIPTOR.size == 585
PARTITION = struct.Struct("<ii3s")

DATA_ENVVAR, DATA_PARTITION = 0x4002, 0x4004
FS_SQUASH, FS_ENCRYPTED = 1, 5
PART_SYSTEM, PART_PRIMSYS = 1, 2
#: The header's architecture codes (``HdrArch*``), as uname names.
ARCHES = {"01": "i386", "02": "x86_64", "03": "arm", "04": "aarch64", "05": "ppc64",
          "06": "ppc64", "07": "mips", "08": "mipsel", "09": "mips64", "10": "mips64el",
          "11": "s390x"}
#: More descriptors than any real image has (the default is 48).
MAX_DESCRIPTORS = 4096
#: The PATH Apptainer gives a container that sets none itself.
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def _arch(code: bytes) -> str | None:
    text = code.rstrip(b"\0").decode("ascii", "replace")
    return ARCHES.get(text)


def open_sif(fd: int, path: str, st: os.stat_result, *, budget: Budget,
             max_inodes: int | None = None) -> Image:
    """The image of SIF file ``fd`` (taken over: closed on error, else by the
    view; ``st`` its fstat), read under ``budget``. Raises
    :class:`ImageError` or ``BudgetExceeded``."""
    try:
        return _open(fd, path, st, budget, max_inodes)
    except BaseException:
        os.close(fd)
        raise


def _read(fd: int, size: int, length: int, offset: int, what: str, budget: Budget) -> bytes:
    if offset < 0 or length < 0 or offset + length > size:
        raise ImageError(f"the SIF file is truncated or corrupt ({what} lies beyond its end)")
    budget.spend_bytes(length)
    try:
        data = os.pread(fd, length, offset)
    except OSError as exc:
        raise ImageError(f"cannot read the SIF file: {exc.strerror}") from None
    if len(data) != length:
        raise ImageError(f"the SIF file is truncated ({what} cannot be read in full)")
    return data


def _open(fd: int, path: str, st: os.stat_result, budget: Budget, max_inodes: int | None
          ) -> Image:
    size = st.st_size
    head = HEADER.unpack(_read(fd, size, HEADER.size, 0, "the header", budget))
    (_launch, magic, _version, arch_code, _uuid, _ctime, _mtime, _dfree, dtotal, descroff,
     _descrlen, _dataoff, _datalen) = head
    if magic != b"SIF_MAGIC\0":
        raise ImageError("not a SIF file (no SIF_MAGIC)")
    if not 0 < dtotal <= MAX_DESCRIPTORS:
        raise ImageError(f"the SIF header claims {dtotal} descriptors")
    table = _read(fd, size, dtotal * DESCRIPTOR.size, descroff, "the descriptor table",
                  budget)
    system = None
    env_objects: list[tuple[int, int]] = []
    for i in range(dtotal):
        (dtype, used, _id, _group, _link, offset, length, _padded, _c, _m, _uid, _gid, _name,
         extra) = DESCRIPTOR.unpack_from(table, i * DESCRIPTOR.size)
        if not used:
            continue
        if dtype == DATA_ENVVAR:
            env_objects.append((offset, length))
        if dtype != DATA_PARTITION:
            continue
        fstype, parttype, part_arch = PARTITION.unpack_from(extra)
        if parttype == PART_PRIMSYS or (parttype == PART_SYSTEM and system is None):
            system = (fstype, offset, length, part_arch)
    if system is None:
        raise ImageError("the SIF file has no system partition")
    fstype, offset, length, part_arch = system
    if fstype == FS_ENCRYPTED:
        raise ImageError("the SIF file's system partition is encrypted")
    if fstype != FS_SQUASH:
        raise ImageError(f"the SIF file's system partition is not squashfs (type {fstype})")
    if offset < 0 or length <= 0 or offset + length > size:
        raise ImageError("the SIF file is truncated (its system partition lies beyond its "
                         "end)")
    arch = _arch(arch_code) or _arch(part_arch)
    view = SquashView(fd, path, st, budget=budget, span=Span(offset, length),
                      max_inodes=max_inodes)
    return Image(path=path, kind="sif", view=view, arch=arch, env=_environment(view),
                 identity=identity(st))


def _environment(view: SquashView) -> tuple[tuple[str, str], ...]:
    """The variables the image's ``/.singularity.d/env/*.sh`` export with
    plain values (a value that expands anything is skipped), and
    Apptainer's default PATH when none is set."""
    from .view import MAX_ENV_BYTES, read_view_file

    out: dict[str, str] = {"PATH": DEFAULT_PATH}
    try:
        names = sorted(view.listdir("/.singularity.d/env"))
    except OSError:
        names = []
    for name in names[:64]:
        if not name.endswith(".sh"):
            continue
        data = read_view_file(view, f"/.singularity.d/env/{name}", MAX_ENV_BYTES)
        if not data:
            continue
        for key, value in parse_env_lines(data.decode("utf-8", "surrogateescape")):
            if "$" in value or "`" in value:
                continue
            out[key] = value
    return tuple(out.items())
