"""The confinement of the process that judges (grace_policy/checker/confine.py):
the filter's numbers against the kernel headers of both architectures, the
filter's logic for both by a small BPF interpreter, each refused call in a
confined process of this machine (the foreign-ABI gate with a compiled
i386 call), the data limit, and the node checker's real child: confined,
its OOM standing reset while its server keeps -1000, no audit descriptor,
and a check that grows past max_memory ending as check-limit.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from grace_policy import contract
from grace_policy.checker import confine, wire

U32 = struct.Struct("=I")
REPO = Path(__file__).resolve().parent.parent
MACHINE = os.uname().machine


# -- the table against the kernel's ------------------------------------------

def _header_numbers(cc: str) -> dict[str, int | None]:
    """__NR_<name> for every name of the table, as the C compiler's
    <sys/syscall.h> has it (None: no such call on that architecture)."""
    names = [entry[0] for entry in confine.REFUSED]
    src = "#include <sys/syscall.h>\n" + "".join(f"N_{n} __NR_{n}\n" for n in names)
    out = subprocess.run([cc, "-E", "-P", "-x", "c", "-"], input=src, capture_output=True,
                         text=True, check=True, timeout=60).stdout
    got: dict[str, int | None] = {}
    for line in out.splitlines():
        if line.startswith("N_"):
            name, _, value = line[2:].partition(" ")
            got[name] = int(value) if value.strip().isdigit() else None
    return got


@pytest.mark.parametrize(("cc", "column"), [("gcc", 1), ("aarch64-linux-gnu-gcc", 2)])
def test_the_numbers_are_the_kernel_headers(cc: str, column: int) -> None:
    """linux-libc-dev's x86_64 table, libc6-dev-arm64-cross's aarch64 one
    (packaging/install-deps.sh installs both)."""
    if shutil.which(cc) is None:
        pytest.skip(f"no {cc} (packaging/install-deps.sh installs it)")
    headers = _header_numbers(cc)
    assert {entry[0]: entry[column] for entry in confine.REFUSED} == headers


# -- the program, run by a BPF interpreter -----------------------------------

def _run_bpf(code: bytes, nr: int, arch: int, args: tuple[int, ...] = (0,) * 6) -> int:
    """What the kernel would return for one call: the classic-BPF subset
    confine.program uses, over struct seccomp_data (little-endian)."""
    args = (*args, 0, 0, 0, 0, 0, 0)[:6]
    data = struct.pack("<iIQ6Q", nr, arch, 0, *(a & (2**64 - 1) for a in args))
    insns = [struct.unpack_from("=HBBI", code, i) for i in range(0, len(code), 8)]
    pc, acc = 0, 0
    for _ in range(len(insns)):
        op, jt, jf, k = insns[pc]
        if op == 0x20:
            (acc,) = struct.unpack_from("<I", data, k)
            pc += 1
        elif op in (0x15, 0x35, 0x45):
            hit = acc == k if op == 0x15 else acc >= k if op == 0x35 else bool(acc & k)
            pc += 1 + (jt if hit else jf)
        elif op == 0x06:
            return k
        else:
            raise AssertionError(f"unknown op {op:#x}")
    raise AssertionError("ran off the end")


ALLOW, DENY, NOSYS = 0x7FFF0000, 0x00050001, 0x00050026


@pytest.mark.parametrize("machine", sorted(confine.ARCHES))
def test_the_program_refuses_the_table_and_nothing_else(machine: str) -> None:
    arch, column, foreign = confine.ARCHES[machine]
    me = 4242
    code = confine.program(machine, me)
    refused = {e[column]: e[3] for e in confine.REFUSED if e[column] is not None}
    for nr in range(0, 512):
        how = refused.get(nr)
        got = _run_bpf(code, nr, arch)
        if how == confine.PLAIN:
            assert got == DENY, nr
        elif how == confine.NOSYS:
            assert got == NOSYS, nr
        elif how == confine.SELF:
            assert got == DENY, nr  # pid 0: the process group
            assert _run_bpf(code, nr, arch, (me, 0, 0)) == ALLOW, nr
            assert _run_bpf(code, nr, arch, (1, 0, 0)) == DENY, nr
            assert _run_bpf(code, nr, arch, (-1, 0, 0)) == DENY, nr
            assert _run_bpf(code, nr, arch, (me | 1 << 32, 0, 0)) == DENY, nr
        elif how == confine.NS:
            assert got == ALLOW, nr  # flags 0: a thread or fork
            assert _run_bpf(code, nr, arch, (0x003D0F00, 0, 0)) == ALLOW  # pthread_create's
            for flag in (0x00020000, 0x10000000, 0x20000000, 0x40000000, 0x04000000):
                assert _run_bpf(code, nr, arch, (flag | 17, 0, 0)) == DENY, (nr, flag)
        else:
            assert got == ALLOW, nr
    # Another ABI: every call refused, even an allowed number.
    for other in (0x40000003, 0x40000028, 0xC00000B7 if machine == "x86_64" else 0xC000003E):
        assert _run_bpf(code, 0, other) == DENY
    if foreign:
        assert _run_bpf(code, foreign | 39, arch) == DENY  # x32's getpid


# -- a confined process of this machine --------------------------------------

def _confined(max_memory: int, then: str) -> dict[str, object]:
    """Fork, confine, run ``then`` (Python, its result in ``out``), report."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.close(r)
            confine.enter(max_memory)
            scope: dict[str, object] = {"confine": confine, "os": os}
            exec(then, scope)
            os.write(w, json.dumps(scope["out"]).encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as fh:
        said = fh.read()
    os.waitpid(pid, 0)
    assert said, "the confined child died"
    return json.loads(said)  # type: ignore[no-any-return]


@pytest.mark.skipif(MACHINE not in confine.ARCHES, reason="no filter for this machine")
def test_each_refused_call_is_refused_in_a_confined_process() -> None:
    got = _confined(0, "out = confine.selftest()")
    assert (got["Seccomp"], got["NoNewPrivs"], got["dumpable"]) == ("2", "1", "0")
    column = confine.ARCHES[MACHINE][1]
    for name, *nrs, how in confine.REFUSED:
        if nrs[column - 1] is not None:
            assert got[name] == ("ENOSYS" if how == confine.NOSYS else "EPERM"), name
    # Unconfined, the same probe is not all refusals (the test can fail).
    if os.geteuid() == 0:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            os.write(w, b"%d" % libc.syscall(117, -1, -1, -1))  # setresuid(-1,-1,-1)
            os._exit(0)
        os.close(w)
        assert os.read(r, 16) == b"0"
        os.waitpid(pid, 0)


@pytest.mark.skipif(MACHINE not in confine.ARCHES, reason="no filter for this machine")
def test_a_confined_process_still_judges() -> None:
    """What a check does: threads (clone3 refused with ENOSYS: glibc falls
    back to clone), a fork, signals to itself, files."""
    then = """
import threading
said = []
t = threading.Thread(target=lambda: said.append("thread")); t.start(); t.join()
os.kill(os.getpid(), 0)
pid = os.fork()
if pid == 0:
    os._exit(7)
said.append(os.waitpid(pid, 0)[1] >> 8)
said.append(len(open("/proc/self/status").read()) > 0)
try:
    os.execv("/bin/true", ["true"])
except OSError as exc:
    said.append(exc.errno)
out = said
"""
    assert _confined(0, then) == ["thread", 7, True, 1]


@pytest.mark.skipif(MACHINE not in confine.ARCHES, reason="no filter for this machine")
def test_a_program_the_kernel_refuses_is_refused_not_skipped() -> None:
    """EINVAL for our program on a kernel that filters (a program that
    allows all installs) is a broken filter: the check must not run. Only a
    kernel without seccomp filters (one built from allnoconfig, as the 64
    KiB test guest's was) runs it unfiltered, and says so."""
    then = """
confine.program = lambda machine, pid: confine._insn(confine._LD_W_ABS, 3)  # misaligned
try:
    out = ["entered", confine.enter(0)]
except confine.Refused as exc:
    out = ["refused", str(exc)]
"""
    assert _confined_raw(then) == ["refused", "seccomp: Invalid argument"]


def test_a_machine_without_a_table_is_confined_but_unfiltered() -> None:
    then = """
import os as real_os
class Fake:
    machine = "riscv64"
confine.os.uname = lambda: Fake()
note = confine.enter(0)
status = open("/proc/self/status").read()
out = [note, "NoNewPrivs:\t1" in status, "Seccomp:\t0" in status]
"""
    assert _confined_raw(then) == ["no system call table for riscv64", True, True]


def _confined_raw(then: str) -> object:
    """Fork and run ``then`` (it calls confine.enter itself)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.close(r)
            scope: dict[str, object] = {"confine": confine}
            exec(then, scope)
            os.write(w, json.dumps(scope["out"]).encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as fh:
        said = fh.read()
    os.waitpid(pid, 0)
    assert said, "the child died"
    return json.loads(said)


def test_the_data_limit_turns_growth_into_memory_error() -> None:
    grow = """
try:
    held = [bytearray(1 << 20) for _ in range(256)]
    out = "grew"
except MemoryError:
    out = "MemoryError"
"""
    assert _confined(64, grow) == "MemoryError"
    assert _confined(0, grow) == "grew"  # the same growth without a limit


@pytest.mark.skipif(MACHINE != "x86_64", reason="i386 calls exist on x86_64 only")
def test_an_i386_call_is_refused(tmp_path: Path) -> None:
    """int $0x80 in a 64-bit process reaches the i386 table with its own
    numbers (20: getpid there, lseek here): the arch word refuses it."""
    src = tmp_path / "i386.c"
    src.write_text(r"""
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <unistd.h>
int main(int argc, char **argv)
{
    static unsigned char code[65536];
    size_t n = fread(code, 1, sizeof(code), stdin);
    struct sock_fprog prog = { (unsigned short)(n / 8), (struct sock_filter *)code };
    long rc;
    if (argc > 1 && (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) ||
             prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog)))
        return 2;
    __asm__ volatile ("int $0x80" : "=a"(rc) : "a"(20L) : "memory");
    printf("%ld\n", rc);
    return 0;
}
""")
    exe = tmp_path / "i386"
    subprocess.run(["gcc", "-O1", "-o", str(exe), str(src)], check=True, timeout=120)
    code = confine.program("x86_64", 1)
    plain = subprocess.run([str(exe)], input=code, capture_output=True, timeout=60)
    if plain.returncode != 0 or int(plain.stdout) <= 0:
        pytest.skip("this kernel has no i386 system calls (IA32_EMULATION off)")
    confined = subprocess.run([str(exe), "filter"], input=code, capture_output=True,
                              timeout=60)
    assert confined.returncode == 0 and int(confined.stdout) == -1  # -EPERM


# -- the node checker's real child ------------------------------------------

BOOT = (f"import sys; sys.path.insert(0, sys.argv[1]); from {contract.CHECKER_MODULE} import "
        f"{contract.CHECKER_FUNCTION} as main; sys.exit(main(sys.argv[2:]))")


def _as_slurmd_runs_it() -> None:  # pragma: no cover - between fork and exec
    """-1000, as sites run slurmd. Lowering it needs CAP_SYS_RESOURCE, which
    a container may lack: then 500, which any process may take, and which
    the child must equally leave for 0."""
    for value in (b"-1000\n", b"500\n"):
        try:
            with open("/proc/self/oom_score_adj", "wb") as fh:
                fh.write(value)
            return
        except OSError:
            continue


def _server(sock: Path, test: str) -> tuple[subprocess.Popen[bytes], int]:
    """A real server as grace_node.c starts it (with a test hook), at the
    OOM standing sites give slurmd; the write end of its life pipe."""
    r, w = os.pipe()
    proc = subprocess.Popen(
        [sys.executable, "-I", "-B", "-c", BOOT, str(REPO), "--socket", str(sock),
         "--code", "x|-", "--life", str(r), "--test", test], pass_fds=(r,), cwd="/", env={},
        preexec_fn=_as_slurmd_runs_it)
    os.close(r)
    return proc, w


def _request(ids: dict[str, int], groups: list[int]) -> bytes:
    body = b"".join(U32.pack(ids[name]) for name in contract.CREDS_IDS)
    body += b"".join(U32.pack(n) for n in (len(groups), *groups))
    body += U32.pack(60_000) + U32.pack(4) + b"x|-\0" + U32.pack(14) + b"/usr/bin:/bin\0"
    return U32.pack(len(body)) + body


def _step(config: bytes, max_memory: int) -> bytes:
    raw: dict[str, object] = {f.name: None for f in contract.FRAME if f.kind == contract.TEXT}
    raw.update(config=config, on_error=b"deny", node=b"n1", code=b"x|-", argv=[b"/bin/true"],
               env=[b"PATH=/usr/bin:/bin"], job_id=12, step_id=0, uid=os.geteuid(), batch=0,
               audit_fd=9, container_local=0, max_memory=max_memory)
    frame = wire.encode_step(raw)
    return U32.pack(len(frame)) + frame


def _ask(sock: Path, request: bytes, step: bytes, fd: int) -> list[tuple[str, bytes]]:
    """One miss as slurmstepd sends it, with a descriptor attached as an
    older plugin did (the audit file's): the records that come back."""
    end = time.monotonic() + 60
    while True:
        conn = socket.socket(socket.AF_UNIX)
        try:
            conn.connect(str(sock))
            break
        except OSError:
            conn.close()
            assert time.monotonic() < end, "the server never listened"
            time.sleep(0.05)
    with conn:
        socket.send_fds(conn, [request], [fd])
        conn.sendall(step)
        conn.settimeout(60)
        data = b""
        while True:
            got = conn.recv(65536)
            if not got:
                break
            data += got
    out = []
    while len(data) >= 5:
        kind, n = struct.unpack_from("=BI", data)
        out.append((chr(kind), data[5:5 + n]))
        data = data[5 + n:]
    assert out and out[-1][0] == "Z", out
    return out


def _serve(tmp_path: Path, test: str, request: bytes, step: bytes) -> tuple[
        list[tuple[str, bytes]], str, int]:
    """The records, the server's OOM standing, the inode of the (audit)
    descriptor sent with the request."""
    sock = tmp_path / "checker" / "socket"
    server, life = _server(sock, test)
    audit_r, audit_w = os.pipe()
    try:
        records = _ask(sock, request, step, audit_w)
        theirs = Path(f"/proc/{server.pid}/oom_score_adj").read_text().strip()
        inode = os.fstat(audit_w).st_ino
    finally:
        os.close(audit_r)
        os.close(audit_w)
        os.close(life)
        assert server.wait(timeout=60) == 0
    return records, theirs, inode


@pytest.mark.skipif(os.geteuid() != 0 or MACHINE not in confine.ARCHES,
                    reason="the server wants root (socket directory, credentials)")
def test_the_node_checkers_child_is_confined(tmp_path: Path) -> None:
    """As slurmstepd asks at user_init: the user's effective ids, root's
    real and saved ones. The child that judges reports what it may do."""
    user = 65534
    ids = dict(ruid=0, euid=user, suid=0, rgid=0, egid=user, sgid=0)
    records, server_oom, audit = _serve(tmp_path, "probe", _request(ids, [user]),
                                 _step(b"/nonexistent.toml", 48))
    [said] = [ast.literal_eval(text.decode()) for kind, text in records if kind == "L"]
    assert server_oom in ("-1000", "500")
    assert said["oom_score_adj"] == "0"
    assert (said["Seccomp"], said["NoNewPrivs"], said["dumpable"]) == ("2", "1", "0")
    # Its data limit: what it had, plus 48 MiB.
    assert 48 << 20 < int(said["RLIMIT_DATA"]) < (48 << 20) + (1 << 30)
    column = confine.ARCHES[MACHINE][1]
    for name, *nrs, how in confine.REFUSED:
        if nrs[column - 1] is not None:
            assert said[name] == ("ENOSYS" if how == confine.NOSYS else "EPERM"), name
    # The audit descriptor sent with the request is not among its files.
    inodes = [int(item.partition(":")[2]) for item in said["fds"].split()]
    assert inodes and audit not in inodes, said["fds"]


@pytest.mark.skipif(os.geteuid() != 0, reason="the server wants a socket directory of root's")
@pytest.mark.parametrize("max_memory", [64, 0])
def test_a_check_that_grows_past_max_memory_ends_as_check_limit(tmp_path: Path,
                                                                max_memory: int) -> None:
    """The ``hog`` hook makes the real child's check allocate up to 1 GiB
    before it looks at the program: past max_memory that is check-limit
    (on_error decides), not a dead child, an OOM kill or a traceback."""
    from grace_policy.compiled import compile_config

    config = tmp_path / "grace-policy.toml"
    config.write_text('mode = "enforce"\ndeadline_ms = 60000\n')
    compile_config(str(config))
    ids = dict(zip(("ruid", "euid", "suid"), os.getresuid()))
    ids.update(zip(("rgid", "egid", "sgid"), os.getresgid()))
    records, _, _ = _serve(tmp_path, "hog", _request(ids, os.getgroups()),
                        _step(os.fsencode(config), max_memory))
    text = b"\n".join(t for _k, t in records).decode()
    assert "Traceback" not in text
    kinds = [k for k, _t in records]
    assert kinds[0] == "A" and kinds[-2:] == ["R", "Z"], records
    if max_memory:
        assert "check-limit" in text or "max_memory" in text, text
        assert "the check needed more memory than max_memory= allows" in text, text
    else:
        assert "max_memory" not in text, text


@pytest.mark.parametrize(("value", "want", "error"), [
    (None, 512, None), ("0", 0, None), ("16", 16, None), ("1048576", 1 << 20, None),
    ("8", 512, "max_memory must be 0 or 16..1048576 (MiB), not '8'"),
    ("1G", 512, "max_memory must be 0 or 16..1048576 (MiB), not '1G'"),
    ("-1", 512, "max_memory must be 0 or 16..1048576 (MiB), not '-1'"),
])
def test_max_memory_is_read_as_the_plugin_reads_it(value: str | None, want: int,
                                                   error: str | None) -> None:
    """plugstack.py mirrors grace_spank.c (its messages are checked on the
    real Slurm: tests/slurm/test_nodecheck.py test_checker_arguments_are_checked)."""
    from grace_policy import plugstack

    args = ["config=/etc/g.toml"] + ([f"max_memory={value}"] if value is not None else [])
    entry = plugstack.PluginLine("plugstack.conf", 1, "required", "spank_grace_policy.so", args)
    plugstack.parse_args(entry)
    assert (entry.max_memory, entry.error) == (want, error)


def test_config_check_says_what_max_memory_does(tmp_path: Path) -> None:
    cfg = tmp_path / "gp.toml"
    cfg.write_text('mode = "enforce"\n')
    stack = tmp_path / "plugstack.conf"
    for arg, said in (("", "check memory: 512 MiB beyond what its process starts with"),
                      ("max_memory=0", "check memory: unlimited (max_memory=0)")):
        stack.write_text(f"required /usr/lib/slurm/spank_grace_policy.so config={cfg} {arg}\n")
        done = subprocess.run(
            [sys.executable, "-m", "grace_policy", "config", "check", "--plugstack", str(stack),
             str(cfg)], capture_output=True, text=True, cwd=REPO, check=False,
            env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)
        assert said in done.stdout, done.stdout + done.stderr
