"""Judge a step in its job's mount namespace, not in slurmd's.

Why: with ``JobContainerType=job_container/tmpfs`` (field notes §13) every
task of a job runs in the job's own mount namespace, with a private /tmp
and /dev/shm; Slurm joins it in the task's child (``container_g_join`` in
slurmstepd's ``_pre_task_child_privileged``), after user_init. The node
checker descends from slurmd and is in slurmd's namespace; so is slurmstepd
itself at slurm_spank_init and user_init on 22.05 (seen here: its
``/proc/PID/ns/mnt`` is the host's while its task's is the job's), so the
peer of the checker's socket (SO_PEERCRED) names the wrong namespace. A
program an earlier step put in the job's /tmp would be judged from the
host's /tmp: a foreign one run unjudged, a good one refused.

Where the namespace is: the job container plugin keeps it alive with an
nsfs bind mount ``BASEPATH/NODE/JOB/.ns`` (job_container/tmpfs, 22.05 to
25.x; ``.../JOB/.ns/mnt`` for the later namespace/linux) in slurmd's own
mount table, which is ours. Only root can mount there, so a user cannot
point us at another namespace. The forked child enters it with
``setns(CLONE_NEWNS)`` while it is still root and single-threaded (setns
needs CAP_SYS_ADMIN and an unshared fs struct), before it takes the user's
credentials; the server never does, so it stays in slurmd's view.

A namespace the child cannot enter is not judged in the wrong view: the
step gets a check failure naming the reason, and on_error decides (the
fallback to checker=step would not help: slurmstepd's own helper is in the
host's view too). A step judged in the job's view leaves no verdict-cache
entry: the cache is replayed by slurmstepd, in the host's view, where the
job's /tmp answers are not the ones recorded.
"""

from __future__ import annotations

import os

from .. import slurm_bridge
from ..jobns import HOLDER, MOUNTINFO, holders  # noqa: F401 (HOLDER: re-exported)

if not hasattr(os, "setns"):  # Python < 3.12: setns through libc
    # Loaded here, by the server at its start (only server.py imports this
    # module), so that no child pays for it: ctypes' first import took
    # 24-35 ms in a forked child here, against 0.6 ms for the whole entry.
    import ctypes
else:
    ctypes = None  # type: ignore[assignment]



class Unenterable(Exception):
    """The job has a mount namespace of its own that we cannot enter."""


def _setns(fd: int) -> None:
    if ctypes is None:  # Python 3.12+
        os.setns(fd, os.CLONE_NEWNS)
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, 0x00020000) != 0:  # CLONE_NEWNS
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def enter_job(job_id: int, mountinfo: str = MOUNTINFO) -> bool:
    """Enter job ``job_id``'s mount namespace if it has one other than ours.
    True: entered; False: none, or it is ours. Raises :class:`Unenterable`."""
    found = holders(job_id, mountinfo)
    if not found:
        return False
    spaces = set(found.values())
    if len(spaces) > 1:
        raise Unenterable(f"{len(spaces)} mount namespaces are held for job {job_id}: "
                          f"{', '.join(sorted(found))}")
    (space,) = spaces
    if os.readlink("/proc/self/ns/mnt") == space:
        return False
    holder = min(found)
    try:
        fd = os.open(holder, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise Unenterable(f"{holder}: {exc.strerror}") from None
    try:
        _setns(fd)
    except OSError as exc:
        raise Unenterable(f"setns {holder}: {exc.strerror}") from None
    finally:
        os.close(fd)
    if os.readlink("/proc/self/ns/mnt") != space:
        raise Unenterable(f"setns {holder}: still not in {space}")
    return True


class View:
    """Where a step is judged: the result of :func:`enter`."""

    __slots__ = ("entered", "problem")

    def __init__(self, entered: bool, problem: str | None) -> None:
        self.entered, self.problem = entered, problem

    def outcome(self, step: slurm_bridge.StepInput) -> slurm_bridge.Outcome:
        """The step's outcome in this view; a failure if it is not the job's."""
        if self.problem is not None:
            return slurm_bridge.Outcome.failed(self.problem)
        out = slurm_bridge.outcome_for(step)
        if self.entered:
            out.cache = None  # slurmstepd replays it in the host's view
        return out


def enter(job_id: int) -> View:
    """Enter the job's mount namespace (root, single-threaded, before the
    credential switch); what went wrong is said with the step, never raised."""
    try:
        return View(enter_job(job_id), None)
    except Exception as exc:  # Unenterable, OSError, an unreadable table
        return View(False, f"cannot judge job {job_id} in its own mount namespace (its "
                           f"/tmp and /dev/shm): {exc}; not judged in the host's view")
