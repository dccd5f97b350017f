"""The system's LZO and zstd decoders (liblzo2, libzstd) through ctypes.

Why: enroot's squashfs images are lzo-compressed by default, and the
pure-Python decoder (:mod:`.lzo`) costs ~6.5 ms per 128 KiB block, most of
a cold container step's check. squashfs-tools, which enroot needs on every
pyxis node, depends on liblzo2 and libzstd, so the native decoders are there
wherever such images are read.

Loaded lazily: ``ctypes`` (~5 ms to import) and the library are touched only
when the first block of that compression is inflated, never on a host step.
Only the bounded APIs are called (``lzo1x_decompress_safe``,
``ZSTD_decompress`` with the output capacity), into a buffer of exactly
``limit`` bytes; any error code is a :class:`ValueError` the reader turns
into "corrupt image". The libraries are opened by absolute path from the
system's library directories, root-owned and not writable by others, never
through a search path the job's environment could steer.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

Inflate = Callable[[bytes, int], bytes]

#: Where a distribution keeps its shared libraries (Debian multiarch first).
_MULTIARCH = getattr(sys.implementation, "_multiarch", "")
_DIRS = tuple(d for d in (f"/usr/lib/{_MULTIARCH}" if _MULTIARCH else "",
                          f"/lib/{_MULTIARCH}" if _MULTIARCH else "",
                          "/usr/lib64", "/lib64", "/usr/lib") if d)

#: liblzo2's error codes (lzoconf.h), for the message.
_LZO_ERRORS = {-1: "error", -4: "input overrun", -5: "output overrun",
               -6: "lookbehind overrun", -7: "end of stream not found",
               -8: "input not consumed"}

_loaded: dict[str, Inflate | None] = {}


class NativeError(ValueError):
    """A native decoder refused the input (corrupt, or longer than the limit)."""


def _library(soname: str) -> str | None:
    """The absolute path of ``soname`` in a system library directory, if it
    is a root-owned file nobody else may write."""
    for where in _DIRS:
        path = os.path.join(where, soname)
        try:
            st = os.stat(path)
        except OSError:
            continue
        if st.st_uid == 0 and not st.st_mode & 0o022 and os.path.isfile(path):
            return path
    return None


def lzo() -> Inflate | None:
    """``inflate(data, limit)`` from liblzo2, or None when it is absent."""
    if "lzo" not in _loaded:
        _loaded["lzo"] = _load_lzo()
    return _loaded["lzo"]


def zstd() -> Inflate | None:
    """``inflate(data, limit)`` from libzstd, or None when it is absent."""
    if "zstd" not in _loaded:
        _loaded["zstd"] = _load_zstd()
    return _loaded["zstd"]


def _load_lzo() -> Inflate | None:
    if os.environ.get("GRACE_POLICY_NO_NATIVE"):  # tests: the fallback path
        return None
    path = _library("liblzo2.so.2")
    if path is None:
        return None
    try:
        import ctypes

        lib = ctypes.CDLL(path)
        fn = lib.lzo1x_decompress_safe
    except (OSError, AttributeError, ImportError):
        return None
    # int lzo1x_decompress_safe(const lzo_bytep src, lzo_uint src_len,
    #                           lzo_bytep dst, lzo_uintp dst_len, lzo_voidp wrkmem)
    fn.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_void_p,
                   ctypes.POINTER(ctypes.c_size_t), ctypes.c_void_p]
    fn.restype = ctypes.c_int
    string_at, buffer = ctypes.string_at, ctypes.create_string_buffer

    def inflate(data: bytes, limit: int) -> bytes:
        if limit <= 0 or len(data) < 3:
            raise NativeError("the input is too short")
        buf = buffer(limit)  # a fresh one: no state shared between calls
        size = ctypes.c_size_t(limit)
        code = fn(data, len(data), buf, ctypes.byref(size), None)
        if code != 0:
            raise NativeError(f"liblzo2: {_LZO_ERRORS.get(code, f'code {code}')}")
        if size.value > limit:  # cannot happen with the safe decoder
            raise NativeError("the output exceeds its limit")
        return string_at(buf, size.value)
    return inflate


def _load_zstd() -> Inflate | None:
    if os.environ.get("GRACE_POLICY_NO_NATIVE"):
        return None
    path = _library("libzstd.so.1")
    if path is None:
        return None
    try:
        import ctypes

        lib = ctypes.CDLL(path)
        fn, is_error, name = lib.ZSTD_decompress, lib.ZSTD_isError, lib.ZSTD_getErrorName
    except (OSError, AttributeError, ImportError):
        return None
    # size_t ZSTD_decompress(void *dst, size_t cap, const void *src, size_t len)
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t]
    fn.restype = ctypes.c_size_t
    is_error.argtypes = [ctypes.c_size_t]
    is_error.restype = ctypes.c_uint
    name.argtypes = [ctypes.c_size_t]
    name.restype = ctypes.c_char_p
    string_at, buffer = ctypes.string_at, ctypes.create_string_buffer

    def inflate(data: bytes, limit: int) -> bytes:
        if limit <= 0 or not data:
            raise NativeError("no input or no room for output")
        buf = buffer(limit)
        got = fn(buf, limit, data, len(data))
        if is_error(got):
            raise NativeError(f"libzstd: {name(got).decode('ascii', 'replace')}")
        if got > limit:
            raise NativeError("the output exceeds its limit")
        return string_at(buf, got)
    return inflate
