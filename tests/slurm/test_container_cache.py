"""No stale allow for a changed container step (issue 27, R11), on a real
Slurm with real pyxis 0.24.0 and enroot 4.1.2.

A clean pyxis step is a verdict-cache entry keyed on ``KIND:IMAGE``. What
else decides what argv finds in the container must be in the key too:
pyxis' own options (``--container-mounts``, ``--container-workdir``, the
home mount: the ``cargs`` input, grace_cache.c) and enroot's configuration
(``mounts.d``/``environ.d`` of the site and the user, read through fsprobe
and so recorded). Without the change, the second step below replays the
first one's allow, and the foreign program mounted over the image's
reaches enroot's ``Exec format error``.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from .test_containers import Pyxis, pyxis  # noqa: F401  (the fixture)

pytestmark = pytest.mark.slurm

PREFIX = "grace-policy: "


def _cached_image(pyxis: Pyxis, name: str) -> str:  # noqa: F811
    """A copy of the clean image of its own (no earlier entry keyed on it)
    and a first step that makes it a cache entry, then a hit."""
    pyxis.use()
    shutil.copy2(pyxis.images["clean"], pyxis.slurm.cluster.shared / name)
    before = len(pyxis.slurm.audit_lines())
    for _ in range(2):
        res = pyxis.srun([f"--container-image=./{name}", "tool"])
        assert res.returncode == 0, res.stderr
        assert "side-effect program ran" in res.stdout
    first, second = pyxis.records(before)
    assert (first.get("cache"), second.get("cache")) == (None, "hit")
    return f"--container-image=./{name}"


def _foreign_dir(where: Path, pyxis: Pyxis) -> Path:  # noqa: F811
    """A directory holding another architecture's ``tool``."""
    where.mkdir(exist_ok=True)
    where.chmod(0o755)
    shutil.copy2(pyxis.work / "src" / "foreign", where / "tool")
    return where


def _refused(pyxis: Pyxis, args: list[str], **kw: object) -> None:  # noqa: F811
    before = len(pyxis.slurm.audit_lines())
    res = pyxis.srun(args, **kw)  # type: ignore[arg-type]
    assert res.returncode != 0
    assert f"{PREFIX}ERROR exe-arch-mismatch" in res.stderr, res.stderr
    assert "Exec format error" not in res.stderr
    [rec] = pyxis.records(before)
    assert rec.get("cache") is None and rec["rules"] == ["exe-arch-mismatch"]


def test_container_mounts_are_in_the_key(pyxis: Pyxis) -> None:  # noqa: F811
    image = _cached_image(pyxis, "keyed-mounts.sqsh")
    other = _foreign_dir(pyxis.work / "otherbin", pyxis)
    _refused(pyxis, [image, f"--container-mounts={other}:/opt/app/bin", "tool"])
    # pyxis' environment default for the option is read the same way.
    before = len(pyxis.slurm.audit_lines())
    res = pyxis.slurm.cluster.srun(
        [image, "tool"], env={**pyxis.env(), "PYXIS_CONTAINER_MOUNTS": f"{other}:/opt/app/bin"},
        timeout=180)
    assert res.returncode != 0 and f"{PREFIX}ERROR exe-arch-mismatch" in res.stderr, res.stderr
    [rec] = pyxis.records(before)
    assert rec.get("cache") is None


def test_a_relative_mount_source_is_the_jobs_cwd(pyxis: Pyxis) -> None:  # noqa: F811
    """pyxis takes ``./DIR`` as a source (args.c ``add_mount``); enroot runs
    in the job's cwd, where ``mount(2)`` resolves it. Without the grammar,
    the mount was ignored and the image's own ``tool`` judged."""
    image = _cached_image(pyxis, "keyed-relative.sqsh")
    _foreign_dir(pyxis.slurm.cluster.shared / "relbin", pyxis)
    _refused(pyxis, [image, "--container-mounts=./relbin:/opt/app/bin", "tool"])


def test_users_enroot_mounts_d_is_recorded(pyxis: Pyxis) -> None:  # noqa: F811
    """A ``.fstab`` the user adds to ``$HOME/.config/enroot/mounts.d`` after
    the entry was made: a miss, judged with the new mount."""
    image = _cached_image(pyxis, "keyed-enroot.sqsh")
    other = _foreign_dir(pyxis.work / "otherbin", pyxis)
    config = Path(pyxis.env()["HOME"]) / ".config" / "enroot"
    made = not config.exists()
    (config / "mounts.d").mkdir(parents=True, exist_ok=True)
    fstab = config / "mounts.d" / "50-mine.fstab"
    try:
        fstab.write_text(f"{other} /opt/app/bin none x-create=dir,bind,ro 0 -1\n")
        _refused(pyxis, [image, "tool"])
    finally:
        fstab.unlink(missing_ok=True)
        if made:
            shutil.rmtree(config)
    # The mount gone again: clean, and the old entry (made before the file
    # existed) still holds.
    before = len(pyxis.slurm.audit_lines())
    res = pyxis.srun([image, "tool"])
    assert res.returncode == 0, res.stderr
    [rec] = pyxis.records(before)
    assert rec["rules"] == []


def test_an_option_too_long_to_carry_is_not_judged_nor_cached(pyxis: Pyxis  # noqa: F811
                                                              ) -> None:
    """A ``--container-mounts`` longer than C's buffer: before, C dropped
    the whole option silently and the image was judged (and cached) as if
    nothing were mounted; now the step is a skip with the reason, never an
    entry."""
    image = _cached_image(pyxis, "keyed-long.sqsh")
    other = _foreign_dir(pyxis.work / "otherbin", pyxis)
    items = ",".join(f"{other}:/mnt/m{i:04d}" for i in range(4200 // (len(str(other)) + 11)))
    items += f",{other}:/opt/app/bin"
    assert len(items) > 4096
    before = len(pyxis.slurm.audit_lines())
    for _ in range(2):
        pyxis.srun([image, f"--container-mounts={items}", "tool"])
    recs = pyxis.records(before)
    assert len(recs) == 2 and all(r.get("cache") is None for r in recs), recs
    assert all("too long for the check to read" in (r["skipped"] or "") for r in recs), recs


def test_a_newline_in_a_mount_source_is_carried(pyxis: Pyxis) -> None:  # noqa: F811
    """A directory whose name holds a newline (legal; pyxis splits only at
    ``,`` and ``:``, and escapes it for enroot's fstab): C used to drop the
    whole option, and the image was judged (and cached) without the mount.
    Now C carries it (``%0A``) and the mounted foreign program is refused."""
    image = _cached_image(pyxis, "keyed-newline.sqsh")
    odd = _foreign_dir(pyxis.work / "odd\nbin", pyxis)
    _refused(pyxis, [image, f"--container-mounts={odd}:/opt/app/bin", "tool"])
