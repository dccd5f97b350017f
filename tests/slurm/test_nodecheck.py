"""checker=node: the pre-started checker per node (spank/grace_node.c,
grace_policy/nodecheck.py), on the real one-node Slurm.

slurmd starts the server at its own start, so every test here restarts
slurmd with the plugstack line it needs. A cold step judged by the server's
child gets the verdict and audit line the in-slurmstepd helper gives; a
killed server means today's path, said once; a hung child costs timeout_ms
and on_error decides; slurmd's stop ends the server; an unprivileged user
can reach neither the socket nor, with the permissions opened up, the
server (it wants uid 0 at the other end); and the child reads files with
the user's uid and groups, not root's. The one fault the real code cannot be
made to show (a check that hangs) is the test build's hook
(test_checker=hang, make plugin-testhooks).
"""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from .harness import SlurmEnv

pytestmark = pytest.mark.slurm

PREFIX = "grace-policy: "
REFUSED = f"{PREFIX}this step was refused: the site's launch check could not run"
SAY = 'echo JOBID=$SLURM_JOB_ID; echo VENV=$VIRTUAL_ENV'


def _socket(env: SlurmEnv) -> Path:
    return env.checker_socket


def _line(env: SlurmEnv, plugin: Path | str, checker: str, *extra: str) -> None:
    env.set_plugin_line(plugin, f"config={env.configs['base']}", f"audit={env.audit_log}",
                        f"checker={checker}", f"checker_socket={_socket(env)}", *extra)


def _servers(env: SlurmEnv) -> list[int]:
    """Live processes of the node checker on our socket (server and children)."""
    want = f"--socket\0{_socket(env)}\0".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes()
            state = (entry / "stat").read_text().rpartition(")")[2].split()[0]
        except OSError:
            continue
        if want in cmd and state != "Z":
            pids.append(int(entry.name))
    return pids


def _server(env: SlurmEnv) -> int:
    """The listening server: the one whose parent is none of them."""
    pids = _servers(env)
    for pid in pids:
        ppid = int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[1])
        if ppid not in pids:
            return pid
    raise AssertionError(f"no node checker on {_socket(env)}: {pids}")


def _listening(env: SlurmEnv) -> bool:
    """A socket listens at the checker's path (/proc/net/unix, __SO_ACCEPTCON).
    A new server's pid shows before its listen(), and the old server's file
    can outlive it: a step started in between is "not reachable" (seen in
    the 24.11 root under load)."""
    want = str(_socket(env))
    try:
        lines = Path("/proc/net/unix").read_text().splitlines()[1:]
    except OSError:
        return False
    for line in lines:
        fields = line.split()
        if len(fields) >= 8 and fields[7] == want and int(fields[3], 16) & 0x10000:
            return True
    return False


def _wait(what: object, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if what():  # type: ignore[operator]
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _restart(env: SlurmEnv) -> int:
    """slurmd restarted on the current plugstack: its new server listens."""
    old = _servers(env)
    env.cluster.restart_slurmd()
    _wait(lambda: any(p not in old for p in _servers(env)) and _listening(env))
    return _server(env)


def _start(env: SlurmEnv, plugin: Path | str, *extra: str) -> int:
    """plugstack with checker=node, slurmd restarted: the server is up."""
    _line(env, plugin, "node", *extra)
    return _restart(env)


@pytest.fixture(scope="module")
def hooks_prefix(slurm: SlurmEnv) -> Path:
    """The test build of the stub in a copy of the install."""
    return slurm.testhooks_prefix("nodecheck-hooks")


@pytest.fixture
def node(slurm: SlurmEnv) -> Iterator[SlurmEnv]:
    yield slurm
    # Back to the plugin as every other test file has it: the base line at
    # slurmd's start, so its server (the default checker=node), none older.
    old = _servers(slurm)
    slurm.use("base")
    slurm.cluster.restart_slurmd()
    _wait(lambda: bool(_servers(slurm)) and not set(old) & set(_servers(slurm))
          and _listening(slurm))
    state = slurm.cluster.settled_node_state()
    assert state in ("idle", "mixed", "allocated"), (state, slurm.cluster.node_reason())


def _srun(slurm: SlurmEnv, argv: list[str], **kw: object) -> tuple[
        subprocess.CompletedProcess[str], dict[str, object] | None]:
    """Run a step as nobody; its audit record (None if it wrote none)."""
    before = len(slurm.audit_lines())
    res = slurm.cluster.srun(argv, user="nobody", timeout=90, **kw)
    assert "Traceback" not in res.stderr + res.stdout
    new = [json.loads(line) for line in slurm.audit_lines()[before:]]
    new = [r for r in new if r.get("step_id") not in ("extern",)]
    return res, (new[-1] if new else None)


def _same(record: dict[str, object]) -> dict[str, object]:
    """What must not depend on who ran the check."""
    keep = ("action", "mode", "failure", "env_unset", "env_set", "program", "findings",
            "uid", "error")
    out = {k: record.get(k) for k in keep}
    out["findings"] = [{k: v for k, v in f.items() if k != "elapsed_ms"}
                       for f in (record.get("findings") or [])]  # type: ignore[attr-defined]
    return out


def _fallbacks(env: SlurmEnv, since: int) -> list[str]:
    text = env.cluster.slurmd_log_text()[since:]
    return [line for line in text.splitlines() if "(failure checker)" in line]


def _judged_by_fallback(env: SlurmEnv, why: str) -> None:
    """A foreign binary is still refused (the check really ran, in today's
    helper), and slurmd's log says once why the node checker was not used."""
    since = len(env.cluster.slurmd_log_text())
    res, record = _srun(env, [str(env.files / "foreign")])
    assert res.returncode != 0 and REFUSED not in res.stderr, res.stderr
    assert record is not None and record["action"] == "reject", record
    said = _fallbacks(env, since)
    assert len(said) == 1 and why in said[0], said


def _cases(env: SlurmEnv) -> dict[str, tuple[list[str], dict[str, str]]]:
    return {
        "clean": (["sh", "-c", SAY], {}),
        "rejected": ([str(env.files / "foreign")], {}),
        "env-edit": (["sh", "-c", SAY], {"VIRTUAL_ENV": str(env.files / "venv-foreign")}),
        "python": (["/usr/bin/python3", "-c", "pass"], {}),
    }


def test_node_checker_judges_as_the_helper_does(node: SlurmEnv) -> None:
    """The same steps, cold, judged by the server's child and by the helper
    slurmstepd forks: the same verdict, user lines and audit line, and no
    fallback said - the node checker judged them."""
    server = _start(node, node.plugin, "cache_dir=none")
    since = len(node.cluster.slurmd_log_text())
    seen: dict[str, dict[str, object]] = {}
    for name, (argv, env) in _cases(node).items():
        res, record = _srun(node, argv, env=env)
        assert record is not None, (name, res.stderr)
        seen[name] = {"rc": res.returncode == 0, "user": res.stderr.count(PREFIX),
                      **_same(record)}
    assert _fallbacks(node, since) == []
    assert _server(node) == server  # still the one slurmd started
    assert seen["clean"]["action"] == "allow" and seen["rejected"]["action"] == "reject"
    assert seen["env-edit"]["env_unset"] == ["VIRTUAL_ENV"], seen["env-edit"]
    _line(node, node.plugin, "step", "cache_dir=none")
    for name, (argv, env) in _cases(node).items():
        res, record = _srun(node, argv, env=env)
        assert record is not None, (name, res.stderr)
        assert {"rc": res.returncode == 0, "user": res.stderr.count(PREFIX),
                **_same(record)} == seen[name], name


def test_default_line_is_judged_by_the_node_checker(node: SlurmEnv) -> None:
    """The base line names no checker=: slurmd started with it runs a
    server, and a cold step is judged by it (no fallback said)."""
    assert "checker=" not in node.cluster.plugstack.read_text().replace("checker_socket=", "")
    node.use("base", "cache_dir=none")
    server = _restart(node)
    since = len(node.cluster.slurmd_log_text())
    for name, (argv, env) in _cases(node).items():
        res, record = _srun(node, argv, env=env)
        assert record is not None and record.get("failure") is None, (name, res.stderr)
    assert _fallbacks(node, since) == []
    assert _server(node) == server


def test_no_plugin_line_no_server(node: SlurmEnv) -> None:
    """A slurmd whose plugstack has no line of ours starts no checker."""
    node.cluster.set_plugstack(["# no grace-policy here"])
    node.cluster.restart_slurmd()
    _wait(lambda: not _servers(node))
    time.sleep(2)  # time enough for a server to bind, if one would
    assert not _servers(node) and not _socket(node).exists()


def test_concurrent_steps_each_get_a_child(node: SlurmEnv) -> None:
    """Four cold steps at once: four children, four verdicts, no fallback."""
    from concurrent.futures import ThreadPoolExecutor

    _start(node, node.plugin, "cache_dir=none")
    since = len(node.cluster.slurmd_log_text())
    before = len(node.audit_lines())
    cmds = [["sh", "-c", f"echo JOBID=$SLURM_JOB_ID; exit {i % 2}"] for i in range(4)]
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(
            lambda argv: node.cluster.srun(argv, user="nobody", timeout=120), cmds))
    assert [r.returncode for r in results] == [0, 1, 0, 1], [r.stderr for r in results]
    records = [json.loads(line) for line in node.audit_lines()[before:]]
    assert sorted(r["action"] for r in records) == ["allow"] * 4, records
    assert _fallbacks(node, since) == []


def test_batch_step_is_judged_by_the_node_checker(node: SlurmEnv) -> None:
    """The batch step (its script read too) goes the same way: one audit
    record as checker=step writes it, no fallback."""
    seen = []
    for checker in ("node", "step"):
        if checker == "node":
            _start(node, node.plugin)
        else:
            _line(node, node.plugin, "step")
        since = len(node.cluster.slurmd_log_text())
        before = len(node.audit_lines())
        out = node.side_file(f"nodecheck-batch-{checker}.out")
        job = node.cluster.sbatch("#!/bin/sh\necho batch-ran\n", ["-o", str(out)],
                                  user="nobody")
        assert node.cluster.wait_job(job) == "COMPLETED"
        assert out.read_text().strip() == "batch-ran"
        records = [json.loads(line) for line in node.audit_lines()[before:]]
        [record] = [r for r in records if r.get("step_id") == "batch"]
        assert _fallbacks(node, since) == []
        same = _same(record)
        same["program"] = os.path.basename(str(same["program"]))  # job<N>/slurm_script
        seen.append(same)
    assert seen[0] == seen[1] and seen[0]["action"] == "allow", seen


def test_warm_step_never_reaches_the_checker_and_cold_stores(node: SlurmEnv) -> None:
    """A cold step judged by the node checker stores its entry (C writes the
    'C' record the child sent); the same step then hits."""
    _start(node, node.plugin)
    cmd = ["sh", "-c", "echo warm-$SLURM_JOB_ID"]
    _srun(node, cmd)
    res, record = _srun(node, cmd)
    assert res.returncode == 0 and record is not None, res.stderr
    assert record.get("cache") == "hit", record


def _fill_backlog(path: Path, cap: int = 6000) -> list[socket.socket]:
    """Connections to a server that is not accepting, until the kernel says
    its listen backlog is full (EAGAIN): what a job array of hundreds of
    steps starting at once does to it."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < cap + 100:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, cap + 100), hard))
    held: list[socket.socket] = []
    for _ in range(cap):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.setblocking(False)
        try:
            s.connect(str(path))
        except BlockingIOError:
            s.close()
            return held
        except BaseException:
            s.close()
            raise
        held.append(s)
    for s in held:
        s.close()
    raise AssertionError(f"the backlog of {path} took {cap} connections")


def test_a_full_backlog_is_busy_not_dead(node: SlurmEnv) -> None:
    """More steps at once than the server has accepted (R1): connect's
    EAGAIN. The step is checked by its own helper and nothing is marked, so
    when the server really dies later, that is still said. The backlog is
    the kernel's cap (4096 here), not 128."""
    server = _start(node, node.plugin, "cache_dir=none")
    os.kill(server, signal.SIGSTOP)  # accepts nothing: every connect waits in the backlog
    held: list[socket.socket] = []
    try:
        held = _fill_backlog(_socket(node))
        assert len(held) > 1000, len(held)
        since = len(node.cluster.slurmd_log_text())
        res, record = _srun(node, [str(node.files / "foreign")])
        assert res.returncode != 0 and REFUSED not in res.stderr, res.stderr
        assert record is not None and record["action"] == "reject", record
        assert _fallbacks(node, since) == []
        assert not Path(f"{_socket(node)}.down").exists()
    finally:
        for s in held:
            s.close()
        try:  # (in the 26.05 root it was once gone already: only its end matters)
            os.kill(server, signal.SIGKILL)
            os.kill(server, signal.SIGCONT)
        except ProcessLookupError:
            pass
    _wait(lambda: server not in _servers(node))
    for pid in _servers(node):  # its spare or a check child, if any
        try:  # (a child can end between the listing and the kill: seen in the 24.11 root)
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    _wait(lambda: not _servers(node))
    since = len(node.cluster.slurmd_log_text())
    res, record = _srun(node, ["sh", "-c", SAY])
    assert res.returncode == 0 and record is not None, res.stderr
    said = _fallbacks(node, since)
    assert len(said) == 1 and "not reachable" in said[0], said


def test_killed_server_falls_back_and_says_so_once(node: SlurmEnv) -> None:
    server = _start(node, node.plugin, "cache_dir=none")
    os.kill(server, signal.SIGKILL)
    _wait(lambda: not _servers(node))
    since = len(node.cluster.slurmd_log_text())
    res, record = _srun(node, ["sh", "-c", SAY])
    assert res.returncode == 0 and record is not None, res.stderr
    assert record["action"] == "allow" and record.get("failure") is None, record
    res, record = _srun(node, [str(node.files / "foreign")])
    assert res.returncode != 0 and REFUSED not in res.stderr, res.stderr
    assert record is not None and record["action"] == "reject", record
    said = _fallbacks(node, since)
    assert len(said) == 1 and "not reachable" in said[0], said
    assert str(_socket(node)) in said[0], said


def test_other_install_is_not_served(node: SlurmEnv, hooks_prefix: Path) -> None:
    """A step of another install (another plugin dir) is not judged by a
    server that loaded this one: 'V', today's path, the reason logged."""
    _start(node, node.plugin, "cache_dir=none")
    _line(node, hooks_prefix / "lib" / "slurm" / "spank_grace_policy.so", "node",
          "cache_dir=none")
    _judged_by_fallback(node, "the node checker is stale")


def test_changed_install_ends_the_server(node: SlurmEnv) -> None:
    """A module file the server loaded gets a new identity (a reinstall):
    the next miss is checked by today's helper, says why, and the server
    exits rather than judge with code that is no longer the install's."""
    prefix = node.copy_prefix("prefix-nodecheck-stale")
    plugin = prefix / "lib" / "slurm" / "spank_grace_policy.so"
    server = _start(node, plugin, "cache_dir=none")
    module = prefix / "lib" / "grace-policy" / "python" / "grace_policy" / "decide.py"
    module.write_bytes(module.read_bytes())  # same text, new mtime
    _judged_by_fallback(node, "decide.py changed since the checker started")
    _wait(lambda: not Path(f"/proc/{server}").exists(), timeout=20)


def test_replaced_module_not_loaded_ends_the_server(node: SlurmEnv) -> None:
    """An upgrade that replaces a module the server never imported (image/,
    loaded by the first container step): the stamp covers the whole
    package, so the next miss is not judged with old and new code mixed."""
    prefix = node.copy_prefix("prefix-nodecheck-stale-tree")
    plugin = prefix / "lib" / "slurm" / "spank_grace_policy.so"
    server = _start(node, plugin, "cache_dir=none")
    module = prefix / "lib" / "grace-policy" / "python" / "grace_policy" / "image" / "sif.py"
    data = module.read_bytes()
    module.unlink()  # as an installer replaces it: a new inode
    module.write_bytes(data)
    _judged_by_fallback(node, "sif.py changed since the checker started")
    _wait(lambda: not Path(f"/proc/{server}").exists(), timeout=20)


@pytest.mark.parametrize("on_error", ["allow", "deny"])
def test_hung_checker_costs_the_deadline_and_on_error_decides(
        node: SlurmEnv, hooks_prefix: Path, on_error: str) -> None:
    plugin = hooks_prefix / "lib" / "slurm" / "spank_grace_policy.so"
    _start(node, plugin, "cache_dir=none", "test_checker=hang", "timeout_ms=1500",
           f"on_error={on_error}")
    res, record = _srun(node, ["sh", "-c", SAY])
    assert record is not None, res.stderr
    assert (record["failure"], record["action"]) == (
        "timeout", "allow" if on_error == "allow" else "reject"), record
    if on_error == "deny":
        assert res.returncode != 0 and REFUSED in res.stderr, res.stderr
    else:
        assert res.returncode == 0, res.stderr
    # The hung child ends itself shortly after the deadline (its own timer):
    # only the server and its next spare are left.
    _wait(lambda: len(_servers(node)) == 2, timeout=20)


def test_slurmd_stop_ends_the_server(node: SlurmEnv) -> None:
    server = _start(node, node.plugin)
    node.cluster.restart_slurmd()  # TERM: slurmd's own shutdown, then a new slurmd
    _wait(lambda: not Path(f"/proc/{server}").exists(), timeout=20)
    assert _server(node) != server  # the new slurmd started its own


def test_slurmd_killed_ends_the_server(node: SlurmEnv) -> None:
    """No shutdown code runs at all: the pipe's EOF is enough."""
    server = _start(node, node.plugin)
    node.cluster.procs["slurmd"].kill()
    node.cluster.procs["slurmd"].wait(timeout=15)
    _wait(lambda: not Path(f"/proc/{server}").exists(), timeout=20)


CONNECT = """
import socket, sys
s = socket.socket(socket.AF_UNIX)
try:
    s.connect(sys.argv[1])
except OSError as exc:
    print("CONNECT", type(exc).__name__)
    sys.exit(0)
s.settimeout(10)
print("CONNECT ok", "EOF" if s.recv(1) == b"" else "DATA")
"""


def test_socket_directory_of_a_user_is_refused(node: SlurmEnv) -> None:
    """A checker_socket whose directory a user owns (who could then swap the
    socket): no server starts there; steps are checked by today's helper."""
    theirs = node.cluster.root / "run" / "nobody-checker"
    theirs.mkdir(exist_ok=True)
    os.chown(theirs, int(subprocess.run(["id", "-u", "nobody"], capture_output=True,
                                        text=True, check=True).stdout), 0)
    sock = theirs / "socket"
    node.set_plugin_line(node.plugin, f"config={node.configs['base']}",
                         f"audit={node.audit_log}", "checker=node", f"checker_socket={sock}",
                         "cache_dir=none")
    node.cluster.restart_slurmd()
    since = len(node.cluster.slurmd_log_text())
    time.sleep(2)  # time enough for a server to bind, if one would
    assert not sock.exists()
    res, record = _srun(node, ["sh", "-c", SAY])
    assert res.returncode == 0 and record is not None, res.stderr
    assert record["action"] == "allow" and record.get("failure") is None, record
    said = _fallbacks(node, since)
    assert len(said) == 1 and "not reachable" in said[0], said
    # The user binds a socket of their own there: slurmstepd will not talk
    # to it (SO_PEERCRED: not root's) and checks the step itself.
    Path(f"{sock}.down").unlink()
    fake = subprocess.Popen(["/usr/bin/python3", "-I", "-c",
                             "import socket,sys,time; s=socket.socket(socket.AF_UNIX); "
                             "s.bind(sys.argv[1]); s.listen(8); time.sleep(120)", str(sock)],
                            user="nobody", group=pwd.getpwnam("nobody").pw_gid,
                            extra_groups=[], cwd="/")
    try:
        _wait(sock.exists)
        _judged_by_fallback(node, "the process at the socket is not root's")
    finally:
        fake.kill()
        fake.wait(timeout=10)


def test_unprivileged_user_cannot_reach_the_server(node: SlurmEnv) -> None:
    """nobody cannot connect (root's 0700 directory, a 0600 socket); with
    both opened up, the server still hangs up on a peer that is not root,
    without forking a child for it."""
    _start(node, node.plugin)
    runuser = shutil.which("runuser") or "/usr/sbin/runuser"
    cmd = [runuser, "-u", "nobody", "--", "/usr/bin/python3", "-I", "-c", CONNECT,
           str(_socket(node))]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False)
    assert done.stdout.strip() == "CONNECT PermissionError", done.stdout + done.stderr
    parent = _socket(node).parent
    modes = [(p, p.stat().st_mode & 0o7777)
             for p in (node.cluster.root, node.cluster.root / "run", parent, _socket(node))]
    try:
        for p, mode in modes:
            p.chmod(mode | 0o777 if p == _socket(node) else mode | 0o755)
        before = len(_servers(node))
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False)
        assert done.stdout.strip() == "CONNECT ok EOF", done.stdout + done.stderr
        assert len(_servers(node)) == before
    finally:
        for p, mode in modes:
            p.chmod(mode)


def test_child_reads_with_the_users_uid_and_groups(node: SlurmEnv) -> None:
    """A program in a directory only root may enter is judged unreadable for
    nobody; one in a directory of nobody's group (mode 0750, root-owned) is
    judged readable - the child had the user's uid and the user's groups."""
    src = node.files / "native"
    rootonly = node.cluster.shared / "nodecheck-root"
    bygroup = node.cluster.shared / "nodecheck-group"
    group = int(subprocess.run(["id", "-g", "nobody"], capture_output=True, text=True,
                               check=True).stdout)
    for d, mode, gid in ((rootonly, 0o700, 0), (bygroup, 0o750, group)):
        d.mkdir(exist_ok=True)
        shutil.copy2(src, d / "native")
        os.chown(d, 0, gid)
        d.chmod(mode)
    _start(node, node.plugin, "cache_dir=none")
    since = len(node.cluster.slurmd_log_text())
    out = node.side_file("nodecheck-native.out")
    res, record = _srun(node, [str(bygroup / "native"), str(out)])
    assert res.returncode == 0 and record is not None, res.stderr
    assert record["action"] == "allow" and record.get("failure") is None, record
    assert "exe-unreadable" not in record["rules"], record  # type: ignore[operator]
    res, record = _srun(node, [str(rootonly / "native"), str(out)])
    assert record is not None, res.stderr
    assert record.get("failure") is None, record
    assert "exe-unreadable" in record["rules"], record  # type: ignore[operator]
    assert _fallbacks(node, since) == []
    verdict_node = _same(record)
    _line(node, node.plugin, "step", "cache_dir=none")
    _res, record = _srun(node, [str(rootonly / "native"), str(out)])
    assert record is not None and _same(record) == verdict_node, record


@pytest.mark.parametrize(("arg", "said"), [
    ("checker=yes", "checker must be node or step, not 'yes'"),
    ("checker_socket=run/sock", "checker_socket must be an absolute path, not 'run/sock'"),
    # The hook exists only in the test build (make plugin-testhooks).
    ("test_checker=hang", "unknown plugstack argument 'test_checker=hang'"),
    ("max_memory=8", "max_memory must be 0 or 16..1048576 (MiB), not '8'"),
    ("max_memory=1G", "max_memory must be 0 or 16..1048576 (MiB), not '1G'"),
])
def test_checker_arguments_are_checked(node: SlurmEnv, arg: str, said: str) -> None:
    node.set_plugin_line(node.plugin, f"config={node.configs['base']}",
                         f"audit={node.audit_log}", arg)
    res = node.cluster.srun(["sh", "-c", "echo JOBID=$SLURM_JOB_ID"], user="nobody",
                            timeout=60)
    job = re.search(r"JOBID=(\d+)", res.stdout)
    assert job, res.stdout + res.stderr
    log = [line for line in node.cluster.slurmd_log_text().splitlines()
           if f"{PREFIX}error: job {job.group(1)} step 0:" in line]
    assert len(log) == 1 and said in log[0], log


def test_stale_gpu_facts_are_removed_by_a_checker_without_nvml(node: SlurmEnv) -> None:
    """slurmd hands the server cache_dir (grace_node.c's --cache-dir); the
    server, finding no NVML answer on this GPU-less machine, removes GPU
    facts an earlier checker published there, so no entry keyed on them is
    replayed any more (docs/CUDA.md "The verdict cache")."""
    from grace_policy import __version__

    cache = node.cluster.root.parent / "cache-gpu-facts"
    if cache.exists():
        shutil.rmtree(cache)
    cache.mkdir(mode=0o700)
    facts = cache / f"gpus.v{__version__}"
    facts.write_text("0:sm_90 cuda 13.5")
    facts.chmod(0o600)
    server = _start(node, node.plugin, f"cache_dir={cache}")
    cmd = Path(f"/proc/{server}/cmdline").read_bytes()
    assert f"\0--cache-dir\0{cache}\0".encode() in cmd, cmd
    _wait(lambda: not facts.exists())


def _probe(node: SlurmEnv, since: int) -> dict[str, str]:
    """What the probe hook's child said of itself (its one log line)."""
    import ast

    said = [line.partition(" step 0: ")[2] for line in
            node.cluster.slurmd_log_text()[since:].splitlines()
            if PREFIX in line and "'Seccomp':" in line]
    assert len(said) == 1, said
    return ast.literal_eval(said[0])  # type: ignore[no-any-return]


def test_the_child_that_judges_is_confined(node: SlurmEnv, hooks_prefix: Path) -> None:
    """The real child of the real server, asked by slurmstepd for nobody's
    step (test_checker=probe: it reports instead of judging): the filter
    (no way back to root, no exec, no trace, no signal to others), no new
    privileges, not dumpable, max_memory above what it had, OOM standing 0,
    and no audit descriptor (slurmstepd writes the line)."""
    from grace_policy.checker import confine

    plugin = hooks_prefix / "lib" / "slurm" / "spank_grace_policy.so"
    _start(node, plugin, "cache_dir=none", "test_checker=probe", "max_memory=48")
    since = len(node.cluster.slurmd_log_text())
    res, _record = _srun(node, ["sh", "-c", SAY])  # (the hook writes no audit line)
    assert res.returncode == 0, res.stderr
    said = _probe(node, since)
    assert (said["Seccomp"], said["NoNewPrivs"], said["dumpable"]) == ("2", "1", "0"), said
    assert said["oom_score_adj"] == "0", said
    assert 48 << 20 < int(said["RLIMIT_DATA"]) < (48 << 20) + (1 << 30), said
    column = confine.ARCHES[os.uname().machine][1]
    for name, *nrs, how in confine.REFUSED:
        if nrs[column - 1] is not None:
            assert said[name] == ("ENOSYS" if how == confine.NOSYS else "EPERM"), name
    audit = os.stat(node.audit_log)
    for item in said["fds"].split():
        assert int(item.partition(":")[2]) != audit.st_ino, said["fds"]


def test_a_check_past_max_memory_is_check_limit(node: SlurmEnv, hooks_prefix: Path) -> None:
    """test_checker=hog: the real child's check allocates up to 1 GiB before
    it looks at the program. With max_memory=64 it stops at the limit: a
    check-limit finding, on_error decides, the audit line says why; no
    traceback, no dead child (no fallback to slurmstepd's helper)."""
    plugin = hooks_prefix / "lib" / "slurm" / "spank_grace_policy.so"
    _start(node, plugin, "cache_dir=none", "test_checker=hog", "max_memory=64",
           "on_error=allow")
    since = len(node.cluster.slurmd_log_text())
    res, record = _srun(node, ["sh", "-c", SAY])
    assert res.returncode == 0 and record is not None, res.stderr
    assert "check-limit" in record["rules"], record  # type: ignore[operator]
    assert "max_memory" in str(record.get("error")), record
    assert _fallbacks(node, since) == []
