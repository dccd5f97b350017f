"""Processes of one test cluster, told apart from every other cluster's.

``make test`` runs independent parts at once (tests/parts.py), and another
session may run its own clusters on this machine: the same node name, job
ids that start at 1 in every cluster, helpers all named ``grace-check``. A
census of "what this cluster left behind" must count only the processes
that belong to it: those whose command line names a path under the
cluster's own directory (a node checker's ``--socket``), that hold a
descriptor of a file there (slurmstepd's log), or whose environment does
(slurmstepd's helpers: the daemons' PATH starts with the cluster's own
``bin``; a helper holds no file of the cluster's once its verdict-cache
lookup is over, docs/SECURITY.md "The checker's confinement").
"""

from __future__ import annotations

import os
from pathlib import Path


def belongs(pid: int, scope: Path) -> bool:
    """Whether process ``pid`` is one of the cluster under ``scope``'s."""
    mark = str(scope).rstrip("/") + "/"
    proc = Path(f"/proc/{pid}")
    try:
        if mark.encode() in (proc / "cmdline").read_bytes():
            return True
        fds = os.listdir(proc / "fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(proc / "fd" / fd).startswith(mark):
                return True
        except OSError:
            continue
    try:
        return any(b"=" + mark.encode() in item or b":" + mark.encode() in item
                   for item in (proc / "environ").read_bytes().split(b"\0"))
    except OSError:
        return False


def live(comm: str, scope: Path) -> list[str]:
    """``pid state comm args`` of the live (not zombie) processes named
    ``comm`` that belong to the cluster under ``scope``. Read from /proc: ps
    cuts args at 80 columns when not on a terminal."""
    rows = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            name = (entry / "comm").read_text().strip()
            if name != comm:
                continue
            state = (entry / "stat").read_text().rpartition(")")[2].split()[0]
            args = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if state != "Z" and belongs(int(entry.name), scope):
            rows.append(f"{entry.name} {state} {name} {args.strip()}")
    return rows
