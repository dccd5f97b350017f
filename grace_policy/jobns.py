"""Whether a job keeps a mount namespace of its own, and which.

Why a module of its own: the node checker's child enters that namespace
(:mod:`grace_policy.checker.mntns`), and slurmstepd's own helper
(``checker=step``), which cannot, must know that it is not in it
(:func:`grace_policy.slurm_bridge.confined_outcome`): one reading of the
mount table for both. The job container plugin keeps the namespace alive
with an nsfs bind mount ``BASEPATH/NODE/JOB/.ns`` (job_container/tmpfs;
``.../JOB/.ns/mnt`` for the later namespace/linux) in slurmd's mount table,
which slurmstepd and the node checker share; only root can mount there.
"""

from __future__ import annotations

import os

#: The nsfs holder's name in the job's directory under the plugin's BasePath.
HOLDER = ".ns"
MOUNTINFO = "/proc/self/mountinfo"


def _unescape(field: str) -> str:
    """mountinfo's octal escapes (space, tab, newline, backslash)."""
    if "\\" not in field:
        return field
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def holders(job_id: int, mountinfo: str = MOUNTINFO) -> dict[str, str]:
    """The job's mount-namespace holders in our mount table: mount point ->
    namespace (``mnt:[INODE]``). Empty: the job has none that we know of."""
    want = str(job_id)
    found: dict[str, str] = {}
    with open(mountinfo, "rb") as fh:
        data = fh.read()
    if f"/{want}/{HOLDER}".encode() not in data:
        return found  # every step of a site without job containers: no parse
    for line in os.fsdecode(data).splitlines():
        head, sep, tail = line.partition(" - ")
        fields = head.split()
        if not sep or len(fields) < 5 or tail.split()[:1] != ["nsfs"]:
            continue
        root, point = fields[3], _unescape(fields[4])
        if not root.startswith("mnt:["):
            continue
        parts = point.split("/")
        if parts[-1] == "mnt":  # namespace/linux: JOB/.ns/mnt
            parts.pop()
        if len(parts) >= 2 and parts[-1] == HOLDER and parts[-2] == want:
            found[point] = root
    return found


def elsewhere(job_id: int, mountinfo: str = MOUNTINFO) -> str | None:
    """Why a process in this mount namespace cannot judge job ``job_id`` in
    its own view of files, or None when the job has no namespace held, or
    holds this one (24.05+ ``contain_spank`` runs user_init in it)."""
    try:
        found = holders(job_id, mountinfo)
        if not found or set(found.values()) == {os.readlink("/proc/self/ns/mnt")}:
            return None
    except OSError as exc:
        return f"cannot read the mount table ({exc.strerror})"
    return (f"job {job_id} has a mount namespace of its own (its /tmp and /dev/shm: "
            f"{', '.join(sorted(found))}) and this process is not in it")
