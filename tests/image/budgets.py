"""A budget for tests that judge *what* an image reader answers, not how fast.

An image keeps the budget it was opened under for every later read
(grace_policy/image/open.py): a module-scoped image read across many tests
on a loaded CI machine must not run into the node's 500 ms deadline. The
bounds themselves are held by tests/image/test_image_bounds.py.
"""

from __future__ import annotations

from grace_policy.budget import Budget


def roomy() -> Budget:
    """An hour, a million files, a TiB: nothing a test of answers reaches."""
    return Budget(deadline_ms=3_600_000, max_files=1_000_000, max_bytes=1 << 40)
