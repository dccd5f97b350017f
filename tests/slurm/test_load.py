"""Load: 50 steps launched at once on the local cluster (issue 5 "Load").

One batch job of ``nobody`` starts 50 ``srun --overlap`` steps in the
background at the same moment (half native, half foreign, enforce mode), so
50 slurmstepds start their interpreter, check and write the shared audit log
concurrently. Every decision must be right (the native ones ran, the foreign
ones were refused before exec), nothing may hang (a deadlock would show as a
timeout), and the audit log must hold exactly one intact JSON line per step.
"""

from __future__ import annotations

import json
import shutil

import pytest

from .harness import SlurmEnv

pytestmark = pytest.mark.slurm

STEPS = 50
PREFIX = "grace-policy: "


def test_fifty_concurrent_steps(grace: SlurmEnv) -> None:
    work = grace.cluster.shared / "load"
    if work.exists():
        shutil.rmtree(work)
    work.mkdir()
    work.chmod(0o1777)
    programs = []
    for i in range(STEPS):
        kind = "native" if i % 2 == 0 else "foreign"
        prog = work / f"{kind}-{i}"
        shutil.copy2(grace.files / kind, prog)  # own path: the audit names it
        programs.append((kind, prog))
    launches = "\n".join(
        f"srun --overlap -n1 {prog} {work / f'{i}.ran'} >{work / f'{i}.out'} "
        f"2>{work / f'{i}.err'}; echo $? >{work / f'{i}.rc'} &"
        for i, (_, prog) in enumerate(programs))
    # Inside an 'if': the batch-script reader (issue 21) only warns there,
    # so the job runs and every step reaches the plugin on its own (on the
    # main path, the foreign srun lines would stop the job before line 1).
    script = f"#!/bin/sh\nif true; then\n{launches}\nfi\nwait\necho ALLDONE\n"
    out = work / "batch.out"
    before = len(grace.audit_lines())
    job = grace.cluster.sbatch(script, ["-o", str(out), "-n1"], user="nobody")
    state = grace.cluster.wait_job(job, timeout=110)
    assert state == "COMPLETED", (state, out.read_text() if out.exists() else "")
    assert "ALLDONE" in out.read_text()

    for i, (kind, _) in enumerate(programs):
        err = (work / f"{i}.err").read_text()
        assert "Traceback" not in err
        if kind == "native":
            assert (work / f"{i}.rc").read_text().strip() == "0", err
            assert (work / f"{i}.ran").read_text() == "executed\n", err
            assert PREFIX not in err
        else:
            assert (work / f"{i}.rc").read_text().strip() != "0"
            assert f"{PREFIX}ERROR exe-arch-mismatch: {work}/foreign-{i}" in err, err
            assert not (work / f"{i}.ran").exists()

    new = grace.audit_lines()[before:]
    records = [json.loads(line) for line in new]  # every line is whole, valid JSON
    mine = [r for r in records if r["job_id"] == str(job)]
    assert len(mine) == STEPS + 1, len(mine)  # the steps and the batch step
    steps = sorted(int(r["step_id"]) for r in mine if r["step_id"] != "batch")
    assert steps == list(range(STEPS))  # one line per step, none lost or doubled
    rejected = sorted(p for r in mine if r["action"] == "reject" for p in r["paths"])
    assert rejected == sorted(str(p) for k, p in programs if k == "foreign")
    assert sum(r["action"] == "allow" for r in mine) == STEPS // 2
    [batch] = [r for r in mine if r["step_id"] == "batch"]
    assert batch["action"] == "warn"  # the reader's warnings for the srun lines
    assert all(r["error"] is None and r["uid"] == 65534 for r in mine)
    assert f"{PREFIX}error: job {job} " not in grace.cluster.slurmd_log_text()
