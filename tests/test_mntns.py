"""grace_policy/checker/mntns.py: finding a job's mount namespace in the
mount table and entering it, against real namespaces.

The holders are made as job_container/tmpfs makes them: a process in a new
mount namespace (``unshare --mount``), its ``/proc/PID/ns/mnt`` bind-mounted
onto ``BASE/NODE/JOB/.ns``. Entering happens in a forked child, as in the
node checker; the test process itself never changes namespace.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from grace_policy.checker import mntns

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None,
    reason="making a mount namespace and its holder needs root and unshare (util-linux)")

MOUNTINFO = """\
22 1 0:21 / / rw,relatime - ext4 /dev/vda rw
113 27 0:4 mnt:[4026532176] /srv/jc/node1/77/.ns rw - nsfs nsfs rw
114 27 0:4 mnt:[4026532180] /srv/jc/node1/177/.ns rw - nsfs nsfs rw
115 27 0:4 net:[4026532190] /run/netns/77 rw - nsfs nsfs rw
116 27 0:4 mnt:[4026532199] /srv/ns\\040base/node1/88/.ns/mnt rw - nsfs nsfs rw
117 27 0:50 / /srv/jc/node1/99/.ns rw - tmpfs tmpfs rw
"""


def test_holders_are_the_jobs_mount_namespaces_only(tmp_path: Path) -> None:
    """Only nsfs mounts of a mount namespace, at JOB/.ns (tmpfs) or
    JOB/.ns/mnt (namespace/linux), of exactly that job id."""
    info = tmp_path / "mountinfo"
    info.write_text(MOUNTINFO)
    assert mntns.holders(77, str(info)) == {"/srv/jc/node1/77/.ns": "mnt:[4026532176]"}
    assert mntns.holders(177, str(info)) == {"/srv/jc/node1/177/.ns": "mnt:[4026532180]"}
    assert mntns.holders(88, str(info)) == {"/srv/ns base/node1/88/.ns/mnt": "mnt:[4026532199]"}
    assert mntns.holders(7, str(info)) == {}
    assert mntns.holders(99, str(info)) == {}  # not an nsfs mount


@pytest.fixture
def hold() -> Iterator[Callable[..., str]]:
    """``hold(job, node)``: a new mount namespace held for ``job`` (its
    ``mnt:[INODE]``); all undone afterwards."""
    root = Path(tempfile.mkdtemp(prefix="grace-mntns-"))
    root.chmod(0o755)  # the holder opens for anyone: setns itself is what fails
    made: list[tuple[subprocess.Popen[bytes], Path]] = []

    def _hold(job: int, node: str = "node1") -> str:
        proc = subprocess.Popen(["unshare", "--mount", "--propagation", "private",
                                 "sleep", "120"])
        holder = root / node / str(job) / ".ns"
        holder.parent.mkdir(parents=True, exist_ok=True)
        holder.touch()
        made.append((proc, holder))
        space = ""
        for _ in range(100):  # until unshare has exec'd sleep in its namespace
            space = os.readlink(f"/proc/{proc.pid}/ns/mnt")
            if space != os.readlink("/proc/self/ns/mnt"):
                break
            time.sleep(0.05)
        subprocess.run(["mount", "--bind", f"/proc/{proc.pid}/ns/mnt", str(holder)], check=True)
        return space

    try:
        yield _hold
    finally:
        for proc, holder in made:
            subprocess.run(["umount", str(holder)], capture_output=True, check=False)
            proc.kill()
            proc.wait()
        shutil.rmtree(root, ignore_errors=True)


def _in_child(job: int, uid: int | None = None) -> str:
    """Fork; the child (optionally as ``uid`` first) calls mntns.enter and
    reports what it got and the namespace it is in then."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read)
            if uid is not None:
                os.setresuid(uid, uid, uid)
            view = mntns.enter(job)
            said = f"{view.entered}|{view.problem}|{os.readlink('/proc/self/ns/mnt')}"
            os.write(write, said.encode())
        except BaseException as exc:
            os.write(write, f"{type(exc).__name__}: {exc}".encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as fh:
        out = fh.read().decode()
    os.waitpid(pid, 0)
    return out


def test_child_enters_the_jobs_namespace_and_the_parent_stays(
        hold: Callable[..., str]) -> None:
    job = 900000 + os.getpid() % 90000
    space = hold(job)
    ours = os.readlink("/proc/self/ns/mnt")
    assert space != ours
    assert _in_child(job) == f"True|None|{space}"
    assert os.readlink("/proc/self/ns/mnt") == ours
    # A job without a namespace of its own: judged where we are.
    assert _in_child(job + 1) == f"False|None|{ours}"


def test_unenterable_namespace_is_a_problem_not_the_wrong_view(
        hold: Callable[..., str]) -> None:
    """Without CAP_SYS_ADMIN setns fails; two namespaces held for one job
    are ambiguous. Either way the child stays where it is and says why."""
    job = 800000 + os.getpid() % 90000
    hold(job)
    ours = os.readlink("/proc/self/ns/mnt")
    entered, problem, where = _in_child(job, uid=65534).split("|")
    assert (entered, where) == ("False", ours)
    assert f"cannot judge job {job} in its own mount namespace" in problem
    assert "setns" in problem and "not permitted" in problem, problem
    assert problem.endswith("not judged in the host's view"), problem
    hold(job, node="node2")
    entered, problem, where = _in_child(job).split("|")
    assert (entered, where) == ("False", ours)
    assert "2 mount namespaces are held" in problem
