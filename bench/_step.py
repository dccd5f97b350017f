"""One clean step's Python side in a fresh interpreter, as slurmstepd runs it.

Run as ``/usr/bin/python3 -I -S bench/_step.py PKGDIR CONFIG ARGV...``: the
same isolated, site-less start as the plugin (spank/grace_python.c), the
same imports (``_cffi_backend``, then the bridge), then
``slurm_bridge.run_step`` on the given argv with this process's PATH (a
cache miss: the check plus the verdict-cache entry it hands C). The
bench times this process against ``-c pass`` to get the Python-side cost of a
step without Slurm's noise. Kept free of imports of its own for that reason.
"""

import sys

sys.path[:0] = sys.argv[1].split(":")
import _cffi_backend  # noqa: E402,F401  (the plugin imports it before anything)

from grace_policy import slurm_bridge  # noqa: E402

_env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/nonexistent"}
_kw = {}
if "audit_fd" in slurm_bridge.StepInput.__annotations__:
    # The plugin opens the audit log as root and hands the check its fd.
    import os

    _audit = os.environ.get("GRACE_BENCH_AUDIT", "/dev/null")
    _kw = {"audit_path": _audit,
           "audit_fd": os.open(_audit, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)}
if "code" in slurm_bridge.StepInput.__annotations__:
    _kw["code"] = "bench|-"  # a miss builds the verdict-cache entry, as in slurmstepd
_out = slurm_bridge.run_step(slurm_bridge.StepInput(
    config=sys.argv[2], on_error="allow", partition="enforce", cwd="/", user_mode=None,
    node="bench", argv=tuple(sys.argv[3:]), env=_env, job_id=1, step_id=0, uid=os.geteuid(),
    batch=False, **_kw))
if _out.action != "allow" or _out.user or _out.log:
    print(f"not a clean step: {_out}", file=sys.stderr)
    sys.exit(1)
