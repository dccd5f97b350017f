"""Import what a check may need, and check nothing: for a pre-started checker.

A per-node checker that forks a child per step pays every import once, in
the parent, if the parent imports them before the first step; each child
then starts with them. :func:`preload` does that. It reads no config, no
user file and no node file (ld.so.cache, the interpreter, its libraries:
those are the step's inputs and must be read by the step's own check, as
the step's user), so calling it changes no verdict and no cache entry.

:data:`STEP` is what a clean step's check imports (``/bin/true``,
``python3 -c pass`` with and without a venv, an executable with 100
libraries: tests/test_warm.py checks that nothing is left over);
:data:`LATER` is what rarer paths import (a finding and its wording, an
exemption, a login-node or 64 KiB check, torch, editable installs), which
a long-lived parent can afford to hold too.
"""

from __future__ import annotations

from .slurm_bridge import PRELOAD

#: Imported by a clean step's check, in the order the check needs them: the
#: list the C prestart of grace_python.c walks one module at a time.
STEP = PRELOAD

#: Imported by rarer checks: findings and their wording, exemptions, the
#: rules of particular packages, another architecture's or page size's.
LATER = ("grace_policy.rules", "grace_policy.exempt", "grace_policy.pagecode",
         "grace_policy.python.editable", "grace_policy.python.torch_build",
         "grace_policy.python.torchcodec", "grace_policy.python.jitcache",
         "grace_policy.python.gpus", "grace_policy.python.nodeinterp")


def preload(*, later: bool = True) -> list[str]:
    """Import :data:`STEP` (and :data:`LATER` unless ``later`` is False).
    Returns the names that failed to import (a broken install: the check
    reports it itself when it needs the module); never raises for them."""
    import importlib

    failed = []
    for name in STEP + (LATER if later else ()):
        try:
            importlib.import_module(name)
        except Exception:
            failed.append(name)
    return failed
