"""LZO1X decompression, bounded and safe on hostile input (enroot's default
squashfs compression, ``mksquashfs -comp lzo``).

Pure Python: the fallback where the system's liblzo2 is absent
(:mod:`.native` is used first; the fuzz tests hold the two to each other).
It follows the decoder of ``lzo1x_decompress_safe`` (the Linux kernel's
``lib/lzo/lzo1x_decompress_safe.c``, liblzo2's ``lzo1x_d.ch``): a stream
of literal runs and back-references, ended by the M4 marker ``0x11 0 0``.
Every read of the input and every write of the output is checked: a
reference before the start of the output, a run past the end of the input
or an output longer than ``limit`` raises :class:`LzoError`; nothing loops
without consuming input. Literal runs and non-overlapping matches are slice
copies, so a 128 KiB block costs a few ms, not a byte loop.
"""

from __future__ import annotations

#: glibc's M2_MAX_OFFSET (0x0800): the distance base of a short match after
#: a literal run of 4 or more bytes.
_M2_MAX_OFFSET = 0x0800


class LzoError(ValueError):
    """The input is not a valid LZO1X stream (or inflates past the limit)."""


def decompress(src: bytes, limit: int) -> bytes:
    """The bytes ``src`` decodes to, at most ``limit`` of them."""
    try:
        return _decode(src, limit)
    except IndexError:  # a read past the end of the input (Python checks it)
        raise LzoError("the input ends inside an instruction") from None


def _long(src: bytes, ip: int, base: int, limit: int) -> tuple[int, int]:
    """A run length continued in zero bytes (255 each) and a last non-zero
    byte: (length, position after it)."""
    extra = 0
    while src[ip] == 0:
        ip += 1
        extra += 255
        if extra > limit:
            raise LzoError("a length longer than the output may be")
    return base + extra + src[ip], ip + 1


def _decode(src: bytes, limit: int) -> bytes:
    # One loop with everything inlined: a call per instruction would double
    # the cost. Reads past the end raise IndexError (turned into LzoError);
    # slices cannot, so literal runs and match sources are checked by hand.
    n = len(src)
    if n < 3:
        raise LzoError("the input is too short")
    out = bytearray()
    ip = 0
    state = 0
    if src[0] > 17:
        t = src[0] - 17
        ip = 1
        if ip + t > n:
            raise LzoError("a literal run goes past the end of the input")
        out += src[ip:ip + t]
        ip += t
        state = t if t < 4 else 4
    while True:
        t = src[ip]
        ip += 1
        if t >= 64:  # the most common instruction: a short match
            nxt = t & 3
            distance = 1 + ((t >> 2) & 7) + (src[ip] << 3)
            ip += 1
            length = (t >> 5) + 1
        elif t < 16:
            if state == 0:
                if t == 0:
                    t, ip = _long(src, ip, 15, limit)
                t += 3
                if ip + t > n:
                    raise LzoError("a literal run goes past the end of the input")
                out += src[ip:ip + t]
                ip += t
                if len(out) > limit:
                    raise LzoError("the output would exceed its limit")
                state = 4
                continue
            nxt = t & 3
            if state != 4:
                # A 2-byte match right after a short literal run.
                distance = 1 + (t >> 2) + (src[ip] << 2)
                length = 2
            else:
                distance = 1 + _M2_MAX_OFFSET + (t >> 2) + (src[ip] << 2)
                length = 3
            ip += 1
        elif t >= 32:
            length = t & 31
            if length == 0:
                length, ip = _long(src, ip, 31, limit)
            word = src[ip] | (src[ip + 1] << 8)
            ip += 2
            nxt = word & 3
            distance = 1 + (word >> 2)
            length += 2
        else:  # 16..31: a far match, or the end marker
            length = t & 7
            if length == 0:
                length, ip = _long(src, ip, 7, limit)
            word = src[ip] | (src[ip + 1] << 8)
            ip += 2
            distance = ((t & 8) << 11) + (word >> 2)
            if distance == 0:
                if length != 1:
                    raise LzoError("a malformed end marker")
                if ip != n:
                    # Bytes after the end marker (liblzo's
                    # LZO_E_INPUT_NOT_CONSUMED): not one stream.
                    raise LzoError("bytes after the end of the stream")
                return bytes(out)
            nxt = word & 3
            distance += 0x4000
            length += 2
        olen = len(out)
        if olen + length + nxt > limit:
            raise LzoError("the output would exceed its limit")
        begin = olen - distance
        if begin < 0:
            raise LzoError("a match refers to before the start of the output")
        if distance >= length:
            out += out[begin:begin + length]
        else:  # overlapping: the last ``distance`` bytes repeat
            chunk = out[begin:]
            reps, rest = divmod(length, distance)
            out += chunk * reps + chunk[:rest]
        state = nxt
        if nxt:
            if ip + nxt > n:
                raise LzoError("a literal run goes past the end of the input")
            out += src[ip:ip + nxt]
            ip += nxt
