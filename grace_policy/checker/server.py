"""The node checker's server: the socket, the spare, the children.

Why this shape (docs/SPANK.md "The node checker"): the listening parent
imports what a check needs once and then only accepts. slurmstepd connects
for every step in slurm_spank_init; on a verdict-cache hit - most steps - it
hangs up without a word and the server forks nothing. On a miss the server
hands the connection to a *spare*, a child forked ahead of time that has
already paid its copy-on-write faults (:func:`warm.prefault`) while it
waited, and forks the next spare. The child enters the job's mount
namespace (:mod:`.mntns`) and takes the user's credentials (:mod:`.creds`)
before it opens any file of the step, runs the same entry
the embedded check runs (:func:`slurm_bridge.outcome_for`), writes the same
records (:mod:`.wire`) and exits. The server itself never runs a check, so
no child inherits anything a step left behind.

Who can reach it: the socket is mode 0600 in a directory that is root's,
mode 0700, and each peer must be uid 0 (SO_PEERCRED) - slurmstepd, before it
drops privileges. It ends when slurmd's pipe reads EOF (slurmd stopped or
died), and when a request shows that the install it loaded has changed
(:mod:`.stale`).
"""

from __future__ import annotations

import fcntl
import os
import select
import signal
import socket
import stat
import struct
import time

from .. import slurm_bridge
from . import confine, creds, mntns, stale, wire

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
    """The server cannot start here (its socket's directory is not root's)."""


def _name(comm: str) -> None:
    """What ps and top show for this process (the kernel's comm): a check in
    progress is ``grace-check`` whichever checker runs it (grace_helper.c
    names slurmstepd's helper so), a waiting spare ``grace-spare``."""
    try:
        with open("/proc/self/comm", "w") as fh:
            fh.write(comm)
    except OSError:
        pass


class Server:
    """The listening parent: accepts, checks the peer, hands a step that
    asks to be judged to the spare, forks the next spare, forgets."""

    def __init__(self, path: str, code: str, life: int, test: str | None = None, *,
                 cache_dir: str | None = None) -> None:
        self.path, self.code, self.life, self.test = path, code, life, test
        #: plugstack's cache_dir=, where the node's GPU facts are published.
        self.cache_dir = cache_dir
        self.published = False
        self.install = stale.Install(slurm_bridge.code_files(), [stale.PACKAGE])
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
        sock.listen(4096)  # a burst of steps (a job array) waits here; the kernel caps it
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
        confine.prepare()  # what every child's confinement shares, made once
        self.poll = select.poll()
        self.poll.register(self.life, select.POLLIN)
        self.poll.register(self.sock.fileno(), select.POLLIN)
        # The node's GPUs, once per start and before any child is forked, so
        # no step waits for NVML (docs/CUDA.md); published in cache_dir so
        # verdicts judged on them can be replayed by C.
        from ..cuda.nodegpus import preload

        self.published = preload(self.cache_dir)
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
        step ended: nothing to do). Peeked, not read: the frames are the
        judging child's to take."""
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
        # Not slurmd's standing (often -1000): a child that grows is the
        # OOM killer's candidate like any process. Now, while still root.
        confine.fair_oom()

    def _spare(self, link: socket.socket) -> None:
        """Prefault at low priority, then wait for one step's connection;
        end when the server or slurmd is gone."""
        from .. import warm

        _name("grace-spare")
        try:
            os.nice(_SPARE_NICE)
        except OSError:
            pass
        warm.prefault()
        confine.prepare()  # its filter, for its own pid: off the step's path
        try:
            link.send(b"R")
        except OSError:
            return  # the server is gone
        ready, _, _ = select.select([link, self.life], [], [])
        if link not in ready:
            return  # slurmd is gone
        try:
            _msg, fds, _flags, _addr = socket.recv_fds(link, 1, 1, socket.MSG_CMSG_CLOEXEC)
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
            frame = wire.read_frame(conn)
        except (EOFError, OSError, ValueError):
            return  # a hit, or the step ended: nothing to do
        why = self.install.changed()
        if why:
            conn.sendall(wire.record("stale", why.encode()) + wire.record("end"))
            if os.getppid() == self.pid:  # not whoever adopted us after it ended
                os.kill(self.pid, signal.SIGTERM)
            return
        try:
            request = wire.Request(frame)
            # Past slurmstepd's deadline nothing we say is used: end by then.
            signal.setitimer(signal.ITIMER_REAL, request.left_ms / 1000.0 + _SLACK_S)
            # The job's view of files, entered while still root (mntns.py).
            step_frame = wire.read_frame(conn)
            view = mntns.enter(wire.decode_step(step_frame)["job_id"])
            creds.take(request)
        except (EOFError, OSError, ValueError):
            return  # EOF before 'A': slurmstepd checks it itself
        if request.code != self.code:
            conn.sendall(wire.record("stale", f"it runs {self.code!r}, the step "
                                     f"{request.code!r}".encode()) + wire.record("end"))
            return
        try:
            step = wire.parse_step(step_frame)
        except ValueError:
            return
        conn.sendall(wire.record("accepted"))
        refused, note = slurm_bridge.confine(step)
        if refused is not None:
            conn.sendall(wire.outcome_records(refused))
            return
        while self.test == "hang":
            signal.pause()  # as a check stuck on a dead file system
        if self.test == "probe":  # what the child may still do (tests/test_confine.py)
            said = repr(confine.selftest())  # (no import: the user may not read the stdlib)
            conn.sendall(wire.outcome_records(slurm_bridge.Outcome("allow", log=[said])))
            return
        if self.test == "hog":  # a check that grows (tests/test_confine.py)
            _hog()
        out = view.outcome(step)  # the job's view, or the failure to enter it
        if note:
            out.log.append(note)
        conn.sendall(wire.outcome_records(out))


def _hog() -> None:
    """Test hook: make this child's check allocate 1 MiB at a time, up to
    1 GiB, before it looks at the step's program - as a parser fed a
    hostile file would. Within max_memory nothing shows; past it the
    check must end as check-limit."""
    from .. import check

    judge = check._check

    def hungry(*args: object, **kwargs: object) -> None:
        held = [bytearray(1 << 20) for _ in range(1024)]
        del held
        judge(*args, **kwargs)  # type: ignore[arg-type]

    check._check = hungry  # type: ignore[assignment]
