"""grace_policy.nodecheck without Slurm: the frames and records it shares
with spank/grace_helper.c, and the constants it shares with spank/grace.h.
The server itself is tested on the real Slurm (tests/slurm/test_nodecheck.py).
"""

from __future__ import annotations

import os
import re
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from grace_policy import nodecheck, slurm_bridge

U32 = struct.Struct("=I")


def _s(raw: bytes | None) -> bytes:
    """grace_put_str: u32 length with the NUL, then the bytes; 0 for NULL."""
    if raw is None:
        return U32.pack(0)
    return U32.pack(len(raw) + 1) + raw + b"\0"


def _frame(argv: list[bytes], env: list[bytes], audit_fd: int = 7) -> bytes:
    texts = [b"/etc/g.toml", b"deny", b"gpu", b"/home/u", None, b"n1", None, b"/var/a.log",
             b"/p/lib/slurm|-", None, None, None]
    head = b"".join(_s(t) for t in texts)
    nums = (12, 0, 1000, 0, 0, audit_fd, len(argv), len(env))
    return head + b"".join(U32.pack(n) for n in nums) + b"".join(_s(a) for a in argv + env)


def test_rc_codes_are_grace_h_s() -> None:
    header = (Path(__file__).resolve().parents[1] / "spank" / "grace.h").read_text()
    defined = dict(re.findall(r"#define GRACE_RC_(\w+) (\d+)", header))
    assert {k.lower(): int(v) for k, v in defined.items()} == slurm_bridge.RC_CODES


def test_step_frame_is_read_as_c_writes_it() -> None:
    step = nodecheck.parse_step(
        _frame([b"/bin/\xffodd", b"-c"], [b"A=1", b"A=2", b"NOEQ", b"B="]), audit_fd=42)
    assert step.argv == ("/bin/\udcffodd", "-c")  # odd bytes survive (surrogateescape)
    assert step.env == {"A": "1", "B": ""}  # getenv(): the first wins; no '=' is dropped
    assert (step.config, step.on_error, step.partition, step.user_mode) == (
        "/etc/g.toml", "deny", "gpu", None)
    assert (step.job_id, step.step_id, step.uid, step.batch) == (12, 0, 1000, False)
    # The descriptor that came with the request, never the number in the frame.
    assert step.audit_fd == 42 and step.code == "/p/lib/slurm|-"


@pytest.mark.parametrize("cut", [3, 40, -1])
def test_short_or_bad_frame_is_refused(cut: int) -> None:
    frame = _frame([b"/bin/true"], [])
    with pytest.raises(ValueError):
        nodecheck.parse_step(frame[:cut], audit_fd=-1)


def test_records_follow_grace_send_outcome() -> None:
    out = slurm_bridge.Outcome(action="warn", user=["grace-policy: u"], unset=["V"],
                               set=[("K", "v")], log=["l\0x"], cache="entry")
    data = nodecheck.outcome_records(out)
    seen = []
    at = 0
    while at < len(data):
        kind, n = struct.unpack_from("=BI", data, at)
        seen.append((chr(kind), data[at + 5:at + 5 + n]))
        at += 5 + n
    assert seen == [("U", b"grace-policy: u"), ("X", b"V"), ("S", b"K=v"), ("L", b"l\\0x"),
                    ("C", b"entry"), ("D", b""), ("R", b"2"), ("Z", b"")]


# -- two servers on one socket (slurmd restarted while its old one starts) --
REPO = Path(__file__).resolve().parent.parent
BOOT = ("import sys; sys.path.insert(0, sys.argv[1]); from grace_policy.nodecheck import main; "
        "sys.exit(main(sys.argv[2:]))")


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
    """grace_put_creds + time left + install + PATH, as grace_node_run sends it."""
    ids = (os.getuid(), os.geteuid(), os.getuid(), os.getgid(), os.getegid(), os.getgid())
    groups = os.getgroups()
    body = b"".join(U32.pack(n) for n in (*ids, len(groups), *groups))
    body += U32.pack(20_000) + _s(code) + _s(b"/usr/bin:/bin")
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
