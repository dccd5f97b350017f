"""How runc finds a bare program name of ``srun --container=BUNDLE NAME``.

runc (1.1.5, ``libcontainer/standard_init_linux.go``) looks ``process.args[0]``
up with Go's ``exec.LookPath`` inside the container, after it has cleared its
own environment, set ``process.env`` (the last definition of a name wins) and
changed to ``process.cwd``; on 22.05 ``process.env`` is the bundle's followed
by the job's, so the job's PATH is the one searched. Without the change
these tests cover, a name not found was predicted the way slurmstepd would
run it on the host (``execve(): tool``, or ``exec /tool`` for a foreign
bundle) instead of runc's ``exec: "tool": executable file not found in
$PATH``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from . import test_containers
from .test_containers import PREFIX, Pyxis

pytestmark = pytest.mark.slurm

# The fixtures, shared with test_containers (module-scoped: built once here).
pyxis = test_containers.pyxis
oci = test_containers.oci

NOT_FOUND = ('runc run failed: unable to start container process: '
             'exec: "tool": executable file not found in $PATH')


def _runc_version() -> tuple[int, int]:
    done = subprocess.run(["runc", "--version"], capture_output=True, text=True, check=False)
    found = re.search(r"runc version (\d+)\.(\d+)", done.stdout)
    return (int(found[1]), int(found[2])) if found else (0, 0)


def _as_this_runc_says(text: str) -> str:
    """runc 1.2 on wraps an init error once more ("error during container
    init: ", process_linux.go); our text is 1.1's (Debian 12), which the
    plugin cannot tell apart without running the runtime: the known gap."""
    if _runc_version() >= (1, 2):
        return text.replace("process: exec: ", "process: error during container init: exec: ")
    return text


def _runc_error(stderr: str) -> list[str]:
    """The messages of runc's logrus error lines, unquoted."""
    found = re.findall(r'^time="[^"]*" level=error msg=("(?:[^"\\]|\\.)*")$', stderr, re.M)
    return [json.loads(text) for text in found]


def _predicted(stderr: str) -> str:
    """Our ``without this check:`` text, its wrapped lines joined again.
    Only our lines: srun writes the step's stderr as it comes, and runc's own
    error can land between two lines of our message (seen in a cold CI run)."""
    head = f"{PREFIX}  without this check: "
    cont = PREFIX + " " * (len(head) - len(PREFIX))
    lines = [line for line in stderr.splitlines() if line.startswith(PREFIX)]
    [at] = [i for i, line in enumerate(lines) if line.startswith(head)]
    words = [lines[at][len(head):]]
    for line in lines[at + 1:]:
        if not line.startswith(cont):
            break
        words.append(line[len(cont):])
    return " ".join(words)


def _bundle_env_wins() -> bool:
    """Slurm 26.05's ``setup_container`` writes the bundle's ``process.env``
    over the step's environment (the bundle's PATH is then the one runc
    searches); 22.05 puts the job's after the bundle's, so the job's wins.
    (24.11 is not run here: the container files run on the newest release.)"""
    return test_containers._slurm_major() >= 26


def _job_path(extra: str = "") -> dict[str, str]:
    path = os.environ.get("PATH", "/usr/bin:/bin")
    return {"PATH": f"{extra}:{path}" if extra else path}


def test_bare_name_not_on_the_jobs_path(pyxis: Pyxis, oci: dict[str, Path]) -> None:
    """``tool`` lies in the bundle's /opt/app/bin, on the bundle's PATH, but
    on 22.05 the job's PATH comes later in process.env and wins: runc does
    not find it, and says what we said (exe-not-found warns in every mode,
    as on the host: the step fails by itself). On 26.05 the bundle's PATH
    wins: runc finds and runs it, and the check judged that file."""
    pyxis.use()
    if _bundle_env_wins():
        before = len(pyxis.slurm.audit_lines())
        res = pyxis.slurm.cluster.srun([f"--container={oci['clean']}", "tool"],
                                       env=_job_path())
        assert res.returncode == 0, res.stderr
        assert "side-effect program ran" in res.stdout
        assert PREFIX not in res.stderr
        [rec] = pyxis.records(before)
        assert (rec["action"], rec["rules"], rec["image"]) == ("allow", [], str(oci["clean"]))
        return
    for part in ("enforce", "warnp"):
        res = pyxis.slurm.cluster.srun(["-p", part, f"--container={oci['clean']}", "tool"],
                                       env=_job_path())
        assert res.returncode != 0
        assert f"{PREFIX}WARNING exe-not-found: {oci['clean']}:tool\n" in res.stderr
        assert "side-effect program ran" not in res.stdout
        assert _runc_error(res.stderr) == [_as_this_runc_says(NOT_FOUND)]
        assert _predicted(res.stderr) == NOT_FOUND


def test_bare_name_found_on_the_jobs_path(pyxis: Pyxis, oci: dict[str, Path]) -> None:
    """The same name with /opt/app/bin on the job's PATH: runc runs the
    bundle's tool, which the check judged."""
    pyxis.use()
    before = len(pyxis.slurm.audit_lines())
    res = pyxis.slurm.cluster.srun([f"--container={oci['clean']}", "tool"],
                                   env=_job_path("/opt/app/bin"))
    assert res.returncode == 0, res.stderr
    assert "side-effect program ran" in res.stdout
    assert PREFIX not in res.stderr
    [rec] = pyxis.records(before)
    assert (rec["action"], rec["rules"], rec["image"]) == ("allow", [], str(oci["clean"]))


@pytest.mark.parametrize("found", [True, False], ids=["found", "not-found"])
def test_foreign_bundle_predicts_runcs_lookup(pyxis: Pyxis, oci: dict[str, Path],
                                              found: bool) -> None:
    """The other architecture's bundle, a bare name: enforce refuses it
    before runc runs; in warn mode runc fails as predicted, word for word —
    ``exec format error`` on the file it found, or its lookup error."""
    pyxis.use()
    env = _job_path("/opt/app/bin" if found else "")
    args = [f"--container={oci['arm64']}", "tool"]
    res = pyxis.slurm.cluster.srun(args, env=env)
    assert res.returncode != 0
    assert PREFIX + "ERROR image-arch-mismatch: " + str(oci["arm64"]) in res.stderr
    assert not _runc_error(res.stderr)  # refused in task_init, before runc ran
    assert not [line for line in res.stderr.splitlines()
                if "exec format error" in line and not line.startswith(PREFIX)]
    res = pyxis.slurm.cluster.srun(["-p", "warnp", *args], env=env)
    assert res.returncode != 0
    assert PREFIX + "the step runs anyway (partition warnp, mode warn)" in res.stderr
    if found or _bundle_env_wins():  # 26.05: the bundle's PATH finds it anyway
        [real] = [line for line in res.stderr.splitlines()
                  if "exec format error" in line and not line.startswith(PREFIX)]
        assert real == "exec /opt/app/bin/tool: exec format error"
    else:
        [real] = _runc_error(res.stderr)
        assert real == _as_this_runc_says(NOT_FOUND)
        real = NOT_FOUND
    assert _predicted(res.stderr) == real
