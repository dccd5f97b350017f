"""A clean step's check in a warm process, as a pre-started checker runs it.

Run as ``/usr/bin/python3 -I -S bench/_warm.py PKGDIR CONFIG MODE RUNS ARGV...``:

* ``fresh``: import the bridge as the plugin does, then time one
  ``slurm_bridge.run_step`` (the first call of a process: what it still
  imports, ld.so.cache, the config, the check and the cache entry);
* ``fork``: import everything a check may need (``grace_policy.warm``, or the
  bridge's ``PRELOAD`` list on a tree without it) but run no check, then fork
  a child per step and time ``run_step`` in the child (what a per-node
  checker that forks per miss pays);
* ``fork-prefault``: as ``fork``, but each child runs ``warm.prefault``
  before the clock starts (a checker that forks its next child ahead);
* ``profile``: as ``fork-prefault``, under cProfile (``RUNS`` children's
  stats summed; ``SORT`` and ``TOP`` from the environment); prints the top
  functions.

Prints two lines of milliseconds (``RUNS`` of them) for the first two: wall
time, then CPU time (which moves less with the machine's load).
Kept free of imports of its own before the clock, like bench/_step.py.
"""

import os
import sys

sys.path[:0] = sys.argv[1].split(":")
import _cffi_backend  # noqa: E402,F401  (the plugin imports it before anything)

from grace_policy import slurm_bridge  # noqa: E402

CONFIG, MODE, RUNS, ARGV = sys.argv[2], sys.argv[3], int(sys.argv[4]), tuple(sys.argv[5:])


def step() -> tuple[float, float]:
    """One run_step of ARGV: its wall and CPU ms (the CPU figure moves less
    with the machine's load); exits 1 if the step is not clean."""
    import time

    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/nonexistent"}
    t0, c0 = time.perf_counter(), time.process_time()
    out = slurm_bridge.run_step(slurm_bridge.StepInput(
        config=CONFIG, on_error="allow", partition="enforce", cwd="/", user_mode=None,
        node="bench", argv=ARGV, env=env, job_id=1, step_id=0, uid=os.geteuid(),
        batch=False, code="bench|-"))
    ms = (time.perf_counter() - t0) * 1000, (time.process_time() - c0) * 1000
    if out.action != "allow" or out.user or out.log:
        print(f"not a clean step: {out}", file=sys.stderr)
        os._exit(1)
    return ms


def preload() -> None:
    try:
        from grace_policy import warm
    except ImportError:  # a tree from before grace_policy.warm: the C side's list
        import importlib

        for name in slurm_bridge.PRELOAD:
            importlib.import_module(name)
    else:
        warm.preload()


def forked(profile: str = "", touch: bool = False) -> str:
    """Fork, run one step in the child, hand its figure back through a pipe.
    ``touch``: the child first runs ``warm.prefault`` (not timed: a checker
    that forks ahead does that before the step arrives)."""
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(rfd)
        if touch:
            from grace_policy import warm

            warm.prefault()
        if profile:
            import cProfile

            prof = cProfile.Profile()
            prof.enable()
            step()
            prof.disable()
            prof.dump_stats(profile)
            out = profile
        else:
            wall, cpu = step()
            out = f"{wall:.3f} {cpu:.3f}"
        os.write(wfd, out.encode())
        os._exit(0)
    os.close(wfd)
    chunks = []
    while chunk := os.read(rfd, 65536):
        chunks.append(chunk)
    os.close(rfd)
    _pid, status = os.waitpid(pid, 0)
    if status:
        sys.exit(1)
    return b"".join(chunks).decode()


if MODE == "fresh":
    wall, cpu = step()
    print(f"{wall:.3f}\n{cpu:.3f}")
elif MODE in ("fork", "fork-prefault"):
    preload()
    pairs = [forked(touch=MODE == "fork-prefault").split() for _ in range(RUNS)]
    print(" ".join(p[0] for p in pairs))
    print(" ".join(p[1] for p in pairs))
elif MODE == "profile":
    import io
    import pstats
    import tempfile

    preload()
    stats = None
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(RUNS):
            name = f"{tmp}/{i}"
            forked(profile=name, touch=True)
            stats = pstats.Stats(name) if stats is None else stats.add(name)
    text = io.StringIO()
    stats.stream = text  # type: ignore[union-attr]
    stats.sort_stats(os.environ.get("SORT", "cumulative")).print_stats(  # type: ignore[union-attr]
        int(os.environ.get("TOP", "40")))
    print(text.getvalue())
else:
    sys.exit(f"unknown mode {MODE}")
