"""A policy for tests that judge *what* a step decides, not how fast.

The default deadline (500 ms) is the node's: on a loaded 2-core CI machine,
with coverage tracing every line, a large script or environment can pass it
and turn the verdict into ``check-limit``, which such a test would report as a
wrong answer. The deadline itself is held by its own tests (test_budget,
test_hostile, test_batch's deadline case) with small explicit limits.
"""

from __future__ import annotations

from grace_policy.policy import Limits, Policy

ROOMY = Policy(limits=Limits(deadline_ms=60_000))
