"""The check's budget also notices when the process' rights change under it:
slurmstepd takes root back for every thread once it stops waiting (the
plugin's C timeout), and a check left behind must not read on as root."""

from __future__ import annotations

import os

import pytest

from grace_policy.budget import Budget, BudgetExceeded


@pytest.mark.skipif(os.geteuid() != 0, reason="changing the euid needs root")
def test_tick_stops_when_the_effective_uid_changes() -> None:
    pid = os.fork()
    if pid == 0:  # child: do not let pytest run on in here
        code = 3
        try:
            os.seteuid(65534)  # the check starts as the job's user ...
            budget = Budget(deadline_ms=60_000)
            budget.tick()  # ... fine while the rights stay
            os.seteuid(0)  # slurmstepd reclaims root for every thread
            try:
                budget.tick()
                code = 1  # not noticed
            except BudgetExceeded as exc:
                code = 0 if "rights changed" in str(exc) else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
