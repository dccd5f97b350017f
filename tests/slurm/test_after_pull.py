"""What pyxis unpacked, judged before the first task runs (issue 25 item 2),
on a real Slurm with pyxis 0.24.0 + enroot 4.1.2 pulling from Debian's
``docker-registry`` 2.8.2 (the fixtures of test_registry).

The image that needs it: its config says amd64, so the check before the
pull (the manifest only) lets it through on this x86_64 node, while its
``tool`` is an aarch64 ELF built here with the cross gcc (the Debian amd64
root of test_containers, whose ``/bin/sh`` enroot starts, with that one
file replaced). Without the change the step runs and fails in execve();
with it our task_init (listed after pyxis) has the container's root judged
by a helper and refuses every task with one message.

An arm64 image built for 4 KiB pages cannot be shown here on a simulated
64 KiB aarch64 partition: enroot starts its aarch64 ``/bin/sh`` on this
x86_64 node and fails before any task_init of ours; the judgement of such
a root is tests/test_after_pull.py's.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import threading
from pathlib import Path

import pytest

from .test_containers import PREFIX, Pyxis, pyxis  # noqa: F401  (the fixture)
from .test_registry import Pulls, pulls  # noqa: F401  (the fixture)

pytestmark = pytest.mark.slurm


@pytest.fixture(scope="module")
def liar(pulls: Pulls) -> str:  # noqa: F811
    """Push ``lab/img:liar``: amd64 by its config, aarch64 by its program."""
    from local_registry import oci_image  # on sys.path once test_registry is imported

    work = pulls.pyxis.work
    foreign = (work / "src" / "foreign").read_bytes()
    oci_image(work / "registry" / "layout", "liar", {"x86_64": work / "root-clean"},
              env=["PATH=/opt/app/bin:/usr/bin:/bin"],
              files={"opt/app/bin/tool": foreign, "etc/image-tag": b"liar"})
    pulls.registry.push(work / "registry" / "layout", "liar", "lab/img")
    return pulls.ref("liar")


#: Prints "FD TARGET" for every descriptor the program holds but its own
#: directory stream: what the user's program inherited.
FDS_C = r"""
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
int main(void)
{
    DIR *d = opendir("/proc/self/fd");
    struct dirent *e;
    char path[64], target[512];
    if (d == NULL)
        return 2;
    while ((e = readdir(d)) != NULL) {
        ssize_t n;
        if (e->d_name[0] == '.' || atoi(e->d_name) == dirfd(d))
            continue;
        snprintf(path, sizeof(path), "/proc/self/fd/%s", e->d_name);
        n = readlink(path, target, sizeof(target) - 1);
        target[n > 0 ? n : 0] = 0;
        printf("%s %s\n", e->d_name, target);
    }
    return 0;
}
"""


def _ours(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if PREFIX + "ERROR" in line]


def test_contents_judged_after_the_pull_enforce(pulls: Pulls, liar: str) -> None:  # noqa: F811
    px = pulls.pyxis
    px.use()
    mark = pulls.registry.mark()
    before = len(px.slurm.audit_lines())
    res = px.slurm.cluster.run(["srun", "-N1", "-n2", f"--container-image={liar}", "tool"],
                               env=px.env(), timeout=180)
    assert res.returncode != 0
    errors = _ours(res.stderr)
    # Once for the node's two tasks, naming the program in the container.
    assert len(errors) == 1, res.stderr
    assert re.search(r"ERROR exe-arch-mismatch: \S*/pyxis_\d+\.\d+:/opt/app/bin/tool",
                     errors[0]), res.stderr
    assert "side-effect program ran" not in res.stdout
    assert "Exec format error" not in res.stderr and "Traceback" not in res.stderr
    # The manifest passed: enroot pulled the layer before our judgement.
    assert pulls.registry.blob_gets(mark)
    records = px.records(before)
    assert [r["action"] for r in records] == ["allow", "reject"], records
    assert "exe-arch-mismatch" in records[1]["rules"]


def test_contents_judged_after_the_pull_warn(pulls: Pulls, liar: str) -> None:  # noqa: F811
    """warn: one line for the two tasks, then the failure it predicted."""
    px = pulls.pyxis
    px.use()
    res = px.slurm.cluster.run(["srun", "-N1", "-n2", "-p", "warnp",
                                f"--container-image={liar}", "tool"],
                               env=px.env(), timeout=180)
    assert res.returncode != 0
    errors = _ours(res.stderr)
    assert len(errors) == 1 and "exe-arch-mismatch" in errors[0], res.stderr
    assert "Exec format error" in res.stderr, res.stderr


def test_batch_step_of_the_image(pulls: Pulls, liar: str) -> None:  # noqa: F811
    """sbatch --container-image: pyxis makes the container for the batch
    step too, whose script then runs in it with the image's interpreter
    (its ``#!``, here the aarch64 ``tool``); the root is judged there."""
    px = pulls.pyxis
    px.use()
    out = px.slurm.cluster.shared / "after-pull-batch.out"
    out.unlink(missing_ok=True)
    job = px.slurm.cluster.sbatch("#!/opt/app/bin/tool\n", [
        "-o", str(out), f"--container-image={liar}"], env=px.env())
    state = px.slurm.cluster.wait_job(job, timeout=180)
    text = out.read_text() if out.exists() else ""
    assert state == "FAILED", text
    assert len(_ours(text)) == 1 and "exe-arch-mismatch" in text, text
    assert "execve()" not in text  # refused before the exec (our line predicts its error)


def test_clean_registry_image_runs_and_leaves_nothing_open(pulls: Pulls) -> None:  # noqa: F811
    """A clean image runs as before, judged twice (manifest, then root),
    and the user's program holds the same descriptors as in a step of a
    local image (no after-pull socket, no verdict page reaches it)."""
    px = pulls.pyxis
    px.use()
    before = len(px.slurm.audit_lines())
    res = px.srun([f"--container-image={pulls.ref('amd')}", "tool"])
    assert res.returncode == 0, res.stderr
    assert "side-effect program ran" in res.stdout and PREFIX not in res.stderr
    records = px.records(before)
    assert [r["action"] for r in records] == ["allow", "allow"], records
    assert "/pyxis_" in str(records[1]["image"])
    # The image has no ls nor readlink: a program of our own, mounted;
    # static, as the image's glibc may be older than the one it is built
    # with (the release roots' is: lib-version-missing, after the pull).
    host = px.work / "fds-bin"
    host.mkdir(exist_ok=True)
    (host / "fds.c").write_text(FDS_C)
    subprocess.run(["gcc", "-O1", "-static", "-o", str(host / "fds"), str(host / "fds.c")],
                   check=True, capture_output=True, timeout=120)

    def fds(image: str) -> list[str]:
        done = px.srun([f"--container-image={image}", f"--container-mounts={host}:/mnt/fds",
                        "/mnt/fds/fds"])
        assert done.returncode == 0, done.stderr
        # pipe/socket inode numbers differ from step to step: their kinds count.
        out = [re.sub(r"\[\d+\]", "", line) for line in done.stdout.splitlines()]
        assert any(line.startswith("0 ") for line in out), done.stdout
        return sorted(out)

    pulled, local = fds(pulls.ref("amd")), fds("./clean.sqsh")
    assert pulled == local, (pulled, local)
    assert not any("grace" in line for line in pulled)


# -- no verdict: on_error (the test build's hooks, make plugin-testhooks) ---

@pytest.fixture(scope="module")
def hooks_plugin(pulls: Pulls) -> Path:  # noqa: F811
    prefix = pulls.pyxis.slurm.testhooks_prefix("prefix-after-pull-hooks")
    return prefix / "lib" / "slurm" / "spank_grace_policy.so"


def _use_hooks(px: Pyxis, plugin: Path, *extra: str) -> None:
    ours = "required " + px.slurm.plugin_line(
        plugin, f"config={px.slurm.configs['base']}", f"audit={px.slurm.audit_log}", *extra)
    theirs = f"required {px.plugin} runtime_path={px.work / 'pyxis-runtime'}"
    px.slurm.cluster.set_plugstack([theirs, ours])


def _followed_on_error(records: list[dict[str, object]],
                       res: subprocess.CompletedProcess[str], on_error: str
                       ) -> list[dict[str, object]]:
    """A step whose after-pull judgement gave no verdict: the manifest's
    allow, then on_error's outcome, both lines marked as one step's (C
    writes the second); deny refuses every task with one line, allow lets
    them fail as predicted. Returns the records."""
    assert res.returncode != 0 and "Traceback" not in res.stderr
    assert [r["action"] for r in records] == [
        "allow", "allow" if on_error == "allow" else "reject"], records
    assert [r.get("phase") for r in records] == ["before_pull", "after_pull"]
    refused = [line for line in res.stderr.splitlines()
               if "could not judge the container pyxis unpacked" in line]
    if on_error == "allow":
        assert not refused and "Exec format error" in res.stderr, res.stderr
    else:
        assert len(refused) == 1 and "Exec format error" not in res.stderr, res.stderr
    return records


@pytest.mark.parametrize("hook", ["die", "hang"])
def test_no_verdict_follows_on_error(pulls: Pulls, liar: str, hooks_plugin: Path,  # noqa: F811
                                     hook: str) -> None:
    """The helper dies, or hangs past timeout_ms, once asked: allow lets
    the step run (and fail as it would have), with the failure in the
    audit; deny refuses every task with one line. The node stays usable."""
    px = pulls.pyxis
    try:
        for on_error in ("allow", "deny"):
            _use_hooks(px, hooks_plugin, f"test_afterpull={hook}", f"on_error={on_error}",
                       "timeout_ms=3000")
            before = len(px.slurm.audit_lines())
            res = px.slurm.cluster.run(["srun", "-N1", "-n2", f"--container-image={liar}",
                                        "tool"], env=px.env(), timeout=180)
            records = _followed_on_error(px.records(before), res, on_error)
            assert records[1]["error"], records[1]
    finally:
        px.use()
        px.slurm.restore_and_check_node()


# -- checker=node: the judgement is the node checker's -------------------------

#: An enroot start hook (hooks.d, run as the job's user while pyxis'
#: task_init starts the container, before ours): says it is there, then
#: holds until the test says go (bounded: 60 s).
HOLD_HOOK = """#!/bin/sh
touch "{dir}/held"
i=0
while [ ! -e "{dir}/go" ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done
exit 0
"""


@pytest.mark.parametrize("on_error", ["allow", "deny"])
def test_node_checker_gone_before_the_task_asks(pulls: Pulls, liar: str,  # noqa: F811
                                                on_error: str) -> None:
    """With the node checker up (the default checker=node), slurmstepd
    dials it a second connection in slurm_spank_init and the first task
    asks there: no interpreter of slurmstepd's own. If the server is gone
    by then (killed while pyxis started the container), no verdict:
    on_error decides, once, and the audit line names the node checker.
    Without that connection the helper would have judged the step."""
    from .test_nodecheck import _server, _servers, _wait

    px = pulls.pyxis
    hold = px.work / "hold"
    hook = px.work / "enroot" / "etc" / "enroot" / "hooks.d" / "99-grace-test-hold.sh"
    assert hook.parent.is_dir(), hook.parent
    shutil.rmtree(hold, ignore_errors=True)
    hold.mkdir(mode=0o777)
    hold.chmod(0o777)
    hook.write_text(HOLD_HOOK.format(dir=hold))
    hook.chmod(0o755)
    server = _server(px.slurm)
    ours = "required " + px.slurm.plugin_line(
        px.slurm.plugin, f"config={px.slurm.configs['base']}", f"audit={px.slurm.audit_log}",
        f"on_error={on_error}", "timeout_ms=5000")
    theirs = f"required {px.plugin} runtime_path={px.work / 'pyxis-runtime'}"
    px.slurm.cluster.set_plugstack([theirs, ours])
    before = len(px.slurm.audit_lines())
    done: list[subprocess.CompletedProcess[str]] = []
    step = threading.Thread(target=lambda: done.append(px.slurm.cluster.run(
        ["srun", "-N1", "-n2", f"--container-image={liar}", "tool"], env=px.env(),
        timeout=180)))
    try:
        step.start()
        _wait(lambda: (hold / "held").exists(), timeout=120)
        os.kill(server, signal.SIGKILL)
        _wait(lambda: server not in _servers(px.slurm))
        (hold / "go").touch()
        step.join(timeout=200)
        assert done, "the step did not end"
        records = _followed_on_error(px.records(before), done[0], on_error)
        assert "node checker" in str(records[1]["error"]), records[1]
    finally:
        (hold / "go").touch()
        step.join(timeout=200)
        hook.unlink(missing_ok=True)
        # A new node checker for the tests after this one, from slurmd
        # started as the fixtures start it: our base line alone, pyxis not
        # loaded in slurmd itself.
        old = _servers(px.slurm)
        px.slurm.use("base")
        px.slurm.cluster.restart_slurmd()
        _wait(lambda: bool(_servers(px.slurm)) and not set(old) & set(_servers(px.slurm)))
        px.use()
        px.slurm.restore_and_check_node()


def test_existing_named_container_with_a_registry_image_is_judged_once(
        pulls: Pulls) -> None:  # noqa: F811
    """``--container-image=REGISTRY#... --container-name=NAME`` with NAME
    already made: pyxis reuses the container and pulls nothing, so the
    check in user_init judged its root as it is, and that verdict says so
    to C (no ``pull`` emission): no second judgement in task_init, and a
    warning is printed once, not twice. The first step, which made the
    container, was a pull: judged before and after it."""
    px = pulls.pyxis
    px.use()
    name = "reg-named"
    env = px.env()
    root = Path(env.get("XDG_DATA_HOME") or f"{env['HOME']}/.local/share") / "enroot" \
        / f"pyxis_{name}"
    shutil.rmtree(root, ignore_errors=True)
    image = f"--container-image={pulls.ref('amd')}"
    try:
        before = len(px.slurm.audit_lines())
        res = px.srun([image, f"--container-name={name}", "tool"])
        assert res.returncode == 0, res.stderr
        assert [r.get("phase") for r in px.records(before)] == ["before_pull", "after_pull"]
        assert (root / "opt/app/bin/tool").is_file()
        # An aarch64 program copied in by hand; warn mode: it runs and fails.
        shutil.copyfile(px.work / "src" / "foreign", root / "opt/app/bin/tool")
        before = len(px.slurm.audit_lines())
        res = px.srun(["-p", "warnp", "-n2", image, f"--container-name={name}", "tool"])
        assert res.returncode != 0
        records = px.records(before)
        assert [(r["action"], r.get("phase")) for r in records] == [("warn", None)], records
        assert records[0]["image"] == str(root), records[0]
        said = [line for line in res.stderr.splitlines()
                if f"{PREFIX}ERROR exe-arch-mismatch: {root}:/opt/app/bin/tool" in line]
        assert len(said) == 1, res.stderr
    finally:
        shutil.rmtree(root, ignore_errors=True)
