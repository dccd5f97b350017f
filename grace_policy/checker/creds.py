"""Become what slurmstepd is at user_init, before reading anything of the step.

Why first: the child reads the step's files as the step's user would, and
the user must be able neither to signal nor to trace it. So it takes the
user's groups, then gids, then uids - the user's effective ids, root's real
and saved ids, as slurmstepd has them in user_init - while it is still
root, and checks that they took (as spank/grace_helper.c grace_take_creds
does for the pre-started helper).
"""

from __future__ import annotations

import os

from .wire import Request


def take(request: Request) -> None:
    """Take the request's credentials and slurmstepd's own PATH (what pyxis'
    enroot is found on, container/enroot.py; the forked helper of
    checker=step has it as its os.environ). Raises PermissionError if they
    did not all take."""
    ids = request.ids
    if request.path is None:
        os.environ.pop("PATH", None)
    else:
        os.environ["PATH"] = request.path
    os.setgroups(request.groups)
    os.setresgid(ids["rgid"], ids["egid"], ids["sgid"])
    os.setresuid(ids["ruid"], ids["euid"], ids["suid"])
    if os.getresuid() != (ids["ruid"], ids["euid"], ids["suid"]) \
            or os.getegid() != ids["egid"]:
        raise PermissionError("credentials did not take")
