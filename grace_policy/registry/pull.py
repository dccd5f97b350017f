"""``check --image REGISTRY#IMAGE --pull``: the image's files, fetched the
way the job's own pull will fetch them.

The manifest tells what an image claims to be; only its files tell what it
runs. A person asking from a login node may pay for a pull, so ``--pull``
runs the user's own ``enroot import`` (the enroot pyxis runs on the node,
with the user's environment, ``enroot.conf`` and ``.credentials``) for the
node's architecture into a scratch directory, and the squashfs it writes is
judged like any local ``.sqsh``. It names the manifest the check resolved by
its digest (:func:`pinned_uri`), so the files judged are the ones the
output names even if the tag moves meanwhile. :mod:`.cache` runs the same
import from the user's enroot cache, without ``--pull``. Running enroot itself, rather than a
second downloader of ours, keeps every registry rule (auth, proxies,
``ENROOT_ALLOW_HTTP``, the choice of manifest, layer order and whiteouts)
the one the node will follow.

Never used by the plugin: a pull is not something to do on the launch path.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass

from .reference import Reference

#: A pull of a large image (several GB) on a slow link: an hour, then stop.
PULL_TIMEOUT = 3600.0
#: The lines of enroot's own output shown when its import failed.
ERROR_LINES = 8


class PullError(Exception):
    """enroot is missing or its import failed: the reason is for the user."""


@dataclass(frozen=True)
class Pulled:
    #: The squashfs enroot wrote.
    path: str
    #: The scratch directory holding it (removed by :meth:`remove`).
    scratch: str

    def remove(self) -> None:
        shutil.rmtree(self.scratch, ignore_errors=True)


def enroot_uri(given: str) -> str:
    """The URI ``enroot import`` takes: pyxis prefixes ``docker://`` to a
    bare ``[USER@][REGISTRY#]IMAGE[:TAG]`` before it calls enroot."""
    return given if "://" in given else f"docker://{given}"


def pinned_uri(ref: Reference, digest: str) -> str:
    """The URI of one manifest: enroot asks the registry for ``digest``
    itself, so a tag moved since the manifest check imports nothing else.
    ``USER@`` stays (the credentials enroot picks); none: enroot infers it
    from ``.credentials`` as for the tag."""
    user = f"{ref.user}@" if ref.user else ""
    return f"docker://{user}{ref.registry}#{ref.image}@{digest}"


def enroot_import(uri: str, machine: str, env: Mapping[str, str], *,
                  scratch: str | None = None) -> Pulled:
    """``enroot import --arch MACHINE URI`` into ``scratch`` (a new
    directory under ``$TMPDIR`` when None, removed on failure; a given one
    is the caller's to remove). Raises :class:`PullError`."""
    enroot = shutil.which("enroot", path=env.get("PATH", os.defpath))
    if enroot is None:
        raise PullError("--pull runs your own `enroot import`, and enroot is not on PATH "
                        "here; run it where enroot is installed, or leave out --pull")
    where = scratch if scratch is not None else tempfile.mkdtemp(prefix="grace-pull-")
    out = os.path.join(where, "image.sqsh")

    def failed() -> None:
        if scratch is None:
            shutil.rmtree(where, ignore_errors=True)

    try:
        done = subprocess.run([enroot, "import", "--arch", machine, "--output", out, uri],
                              env=dict(env), cwd=where, stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              timeout=PULL_TIMEOUT, check=False)
    except subprocess.TimeoutExpired:
        failed()
        raise PullError(f"`enroot import` did not finish in {PULL_TIMEOUT:.0f} s") from None
    except OSError as exc:
        failed()
        raise PullError(f"cannot run enroot: {exc.strerror}") from None
    if done.returncode != 0 or not os.path.isfile(out):
        failed()
        said = done.stdout.decode(errors="replace").strip().splitlines()[-ERROR_LINES:]
        raise PullError(f"`enroot import` failed (exit {done.returncode}): "
                        + (" / ".join(line.strip() for line in said) or "no output"))
    return Pulled(out, where)
