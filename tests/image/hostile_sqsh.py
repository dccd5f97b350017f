"""Hostile squashfs images made by hand, the way the ELF fuzz corpus is:
a struct-built superblock, inode table and directory table, each
consistent enough to pass the reader's checks and huge where it hurts.

Layout (squashfs-tools ``squashfs_fs.h``, the kernel's
``Documentation/filesystems/squashfs.rst``): a 96-byte superblock, then the
inode table and the directory table as chains of metadata blocks (a u16
header: the stored size, bit 15 set when stored uncompressed, then at most
8 KiB). Everything is gzip (zlib); nothing here is a fixture file.
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

SUPERBLOCK = struct.Struct("<IIIIIHHHHHHQQQQQQQQ")
INODE_HEAD = struct.Struct("<HHHHII")  # type, mode, uid, gid, mtime, inode number
DIR_BASIC = struct.Struct("<IIHHI")  # start, nlink, size (u16), offset, parent
DIR_EXT = struct.Struct("<IIIIHHI")  # nlink, size (u32), start, parent, icount, offset, xattr
FILE_EXT = struct.Struct("<QQQIIII")  # start, size, sparse, nlink, frag, frag offset, xattr
DIR_HEADER = struct.Struct("<III")  # entries - 1, inode block, inode number base
DIR_ENTRY = struct.Struct("<HhHH")  # inode offset, number delta, type, name size - 1
META = 8192
NO_FRAGMENT = 0xFFFFFFFF
NO_XATTR = 0xFFFFFFFF


class Stream:
    """A metadata stream of ``head`` then ``unit`` repeated up to ``total``
    bytes, never held whole (a hostile listing is hundreds of MiB)."""

    def __init__(self, head: bytes, unit: bytes = b"", total: int | None = None) -> None:
        self.head, self.unit = head, unit
        self.total = len(head) if total is None else total
        reps = -(-(META + len(unit)) // len(unit)) if unit else 0
        self.tile = unit * reps

    def chunk(self, at: int) -> bytes:
        end = min(at + META, self.total)
        out = self.head[at:end]
        if end > len(self.head):
            start = max(at, len(self.head)) - len(self.head)
            phase = start % len(self.unit)
            out += self.tile[phase:phase + end - max(at, len(self.head))]
        return out


def metadata(stream: Stream, *, stored: bool = False) -> bytes:
    """``stream`` as a chain of metadata blocks (compressed unless
    ``stored``). Repeated block contents are compressed once."""
    out = bytearray()
    seen: dict[bytes, bytes] = {}
    for at in range(0, stream.total, META):
        chunk = stream.chunk(at)
        if stored:
            out += struct.pack("<H", len(chunk) | 0x8000) + chunk
            continue
        packed = seen.get(chunk)
        if packed is None:
            packed = zlib.compress(chunk, 9)
            if len(seen) < 4096:
                seen[chunk] = packed
        assert len(packed) < META, "a block that does not compress"
        out += struct.pack("<H", len(packed)) + packed
    return bytes(out)


def image(path: Path, inodes: Stream, listing: Stream, *, root_ref: int = 0,
          block_log: int = 12, stored: bool = False) -> Path:
    """A squashfs 4.0 file of one inode stream and one directory stream."""
    inode_table = SUPERBLOCK.size
    inode_blocks = metadata(inodes)
    dir_table = inode_table + len(inode_blocks)
    dir_blocks = metadata(listing, stored=stored)
    used = dir_table + len(dir_blocks)
    head = SUPERBLOCK.pack(0x73717368, 2, 0, 1 << block_log, 0, 1, block_log, 0, 1, 4, 0,
                           root_ref, used, used, 0xFFFFFFFFFFFFFFFF, inode_table, dir_table,
                           0xFFFFFFFFFFFFFFFF, 0xFFFFFFFFFFFFFFFF)
    with path.open("wb") as f:
        f.write(head)
        f.write(inode_blocks)
        f.write(dir_blocks)
    return path


def root_dir_ext(listing_size: int) -> bytes:
    """An extended directory inode (u32 listing size) whose listing starts
    at the directory table's first byte."""
    return INODE_HEAD.pack(8, 0o755, 0, 0, 0, 1) + DIR_EXT.pack(
        2, listing_size + 3, 0, 1, 0, 0, NO_XATTR)


def repeated_name_dir(path: Path, *, name: bytes = b"a", groups: int,
                      stored: bool = False) -> Path:
    """The root directory: one name repeated ``groups * 256`` times (a
    regular file), a listing as long as wanted that keeps one distinct name."""
    target = INODE_HEAD.size + DIR_EXT.size  # the file's inode, after the root's
    entry = DIR_ENTRY.pack(target, 0, 2, len(name) - 1) + name
    group = DIR_HEADER.pack(255, 0, 2) + entry * 256
    listing = Stream(b"", group, len(group) * groups)
    root = root_dir_ext(listing.total)
    regular = INODE_HEAD.pack(2, 0o755, 0, 0, 0, 2) + struct.pack("<IIII", 0, NO_FRAGMENT,
                                                                    0, 0)
    return image(path, Stream(root + regular), listing, stored=stored)


def long_block_list(path: Path, count: int, *, name: bytes = b"big") -> Path:
    """``/big``: a regular file of ``count`` sparse 4 KiB blocks, so a block
    list of ``count`` zero words (64 MiB for 16.7 M entries) that compresses
    to almost nothing."""
    root_len = INODE_HEAD.size + DIR_BASIC.size
    listing = DIR_HEADER.pack(0, 0, 2) + DIR_ENTRY.pack(root_len, 0, 2, len(name) - 1) + name
    root = INODE_HEAD.pack(1, 0o755, 0, 0, 0, 1) + DIR_BASIC.pack(0, 2, len(listing) + 3, 0, 1)
    big = INODE_HEAD.pack(9, 0o755, 0, 0, 0, 2) + FILE_EXT.pack(
        0, count * 4096, 0, 1, NO_FRAGMENT, 0, NO_XATTR)
    head = root + big
    return image(path, Stream(head, bytes(4), len(head) + count * 4), Stream(listing))
