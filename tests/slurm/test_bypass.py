"""Users trying to get around the check, on a real Slurm 22.05 (issue 5).

Every scenario runs the aarch64 ("foreign") program in an enforce partition
as the unprivileged user ``nobody`` with one trick applied, and asserts the
step is still refused before any exec. Each trick is one that worked, or
would work, against a plugin without the protection named in its test:
container variables trusted from the step env (fixed here), an interpreter
started from the user's PYTHON* variables, a partition or option read from
the user's environment, an audit log the user could write.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import pytest

from .harness import SlurmEnv

pytestmark = pytest.mark.slurm

PREFIX = "grace-policy: "
FOREIGN_REFUSED = f"{PREFIX}ERROR exe-arch-mismatch"

#: The contract container_env= relies on, played by a stand-in site plugin
#: listed before ours: it owns --container-image and, in slurmstepd, sets
#: MARKER for a container step and removes it for every other step.
MARKER = "SITE_CONTAINER_STEP"
MARKER_PLUGIN_C = r"""
#include <string.h>
#include <slurm/spank.h>
SPANK_PLUGIN(sitecontainer, 1);
static char image[256];
static int cb(int val, const char *optarg, int remote)
{ (void)val; (void)remote; strncpy(image, optarg ? optarg : "", sizeof(image) - 1); return 0; }
static struct spank_option opt = {"container-image", "IMAGE", "test stand-in", 1, 0, cb};
int slurm_spank_init(spank_t sp, int ac, char **av)
{ (void)ac; (void)av; spank_option_register(sp, &opt); return 0; }
int slurm_spank_user_init(spank_t sp, int ac, char **av)
{
    (void)ac; (void)av;
    if (image[0]) spank_setenv(sp, "%s", image, 1);
    else spank_unsetenv(sp, "%s");
    return 0;
}
""".replace("%s", MARKER)


def _refused(res: subprocess.CompletedProcess[str]) -> None:
    assert res.returncode != 0, res.stderr
    assert FOREIGN_REFUSED in res.stderr, res.stderr
    assert "step not started" in res.stderr
    assert "Traceback" not in res.stderr + res.stdout


def _new_records(env: SlurmEnv, before: int) -> list[dict[str, object]]:
    return [json.loads(line) for line in env.audit_lines()[before:]]


# -- containers ---------------------------------------------------------------

CONTAINER_TRICKS = {
    "SLURM_CONTAINER": "/tmp/bundle",
    "SLURM_CONTAINER_ID": "abc",
    "_SLURM_SPANK_OPTION_pyxis_container_image": "ubuntu",
    "SLURM_SPANK__SLURM_SPANK_OPTION_pyxis_container_image": "ubuntu",
    MARKER: "ubuntu",
}


def _marker_plugin(slurm: SlurmEnv) -> Path:
    so = slurm.files / "spank_sitecontainer.so"
    if not so.exists():
        src = slurm.files / "sitecontainer.c"
        src.write_text(MARKER_PLUGIN_C)
        subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(so), str(src)], check=True,
                       capture_output=True, text=True)
    return so


def _use_with_marker(slurm: SlurmEnv, *extra: str) -> None:
    line = slurm.plugin_line(slurm.plugin, f"config={slurm.configs['base']}",
                             f"audit={slurm.audit_log}", *extra)
    slurm.cluster.set_plugstack([f"required {_marker_plugin(slurm)}", f"required {line}"])


@pytest.mark.parametrize("setup", ["default", "container_env"])
@pytest.mark.parametrize("var", sorted(CONTAINER_TRICKS))
def test_exported_container_variables_do_not_skip_the_check(slurm: SlurmEnv, var: str,
                                                            setup: str) -> None:
    """Before: ``decide.container_reason`` believed the first four from the
    step env and recorded ``skipped``: the foreign program ran. Now nothing in
    the user's environment skips a check; with container_env= only the site
    plugin's own setting counts (it removes what the user exported)."""
    if setup == "default":
        slurm.use("base")
    else:
        _use_with_marker(slurm, f"container_env={MARKER}")
    before = len(slurm.audit_lines())
    try:
        res = slurm.cluster.srun([str(slurm.files / "foreign")], user="nobody",
                                 env={var: CONTAINER_TRICKS[var]})
    finally:
        slurm.use("base")
    _refused(res)
    [record] = _new_records(slurm, before)
    assert (record["action"], record["skipped"]) == ("reject", None)


def test_container_step_marked_by_the_site_is_skipped(slurm: SlurmEnv) -> None:
    """The trusted path: the site plugin marks a real --container-image step."""
    _use_with_marker(slurm, f"container_env={MARKER}")
    before = len(slurm.audit_lines())
    try:
        res = slurm.cluster.srun(["--container-image=ubuntu", str(slurm.files / "native")],
                                 user="nobody")
        # Without container_env= the same option changes nothing: checked.
        _use_with_marker(slurm)
        refused = slurm.cluster.srun(["--container-image=ubuntu", str(slurm.files / "foreign")],
                                     user="nobody")
    finally:
        slurm.use("base")
    assert res.returncode == 0, res.stderr
    record = _new_records(slurm, before)[0]
    assert record["skipped"] == (f"container step ({MARKER} is set by the site): argv runs "
                                 "inside the image")
    _refused(refused)


# -- the user's environment ---------------------------------------------------

def _trick_env(slurm: SlurmEnv, name: str) -> dict[str, str]:
    """The environment of one trick; files it needs go to the shared dir."""
    shared = slurm.cluster.shared
    if name == "PYTHONPATH":
        # A package that shadows ours and fails: honoured, it would turn every
        # check into an error, and on_error=allow lets the step through.
        pkg = shared / "evilpath" / "grace_policy"
        pkg.mkdir(parents=True, exist_ok=True)
        (pkg / "__init__.py").write_text("raise SystemExit('shadowed')\n")
        return {"PYTHONPATH": str(pkg.parent)}
    if name == "PYTHONHOME":
        return {"PYTHONHOME": str(shared / "no-such-home")}
    if name in ("PYTHONSTARTUP", "PYTHONINSPECT"):
        # Run by an interactive interpreter only; must never run in slurmstepd.
        start = shared / "startup.py"
        start.write_text(f"open({str(shared / 'startup-ran')!r}, 'w').close()\n"
                         "raise SystemExit(0)\n")
        return {"PYTHONSTARTUP": str(start), "PYTHONINSPECT": "1"}
    if name == "LD_PRELOAD":
        lib = shared / "preload.so"
        if not lib.exists():
            src = shared / "preload.c"
            src.write_text("#include <unistd.h>\n__attribute__((constructor)) static void "
                           "f(void) { _exit(0); }\n")
            subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True,
                           capture_output=True)
        # Passed with --export below: in srun's own environment it would
        # preload into srun, which is the user's program anyway.
        return {"GRACE_TEST_PRELOAD": str(lib)}
    if name == "SLURM_JOB_PARTITION":
        return {"SLURM_JOB_PARTITION": "offp"}
    if name == "option variable":
        # The names Slurm really reads (non-alphanumerics become '_'); the
        # control in test_plugin shows they act where lowering is allowed.
        return {"SLURM_SPANK__SLURM_SPANK_OPTION_grace_policy_grace_policy": "off",
                "_SLURM_SPANK_OPTION_grace_policy_grace_policy": "off"}
    if name == "PYTHONWARNINGS":
        return {"PYTHONWARNINGS": "error", "PYTHONDEVMODE": "1", "PYTHONMALLOC": "bogus"}
    raise AssertionError(name)


ENV_TRICKS = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONINSPECT", "LD_PRELOAD",
              "SLURM_JOB_PARTITION", "option variable", "PYTHONWARNINGS")


@pytest.mark.parametrize("trick", ENV_TRICKS)
def test_user_environment_cannot_lower_or_skip(grace: SlurmEnv, trick: str) -> None:
    """The interpreter is isolated (reads no PYTHON* variable), slurmstepd is
    not started from the user's env (LD_PRELOAD), the partition and the mode
    come from srun/the option, not from exported variables."""
    before = len(grace.audit_lines())
    env = _trick_env(grace, trick)
    args = [str(grace.files / "foreign")]
    if "GRACE_TEST_PRELOAD" in env:
        args = [f"--export=ALL,LD_PRELOAD={env.pop('GRACE_TEST_PRELOAD')}", *args]
    res = grace.cluster.srun(args, user="nobody", env=env)
    _refused(res)
    [record] = _new_records(grace, before)
    assert (record["mode"], record["partition"], record["error"]) == ("enforce", "enforce",
                                                                       None)
    assert not (grace.cluster.shared / "startup-ran").exists()


# -- whose rights -------------------------------------------------------------

def _root_only_foreign(slurm: SlurmEnv) -> Path:
    secret = slurm.files / "root-only"
    secret.mkdir(exist_ok=True)
    secret.chmod(0o700)
    target = secret / "tool"
    if not target.exists():
        target.write_bytes((slurm.files / "foreign").read_bytes())
    target.chmod(0o700)
    return target


def test_user_files_are_read_with_the_users_rights(grace: SlurmEnv) -> None:
    """A file only root can read, named by a ``nobody`` job: the check cannot
    see it (it runs as the user in user_init), so it neither judges nor
    describes it; slurmstepd's exec then fails as it would without us.
    Root naming the same file gets it judged: the difference is the rights."""
    target = _root_only_foreign(grace)
    res = grace.cluster.srun([str(target)], user="nobody")
    assert "exe-arch-mismatch" not in res.stderr
    assert "aarch64" not in res.stderr and "AArch64" not in res.stderr
    assert res.returncode != 0  # the kernel refuses nobody's exec: EACCES
    assert "Permission denied" in res.stderr or "permission denied" in res.stderr.lower()
    assert "Traceback" not in res.stderr
    res = grace.cluster.srun([str(target)])
    assert FOREIGN_REFUSED in res.stderr


# -- the audit log ------------------------------------------------------------

def test_audit_line_of_a_nobody_step_in_a_root_only_file(grace: SlurmEnv) -> None:
    """The audit file is root's, 0640: nobody can neither write nor read it,
    and yet the step run as nobody gets its line (root opened the file in
    slurm_spank_init and the check writes to that descriptor)."""
    log = grace.audit_log
    st = log.stat()
    assert st.st_uid == 0
    assert stat.S_IMODE(st.st_mode) & 0o022 == 0, oct(st.st_mode)
    forged = subprocess.run(["runuser", "-u", "nobody", "--", "sh", "-c",
                             f"echo '{{\"forged\": 1}}' >> {log}"], capture_output=True,
                            text=True, check=False)
    assert forged.returncode != 0
    assert not any("forged" in line for line in grace.audit_lines())

    out = grace.side_file("audit-nobody.out")
    before = len(grace.audit_lines())
    res = grace.cluster.srun(["sh", "-c", "echo JOBID=$SLURM_JOB_ID"], user="nobody")
    assert res.returncode == 0, res.stderr
    job = res.stdout.split("JOBID=")[1].split()[0]
    [record] = _new_records(grace, before)
    assert (record["uid"], record["job_id"], record["action"]) == (65534, job, "allow")
    assert not out.exists()
    assert f"job {job} step 0: audit log" not in grace.cluster.slurmd_log_text()


def test_audit_file_created_by_the_plugin_is_root_0640(slurm: SlurmEnv) -> None:
    fresh = slurm.audit_log.parent / "created-by-plugin.log"
    if fresh.exists():
        fresh.unlink()
    try:
        slurm.use("base", f"audit={fresh}")
        res = slurm.cluster.srun(["true"], user="nobody")
        assert res.returncode == 0, res.stderr
        st = fresh.stat()
        assert (st.st_uid, stat.S_IMODE(st.st_mode) & ~0o022 & 0o777) == (0, 0o640)
        assert stat.S_IMODE(st.st_mode) & 0o002 == 0
        [line] = fresh.read_text().splitlines()
        assert json.loads(line)["uid"] == 65534
    finally:
        slurm.use("base")
        if fresh.exists():
            fresh.unlink()


def test_zz_node_not_drained(slurm: SlurmEnv) -> None:
    state = slurm.cluster.settled_node_state()
    assert state in ("idle", "mixed", "allocated"), (state, slurm.cluster.node_reason())
    assert os.path.exists(slurm.cluster.slurmd_log)


def test_tasks_inherit_no_descriptor_of_root(grace: SlurmEnv) -> None:
    """root opened the audit log (and the verdict cache) for appending before
    privileges dropped; a task that inherited either descriptor could forge
    lines or entries through /proc/self/fd. Both are close-on-exec. Two
    steps: a miss (Python ran) and the same step again (a cache hit)."""
    cache = grace.cache_dir
    for _ in range(2):
        res = grace.cluster.srun(
            ["sh", "-c", 'for f in /proc/$$/fd/*; do readlink "$f"; done; true'], user="nobody")
        assert res.returncode == 0, res.stderr
        held = res.stdout.splitlines()
        assert held, "the task shows no descriptors at all: the probe is broken"
        leaked = [p for p in held if p == str(grace.audit_log) or p.startswith(str(cache))]
        assert leaked == [], leaked


def test_audit_file_users_could_write_is_used_but_flagged(slurm: SlurmEnv) -> None:
    """An existing audit log that is not root's (or is group/world-writable)
    still gets its lines (dropping them would lose the record), but every
    step tells the admin that users may be able to forge lines in it."""
    loose = slurm.audit_log.parent / "loose-audit.log"
    if loose.exists():
        loose.unlink()
    loose.touch()
    os.chown(loose, 65534, 65534)
    loose.chmod(0o666)
    try:
        slurm.use("base", f"audit={loose}")
        res = slurm.cluster.srun(["true"], user="nobody")
        assert res.returncode == 0, res.stderr
        assert len(loose.read_text().splitlines()) == 1
        assert any(str(loose) in line and "users may be able to write it" in line
                   for line in slurm.cluster.slurmd_log_text().splitlines())
    finally:
        slurm.use("base")
        loose.unlink()
