"""The node checker: one interpreter per node that forks a child per miss.

Why: a cold step pays for an interpreter start and the check's imports
(15-35 ms) before the check itself. This server is started once per node by
slurmd (spank/grace_node.c, ``checker=node``), imports what a check needs,
and then only waits. slurmstepd connects in slurm_spank_init (as root, the
only time it can reach the socket) and, on a verdict-cache hit - most
steps - closes the connection without a word: the server only accepts and
closes, and forks nothing. On a miss slurmstepd sends its credentials, then
the step (spank/grace_helper.c "The node checker's client" has the frames);
the server hands that connection to a *spare*: a child forked ahead of time
that has already paid its copy-on-write faults (:func:`warm.prefault`) while
it waited, and forks the next spare. The child takes the credentials before
it reads anything of the step, runs the same entry the embedded check runs
(:func:`slurm_bridge.outcome_for`) and writes the same result records, then
exits. The server itself never runs a check, so no child inherits anything a
step left behind.

Who can reach it: the socket is mode 0600 in a directory that is root's,
mode 0700, and each peer must be uid 0 (SO_PEERCRED) - slurmstepd, before it
drops privileges. It ends when slurmd's pipe reads EOF (slurmd stopped or
died), and when a request shows that the install it loaded has changed.
"""

from __future__ import annotations

import fcntl
import os
import select
import signal
import socket
import stat
import struct
import sys
import time

from . import slurm_bridge

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

_RECORD = struct.Struct("=BI")  # kind, length (host order): grace_helper.c's records
_U32 = struct.Struct("=I")
_FRAME_MAX = 16 << 20
#: How long after slurmstepd's deadline a child still runs (its own timer).
_SLACK_S = 0.2
#: How long a new server waits for the one before it on the same socket.
_TAKEOVER_S = 10.0
#: Connections held open waiting for slurmstepd's word (one per starting
#: step on the node); past this a new one is closed and that step, on a
#: miss, is checked by slurmstepd's own helper (checker=step).
_MAX_PENDING = 512
#: The spare prefaults at this niceness, so that it yields to the check it
#: was forked beside and to slurmstepd; it is back at 0 before it judges.
_SPARE_NICE = 10


class Refused(Exception):
    """A request this server cannot serve: the reason goes back as 'V'."""


def _record(kind: str, text: bytes = b"") -> bytes:
    return _RECORD.pack(ord(kind), len(text)) + text


class _Cursor:
    """grace_helper.c's frame format: u32 numbers, strings with their NUL."""

    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    def u32(self) -> int:
        if self.at + 4 > len(self.data):
            raise ValueError("short frame")
        (value,) = _U32.unpack_from(self.data, self.at)
        self.at += 4
        return int(value)

    def text(self) -> str | None:
        n = self.u32()
        if n == 0:
            return None
        raw = self.data[self.at:self.at + n]
        if len(raw) != n or raw[-1:] != b"\0":
            raise ValueError("bad string")
        self.at += n
        return os.fsdecode(raw[:-1])


def parse_step(frame: bytes, audit_fd: int) -> slurm_bridge.StepInput:
    """The step frame (grace_put_step) as the bridge's input; the audit
    descriptor is the one that came with the request, not the number in it."""
    c = _Cursor(frame)
    (config, on_error, partition, cwd, user_mode, node, container, audit_path, code,
     kind, image, args) = (c.text() for _ in range(12))
    job_id, step_id, uid, batch, local, _fd, argc, envc = (c.u32() for _ in range(8))
    argv = tuple(c.text() or "" for _ in range(argc))
    env = slurm_bridge.env_dict(c.text() for _ in range(envc))
    return slurm_bridge.StepInput(
        config=config, on_error=on_error or "allow", partition=partition, cwd=cwd,
        user_mode=user_mode, node=node or "", argv=argv, env=env, job_id=job_id,
        step_id=step_id, uid=uid, batch=bool(batch), container=container,
        audit_path=audit_path, audit_fd=audit_fd, code=code, container_kind=kind,
        container_image=image, container_local=bool(local), container_args=args)


def outcome_records(out: slurm_bridge.Outcome) -> bytes:
    """The records grace_send_outcome writes for the same outcome."""
    letters = {"user": "U", "unset": "X", "set": "S", "log": "L", "cache": "C", "done": "D"}
    body = b"".join(_record(letters[kind], text)
                    for kind, text in slurm_bridge.emissions(out))
    rc = slurm_bridge.RC_CODES[out.action]
    return body + _record("R", str(rc).encode()) + _record("Z")


def _recv_exact(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        got = conn.recv(n - len(data))
        if not got:
            raise EOFError
        data += got
    return data


def _frame(conn: socket.socket, with_fd: bool = False) -> tuple[bytes, int]:
    """One frame (u32 length, bytes); the descriptor sent with its first byte."""
    fd = -1
    if with_fd:
        head, fds, _flags, _addr = socket.recv_fds(conn, 4, 1)
        if fds:
            fd = fds[0]
        if len(head) < 4:
            head += _recv_exact(conn, 4 - len(head))
    else:
        head = _recv_exact(conn, 4)
    (n,) = _U32.unpack(head)
    if n > _FRAME_MAX:
        raise ValueError("frame too long")
    return _recv_exact(conn, n), fd


def take_creds(frame: bytes) -> tuple[int, str | None]:
    """Become what slurmstepd is at user_init: groups, gids, then uids (the
    user's effective ids, root's real and saved ids, so the user can neither
    signal nor trace us), with slurmstepd's own PATH (what pyxis' enroot is
    found on, container/enroot.py; the forked helper of checker=step has it
    as its os.environ). Returns the time left (ms) and the sender's install."""
    c = _Cursor(frame)
    ru, eu, su, rg, eg, sg, n = (c.u32() for _ in range(7))
    groups = [c.u32() for _ in range(n)]
    left, code, path = c.u32(), c.text(), c.text()
    if path is None:
        os.environ.pop("PATH", None)
    else:
        os.environ["PATH"] = path
    os.setgroups(groups)
    os.setresgid(rg, eg, sg)
    os.setresuid(ru, eu, su)
    if os.getresuid() != (ru, eu, su) or os.getegid() != eg:
        raise PermissionError("credentials did not take")
    return left, code


def _name(comm: str) -> None:
    """What ps and top show for this process (the kernel's comm): a check in
    progress is ``grace-check`` whichever checker runs it (grace_helper.c
    names slurmstepd's helper so), a waiting spare ``grace-spare``."""
    try:
        with open("/proc/self/comm", "w") as fh:
            fh.write(comm)
    except OSError:
        pass


def _stamp(paths: Sequence[str]) -> dict[str, tuple[int, int, int, int]]:
    out = {}
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            out[path] = (0, 0, 0, 0)
            continue
        out[path] = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    return out


class Server:
    """The listening parent: accepts, checks the peer, hands a step that
    asks to be judged to the spare, forks the next spare, forgets."""

    def __init__(self, path: str, code: str, life: int, test: str | None = None) -> None:
        self.path, self.code, self.life, self.test = path, code, life, test
        self.stamp = _stamp(slurm_bridge.code_files())
        self.sock: socket.socket | None = None
        self.ino = 0
        self.lock = -1
        #: Accepted connections whose slurmstepd has not spoken yet, by fd.
        self.pending: dict[int, socket.socket] = {}
        #: The server's end of the link to the spare child, or None; and
        #: whether the spare said it is done prefaulting.
        self.spare: socket.socket | None = None
        self.spare_ready = False
        #: The server's pid: the only process a child may stop (stale install).
        self.pid = os.getpid()

    def slurmd_gone(self, wait_s: float = 0.0) -> bool:
        """Has slurmd's end of the life pipe closed (EOF; it never writes)?"""
        return bool(select.select([self.life], [], [], wait_s)[0])

    def take_over(self) -> bool:
        """Wait for the server before us on this socket to end, then hold
        ``<socket>.lock`` for our life (children close it). Why: slurmd
        restarted while its old server was still importing gives two
        servers at once; without this the old one could unlink the new
        one's socket, or bind in between its unlink and bind (EADDRINUSE),
        and the node has no checker until the next restart. False: slurmd
        ended meanwhile, so there is nothing to serve."""
        fd = os.open(self.path + ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW,
                     0o600)
        until = time.monotonic() + _TAKEOVER_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                # An old server that does not end (it should within a
                # second) does not keep the node without a checker.
                if time.monotonic() >= until:
                    break
            if self.slurmd_gone(0.05):
                os.close(fd)
                return False
        self.lock = fd
        return not self.slurmd_gone()

    def listen(self) -> bool:
        """Make the directory, take the socket over and bind it. False:
        slurmd has already ended (an old server that was still starting)."""
        parent = os.path.dirname(self.path)
        os.makedirs(os.path.dirname(parent) or "/", mode=0o755, exist_ok=True)
        try:
            os.mkdir(parent, 0o700)
        except FileExistsError:
            pass
        st = os.lstat(parent)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0:
            raise Refused(f"{parent} is not a directory of root's")
        os.chmod(parent, 0o700)
        if not self.take_over():
            return False
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(self.path)
        os.chmod(self.path, 0o600)
        sock.listen(128)
        sock.setblocking(False)
        self.sock, self.ino = sock, os.stat(self.path).st_ino
        try:  # a new server: the next failure to reach it is said again
            os.unlink(self.path + ".down")
        except FileNotFoundError:
            pass
        return True

    def close(self) -> None:
        try:
            if os.stat(self.path).st_ino == self.ino:
                os.unlink(self.path)
        except OSError:
            pass

    def serve(self) -> int:
        assert self.sock is not None
        signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children reap themselves
        self.poll = select.poll()
        self.poll.register(self.life, select.POLLIN)
        self.poll.register(self.sock.fileno(), select.POLLIN)
        self._fork_spare()
        while True:
            for fd, _event in self.poll.poll():
                if fd == self.life:
                    return 0  # slurmd is gone (EOF; it never writes)
                if fd == self.sock.fileno():
                    self._accept()
                elif self.spare is not None and fd == self.spare.fileno():
                    self._spare_event()
                elif fd in self.pending:
                    self._spoke(fd)

    def _accept(self) -> None:
        assert self.sock is not None
        try:
            conn, _addr = self.sock.accept()
        except (BlockingIOError, InterruptedError, ConnectionAbortedError):
            return
        except OSError:
            # Out of descriptors or memory: the step's connect succeeded
            # but goes unserved (its miss falls back to checker=step);
            # pause so a full table does not spin this loop.
            time.sleep(0.01)
            return
        try:
            peer = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                   struct.calcsize("3i"))
            _peer_pid, uid, _gid = struct.unpack("3i", peer)
        except OSError:
            uid = -1
        # slurmstepd before it drops privileges, and only it; a full table
        # means that step's miss is checked by slurmstepd's own helper.
        if uid != 0 or len(self.pending) >= _MAX_PENDING:
            conn.close()
            return
        conn.setblocking(False)
        self.pending[conn.fileno()] = conn
        self.poll.register(conn.fileno(), select.POLLIN)

    def _spoke(self, fd: int) -> None:
        """slurmstepd wrote (a miss: judge it) or hung up (a hit, or the
        step ended: nothing to do). Peeked, not read: the frame and the
        descriptor that comes with it are the judging child's to take."""
        conn = self.pending[fd]
        try:
            first = conn.recv(1, socket.MSG_PEEK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            first = b""
        del self.pending[fd]
        self.poll.unregister(fd)
        try:
            if first:
                self._judge(conn)
        finally:
            conn.close()

    def _judge(self, conn: socket.socket) -> None:
        """The spare takes the connection if it is ready; else a child
        forked now (a spare still prefaulting at low priority would make
        this step wait for it). The server's copy of the connection is
        closed before the next spare is forked: a copy held by any other
        process keeps slurmstepd from reading the end of the answer."""
        if self.spare is not None and self.spare_ready:
            try:
                socket.send_fds(self.spare, [b"S"], [conn.fileno()])
                handed = True
            except OSError:
                handed = False
            self._drop_spare()
            if handed:
                conn.close()
                self._fork_spare()
                return
        try:
            pid = os.fork()
        except OSError:
            return  # closed: slurmstepd reads EOF before 'A' and checks it itself
        if pid == 0:
            try:
                self._leave(keep=conn)
                self._child(conn)
            finally:
                os._exit(0)
        conn.close()
        if self.spare is None:
            self._fork_spare()

    def _spare_event(self) -> None:
        """The spare writes once, 'R' when its prefault is done; its link
        reads EOF once it has died (then the next miss forks its own child,
        and a new spare)."""
        assert self.spare is not None
        try:
            said = self.spare.recv(16, socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return  # an event for an earlier socket of the same number
        except OSError:
            said = b""
        if said:
            self.spare_ready = True
        else:
            self._drop_spare()

    def _drop_spare(self) -> None:
        if self.spare is not None:
            self.poll.unregister(self.spare.fileno())
            self.spare.close()
            self.spare = None
            self.spare_ready = False

    def _fork_spare(self) -> None:
        """The next step's child, forked now so that its fork and its page
        copies are paid before its step arrives, not while slurmstepd waits."""
        try:
            mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        except OSError:
            return  # no spare: the next miss forks its own child
        try:
            pid = os.fork()
        except OSError:
            mine.close()
            theirs.close()
            return
        if pid != 0:
            theirs.close()
            self.spare, self.spare_ready = mine, False
            self.poll.register(mine.fileno(), select.POLLIN)
            return
        try:
            mine.close()
            self._leave(keep=theirs)
            self._spare(theirs)
        finally:
            os._exit(0)

    def _leave(self, keep: socket.socket) -> None:
        """In a child: drop what is the server's (the listening socket, the
        lock, other steps' connections, the spare's link)."""
        assert self.sock is not None
        self.sock.close()
        if self.lock >= 0:  # a hung child must not hold a new server off
            os.close(self.lock)
        for other in self.pending.values():
            if other is not keep:
                other.close()
        if self.spare is not None and self.spare is not keep:
            self.spare.close()
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)

    def _spare(self, link: socket.socket) -> None:
        """Prefault at low priority, then wait for one step's connection;
        end when the server or slurmd is gone."""
        from . import warm

        _name("grace-spare")
        try:
            os.nice(_SPARE_NICE)
        except OSError:
            pass
        warm.prefault()
        try:
            link.send(b"R")
        except OSError:
            return  # the server is gone
        ready, _, _ = select.select([link, self.life], [], [])
        if link not in ready:
            return  # slurmd is gone
        try:
            _msg, fds, _flags, _addr = socket.recv_fds(link, 1, 1)
        except OSError:
            return
        link.close()
        if not fds:
            return  # the server is gone
        try:
            os.setpriority(os.PRIO_PROCESS, 0, 0)  # still root: the step's own pace
        except OSError:
            pass
        self._child(socket.socket(fileno=fds[0]))

    def _child(self, conn: socket.socket) -> None:
        """One step: take the user's credentials, read the step, judge it,
        answer, end."""
        _name("grace-check")
        conn.setblocking(True)
        ready, _, _ = select.select([conn, self.life], [], [])
        if self.life in ready and conn not in ready:
            return
        try:
            frame, audit_fd = _frame(conn, with_fd=True)
        except (EOFError, OSError, ValueError):
            return  # a hit, or the step ended: nothing to do
        stale = self._stale()
        if stale:
            conn.sendall(_record("V", stale.encode()) + _record("Z"))
            if os.getppid() == self.pid:  # not whoever adopted us after it ended
                os.kill(self.pid, signal.SIGTERM)
            return
        try:
            left, code = take_creds(frame)
        except (OSError, ValueError):
            return  # EOF before 'A': slurmstepd checks it itself
        if code != self.code:
            conn.sendall(_record("V", f"it runs {self.code!r}, the step {code!r}".encode())
                         + _record("Z"))
            return
        # Past slurmstepd's deadline nothing we say is used: end by then.
        signal.setitimer(signal.ITIMER_REAL, left / 1000.0 + _SLACK_S)
        try:
            step = parse_step(_frame(conn)[0], audit_fd)
        except (EOFError, OSError, ValueError):
            return
        conn.sendall(_record("A"))
        while self.test == "hang":
            signal.pause()  # as a check stuck on a dead file system
        conn.sendall(outcome_records(slurm_bridge.outcome_for(step)))

    def _stale(self) -> str | None:
        """Why this server must not judge any more (its install changed)."""
        now = _stamp(list(self.stamp))
        changed = sorted(p for p in self.stamp if now[p] != self.stamp[p])
        if changed:
            return (f"{changed[0]} changed since the checker started (restart slurmd to "
                    "start the new install's checker)")
        return None


def _say(text: str) -> None:
    print(text, file=sys.stderr)
    try:
        import syslog

        syslog.openlog("grace-policy", 0, syslog.LOG_DAEMON)
        syslog.syslog(syslog.LOG_ERR, text)
    except Exception:
        pass


def main(argv: Sequence[str]) -> int:
    """``--socket PATH --code CODE --life FD [--test hang]`` (grace_node.c)."""
    opts = dict(zip(argv[::2], argv[1::2]))
    os.chdir("/")
    os.umask(0o077)
    from . import warm

    warm.preload()
    server = Server(opts["--socket"], opts["--code"], int(opts["--life"]), opts.get("--test"))

    def _stop(signum: int, frame: object) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, _stop)
    try:
        if not server.listen():
            return 0  # slurmd ended while we started: the socket is not ours
        return server.serve()
    except (Refused, OSError) as exc:
        # stderr is /dev/null (slurmd's start): the system log is where an
        # admin who reads "not reachable" in slurmd's log can find why.
        _say(f"grace-policy: node checker on {server.path} not started: {exc}")
        return 1
    finally:
        server.close()
