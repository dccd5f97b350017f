"""Slurm's own example batch scripts (tests/batch_corpus.py): each is read
and judged on this (clean) node without a crash and without a finding.

Nothing in them is foreign here: what they run is the node's own
``hostname``, ``srun``, ``sleep``, or programs that do not exist (``a.out``,
``mpi-app``), which the reader does not judge. A finding would be a false
alarm on a script from Slurm's own manual.
"""

from __future__ import annotations

import time

import pytest
from batch_corpus import fetch_scripts
from corpus import CorpusUnavailable, _give_up
from roomy import ROOMY
from test_hostile import no_hang

from grace_policy.batch.judge import decide_batch, read_script
from grace_policy.budget import Budget
from grace_policy.decide import StepRequest
from grace_policy.node import detect


@pytest.fixture(scope="module")
def scripts(tmp_path_factory: pytest.TempPathFactory) -> list:
    try:
        root = fetch_scripts()
    except CorpusUnavailable as exc:
        _give_up(f"Slurm example scripts unavailable (network?): {exc}")
    found = sorted(root.iterdir())
    if not found:
        pytest.fail(f"{root} holds no scripts; delete it to refetch")
    work = tmp_path_factory.mktemp("corpus")
    out = []
    for path in found:
        copy = work / path.name
        copy.write_bytes(path.read_bytes())
        copy.chmod(0o755)
        out.append(copy)
    return out


def test_slurm_example_scripts_read_without_a_finding(scripts: list) -> None:
    node = detect()
    env = {"HOME": "/root", "PATH": "/usr/local/bin:/usr/bin:/bin", "SLURM_JOB_ID": "1",
           "SLURM_SUBMIT_DIR": "/tmp", "SLURM_JOB_NODELIST": "n1", "SLURM_NTASKS": "2"}
    read = 0
    parse_ms = 0.0
    commands = 0
    for script in scripts:
        start = time.perf_counter()
        reading = read_script(str(script), [], env, "/tmp", Budget(60_000, 100_000, 1 << 30))
        parse_ms += (time.perf_counter() - start) * 1000
        assert reading.limit is None, (script.name, reading.limit)
        commands += len(reading.commands)
        with no_hang(60):
            verdict = decide_batch(ROOMY, StepRequest(partition=None, argv=[str(script)], env=env,
                                                      cwd="/tmp", node=node))
        assert verdict.error is None, (script.name, verdict.error)
        shown = [f.rule for f in verdict.findings if f.severity != "info"]
        assert shown == [], (script.name, verdict.findings)
        # info: only why the rest of a script is uncertain (module load, ...)
        assert {f.rule for f in verdict.findings} <= {"batch-uncertain"}
        read += 1
    # Seen in the output with -s; what the report quotes.
    print(f"\n{read} Slurm example scripts, {commands} commands judged, "
          f"read in {parse_ms:.1f} ms together ({parse_ms / read:.2f} ms each)")
    assert read == len(scripts) >= 30
    assert commands > 0  # the reader did find commands to judge
