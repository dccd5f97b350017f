"""Named pyxis containers on a real Slurm 22.05 with real pyxis 0.24.0 and
enroot 4.1.2 (``srun --container-name=NAME``; issue 25 item 3).

A first step makes the container from a clean local ``.sqsh``; later steps
reuse its root as the user left it. After an aarch64 program is copied into
that root by hand (as the user), the same step is refused with our message
naming the path in the container, and in warn mode it runs and fails the
way the message said. Without the change every reuse was skipped ("not a
local image") and, with ``--container-image`` beside the name, replayed
from the image's verdict-cache entry.

pyxis, enroot and the images are test_containers.py's fixture (built in the
test run from the pinned tarballs and Debian roots).
"""

from __future__ import annotations

import os
import pwd
import shutil
import time
from pathlib import Path

import pytest

from . import test_containers as _tc

pytestmark = pytest.mark.slurm

Pyxis = _tc.Pyxis
pyxis = _tc.pyxis  # the module fixture, shared
PREFIX = _tc.PREFIX
USERS = _tc.USERS


def _root(px: Pyxis, user: str, container: str) -> Path:
    """Where pyxis' ``enroot create`` puts the container for this user: the
    data path of the environment the steps get (test_containers.Pyxis.env)."""
    env = px.env(user)
    data = env.get("XDG_DATA_HOME") or f"{env['HOME']}/.local/share"
    return Path(data) / "enroot" / container


def _copy_as(user: str, src: Path, dst: Path) -> None:
    """Replace ``dst``'s content with ``src``'s as the user would (``cp``
    into their own container: the file keeps its owner and mode)."""
    shutil.copyfile(src, dst)
    ent = pwd.getpwnam(user)
    os.chown(dst, ent.pw_uid, ent.pw_gid)


@USERS
def test_named_container_changed_by_hand(pyxis: Pyxis, user: str) -> None:
    pyxis.use()
    name = f"named-{user}"
    root = _root(pyxis, user, f"pyxis_{name}")
    shutil.rmtree(root, ignore_errors=True)
    try:
        # The first step makes the container from the clean image.
        before = len(pyxis.slurm.audit_lines())
        res = pyxis.srun(["--container-image=./clean.sqsh", f"--container-name={name}",
                          "tool"], user=user)
        assert res.returncode == 0, res.stderr
        assert "side-effect program ran" in res.stdout and PREFIX not in res.stderr
        assert (root / "opt/app/bin/tool").is_file()
        [rec] = pyxis.records(before)
        assert (rec["action"], rec["skipped"]) == ("allow", None)
        assert rec["image"] == f"{pyxis.slurm.cluster.shared}/clean.sqsh"
        # Later steps reuse it: judged in its root, every time (no replay).
        before = len(pyxis.slurm.audit_lines())
        for _ in range(2):
            res = pyxis.srun([f"--container-name={name}", "tool"], user=user)
            assert res.returncode == 0, res.stderr
            assert "side-effect program ran" in res.stdout and PREFIX not in res.stderr
        records = pyxis.records(before)
        assert [(r["action"], r["skipped"], r.get("cache")) for r in records] == [
            ("allow", None, None)] * 2
        assert {r["image"] for r in records} == {str(root)}
        # An aarch64 program copied into the container by hand.
        _copy_as(user, pyxis.work / "src" / "foreign", root / "opt/app/bin/tool")
        res = pyxis.srun([f"--container-name={name}", "tool"], user=user)
        assert res.returncode != 0
        assert f"{PREFIX}ERROR exe-arch-mismatch: {root}:/opt/app/bin/tool" in res.stderr, \
            res.stderr
        # What slurmstepd's execve() would say, inside the container.
        assert f"{PREFIX}  without this check: slurmstepd: error: execve(): " \
               "/opt/app/bin/tool: Exec format" in res.stderr
        assert "side-effect program ran" not in res.stdout
        assert "task_init_privileged() failed" in res.stderr  # before pyxis started it
        # With the image beside the name: the container, not the image, is
        # what runs (the image's clean verdict is never replayed for it).
        res = pyxis.srun(["--container-image=./clean.sqsh", "tool"], user=user)
        assert res.returncode == 0, res.stderr
        res = pyxis.srun(["--container-image=./clean.sqsh", f"--container-name={name}",
                          "tool"], user=user)
        assert res.returncode != 0
        assert f"{PREFIX}ERROR exe-arch-mismatch: {root}:/opt/app/bin/tool" in res.stderr
        # Warn mode: it runs, and fails as predicted.
        res = pyxis.srun(["-p", "warnp", f"--container-name={name}", "tool"], user=user)
        assert res.returncode != 0
        assert f"{PREFIX}ERROR exe-arch-mismatch: {root}:/opt/app/bin/tool" in res.stderr
        assert f"{PREFIX}the step runs anyway (partition warnp, mode warn)" in res.stderr
        theirs = [line for line in res.stderr.splitlines() if PREFIX not in line]
        assert any("execve(): /opt/app/bin/tool: Exec format error" in line
                   for line in theirs), res.stderr
        assert "side-effect program ran" not in res.stdout
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_named_container_pyxis_cannot_find(pyxis: Pyxis) -> None:
    """No such container and no image: pyxis' own error, ours is silent;
    the audit line says why nothing was judged."""
    pyxis.use()
    before = len(pyxis.slurm.audit_lines())
    res = pyxis.srun(["--container-name=never-made", "tool"])
    assert res.returncode != 0
    assert "pyxis:" in res.stderr and PREFIX not in res.stderr
    assert "Traceback" not in res.stderr
    [rec] = pyxis.records(before)
    assert rec["action"] == "allow" and "does not exist" in str(rec["skipped"])


def test_job_scoped_named_container(pyxis: Pyxis) -> None:
    """pyxis with ``container_scope=job``: the container of
    ``--container-name=js`` is ``pyxis_<JOBID>_js``, for the steps of that
    job only. Two steps of one batch job: the first makes it, a program of
    the other architecture is copied in, the second is refused at its path."""
    slurm = pyxis.slurm
    # The epilog of a job that just ended reads plugstack.conf when it runs:
    # with container_scope=job already there, pyxis' epilog cleans up for
    # that earlier job (as its user, enroot list) and, failing, drains the
    # node. Not before it is done: the node idle again (bounded).
    deadline = time.monotonic() + 60
    while slurm.cluster.node_state() != "idle" and time.monotonic() < deadline:
        time.sleep(0.3)
    ours = "required " + slurm.plugin_line(
        slurm.plugin, f"config={slurm.configs['base']}", f"audit={slurm.audit_log}")
    slurm.cluster.set_plugstack([
        f"required {pyxis.plugin} runtime_path={pyxis.work / 'pyxis-runtime'} "
        "container_scope=job", ours])
    data = Path(pyxis.env()["HOME"]) / ".local/share/enroot"
    out = slurm.side_file("named-job.out")
    foreign = pyxis.work / "src" / "foreign"
    script = f"""#!/bin/sh
srun --container-image=./clean.sqsh --container-name=js tool
echo "first=$?"
cp {foreign} {data}/pyxis_${{SLURM_JOB_ID}}_js/opt/app/bin/tool
srun --container-name=js tool
echo "second=$?"
"""
    try:
        job = slurm.cluster.sbatch(script, ["-o", str(out)], env=pyxis.env())
        assert slurm.cluster.wait_job(job, 300) == "COMPLETED"
        text = out.read_text()
        root = data / f"pyxis_{job}_js"
        assert "first=0" in text, text
        assert f"{PREFIX}ERROR exe-arch-mismatch: {root}:/opt/app/bin/tool" in text, text
        assert "second=0" not in text
        assert not (data / "pyxis_js").exists()
    finally:
        pyxis.use()
        for left in data.glob("pyxis_*_js"):
            shutil.rmtree(left, ignore_errors=True)
