"""The node checker's server without Slurm: two servers on one socket, hits
that fork nothing, a miss judged by the spare. Its frames and records are
tested against the plugin's C in tests/test_contract.py; the server on the
real Slurm in tests/slurm/test_nodecheck.py.
"""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from grace_policy import contract
from grace_policy.checker import wire

U32 = struct.Struct("=I")


def _frame(argv: list[bytes], env: list[bytes], audit_fd: int = 7, max_memory: int = 0) -> bytes:
    """A step frame, written by the contract's codec (tests/test_contract.py
    holds it to the plugin's C encoder)."""
    raw = {f.name: None for f in contract.FRAME if f.kind == contract.TEXT}
    raw.update(config=b"/etc/g.toml", on_error=b"deny", node=b"n1", code=b"x|-", argv=argv,
               env=env, job_id=12, step_id=0, uid=os.getuid(), batch=0, audit_fd=audit_fd,
               container_local=0, max_memory=max_memory)
    return wire.encode_step(raw)


# -- two servers on one socket (slurmd restarted while its old one starts) --
REPO = Path(__file__).resolve().parent.parent
BOOT = (f"import sys; sys.path.insert(0, sys.argv[1]); from {contract.CHECKER_MODULE} import "
        f"{contract.CHECKER_FUNCTION} as main; sys.exit(main(sys.argv[2:]))")


def _server(sock: Path) -> tuple[subprocess.Popen[bytes], int]:
    """A real server process as grace_node.c starts it; the write end of
    its life pipe (closing it is slurmd's end)."""
    r, w = os.pipe()
    proc = subprocess.Popen(
        [sys.executable, "-I", "-B", "-c", BOOT, str(REPO), "--socket", str(sock),
         "--code", "x|-", "--life", str(r)], pass_fds=(r,), cwd="/", env={})
    os.close(r)
    return proc, w


def _listening(sock: Path) -> bool:
    with socket.socket(socket.AF_UNIX) as s:
        try:
            s.connect(str(sock))
        except OSError:
            return False
    return True


def _until(what: Callable[[], bool], timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while not what():
        assert time.monotonic() < end, what
        time.sleep(0.05)


@pytest.mark.skipif(os.geteuid() != 0, reason="the server wants a socket directory of root's")
def test_a_restart_while_the_old_server_starts_leaves_one_server(tmp_path: Path) -> None:
    """The old server still running (or still importing) when slurmd
    restarts: the new one waits for it, then owns the socket; an old one
    whose slurmd has already gone never touches the socket at all."""
    sock = tmp_path / "checker" / "socket"
    old, old_life = _server(sock)
    _until(lambda: _listening(sock))
    new, new_life = _server(sock)
    time.sleep(1.5)  # the new one waits on <socket>.lock meanwhile
    assert new.poll() is None
    os.close(old_life)  # the old slurmd ends
    assert old.wait(timeout=30) == 0
    _until(lambda: _listening(sock))
    ino = sock.stat().st_ino
    # One that starts after its slurmd already ended: exits, socket untouched.
    late, late_life = _server(sock)
    os.close(late_life)
    assert late.wait(timeout=30) == 0
    assert sock.stat().st_ino == ino and _listening(sock) and new.poll() is None
    os.close(new_life)
    assert new.wait(timeout=30) == 0
    assert not sock.exists()


# -- hits cost the server no fork; a miss goes to the spare ----------------
def _children(pid: int) -> set[int]:
    out = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            out.add(int(entry.name))
    return out


def _creds_frame(code: bytes) -> bytes:
    """grace_put_creds + time left + install + PATH, as grace_node_run sends
    it (in contract.CREDS_IDS' order; this process's own ids)."""
    have = dict(zip(("ruid", "euid", "suid"), os.getresuid()))
    have.update(zip(("rgid", "egid", "sgid"), os.getresgid()))
    groups = os.getgroups()
    body = b"".join(U32.pack(have[name]) for name in contract.CREDS_IDS)
    body += b"".join(U32.pack(n) for n in (len(groups), *groups))
    body += U32.pack(20_000) + U32.pack(len(code) + 1) + code + b"\0"
    body += U32.pack(14) + b"/usr/bin:/bin\0"
    return U32.pack(len(body)) + body


def _records(conn: socket.socket) -> list[str]:
    data = b""
    kinds: list[str] = []
    while not kinds or kinds[-1] != "Z":
        got = conn.recv(65536)
        assert got, kinds
        data += got
        while len(data) >= 5:
            kind, n = struct.unpack_from("=BI", data)
            if len(data) < 5 + n:
                break
            kinds.append(chr(kind))
            data = data[5 + n:]
    return kinds


@pytest.mark.skipif(os.geteuid() != 0, reason="the server wants a socket directory of root's")
def test_hits_fork_nothing_and_a_miss_is_judged_by_the_spare(tmp_path: Path) -> None:
    """slurmstepd connects for every step and, on a cache hit, hangs up
    without a word: the server forks nothing for those (its only child
    stays the one spare). A step that speaks is judged by that spare (it
    answers 'A' ... 'Z'), which then ends, and a new spare takes its place."""
    sock = tmp_path / "checker" / "socket"
    server, life = _server(sock)
    try:
        _until(lambda: _listening(sock) and len(_children(server.pid)) == 1)
        [spare] = _children(server.pid)
        # ps tells it from a check in progress (grace-check)
        _until(lambda: Path(f"/proc/{spare}/comm").read_text().strip() == "grace-spare")
        held = socket.socket(socket.AF_UNIX)
        held.connect(str(sock))  # a step still starting: says nothing yet
        for _ in range(20):
            with socket.socket(socket.AF_UNIX) as hit:
                hit.connect(str(sock))
        time.sleep(1.0)
        assert _children(server.pid) == {spare}
        held.close()
        audit_r, audit_w = os.pipe()
        with socket.socket(socket.AF_UNIX) as miss:
            miss.connect(str(sock))
            socket.send_fds(miss, [_creds_frame(b"x|-")], [audit_w])
            step = _frame([b"/bin/true"], [b"PATH=/usr/bin:/bin"], audit_fd=audit_w)
            miss.sendall(U32.pack(len(step)) + step)
            kinds = _records(miss)
            # Then the end: slurmstepd reads to EOF, so no other process
            # (the next spare) may hold a copy of this connection.
            miss.settimeout(10)
            assert miss.recv(1) == b""
        os.close(audit_r)
        os.close(audit_w)
        assert kinds[0] == "A" and kinds[-2:] == ["R", "Z"], kinds
        # A request the child cannot read ends in EOF too (slurmstepd then
        # checks the step itself), not in a wait for the deadline.
        with socket.socket(socket.AF_UNIX) as bad:
            bad.connect(str(sock))
            bad.sendall(U32.pack(1 << 30) + b"xx")
            bad.settimeout(10)
            try:
                assert bad.recv(1) == b""
            except ConnectionResetError:
                pass  # closed with our bytes unread: an end all the same
        _until(lambda: spare not in _children(server.pid)
               and len(_children(server.pid)) == 1)
        [spare] = _children(server.pid)
    finally:
        os.close(life)
        assert server.wait(timeout=30) == 0
    # The spare does not outlive slurmd (nor its server).
    _until(lambda: not _alive(spare))


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state != "Z"
