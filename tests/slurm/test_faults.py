"""Faults of the plugin's own world, on a real Slurm 22.05 (issue 5 "Faults").

For each fault: the step follows ``on_error`` (allow: it runs; deny: it is
refused with our line), slurmd's log gets exactly one ``grace-policy: error:
job J step S: ...`` line naming the reason, the user never sees a traceback,
and the node keeps taking jobs (checked after each test).

How each fault is made without touching the machine's own files: a copy of
the installed tree with a part removed (package, dependency), a copy of the
plugin's Python part whose DT_NEEDED names a libpython that does not exist, a 64 KiB tmpfs
filled up for the full disk (unmounted again), an admin-only ``python_path``
directory holding a package whose import never returns (the C backstop).
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from .harness import SlurmEnv

pytestmark = pytest.mark.slurm

PREFIX = "grace-policy: "
JOB_CMD = ["sh", "-c", "echo JOBID=$SLURM_JOB_ID"]


@pytest.fixture
def faults(slurm: SlurmEnv) -> Iterator[SlurmEnv]:
    """Each test sets its own plugstack; afterwards: base config, node healthy."""
    yield slurm
    slurm.restore_and_check_node()


def _job(res: subprocess.CompletedProcess[str]) -> int:
    match = re.search(r"JOBID=(\d+)", res.stdout)
    assert match, (res.stdout, res.stderr)
    return int(match.group(1))


def _error_lines(env: SlurmEnv, job: int) -> list[str]:
    return [line for line in env.cluster.slurmd_log_text().splitlines()
            if f"{PREFIX}error: job {job} step 0:" in line]


def _allowed_with_one_line(env: SlurmEnv, *, user: str | None = "nobody") -> str:
    """Run a step under the current plugstack (on_error=allow): it runs, the
    user sees nothing of ours, slurmd's log has one line; returns it."""
    res = env.cluster.srun(JOB_CMD, user=user)
    assert res.returncode == 0, res.stderr
    assert PREFIX not in res.stderr
    assert "Traceback" not in res.stderr + res.stdout
    lines = _error_lines(env, _job(res))
    assert len(lines) == 1, lines
    assert "check failed" in lines[0]
    assert "on_error=allow: step allowed unchecked" in lines[0]
    return lines[0]


def _refused_by_on_error(env: SlurmEnv) -> None:
    out = env.side_file("fault-deny.out")
    res = env.cluster.srun([str(env.files / "native"), str(out)], user="nobody")
    assert res.returncode != 0
    assert f"{PREFIX}this step was refused: the site's launch check could not run" in res.stderr
    assert "Traceback" not in res.stderr
    assert not out.exists()


# -- the config -----------------------------------------------------------------

def _config(env: SlurmEnv, name: str, text: str, mode: int = 0o644) -> Path:
    path = env.configs["base"].parent / name
    path.write_text(text)
    path.chmod(mode)
    return path


def _last_failure(env: SlurmEnv, before: int) -> tuple[str, str]:
    """(failure, action) of the one audit line the step added."""
    [record] = [json.loads(x) for x in env.audit_lines()[before:]]
    assert record["mode"] is None and record["error"], record
    return record["failure"], record["action"]


def test_config_missing(faults: SlurmEnv) -> None:
    missing = faults.configs["base"].parent / "no-such.toml"
    faults.use(missing)
    before = len(faults.audit_lines())
    line = _allowed_with_one_line(faults)
    assert str(missing) in line and "No such file" in line
    # Config errors reach the audit log too (C writes the line).
    assert _last_failure(faults, before) == ("config", "allow")
    faults.use(missing, "on_error=deny")
    _refused_by_on_error(faults)


def test_config_unreadable_by_the_user(faults: SlurmEnv) -> None:
    """The check runs as the job's user: a config only root can read is a
    fault for every user's step (an admin mistake worth one clear line)."""
    text = faults.configs["base"].read_text()
    secret = _config(faults, "root-only.toml", text, 0o600)
    faults.use(secret)
    line = _allowed_with_one_line(faults)
    assert str(secret) in line and "Permission denied" in line


def test_config_invalid(faults: SlurmEnv) -> None:
    bad = _config(faults, "bad-syntax.toml", 'mode = "enforce"\n[partitions\n')
    faults.use(bad)
    line = _allowed_with_one_line(faults)
    assert str(bad) in line
    faults.use(bad, "on_error=deny")
    _refused_by_on_error(faults)


# -- the Python side of the plugin ------------------------------------------------

def test_python_package_missing(faults: SlurmEnv) -> None:
    bare = faults.copy_prefix("prefix-no-package")
    shutil.rmtree(bare / "lib" / "grace-policy" / "python" / "grace_policy")
    faults.set_plugin_line(bare / "lib" / "slurm" / "spank_grace_policy.so",
                           f"config={faults.configs['base']}", f"audit={faults.audit_log}")
    before = len(faults.audit_lines())
    line = _allowed_with_one_line(faults)
    assert "cannot load grace_policy.slurm_bridge" in line
    assert "ModuleNotFoundError" in line
    assert _last_failure(faults, before) == ("python", "allow")


def test_python_dependency_missing(faults: SlurmEnv) -> None:
    """cffi's _cffi_backend gone from the installed tree."""
    tree = faults.copy_prefix("prefix-no-cffi")
    for backend in (tree / "lib" / "grace-policy" / "python").glob("_cffi_backend*"):
        backend.unlink()
    faults.set_plugin_line(tree / "lib" / "slurm" / "spank_grace_policy.so",
                           f"config={faults.configs['base']}", f"audit={faults.audit_log}",
                           "on_error=allow")
    line = _allowed_with_one_line(faults)
    assert "_cffi_backend" in line


def test_python_path_empty_dir_changes_nothing(faults: SlurmEnv) -> None:
    """An empty python_path= directory is searched first and then the
    installed package: still a normal check."""
    empty = faults.cluster.root.parent / "empty-python-path"
    empty.mkdir(exist_ok=True)
    faults.use("base", f"python_path={empty}")
    res = faults.cluster.srun([str(faults.files / "foreign")], user="nobody")
    assert res.returncode != 0
    assert f"{PREFIX}ERROR exe-arch-mismatch" in res.stderr


def test_libpython_missing_on_the_node(faults: SlurmEnv) -> None:
    """libpython is a dependency of the plugin's Python part only
    (grace_policy_py.so), which slurmstepd dlopen()s in user_init on a cache
    miss. Without it the stub still loads everywhere (srun here loads the same
    broken tree: a submit host without libpython), and the step follows
    on_error with one slurmd.log line naming the missing library."""
    tree = faults.copy_prefix("prefix-no-libpython")
    so = tree / "lib" / "grace-policy" / "grace_policy_py.so"
    data = so.read_bytes()
    assert b"libpython3." in data
    patched = re.sub(rb"libpython3\.(\d+)\.so", lambda m: b"libpython9." +
                     b"9" * len(m.group(1)) + b".so", data)
    so.write_bytes(patched)
    needed = subprocess.run(["readelf", "-d", str(so)], capture_output=True, text=True,
                            check=True).stdout
    assert "libpython9." in needed
    stub = tree / "lib" / "slurm" / "spank_grace_policy.so"
    assert "libpython" not in subprocess.run(["readelf", "-d", str(stub)], capture_output=True,
                                             text=True, check=True).stdout

    args = (f"config={faults.configs['base']}", f"audit={faults.audit_log}")
    faults.set_plugin_line(stub, *args)
    line = _allowed_with_one_line(faults)
    assert "cannot load the Python part" in line and "libpython9." in line, line
    faults.set_plugin_line(stub, *args, "on_error=deny")
    _refused_by_on_error(faults)


# -- the audit log ---------------------------------------------------------------

def test_audit_log_cannot_be_opened(faults: SlurmEnv) -> None:
    """A directory that does not exist: the verdict stands (the check ran),
    slurmd's log says why there is no line."""
    nowhere = faults.cluster.root.parent / "no-such-dir" / "audit.log"
    faults.use("base", f"audit={nowhere}")
    res = faults.cluster.srun([str(faults.files / "foreign")], user="nobody")
    assert f"{PREFIX}ERROR exe-arch-mismatch" in res.stderr and res.returncode != 0
    res = faults.cluster.srun(JOB_CMD, user="nobody")
    assert res.returncode == 0 and PREFIX not in res.stderr
    [line] = _error_lines(faults, _job(res))
    assert f"audit log {nowhere}: cannot open as root: No such file or directory" in line


def test_audit_log_is_a_symlink(faults: SlurmEnv) -> None:
    """root must not follow a link planted where the audit log should be."""
    target = faults.cluster.shared / "not-the-audit-log"
    target.write_text("")
    link = faults.cluster.root.parent / "audit-link.log"
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(target)
    faults.use("base", f"audit={link}")
    res = faults.cluster.srun(JOB_CMD, user="nobody")
    assert res.returncode == 0
    [line] = _error_lines(faults, _job(res))
    assert "cannot open as root" in line
    assert target.read_text() == ""


@pytest.fixture
def full_disk(slurm: SlurmEnv) -> Iterator[Path]:
    mnt = slurm.cluster.root.parent / "tinyfs"
    mnt.mkdir(exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,mode=0755", "tmpfs",
                           str(mnt)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        log = mnt / "audit.log"
        log.touch()
        log.chmod(0o640)
        filler = subprocess.run(["dd", "if=/dev/zero", f"of={mnt / 'fill'}", "bs=4k"],
                                capture_output=True, check=False)
        assert filler.returncode != 0  # ran until ENOSPC
        yield log
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def test_audit_log_disk_full(faults: SlurmEnv, full_disk: Path) -> None:
    faults.use("base", f"audit={full_disk}")
    res = faults.cluster.srun([str(faults.files / "foreign")], user="nobody")
    assert f"{PREFIX}ERROR exe-arch-mismatch" in res.stderr and res.returncode != 0
    assert "Traceback" not in res.stderr
    res = faults.cluster.srun(JOB_CMD, user="nobody")
    assert res.returncode == 0 and PREFIX not in res.stderr
    [line] = [entry for entry in faults.cluster.slurmd_log_text().splitlines()
              if f"{PREFIX}job {_job(res)} step 0:" in entry]
    assert f"audit log {full_disk}: cannot write: No space left on device" in line
    assert full_disk.read_text() == ""


# -- deadlines -------------------------------------------------------------------

def test_core_deadline_exceeded_follows_on_error(faults: SlurmEnv) -> None:
    """deadline_ms = 1: the core stops and says check-limit; the config's own
    on_error decides (deny here: refused, with the reason, no exec)."""
    text = faults.configs["base"].read_text().replace("deadline_ms = 5000",
                                                      'deadline_ms = 1\non_error = "deny"')
    cfg = _config(faults, "deadline-1ms.toml", text)
    subprocess.run([str(faults.prefix / "bin" / "grace-policy"), "config", "check",
                    "--compile", str(cfg)], env={}, check=True, capture_output=True)
    faults.use(cfg)
    before = len(faults.audit_lines())
    out = faults.side_file("deadline.out")
    # A check that takes many milliseconds on any machine: python3 with a
    # LD_LIBRARY_PATH, so the standard library's ~45 extension modules and
    # their libraries are judged (a small native program's check can now
    # end within 1 ms, before the deadline is ever looked at).
    libdir = f"/usr/lib/{platform.machine()}-linux-gnu"
    res = faults.cluster.srun(["/usr/bin/python3", "-c", f"open({str(out)!r}, 'w').write('x')"],
                              user="nobody", env={"LD_LIBRARY_PATH": libdir})
    assert res.returncode != 0, res.stderr
    assert f"{PREFIX}ERROR check-limit" in res.stderr, res.stderr
    assert "Traceback" not in res.stderr
    assert not out.exists()
    [record] = [json.loads(line) for line in faults.audit_lines()[before:]]
    assert record["action"] == "reject" and "deadline" in (record["error"] or "")


@pytest.mark.parametrize("on_error", ["allow", "deny"])
def test_c_backstop_fires_on_a_hung_check(faults: SlurmEnv, on_error: str) -> None:
    """A check that never returns (here: an import that sleeps, as one on a
    dead network file system would). Only the admin can arrange it: the
    directory comes from plugstack.conf's python_path. The step waits
    timeout_ms, follows on_error, and slurmstepd is not held by the thread
    left behind."""
    hung = faults.cluster.root.parent / "hung-python" / "grace_policy"
    hung.mkdir(parents=True, exist_ok=True)
    (hung / "__init__.py").write_text("import time\ntime.sleep(3600)\n")
    faults.use("base", f"python_path={hung.parent}", "timeout_ms=1000",
               f"on_error={on_error}")
    if on_error == "deny":
        _refused_by_on_error(faults)
        return
    res = faults.cluster.srun(JOB_CMD, user="nobody", timeout=30)
    assert res.returncode == 0, res.stderr
    [line] = _error_lines(faults, _job(res))
    assert "no verdict within timeout_ms=1000" in line
    assert "on_error=allow: step allowed unchecked" in line
    job = _job(res)
    # The timeout reaches the audit log and grace-policy report counts it
    # apart (the installed command, on the real log).
    [record] = [json.loads(x) for x in faults.audit_lines()
                if json.loads(x).get("job_id") == str(job)]
    assert (record["failure"], record["action"], record["mode"]) == ("timeout", "allow", None)
    report = subprocess.run([str(faults.prefix / "bin" / "grace-policy"), "report", "--json",
                             str(faults.audit_log)], env={}, capture_output=True, text=True,
                            check=False)
    assert report.returncode == 0, report.stderr
    data = json.loads(report.stdout)
    assert data["failures"]["kinds"].get("timeout", 0) >= 1, data["failures"]
    assert data["lines"]["invalid"] == 0, data["lines"]
    text = subprocess.run([str(faults.prefix / "bin" / "grace-policy"), "report",
                           str(faults.audit_log)], env={}, capture_output=True, text=True,
                          check=False).stdout
    assert "of which without a verdict (decided in the plugin):" in text, text
    assert "timeout" in text, text
    # The step, and its slurmstepd, are gone despite the helper left behind.
    for _ in range(50):  # 24.11+: "completing" for a moment after srun returns
        squeue = faults.cluster.run(["squeue", "-h", "-j", str(job)]).stdout
        if str(job) not in squeue:
            break
        time.sleep(0.3)
    assert str(job) not in squeue
    # ... and its slurmstepd process is gone too (given a bounded while to exit).
    title = f"slurmstepd: [{job}."
    for _ in range(50):
        ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
        if title not in ps:
            break
        time.sleep(0.2)
    assert title not in ps, [line for line in ps.splitlines() if title in line]


def test_config_without_compiled_form_says_how_to_fix_it(faults: SlurmEnv) -> None:
    """Not a failure (the step is judged), but every step then validates the
    TOML with pydantic: the admin is told once per step how to stop that."""
    text = faults.configs["base"].read_text()
    confdir = faults.cluster.root.parent / "etc-uncompiled"
    shutil.rmtree(confdir, ignore_errors=True)
    confdir.mkdir(mode=0o755)
    raw = confdir / "never-compiled.toml"
    raw.write_text(text)
    raw.chmod(0o644)
    faults.use(raw)
    before = len(faults.audit_lines())
    # The plugin never writes the config's directory (issue 20 item 4), not
    # even for root's step, which could: compiling is the admin's command.
    for user in ("nobody", "root"):
        out = faults.side_file("uncompiled.out")
        res = faults.cluster.srun([str(faults.files / "native"), str(out)], user=user)
        assert res.returncode == 0, res.stderr
        assert out.exists() and PREFIX not in res.stderr
        assert sorted(p.name for p in confdir.iterdir()) == ["never-compiled.toml"], user
    hints = [line for line in faults.cluster.slurmd_log_text().splitlines()
             if "has no current compiled form" in line and str(raw) in line]
    # Once for every step the check ran for: the second user's step of this
    # node-owned program may be answered by the node-wide cache, without Python.
    checked = [r for r in map(json.loads, faults.audit_lines()[before:])
               if r.get("cache") != "hit"]
    assert checked and len(hints) == len(checked), (hints, checked)
    assert "config check --compile" in hints[0]


def test_a_check_left_behind_by_the_timeout_stays_harmless(faults: SlurmEnv) -> None:
    """The C backstop gives up after timeout_ms and kills the check's helper
    process. Slurm then forks the tasks and takes root back, and frees its
    env array as tasks exit. The late check must neither hold any of that up
    nor write an audit line contradicting what on_error did (it is killed;
    its memory is its own). Here the check is only slow (3 s, admin-only
    python_path), the step lives 6 s and one of its two tasks exits at once."""
    real = faults.prefix / "lib" / "grace-policy" / "python" / "grace_policy"
    slow = faults.cluster.root.parent / "slow-python" / "grace_policy"
    slow.mkdir(parents=True, exist_ok=True)
    (slow / "__init__.py").write_text(
        "import time\ntime.sleep(3)\n"
        f"__path__.append({str(real)!r})\n"
        f"exec(open({str(real / '__init__.py')!r}).read())\n")
    faults.use("base", f"python_path={slow.parent}", "timeout_ms=1000")
    res = faults.cluster.srun(
        ["-n2", "sh", "-c", 'echo JOBID=$SLURM_JOB_ID; [ "$SLURM_PROCID" = 1 ] || sleep 6'],
        user="nobody", timeout=60)
    assert res.returncode == 0, res.stderr
    job = _job(res)
    lines = _error_lines(faults, job)
    assert len(lines) == 1 and "no verdict within timeout_ms=1000" in lines[0], lines
    # One audit line, C's: the timeout and what on_error did. The helper
    # was killed, so no late line of the check contradicts it.
    records = [json.loads(line) for line in faults.audit_lines()
               if json.loads(line).get("job_id") == str(job)]
    assert len(records) == 1, records
    assert records[0]["failure"] == "timeout" and records[0]["action"] == "allow", records
    time.sleep(3)  # past the moment the slow check would have finished
    records = [line for line in faults.audit_lines() if json.loads(line).get("job_id") == str(job)]
    assert len(records) == 1, records


def test_relative_python_path_is_refused(faults: SlurmEnv) -> None:
    """A relative python_path would be resolved against the job's cwd: a user
    could plant modules there for a process that can still regain root."""
    faults.use("base", "python_path=site-python")
    before = len(faults.audit_lines())
    line = _allowed_with_one_line(faults)
    assert "python_path entries must be absolute" in line
    assert _last_failure(faults, before) == ("plugstack", "allow")


def test_hard_linked_audit_log_is_refused(faults: SlurmEnv) -> None:
    """Root appends to the audit file: a second hard link could make that any
    root file a user linked into a writable directory."""
    linked = faults.cluster.root.parent / "audit-linked.log"
    if linked.exists():
        linked.unlink()
    twin = faults.cluster.root.parent / "audit-twin.log"
    if twin.exists():
        twin.unlink()
    linked.touch(mode=0o640)
    os.link(linked, twin)
    faults.set_plugin_line(faults.plugin, f"config={faults.configs['base']}",
                           f"audit={linked}")
    res = faults.cluster.srun(JOB_CMD, user="nobody")
    assert res.returncode == 0, res.stderr
    job = _job(res)
    assert linked.read_text() == ""
    assert any(f"job {job} " in line and "one link" in line
               for line in faults.cluster.slurmd_log_text().splitlines())


def test_control_characters_in_log_lines_are_escaped(faults: SlurmEnv) -> None:
    """A path with an escape sequence in the one slurmd.log line of a fault:
    shown escaped, never raw. (plugstack.conf is line-based, so a newline
    cannot reach the plugin through it.)"""
    odd = faults.configs["base"].parent / "odd\x1b[31mRED.toml"
    faults.use(odd)
    line = _allowed_with_one_line(faults)
    assert "odd\\x1b[31mRED.toml" in line, line
    assert "\x1b" not in faults.cluster.slurmd_log_text()


# -- env edits that fail -------------------------------------------------------------

@pytest.mark.parametrize("on_error", ["allow", "deny"])
def test_failed_env_edit_follows_on_error(faults: SlurmEnv, on_error: str) -> None:
    """A foreign VIRTUAL_ENV is to be removed, and removing it fails. deny:
    refused, never run. allow: the step runs, and the user is told that the
    change was not made (not that it was); one log and one audit line, so
    grace-policy report counts the step once, as an env failure."""
    prefix = faults.testhooks_prefix("prefix-testhooks")  # 22.05's edits never fail
    foreign = faults.files / "venv-foreign"
    faults.set_plugin_line(prefix / "lib" / "slurm" / "spank_grace_policy.so",
                           f"config={faults.configs['base']}", f"audit={faults.audit_log}",
                           f"on_error={on_error}", "test_fail_env=VIRTUAL_ENV")
    before = len(faults.audit_lines())
    res = faults.cluster.srun(["sh", "-c", "echo JOBID=$SLURM_JOB_ID; echo VENV=$VIRTUAL_ENV"],
                              user="nobody", env={"VIRTUAL_ENV": str(foreign)})
    assert "Traceback" not in res.stderr + res.stdout
    assert "removed from the step's environment" not in res.stderr, res.stderr
    # C's line only: the edit failed, and what on_error did. The verdict's
    # own line (which would say the variable was removed) is not written.
    lines = faults.audit_lines()[before:]
    [record] = [json.loads(line) for line in lines]
    assert record["failure"] == "env", record
    assert record["action"] == ("reject" if on_error == "deny" else "allow"), record
    assert "cannot remove VIRTUAL_ENV" in record["error"]
    step_log = faults.side_file(f"env-edit-{on_error}.jsonl")
    step_log.write_text("".join(line + "\n" for line in lines))
    report = subprocess.run([str(faults.prefix / "bin" / "grace-policy"), "report", "--json",
                             str(step_log)], env={}, capture_output=True, text=True,
                            check=False)
    assert report.returncode == 0, report.stderr
    data = json.loads(report.stdout)
    assert (data["steps"], data["failures"]) == (1, {"steps": 1, "kinds": {"env": 1}}), data
    assert data["lines"]["invalid"] == 0, data["lines"]
    # one step whose check failed, shown once: the failure is one of the errors
    assert data["errors"]["steps"] == 1, data["errors"]
    assert sum(p["errors"] for p in data["partitions"].values()) == 1, data["partitions"]
    text = subprocess.run([str(faults.prefix / "bin" / "grace-policy"), "report",
                           str(step_log)], env={}, capture_output=True, text=True, check=False)
    assert text.returncode == 0, text.stderr
    counted = [line for line in text.stdout.splitlines() if "on_error decided" in line]
    assert counted == ["  check errors (on_error decided): 1, of which without a verdict "
                       "(decided in the plugin): 1 (env 1)"], text.stdout
    if on_error == "deny":
        _refused = f"{PREFIX}this step was refused: the site's launch check could not run"
        assert res.returncode != 0 and _refused in res.stderr, res.stderr
        assert "VENV=" not in res.stdout
        return
    assert res.returncode == 0, res.stderr
    assert record["job_id"] == str(_job(res)), record
    assert f"VENV={foreign}" in res.stdout
    told = " ".join(line for line in res.stderr.splitlines() if line.startswith(PREFIX))
    assert "without all of the environment changes" in told, res.stderr
    assert "cannot remove VIRTUAL_ENV" in told and "on_error=allow" in told
    [line] = _error_lines(faults, _job(res))
    assert "cannot remove VIRTUAL_ENV" in line and "step allowed unchecked" in line


def test_test_hooks_are_not_in_the_installed_plugin(faults: SlurmEnv) -> None:
    """The plugin make install ships has no hook: the argument is unknown."""
    faults.use("base", "test_fail_env=VIRTUAL_ENV")
    line = _allowed_with_one_line(faults)
    assert "unknown plugstack argument 'test_fail_env=VIRTUAL_ENV'" in line


def test_a_crashing_check_takes_only_its_helper_down(faults: SlurmEnv) -> None:
    """The check dies of SIGSEGV (here: an admin-only python_path package
    that kills its own process, as a broken extension module would). It ran
    in the helper process, so slurmstepd lives on: on_error decides, the
    log line says how the helper ended, the audit line says "check"."""
    crash = faults.cluster.root.parent / "crash-python" / "grace_policy"
    crash.mkdir(parents=True, exist_ok=True)
    (crash / "__init__.py").write_text("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n")
    faults.use("base", f"python_path={crash.parent}")
    before = len(faults.audit_lines())
    line = _allowed_with_one_line(faults)
    assert "helper process ended without an answer (killed by signal 11)" in line, line
    [record] = [json.loads(x) for x in faults.audit_lines()[before:]]
    assert (record["failure"], record["action"]) == ("check", "allow"), record
