"""A squashfs 4.0 image read without mounting (enroot's ``.sqsh``, the system
partition of an Apptainer SIF).

Only what a check asks is read: the superblock, the metadata blocks of the
inodes and directories on the paths it walks, and the data blocks of the
byte ranges it reads (an ELF header, a program header table, a page of
code), decompressed one block at a time. Compressions: gzip (zlib), xz and
legacy lzma (``lzma``), lzo (enroot's default: liblzo2 through
:mod:`.native`, else the pure-Python :mod:`.lzo`) and zstd (a zstd module,
else libzstd); xattrs and the export table are not read.

The file may be hostile: every offset is checked against the image's size,
every decompression is bounded by the block size, listings and inode bodies
by what their headers may claim, and any inconsistency is an ``OSError``
(EIO) naming what was wrong, so readers treat it as an unreadable file.

What a consistent but huge image could cost is bounded too, under the
step's :class:`~grace_policy.budget.Budget`, which the view is given when it
is opened (never attached later): every byte the reader reads on its own
account (superblock, tables, metadata) is charged to it, data blocks being
charged by the readers that ask for them, as on the host; every block,
compressed or stored, looks at its deadline and counts towards
:data:`MAX_INFLATE`; a listing stops after
:data:`MAX_DIR_ENTRIES` entries read (repeats included); a file's block list
is read a piece at a time where a read needs it, never held whole; the
caches are bounded in bytes. Past any of these the view raises
:class:`~grace_policy.budget.BudgetExceeded`, which the check reports as
``check-limit``.
Layout: ``squashfs-tools`` ``squashfs_fs.h`` and the kernel's
``Documentation/filesystems/squashfs.rst``.
"""

from __future__ import annotations

import errno
import os
import stat as _stat
import struct

from .._record import dataclass
from ..budget import Budget, BudgetExceeded
from . import ImageError
from .view import Stat, TreeView

MAGIC = 0x73717368
SUPERBLOCK = struct.Struct("<IIIIIHHHHHHQQQQQQQQ")
METADATA_SIZE = 8192
#: Largest data block squashfs allows (1 MiB).
MAX_BLOCK = 1 << 20
NO_FRAGMENT = 0xFFFFFFFF
#: Bytes one view may produce in all, metadata (compressed or stored) and
#: decompressed data blocks (a check reads far less).
MAX_INFLATE = 512 << 20
#: Entries one directory listing may read, repeated names included (the
#: largest directories of real images hold a few thousand).
MAX_DIR_ENTRIES = 1 << 17
#: Entries of all cached listings together; the oldest listing goes first.
MAX_CACHED_ENTRIES = 1 << 18
#: Parsed inodes kept per view (a few hundred bytes each).
MAX_CACHED = 16384
#: Bytes of metadata blocks kept per view (512 blocks of 8 KiB); the oldest
#: block goes first.
MAX_META_CACHE = 4 << 20
#: Decompressed data blocks kept per view, by count and by bytes: the
#: loader, the page rules and the page-code reader open the same libraries
#: in turn.
MAX_CACHED_BLOCKS = 64
MAX_BLOCK_CACHE = 16 << 20
#: Entries of the longest block list a file may have to be read (a 512 GiB
#: file at 128 KiB blocks); a longer one is a check-limit when opened.
MAX_FILE_BLOCKS = 1 << 22
#: Block-list entries between two remembered positions of a file's list.
_STRIDE = 2048

COMPRESSORS = {1: "gzip", 2: "lzma", 3: "lzo", 4: "xz", 5: "lz4", 6: "zstd"}

_DIR, _FILE, _LINK, _BLK, _CHR, _FIFO, _SOCK = 1, 2, 3, 4, 5, 6, 7
_KIND = {1: "d", 2: "f", 3: "l", 8: "d", 9: "f", 10: "l"}
_FMT = {1: _stat.S_IFDIR, 2: _stat.S_IFREG, 3: _stat.S_IFLNK, 4: _stat.S_IFBLK,
        5: _stat.S_IFCHR, 6: _stat.S_IFIFO, 7: _stat.S_IFSOCK}


def _corrupt(what: str) -> OSError:
    return OSError(errno.EIO, f"corrupt squashfs image: {what}")


def decompressor(comp: int):  # type: ignore[no-untyped-def]
    """``inflate(data, limit) -> bytes`` for compression id ``comp``; raises
    ImageError when this interpreter cannot read it."""
    name = COMPRESSORS.get(comp, f"id {comp}")
    if comp == 1:
        import zlib

        def inflate(data: bytes, limit: int) -> bytes:
            d = zlib.decompressobj()
            out = d.decompress(data, limit)
            if d.unconsumed_tail:
                raise _corrupt("a gzip block inflates past its size")
            return out
        return inflate
    if comp in (2, 4):
        import lzma

        fmt = lzma.FORMAT_ALONE if comp == 2 else lzma.FORMAT_XZ

        def inflate(data: bytes, limit: int) -> bytes:
            d = lzma.LZMADecompressor(format=fmt)
            out = d.decompress(data, limit)
            if not d.eof and d.needs_input is False:
                raise _corrupt(f"an {name} block inflates past its size")
            return out
        return inflate
    if comp == 3:
        return _lzo()
    if comp == 6:
        inflate = _zstd()
        if inflate is None:
            from . import native

            inflate = native.zstd()
        if inflate is not None:
            return inflate
    raise ImageError(f"the squashfs image is {name}-compressed, which this check cannot "
                     "read (gzip, xz, lzma, lzo and, with a zstd module or libzstd, zstd "
                     "are read)")


def _lzo():  # type: ignore[no-untyped-def]
    """An lzo ``inflate``: liblzo2's safe decoder, picked (and ctypes
    imported) at the first block, or the pure-Python one without it."""
    chosen = []

    def inflate(data: bytes, limit: int) -> bytes:
        if not chosen:
            from . import native

            impl = native.lzo()
            if impl is None:
                from .lzo import decompress as impl
            chosen.append(impl)
        return chosen[0](data, limit)  # type: ignore[no-any-return]
    return inflate


def _zstd():  # type: ignore[no-untyped-def]
    """A zstd ``inflate`` from Python 3.14's ``compression.zstd`` or the
    ``zstandard`` package when one is installed; None otherwise."""
    try:
        from compression import zstd  # type: ignore[import-not-found]

        def inflate(data: bytes, limit: int) -> bytes:
            out = zstd.ZstdDecompressor().decompress(data, max_length=limit)
            return out  # type: ignore[no-any-return]
        return inflate
    except ImportError:
        pass
    try:
        import zstandard  # type: ignore[import-not-found]
    except ImportError:
        return None

    def inflate_zstandard(data: bytes, limit: int) -> bytes:
        out = zstandard.ZstdDecompressor().decompress(data, max_output_size=limit)
        if len(out) > limit:
            raise _corrupt("a zstd block inflates past its size")
        return out  # type: ignore[no-any-return]
    return inflate_zstandard


class _Inode:
    __slots__ = (
        "count",
        "dir_block",
        "dir_off",
        "dir_size",
        "frag",
        "frag_off",
        "ino",
        "kind",
        "list_at",
        "mode",
        "mtime",
        "size",
        "start",
        "target",
        "type",
    )


@dataclass(frozen=True)
class Span:
    """Where in its file an image lies: from byte ``base``, ``length``
    bytes (None: to the end). A SIF holds its squashfs at an offset."""

    base: int = 0
    length: int | None = None


class SquashView(TreeView):
    """The files of one squashfs image, at byte ``base`` of an open file.

    ``fd`` stays open as long as the view (closed by :meth:`close`); ``st`` is
    its ``fstat`` (what was opened, not what the name says now). Every read
    is charged to ``budget`` from the superblock on."""

    def __init__(self, fd: int, name: str, st: os.stat_result, *, budget: Budget,
                 span: Span | None = None, max_inodes: int | None = None) -> None:
        base = span.base if span is not None else 0
        length = span.length if span is not None else None
        self.fd, self.name, self.base = fd, name, base
        self.host_st = st
        self.length = (st.st_size - base) if length is None else length
        #: An st_dev of this image's own (for (dev, ino) keys of readers).
        self.dev = (hash((st.st_dev, st.st_ino, st.st_mtime_ns, base)) & 0x3FFFFFFFFFFF) | (
            1 << 46)
        #: The step's budget, for the view's whole life (read-only).
        self.budget = budget
        self.inflated = 0
        self._meta: dict[int, tuple[bytes, int]] = {}
        self._meta_bytes = 0
        try:
            self._superblock(max_inodes)
        except OSError as exc:
            raise ImageError(f"the squashfs image cannot be read: {exc.strerror}") from None
        except struct.error as exc:
            raise ImageError(f"the squashfs image is corrupt ({exc})") from None

    def _superblock(self, max_inodes: int | None) -> None:
        head = self._raw(0, SUPERBLOCK.size, "the superblock")
        (magic, inodes, mtime, block_size, frags, comp, block_log, _flags, _ids, major, minor,
         root_ref, bytes_used, _id_table, _xattr, inode_table, dir_table, frag_table,
         _export) = SUPERBLOCK.unpack(head)
        if magic != MAGIC:
            raise ImageError("not a squashfs image (bad magic)")
        if (major, minor) != (4, 0):
            raise ImageError(f"squashfs version {major}.{minor} is not 4.0")
        if block_size > MAX_BLOCK or block_size < 4096 or block_size & (block_size - 1) or (
                1 << block_log) != block_size:
            raise ImageError("the squashfs superblock has an invalid block size")
        if bytes_used > self.length:
            raise ImageError(f"the squashfs image is truncated ({self.length} of {bytes_used} "
                             "bytes)")
        if max_inodes is not None and inodes > max_inodes:
            raise ImageError(f"the squashfs image has {inodes} inodes (more than "
                             f"{max_inodes})")
        for pos in (inode_table, dir_table):
            if pos >= bytes_used:
                raise ImageError("the squashfs superblock points past the image")
        self.inflate = decompressor(comp)
        self.compression = COMPRESSORS.get(comp, str(comp))
        self.block_size, self.mtime = block_size, mtime
        self.inode_table, self.dir_table = inode_table, dir_table
        self.frag_table, self.frag_count = frag_table, frags
        self.bytes_used = bytes_used
        self.root_ref = root_ref
        self._inodes: dict[int, _Inode] = {}
        self._dirs: dict[int, dict[str, tuple[int, int]]] = {}
        self._dir_entries = 0
        self._frags: dict[int, tuple[int, int]] = {}
        self._blocks: dict[tuple[int, int], bytes] = {}
        self._block_bytes = 0
        try:
            self.root = self._inode(root_ref)
        except OSError as exc:
            raise ImageError(f"the squashfs root directory cannot be read: {exc.strerror}"
                             ) from None
        if self.root.kind != "d":
            raise ImageError("the squashfs root is not a directory")

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    # -- bytes ----------------------------------------------------------------

    def _raw(self, pos: int, length: int, what: str, *, charge: bool = True) -> bytes:
        """``length`` bytes at ``pos``, charged to the budget unless
        ``charge`` is false: a data block is read for a reader that charged
        what it asked for (the ELF reader, the page-code reader...), as on
        the host; charging its whole compressed block again would spend a
        large image's allowance ten times over."""
        if pos < 0 or length < 0 or pos + length > self.length:
            raise _corrupt(f"{what} lies beyond the end of the image")
        if charge:
            self.budget.spend_bytes(length)
        else:
            self.budget.tick()
        data = os.pread(self.fd, length, self.base + pos)
        if len(data) != length:
            raise _corrupt(f"{what} could not be read in full (truncated image?)")
        return data

    def _inflate(self, data: bytes, limit: int, what: str) -> bytes:
        self.budget.tick()
        try:
            out = self.inflate(data, limit)
        except OSError:
            raise
        except Exception as exc:  # zlib.error, lzma.LZMAError, LzoError, ...
            raise _corrupt(f"{what} does not decompress ({exc})") from None
        self._produced(len(out))
        return out

    def _produced(self, size: int) -> None:
        """Count ``size`` bytes of metadata or data made available, stored or
        decompressed alike: a chain of stored blocks is no cheaper to walk."""
        self.inflated += size
        if self.inflated > MAX_INFLATE:
            raise BudgetExceeded(f"the check read more than {MAX_INFLATE} bytes of the "
                                 "image's contents")

    def _metablock(self, pos: int) -> tuple[bytes, int]:
        """(content, position of the next block) of the metadata block at ``pos``."""
        known = self._meta.get(pos)
        if known is not None:
            return known
        (header,) = struct.unpack("<H", self._raw(pos, 2, "a metadata header"))
        size = header & 0x7FFF
        if size == 0 or size > METADATA_SIZE:
            raise _corrupt(f"a metadata block claims {size} bytes")
        raw = self._raw(pos + 2, size, "a metadata block")
        if header & 0x8000:  # stored: ticks and counts like a decompressed one
            self.budget.tick()
            self._produced(len(raw))
            data = raw
        else:
            data = self._inflate(raw, METADATA_SIZE, "a metadata block")
        meta = self._meta
        while meta and self._meta_bytes + len(data) > MAX_META_CACHE:
            oldest = next(iter(meta))
            self._meta_bytes -= len(meta.pop(oldest)[0])
        meta[pos] = known = (data, pos + 2 + size)
        self._meta_bytes += len(data)
        return known

    def _meta_read(self, pos: int, offset: int, length: int, what: str
                   ) -> tuple[bytes, int, int]:
        """``length`` bytes of a metadata stream from (block ``pos``, ``offset``):
        (bytes, block and offset after them)."""
        parts: list[bytes] = []
        need = length
        while True:
            data, after = self._metablock(pos)
            if offset > len(data):
                raise _corrupt(f"{what}: offset {offset} past its block")
            take = data[offset:offset + need]
            parts.append(take)
            need -= len(take)
            offset += len(take)
            if need <= 0:
                break
            pos, offset = after, 0
            if pos >= self.bytes_used:
                raise _corrupt(f"{what} runs past the image's tables")
        if offset == len(data) and need <= 0:
            # Exactly at a block's end: the next read starts in the next block.
            pos, offset = after, 0
        return b"".join(parts), pos, offset

    # -- inodes -----------------------------------------------------------------

    def _inode(self, ref: int) -> _Inode:
        known = self._inodes.get(ref)
        if known is not None:
            return known
        block, offset = ref >> 16, ref & 0xFFFF
        if offset >= METADATA_SIZE or block > (1 << 32):
            raise _corrupt("an inode reference points nowhere")
        pos = self.inode_table + block
        head, pos, offset = self._meta_read(pos, offset, 16, "an inode")
        itype, perm, _uid, _gid, mtime, ino = struct.unpack("<HHHHII", head)
        node = _Inode()
        node.type = itype
        basic = itype if itype <= 7 else itype - 7
        if not 1 <= basic <= 7:
            raise _corrupt(f"inode type {itype}")
        node.kind = _KIND.get(itype, "o")
        node.mode = _FMT[basic] | (perm & 0o7777)
        node.ino, node.mtime, node.size = ino, mtime, 0
        node.target, node.count = "", 0
        if itype == 1:
            body, _, _ = self._meta_read(pos, offset, 16, "a directory inode")
            start, _nlink, size, boff, _parent = struct.unpack("<IIHHI", body)
            node.dir_block, node.dir_off, node.dir_size = start, boff, size
            node.size = size
        elif itype == 8:
            body, _, _ = self._meta_read(pos, offset, 24, "a directory inode")
            _nlink, size, start, _parent, _count, boff, _xattr = struct.unpack("<IIIIHHI", body)
            node.dir_block, node.dir_off, node.dir_size = start, boff, size
            node.size = size
        elif itype in (2, 9):
            if itype == 2:
                body, pos, offset = self._meta_read(pos, offset, 16, "a file inode")
                start, frag, foff, size = struct.unpack("<IIII", body)
            else:
                body, pos, offset = self._meta_read(pos, offset, 40, "a file inode")
                start, size, _sparse, _nlink, frag, foff, _xattr = struct.unpack(
                    "<QQQIIII", body)
            if size > (1 << 44):
                raise _corrupt("a file claims more than 16 TiB")
            count = size // self.block_size
            if frag == NO_FRAGMENT and size % self.block_size:
                count += 1
            if count * 4 > 64 << 20:
                raise _corrupt("a file's block list is too long")
            # Where the list starts: read a piece at a time by SquashFile.
            node.start, node.size, node.frag, node.frag_off = start, size, frag, foff
            node.count, node.list_at = count, (pos, offset)
        elif itype in (3, 10):
            body, pos, offset = self._meta_read(pos, offset, 8, "a symlink inode")
            _nlink, tsize = struct.unpack("<II", body)
            if tsize > 4096:
                raise _corrupt("a symlink target longer than 4096 bytes")
            target, _, _ = self._meta_read(pos, offset, tsize, "a symlink target")
            node.target = os.fsdecode(target)
            node.size = tsize
        if len(self._inodes) >= MAX_CACHED:
            self._inodes.clear()
        self._inodes[ref] = node
        return node

    def _entries(self, node: _Inode) -> dict[str, tuple[int, int]]:
        """name -> (inode reference, entry type) of directory ``node``."""
        left = node.dir_size - 3  # the size counts "." and ".."
        if left <= 0:
            # An empty directory has no listing: its position is where the
            # next directory's listing starts, so it must not be cached
            # under that position (it would hide that directory's entries).
            return {}
        key = (node.dir_block << 16) | node.dir_off
        known = self._dirs.get(key)
        if known is not None:
            return known
        out: dict[str, tuple[int, int]] = {}
        pos, offset = self.dir_table + node.dir_block, node.dir_off
        read = 0
        while left > 0:
            self.budget.tick()
            if left < 12:
                raise _corrupt("a directory listing ends inside a header")
            head, pos, offset = self._meta_read(pos, offset, 12, "a directory header")
            count, start, _base = struct.unpack("<III", head)
            left -= 12
            if count >= 256:
                raise _corrupt("a directory header claims more than 256 entries")
            for _ in range(count + 1):
                if left < 8:
                    raise _corrupt("a directory listing ends inside an entry")
                ent, pos, offset = self._meta_read(pos, offset, 8, "a directory entry")
                ioff, _delta, etype, nsize = struct.unpack("<HhHH", ent)
                nsize += 1
                if nsize > 256:
                    raise _corrupt("a name longer than 256 bytes")
                name, pos, offset = self._meta_read(pos, offset, nsize, "a name")
                left -= 8 + nsize
                text = os.fsdecode(name)
                if "/" in text or text in (".", "..") or "\0" in text:
                    raise _corrupt(f"a directory entry named {text!r}")
                out[text] = ((start << 16) | ioff, etype)
                read += 1
                if read > MAX_DIR_ENTRIES:
                    # Entries read, not names kept: one name repeated over
                    # a 4 GiB listing would otherwise run for minutes.
                    raise BudgetExceeded("a directory of the image has more than "
                                         f"{MAX_DIR_ENTRIES} entries")
        dirs = self._dirs
        while dirs and self._dir_entries + len(out) > MAX_CACHED_ENTRIES:
            self._dir_entries -= len(dirs.pop(next(iter(dirs))))
        dirs[key] = out
        self._dir_entries += len(out)
        return out

    # -- the walk's questions -------------------------------------------------

    def _root(self) -> object:
        return self.root

    def _child(self, node: object, name: str) -> object | None:
        hit = self._entries(node).get(name)  # type: ignore[arg-type]
        return None if hit is None else self._inode(hit[0])

    def _mode(self, node: object) -> str:
        return node.kind  # type: ignore[attr-defined, no-any-return]

    def _readlink(self, node: object) -> str:
        return node.target  # type: ignore[attr-defined, no-any-return]

    def _stat(self, node: object) -> Stat:
        n: _Inode = node  # type: ignore[assignment]
        return Stat(n.mode, n.ino, self.dev, n.size, n.mtime * 1_000_000_000)

    def _names(self, node: object) -> list[tuple[str, str]]:
        kinds = {1: "d", 2: "f", 3: "l"}
        return [(name, kinds.get(etype, "o"))
                for name, (_ref, etype) in self._entries(node).items()]  # type: ignore[arg-type]

    def _open(self, node: object, st: object) -> SquashFile:
        return SquashFile(self, node)  # type: ignore[arg-type]

    # -- data -----------------------------------------------------------------

    def _fragment(self, index: int) -> tuple[int, int]:
        known = self._frags.get(index)
        if known is not None:
            return known
        if index >= self.frag_count:
            raise _corrupt("a file names a fragment that does not exist")
        # The fragment table: u64 positions of metadata blocks of 512 entries.
        (where,) = struct.unpack("<Q", self._raw(self.frag_table + (index // 512) * 8, 8,
                                                 "the fragment index"))
        if where >= self.bytes_used:
            raise _corrupt("the fragment index points past the image")
        entry, _, _ = self._meta_read(where, (index % 512) * 16, 16, "a fragment entry")
        start, size, _unused = struct.unpack("<QII", entry)
        self._frags[index] = (start, size)
        return start, size

    def block(self, start: int, size_word: int, expect: int, what: str) -> bytes:
        """One data block: ``size_word`` as the block list stores it (bit 24:
        stored uncompressed; 0: a sparse block of zeros)."""
        size = size_word & 0xFFFFFF
        if size == 0:
            return bytes(expect)
        if size > self.block_size:
            raise _corrupt(f"{what} claims {size} bytes")
        key = (start, size_word)
        known = self._blocks.get(key)
        if known is not None:
            return known
        raw = self._raw(start, size, what, charge=False)
        if size_word & (1 << 24):
            self._produced(size)
            data = raw
        else:
            data = self._inflate(raw, self.block_size, what)
        blocks = self._blocks
        while blocks and (len(blocks) >= MAX_CACHED_BLOCKS
                          or self._block_bytes + len(data) > MAX_BLOCK_CACHE):
            self._block_bytes -= len(blocks.pop(next(iter(blocks))))
        blocks[key] = data
        self._block_bytes += len(data)
        return data

    def record(self) -> list[tuple[str, str, str]]:
        # The identity of the file actually read: the descriptor's fstat,
        # never a later stat of the name (renaming another file over it in
        # between would make a clean entry stand for that file). The C side
        # replays a stat of the name: it matches only while the name still
        # is this file, unchanged (its mtime/ctime would move).
        from ..fsprobe import CHANGED, signature

        try:
            return [("s", self.name, signature(os.fstat(self.fd)))]
        except (OSError, ValueError):  # closed: nothing a replay could vouch for
            return [("s", self.name, CHANGED)]


class SquashFile:
    """One regular file of the image: positional reads, decompressing only
    the blocks a read touches (the last one kept).

    The block list (4 bytes a block, up to 64 MiB for a hostile inode) is
    read where a read needs it: the data position of every :data:`_STRIDE`-th
    block is remembered as the list is walked, so memory stays a few
    entries per MiB of list and a read at the end walks it once."""

    def __init__(self, view: SquashView, node: _Inode) -> None:
        if node.count > MAX_FILE_BLOCKS:
            raise BudgetExceeded(f"a file of the image has a block list of {node.count} "
                                 f"entries (more than {MAX_FILE_BLOCKS} are not read)")
        self.view, self.node = view, node
        pos, offset = node.list_at if node.count else (0, 0)
        #: (data position, list block, list offset) of block k * _STRIDE.
        self.marks: list[tuple[int, int, int]] = [(node.start, pos, offset)]
        self.cached: tuple[int, bytes] | None = None

    def _where(self, index: int) -> tuple[int, int]:
        """(data position, size word) of block ``index`` of the list."""
        v = self.view
        mark = index // _STRIDE
        while len(self.marks) <= mark:  # walk the list to the next mark
            data_pos, pos, offset = self.marks[-1]
            raw, pos, offset = v._meta_read(pos, offset, _STRIDE * 4, "a block list")
            data_pos += sum(w & 0xFFFFFF for w in struct.unpack(f"<{_STRIDE}I", raw))
            self.marks.append((data_pos, pos, offset))
        data_pos, pos, offset = self.marks[mark]
        within = index - mark * _STRIDE
        raw, _, _ = v._meta_read(pos, offset, (within + 1) * 4, "a block list")
        words = struct.unpack(f"<{within + 1}I", raw)
        return data_pos + sum(w & 0xFFFFFF for w in words[:within]), words[within]

    def _block(self, index: int) -> bytes:
        if self.cached is not None and self.cached[0] == index:
            return self.cached[1]
        v, n = self.view, self.node
        bs = v.block_size
        expect = min(bs, n.size - index * bs)
        if index < n.count:
            start, word = self._where(index)
            data = v.block(start, word, expect, "a data block")
        else:  # the tail, in a fragment block shared with other files
            start, size_word = v._fragment(n.frag)
            whole = v.block(start, size_word, bs, "a fragment block")
            data = whole[n.frag_off:n.frag_off + expect]
        if len(data) < expect:
            raise _corrupt("a data block is shorter than the file says")
        data = data[:expect]
        self.cached = (index, data)
        return data

    def pread(self, length: int, offset: int) -> bytes:
        size = self.node.size
        if offset >= size or length <= 0:
            return b""
        end = min(size, offset + length)
        bs = self.view.block_size
        parts = []
        pos = offset
        while pos < end:
            index = pos // bs
            data = self._block(index)
            lo = pos - index * bs
            take = data[lo:lo + (end - pos)]
            if not take:
                raise _corrupt("a data block is empty")
            parts.append(take)
            pos += len(take)
        return b"".join(parts)

    def close(self) -> None:
        self.cached = None
