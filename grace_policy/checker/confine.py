"""Take away what a check never needs, once it runs as the user.

Why: the process that judges a step (the node checker's child, or the
helper slurmstepd forks for ``checker=step``) parses files the user controls
(squashfs, SIF, ELF, shell, Python metadata) with C libraries, and it keeps
root as its real and saved uid so that the user can neither signal nor trace
it. A memory bug in one of those parsers would otherwise be a way back to
root (``setresuid(0, 0, 0)``), a way out of the node (``execve``), or a way to
take the node's memory. :func:`enter` closes those, in this order:

* ``RLIMIT_DATA``: what the process already has plus ``max_memory`` MiB
  (plugstack.conf; docs/SPANK.md). Data, not address space: glibc reserves
  address space it never uses (64 MiB per thread arena) and file mappings
  cost no anonymous memory; what the OOM killer counts is data. An
  allocation past it fails (``MemoryError``), which the check reports as
  ``check-limit``; the node never runs out for one step;
* ``PR_SET_NO_NEW_PRIVS`` (needed to install a filter without
  CAP_SYS_ADMIN, and no set-id bit can take effect afterwards) and
  ``PR_SET_DUMPABLE(0)`` (its /proc files stay root's, no core file);
* a seccomp-BPF filter built from :data:`REFUSED`: each call there fails
  with an errno instead of killing the process, so a check that meets one
  (a library that probes, a hostile input that drove the parser there)
  ends as a clean failure that follows ``on_error``, with a line in
  slurmd's log, instead of a helper that died without a word. A call from
  another architecture's table (i386 ``int 0x80``, x32, aarch32) is refused
  whatever its number.

:func:`fair_oom` is separate: it has to run while the process is still root
(``/proc/self/oom_score_adj`` is root's once the credentials changed).

The filter's list is here and nowhere else: docs/SECURITY.md explains each
entry, and tests/test_confine.py checks both architectures' numbers against
the kernel headers (``linux-libc-dev`` and ``libc6-dev-arm64-cross``).
"""

from __future__ import annotations

import os
import struct

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

#: What a refused call returns (errno.EPERM, errno.ENOSYS; numbers, so
#: that this module imports nothing on the check's path).
EPERM, ENOSYS = 1, 38
_EINVAL = 22

#: How a refused call is decided. PLAIN: always. NS: clone() asking for a
#: new namespace. SELF: a signal to any process but this one. NOSYS: always,
#: with ENOSYS (glibc falls back to an older call it then tries).
PLAIN, NS, SELF, NOSYS = "plain", "ns", "self", "nosys"

#: name, x86_64 number, aarch64 number (None: the call does not exist
#: there), how it is refused. docs/SECURITY.md "The checker's confinement"
#: gives each entry's reason; keep the two in step.
REFUSED: tuple[tuple[str, int, int | None, str], ...] = (
    # The way back to root: the real and saved uid are root's.
    ("setuid", 105, 146, PLAIN),
    ("setgid", 106, 144, PLAIN),
    ("setreuid", 113, 145, PLAIN),
    ("setregid", 114, 143, PLAIN),
    ("setresuid", 117, 147, PLAIN),
    ("setresgid", 119, 149, PLAIN),
    ("setfsuid", 122, 151, PLAIN),
    ("setfsgid", 123, 152, PLAIN),
    ("setgroups", 116, 159, PLAIN),
    ("capset", 126, 91, PLAIN),
    # Other processes: reading or writing them, signalling them.
    ("ptrace", 101, 117, PLAIN),
    ("process_vm_readv", 310, 270, PLAIN),
    ("process_vm_writev", 311, 271, PLAIN),
    ("kcmp", 312, 272, PLAIN),
    ("pidfd_open", 434, 434, PLAIN),
    ("pidfd_getfd", 438, 438, PLAIN),
    ("pidfd_send_signal", 424, 424, PLAIN),
    ("kill", 62, 129, SELF),
    ("tkill", 200, 130, PLAIN),
    ("tgkill", 234, 131, SELF),
    ("rt_sigqueueinfo", 129, 138, SELF),
    ("rt_tgsigqueueinfo", 297, 240, SELF),
    # Running anything else.
    ("execve", 59, 221, PLAIN),
    ("execveat", 322, 281, PLAIN),
    # Namespaces and mounts.
    ("unshare", 272, 97, PLAIN),
    ("clone", 56, 220, NS),
    ("clone3", 435, 435, NOSYS),
    ("setns", 308, 268, PLAIN),
    ("mount", 165, 40, PLAIN),
    ("umount2", 166, 39, PLAIN),
    ("pivot_root", 155, 41, PLAIN),
    ("chroot", 161, 51, PLAIN),
    ("open_tree", 428, 428, PLAIN),
    ("move_mount", 429, 429, PLAIN),
    ("fsopen", 430, 430, PLAIN),
    ("fsconfig", 431, 431, PLAIN),
    ("fsmount", 432, 432, PLAIN),
    ("fspick", 433, 433, PLAIN),
    ("mount_setattr", 442, 442, PLAIN),
    ("name_to_handle_at", 303, 264, PLAIN),
    ("open_by_handle_at", 304, 265, PLAIN),
    # The kernel's own attack surface, unneeded by a reader of files.
    ("bpf", 321, 280, PLAIN),
    ("perf_event_open", 298, 241, PLAIN),
    ("userfaultfd", 323, 282, PLAIN),
    ("io_uring_setup", 425, 425, PLAIN),
    ("io_uring_enter", 426, 426, PLAIN),
    ("io_uring_register", 427, 427, PLAIN),
    ("keyctl", 250, 219, PLAIN),
    ("add_key", 248, 217, PLAIN),
    ("request_key", 249, 218, PLAIN),
    ("personality", 135, 92, PLAIN),
    ("fanotify_init", 300, 262, PLAIN),
    # The machine's: each needs a capability the process no longer has;
    # refused here too, so that a capability regained some other way is
    # still not enough.
    ("kexec_load", 246, 104, PLAIN),
    ("kexec_file_load", 320, 294, PLAIN),
    ("init_module", 175, 105, PLAIN),
    ("finit_module", 313, 273, PLAIN),
    ("delete_module", 176, 106, PLAIN),
    ("reboot", 169, 142, PLAIN),
    ("swapon", 167, 224, PLAIN),
    ("swapoff", 168, 225, PLAIN),
    ("acct", 163, 89, PLAIN),
    ("quotactl", 179, 60, PLAIN),
    ("vhangup", 153, 58, PLAIN),
    ("syslog", 103, 116, PLAIN),
    ("settimeofday", 164, 170, PLAIN),
    ("clock_settime", 227, 112, PLAIN),
    ("sethostname", 170, 161, PLAIN),
    ("setdomainname", 171, 162, PLAIN),
    ("iopl", 172, None, PLAIN),
    ("ioperm", 173, None, PLAIN),
)

#: The architectures a filter is built for: uname's machine -> (the
#: AUDIT_ARCH_* seccomp_data.arch holds for the native table, REFUSED's
#: column, the bit that marks another ABI's number in the same arch (x32),
#: or 0).
ARCHES = {
    "x86_64": (0xC000003E, 1, 0x40000000),   # AUDIT_ARCH_X86_64, __X32_SYSCALL_BIT
    "aarch64": (0xC00000B7, 2, 0),           # AUDIT_ARCH_AARCH64
}

#: CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET
#: (CLONE_NEWTIME, 0x80, is part of clone()'s exit signal: unshare only).
NS_FLAGS = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 \
    | 0x40000000

# linux/filter.h, linux/seccomp.h, linux/prctl.h, sys/resource.h
_LD_W_ABS = 0x20      # BPF_LD | BPF_W | BPF_ABS
_JEQ = 0x15           # BPF_JMP | BPF_JEQ | BPF_K
_JGE = 0x35           # BPF_JMP | BPF_JGE | BPF_K
_JSET = 0x45          # BPF_JMP | BPF_JSET | BPF_K
_RET = 0x06           # BPF_RET | BPF_K
_ALLOW = 0x7FFF0000   # SECCOMP_RET_ALLOW
_ERRNO = 0x00050000   # SECCOMP_RET_ERRNO | errno
_NR, _ARCH, _ARG0_LO, _ARG0_HI = 0, 4, 16, 20  # struct seccomp_data (little-endian)
_PR_SET_DUMPABLE, _PR_SET_SECCOMP, _PR_SET_NO_NEW_PRIVS = 4, 22, 38
_SECCOMP_MODE_FILTER = 2
_INSN = struct.Struct("=HBBI")


def _insn(code: int, k: int = 0, jt: int = 0, jf: int = 0) -> bytes:
    return _INSN.pack(code, jt, jf, k & 0xFFFFFFFF)


def program(machine: str, pid: int, refused: Sequence[tuple[str, int, int | None, str]]
            = REFUSED) -> bytes:
    """The filter for ``machine`` as struct sock_filter[] bytes; ``pid``:
    the one process a SELF call may signal (this one: the filter is built
    in the process that installs it). ValueError: no table for machine."""
    if machine not in ARCHES:
        raise ValueError(f"no system call table for {machine}")
    arch, column, foreign_bit = ARCHES[machine]
    deny = _insn(_RET, _ERRNO | EPERM)
    out = [_insn(_LD_W_ABS, _ARCH), _insn(_JEQ, arch, jt=1), deny, _insn(_LD_W_ABS, _NR)]
    if foreign_bit:
        out += [_insn(_JGE, foreign_bit, jf=1), deny]
    for entry in refused:
        nr, how = entry[column], entry[3]
        if nr is None:
            continue
        if how == PLAIN:
            out += [_insn(_JEQ, nr, jf=1), deny]
        elif how == NOSYS:
            out += [_insn(_JEQ, nr, jf=1), _insn(_RET, _ERRNO | ENOSYS)]
        elif how == NS:
            out += [_insn(_JEQ, nr, jf=4), _insn(_LD_W_ABS, _ARG0_LO),
                    _insn(_JSET, NS_FLAGS, jf=1), deny, _insn(_RET, _ALLOW)]
        elif how == SELF:
            # Both halves of the 64-bit argument: -1 or a negative group
            # (every process, a process group) must not match.
            out += [_insn(_JEQ, nr, jf=6), _insn(_LD_W_ABS, _ARG0_LO),
                    _insn(_JEQ, pid, jf=3), _insn(_LD_W_ABS, _ARG0_HI),
                    _insn(_JEQ, 0, jf=1), _insn(_RET, _ALLOW), deny]
        else:
            raise ValueError(f"{entry[0]}: unknown way to refuse {how!r}")
    out.append(_insn(_RET, _ALLOW))
    if len(out) > 4096:  # BPF_MAXINSNS
        raise ValueError("filter too long")
    return b"".join(out)


def data_kib() -> int:
    """This process' data (VmData: what RLIMIT_DATA counts), in KiB; 0 if
    /proc cannot say. One raw read: ~0.13 ms in a fresh child, most of it
    the kernel's."""
    try:
        fd = os.open("/proc/self/status", os.O_RDONLY | os.O_CLOEXEC)
        try:
            data = os.read(fd, 16384)
        finally:
            os.close(fd)
        at = data.index(b"VmData:")
        return int(data[at + 7:data.index(b"kB", at)])
    except (OSError, ValueError):
        return 0


def fair_oom() -> bool:
    """Stand as any process does before the OOM killer (0), not as slurmd
    (sites run it at -1000, and every child inherits it): a check that
    grows is then a candidate rather than the jobs beside it. Must run as
    root (the file is root's once the credentials changed). False: not set."""
    try:
        fd = os.open("/proc/self/oom_score_adj", os.O_WRONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        os.write(fd, b"0\n")
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


class Refused(Exception):
    """The process could not be confined (a kernel without seccomp, say):
    the check must not run."""


_entered = False


#: What :func:`enter` needs that does not depend on the step: prctl through
#: ctypes and the sock_fprog type (made once in the server, inherited by
#: every child), and the filter for one pid (made by the spare while it
#: waits: only the pid's own process may install it).
_native: tuple[Any, Any] | None = None
_code: tuple[int, bytes] | None = None


def prepare() -> None:
    """Do ahead of the step what :func:`enter` would do in its path: the
    node checker's server calls it once and each spare again while it
    waits (measured: ~0.5 ms of a forked child's first run, mostly the
    first touch of pages after fork, off the miss's path)."""
    global _native, _code
    if _native is None:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
        prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong,
                          ctypes.c_ulong]
        prctl.restype = ctypes.c_int

        class _Fprog(ctypes.Structure):
            _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]

        _native = (prctl, _Fprog)
    machine, pid = os.uname().machine, os.getpid()
    if machine not in ARCHES:
        _code = None
    elif _code is None or _code[0] != pid:
        _code = (pid, program(machine, pid))


def enter(max_memory_mib: int) -> str | None:
    """Confine this process for the rest of its life: the data limit, then
    no new privileges, not dumpable, the filter. Once per process (a second
    call does nothing). Raises :class:`Refused` if a step did not take.
    Returns why the filter is missing, or None: a kernel built without
    seccomp filters (EINVAL for any program, even one that allows all) or
    a machine without a table; the other steps still hold and the check
    runs, as it did before the filter existed (refusing every step of such
    a node would make on_error the verdict of every job)."""
    global _entered
    if _entered:
        return None
    import ctypes
    import resource

    prepare()
    assert _native is not None
    prctl, fprog = _native
    if max_memory_mib > 0:
        limit = (data_kib() << 10) + (max_memory_mib << 20)
        try:
            resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
        except (OSError, ValueError) as exc:
            raise Refused(f"data limit: {exc}") from None
    if prctl(_PR_SET_NO_NEW_PRIVS, 1, None, 0, 0) != 0:
        raise Refused(f"no_new_privs: {os.strerror(ctypes.get_errno())}")
    if prctl(_PR_SET_DUMPABLE, 0, None, 0, 0) != 0:
        raise Refused(f"dumpable: {os.strerror(ctypes.get_errno())}")

    def install(code: bytes) -> int:
        prog = fprog(len(code) // _INSN.size, code)
        if prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.addressof(prog), 0, 0) == 0:
            return 0
        return ctypes.get_errno() or _EINVAL

    note = None
    if _code is None:
        note = f"no system call table for {os.uname().machine}"
    else:
        err = install(_code[1])
        if err == _EINVAL and install(_insn(_RET, _ALLOW)) == _EINVAL:
            note = "this kernel has no seccomp filters (CONFIG_SECCOMP_FILTER)"
        elif err:
            raise Refused(f"seccomp: {os.strerror(err)}")
    _entered = True
    return note


def selftest() -> dict[str, str]:
    """What this process is allowed now, for the tests (the node checker's
    ``--test probe`` hook and tests/test_confine.py): each call of
    :data:`REFUSED` tried with arguments that change nothing (``-1``s; a
    signal 0 to init; clone flags the kernel rejects), its errno by name
    (``ok`` if it returned), and the state the kernel reports. Only for a
    process that :func:`enter` confined: unconfined, root, some of these
    could act."""
    import ctypes
    import errno
    import resource

    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    column = ARCHES.get(os.uname().machine, (0, 0, 0))[1]
    out: dict[str, str] = {}
    status = {}
    try:
        with open("/proc/self/status") as fh:
            status = dict(line.rstrip("\n").split(":\t", 1) for line in fh if ":\t" in line)
    except OSError:
        pass
    out["Seccomp"] = status.get("Seccomp", "?").strip()
    out["NoNewPrivs"] = status.get("NoNewPrivs", "?").strip()
    out["dumpable"] = str(libc.prctl(3, 0, 0, 0, 0))  # PR_GET_DUMPABLE
    out["RLIMIT_DATA"] = str(resource.getrlimit(resource.RLIMIT_DATA)[0])
    try:
        with open("/proc/self/oom_score_adj") as fh:
            out["oom_score_adj"] = fh.read().strip()
    except OSError as exc:
        out["oom_score_adj"] = f"unreadable: {exc.strerror}"
    # Each open descriptor's inode (/proc/self/fd is root's once the
    # process is not dumpable: fstat asks the descriptors themselves).
    fds = []
    for fd in range(1024):
        try:
            fds.append(f"{fd}:{os.fstat(fd).st_ino}")
        except OSError:
            continue
    out["fds"] = " ".join(fds)
    if not column or out["Seccomp"] != "2":
        return out
    minus = ctypes.c_long(-1)
    for name, *nrs, how in REFUSED:
        nr = nrs[column - 1]
        if nr is None:
            continue
        if how == SELF:
            args: tuple[object, ...] = (ctypes.c_long(1), ctypes.c_long(1), ctypes.c_long(0))
        elif how == NS:
            args = (ctypes.c_long(0x00020000 | 0x00000200), minus, minus)  # NEWNS|FS: EINVAL
        else:
            args = (minus,) * 6
        ctypes.set_errno(0)
        rc = libc.syscall(ctypes.c_long(nr), *args)
        out[name] = "ok" if rc != -1 else errno.errorcode.get(ctypes.get_errno(), "?")
    return out
