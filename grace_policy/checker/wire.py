"""The node checker's side of the wire: the step frame, the credentials
frame and the result records, laid out as grace_policy/contract.py says
(spank/grace_wire.c is the C side of the same table).

Why by the table and not by position: the C encoder and both Python readers
walk :data:`contract.FRAME` by name, so a field added there is carried,
read and handed to ``slurm_bridge.StepInput`` without any reader being
edited, and a reader can no longer be one field off the writer.
"""

from __future__ import annotations

import os
import socket
import struct

from .. import contract, slurm_bridge

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

_RECORD = struct.Struct("=BI")  # kind, length (host order)
_U32 = struct.Struct("=I")
#: grace_wire.h GRACE_FRAME_MAX: a longer frame is refused.
FRAME_MAX = 16 << 20


def record(name: str, text: bytes = b"") -> bytes:
    """One record of contract.RECORDS, by name."""
    return _RECORD.pack(ord(contract.RECORD[name]), len(text)) + text


def outcome_records(out: slurm_bridge.Outcome) -> bytes:
    """The records grace_send_outcome writes for the same outcome: each
    emission as the record of its name, then the return code and the end."""
    body = b"".join(record(kind, text) for kind, text in slurm_bridge.emissions(out))
    return body + record("rc", str(slurm_bridge.RC_CODES[out.action]).encode()) + record("end")


class Cursor:
    """A reader over one frame: u32 numbers, texts with their NUL."""

    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    def u32(self) -> int:
        if self.at + 4 > len(self.data):
            raise ValueError("short frame")
        (value,) = _U32.unpack_from(self.data, self.at)
        self.at += 4
        return int(value)

    def text(self) -> bytes | None:
        n = self.u32()
        if n == 0:
            return None
        raw = self.data[self.at:self.at + n]
        if len(raw) != n or raw[-1:] != b"\0" or b"\0" in raw[:-1]:
            raise ValueError("bad string")  # C would read a shorter one
        self.at += n
        return raw[:-1]

    def items(self) -> list[bytes | None]:
        n = self.u32()
        if n > (len(self.data) - self.at) // 4:
            raise ValueError("bad count")  # each item takes 4 bytes at least
        out = []
        for _ in range(n):
            item = self.text()
            if item is None:
                raise ValueError("NULL item")  # it would end argv or env early in C
            out.append(item)
        return out

    def end(self) -> None:
        if self.at != len(self.data):
            raise ValueError("frame longer than its fields")


def decode_step(frame: bytes) -> dict[str, Any]:
    """The step frame's fields by name, as C holds them (bytes, ints, lists)."""
    c = Cursor(frame)
    raw: dict[str, Any] = {}
    for f in contract.FRAME:
        if f.kind == contract.TEXT:
            raw[f.name] = c.text()
        elif f.kind in contract.LISTS:
            raw[f.name] = c.items()
        else:
            raw[f.name] = c.u32()
    c.end()
    return raw


def parse_step(frame: bytes) -> slurm_bridge.StepInput:
    """The step frame (grace_put_step) as the bridge's input. Its audit_fd
    is slurmstepd's number, which only says whether the audit file is open:
    the line is written by slurmstepd (grace_stepd.c), so the descriptor
    itself never comes to the process that parses the user's files."""
    return slurm_bridge.step_input(decode_step(frame))


def _text(value: bytes | None) -> bytes:
    return _U32.pack(0) if value is None else _U32.pack(len(value) + 1) + value + b"\0"


def encode_step(raw: dict[str, Any]) -> bytes:
    """A step frame from its fields by name (as :func:`decode_step` gives
    them): what grace_put_step writes for the same step. The checker never
    sends one; tests/test_contract.py hands it to the C decoder."""
    out = []
    for f in contract.FRAME:
        value = raw[f.name]
        if f.kind == contract.TEXT:
            out.append(_text(value))
        elif f.kind in contract.LISTS:
            out.append(_U32.pack(len(value)) + b"".join(_text(v) for v in value))
        else:
            out.append(_U32.pack(value & 0xFFFFFFFF))
    return b"".join(out)


class Request:
    """The node checker's first frame: slurmstepd's credentials now
    (contract.CREDS_IDS, then the groups), then contract.REQUEST_TAIL."""

    __slots__ = ("code", "groups", "ids", "left_ms", "path")

    def __init__(self, frame: bytes) -> None:
        c = Cursor(frame)
        self.ids = {name: c.u32() for name in contract.CREDS_IDS}
        n = c.u32()
        if n > (len(frame) - c.at) // 4:
            raise ValueError("bad group count")
        self.groups = [c.u32() for _ in range(n)]
        tail: dict[str, Any] = {}
        for name, kind in contract.REQUEST_TAIL:
            tail[name] = c.u32() if kind == contract.UINT else c.text()
        c.end()
        self.left_ms: int = tail["left_ms"]
        code, path = tail["code"], tail["path"]
        self.code = None if code is None else os.fsdecode(code)
        self.path = None if path is None else os.fsdecode(path)


def _recv_exact(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        got = conn.recv(n - len(data))
        if not got:
            raise EOFError
        data += got
    return data


def read_frame(conn: socket.socket) -> bytes:
    """One frame (u32 length, bytes). A descriptor that comes with it (an
    older plugin sent the audit file's) is closed at once: nothing here
    writes to it, and a check must not hold what it does not use."""
    head, fds, _flags, _addr = socket.recv_fds(conn, 4, 1, socket.MSG_CMSG_CLOEXEC)
    for fd in fds:
        os.close(fd)
    if len(head) < 4:
        head += _recv_exact(conn, 4 - len(head))
    (n,) = _U32.unpack(head)
    if n > FRAME_MAX:
        raise ValueError("frame too long")
    return _recv_exact(conn, n)
