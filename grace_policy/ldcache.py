"""Read ``/etc/ld.so.cache`` the way glibc's ``_dl_load_cache_lookup`` does.

We parse the file ourselves (no ``ldconfig -p`` subprocess on the launch
path) and keep only the entries the node's loader would accept: the flags of
its architecture, and glibc-hwcaps subdirectories it supports.
"""

from __future__ import annotations

import struct

from . import fsprobe
from ._record import dataclass

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: keep the import off the launch path
    from collections.abc import Callable

OLD_MAGIC = b"ld.so-1.7.0"
NEW_MAGIC = b"glibc-ld.so.cache1.1"
EXTENSION_MAGIC = 0xEAA42174
EXT_TAG_HWCAPS = 1
HWCAP_EXTENSION_BIT = 1 << 62
MAX_CACHE_BYTES = 64 * 1024 * 1024
#: Where architectures put platform bits in the legacy hwcap word (x86:
#: ``_DL_FIRST_PLATFORM`` 48, i586/i686/haswell/xeon_phi); bits 32-62 as a
#: whole so other layouts are covered too.
_PLATFORM_BITS = ((1 << 31) - 1) << 32


#: Legacy hwcap word bits shared by all architectures (``_DL_HWCAP_TLS_MASK``).
LEGACY_TLS_BIT = 1 << 63


@dataclass(frozen=True)
class CacheEntry:
    flags: int
    name: str
    path: str
    hwcap_subdir: str | None
    #: The legacy hwcap word (ldconfig < 2.37 files libraries found in
    #: ``tls/``, ``x86_64/``, ``haswell/`` ... under it); 0 for plain entries.
    legacy_hwcap: int = 0


#: One raw entry: (flags, key offset, value offset, hwcap word).
_Raw = tuple


class LdCache:
    """Entries by library name, in the file's order (glibc's tie-break).

    A clean step looks up two or three names in a cache of thousands: the
    names are indexed as raw bytes, and an entry is decoded only when its
    name is asked for (decoding them all was most of a clean check).
    """

    def __init__(self, entries: list[CacheEntry] | None = None, *,
                 raw: dict[bytes, list[_Raw]] | None = None,
                 make: Callable[[_Raw], CacheEntry | None] | None = None) -> None:
        self._decoded: dict[str, list[CacheEntry]] = {}
        for entry in entries or ():
            self._decoded.setdefault(entry.name, []).append(entry)
        self._raw = raw or {}
        self._make = make

    def entries(self, name: str) -> list[CacheEntry]:
        got = self._decoded.get(name)
        if got is None:
            raws = self._raw.get(name.encode("utf-8", "surrogateescape"), ())
            made = [self._make(r) for r in raws] if self._make is not None else []
            got = self._decoded[name] = [e for e in made if e is not None]
        return got

    @property
    def by_name(self) -> dict[str, list[CacheEntry]]:
        """Every entry, decoded (for tests and ``inspect``; not the hot path)."""
        for key in self._raw:
            self.entries(key.decode("utf-8", "surrogateescape"))
        return {k: v for k, v in self._decoded.items() if v}

    def lookup(
        self,
        name: str,
        flags: int | None,
        hwcaps: tuple[str, ...] = (),
        legacy: tuple[int, int] | None = None,
    ) -> str | None:
        """The path glibc's ``search_cache`` (2.33-2.36) would take for ``name``.

        ``flags`` None accepts any architecture (judging a foreign node from
        here by name only). Entries in a supported glibc-hwcaps subdirectory
        win by priority (earlier in ``hwcaps`` is better); otherwise the first
        other entry that fits, in file order. ``legacy`` is ``(allowed bits,
        platform bit)`` for a glibc that still honours legacy hwcap entries
        (< 2.37): an entry is taken when its bits are all allowed and its
        platform bit, if any, is the node's (glibc's ``hwcap_exclude`` test;
        seen here: ``tls/libx.so`` wins over ``libx.so``). With None, such
        entries are passed over.
        """
        best: str | None = None
        best_prio = len(hwcaps)
        for entry in self.entries(name):
            if flags is not None and entry.flags != flags:
                continue
            if entry.hwcap_subdir is not None:
                if entry.hwcap_subdir in hwcaps:
                    prio = hwcaps.index(entry.hwcap_subdir)
                    if best is None or prio < best_prio:
                        best, best_prio = entry.path, prio
                continue
            if best is not None:
                # glibc-hwcaps entries come first; a match among them wins.
                break
            if entry.legacy_hwcap:
                if legacy is None:
                    continue
                allowed, platform = legacy
                if entry.legacy_hwcap & ~allowed:
                    continue
                plat = entry.legacy_hwcap & allowed & ~LEGACY_TLS_BIT & _PLATFORM_BITS
                if plat and plat != platform:
                    continue
            return entry.path
        return best

    def __len__(self) -> int:
        return sum(len(v) for v in self.by_name.values())


def parse(data: bytes) -> LdCache:
    """Parse a cache image; malformed input yields an empty or partial cache
    (glibc then falls back to the system directories, and so do we)."""
    start = 0
    if data.startswith(OLD_MAGIC):
        if len(data) < 16:
            return LdCache([])
        (nlibs,) = struct.unpack_from("<I", data, 12)
        start = 16 + nlibs * 12
        start = (start + 7) & ~7 if data[start:start + len(NEW_MAGIC)] != NEW_MAGIC else start
        if data[start:start + len(NEW_MAGIC)] != NEW_MAGIC:
            # Old-format-only caches are gone since glibc 2.32.
            return LdCache([])
    if data[start:start + len(NEW_MAGIC)] != NEW_MAGIC or len(data) < start + 48:
        return LdCache([])
    nlibs, _len_strings, _flags, ext_off = struct.unpack_from("<IIB3xI", data, start + 20)
    entries_off = start + 48
    if nlibs > (len(data) - entries_off) // 24:
        return LdCache([])

    def string_at(off: int) -> str | None:
        pos = start + off
        if not 0 <= pos < len(data):
            return None
        end = data.find(b"\0", pos, pos + 4096)
        if end < 0:
            return None
        return data[pos:end].decode("utf-8", "surrogateescape")

    hwcap_names: list[str] = []
    if ext_off and start + ext_off + 8 <= len(data):
        magic, count = struct.unpack_from("<II", data, start + ext_off)
        if magic == EXTENSION_MAGIC and count < 64:
            for i in range(count):
                pos = start + ext_off + 8 + i * 16
                if pos + 16 > len(data):
                    break
                tag, _sflags, off, size = struct.unpack_from("<IIII", data, pos)
                if tag == EXT_TAG_HWCAPS and start + off + size <= len(data):
                    for (soff,) in struct.iter_unpack("<I", data[start + off:start + off + size]):
                        hwcap_names.append(string_at(soff) or "")

    raw: dict[bytes, list[_Raw]] = {}
    find = data.find
    for flags, key, value, _osv, hwcap in struct.iter_unpack(
        "<iIIIQ", data[entries_off:entries_off + nlibs * 24]
    ):
        pos = start + key
        end = find(b"\0", pos, pos + 4096) if 0 <= pos < len(data) else -1
        if end >= 0:
            raw.setdefault(data[pos:end], []).append((flags, key, value, hwcap))

    def make(entry: _Raw) -> CacheEntry | None:
        flags, key, value, hwcap = entry
        name, path = string_at(key), string_at(value)
        if name is None or path is None:
            return None
        subdir: str | None = None
        if hwcap & HWCAP_EXTENSION_BIT:
            index = hwcap & 0xFFFFFFFF
            if index >= len(hwcap_names):
                return None
            subdir = hwcap_names[index]
        return CacheEntry(flags & 0xFFFF, name, path, subdir, 0 if subdir is not None else hwcap)

    return LdCache(raw=raw, make=make)


def load(path: str, files: fsprobe.Files = fsprobe.HOST) -> LdCache:
    try:
        # Recorded by its identity: the verdict depends on this file.
        data = files.read_file(path, MAX_CACHE_BYTES)
    except OSError:
        return LdCache([])
    return parse(data)
