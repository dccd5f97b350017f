"""What enroot itself mounts into a pyxis container, on a real Slurm with
real pyxis 0.24.0 and enroot 4.1.2 (issue 15): a program that lives only in
a host directory the site's ``mounts.d`` mounts, or in the home directory
``ENROOT_MOUNT_HOME`` mounts, is judged from the host under that mount.

The site's enroot is the built one installed with its configuration in a
directory of this test (tests/slurm/containers.py ``site_enroot``), first on
slurmstepd's PATH for this module (pyxis runs the first ``enroot`` there);
its ``mounts.d`` gains ``50-site.fstab``, as an admin writes one.

Without the change these tests pin, ``/opt/site/tool`` does not exist in
the image, so the check warned ``exe-not-found`` and let a foreign program
reach ``Exec format error``.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from .test_containers import Pyxis, pyxis  # noqa: F401  (the fixture)

pytestmark = pytest.mark.slurm

PREFIX = "grace-policy: "


@pytest.fixture(scope="module")
def site(pyxis: Pyxis) -> Iterator[dict[str, Path]]:  # noqa: F811
    from . import containers

    dest = pyxis.work / "site-enroot"
    script = containers.site_enroot(dest)
    apps = pyxis.work / "site-apps"
    apps.mkdir(exist_ok=True)
    apps.chmod(0o755)
    shutil.copy2(pyxis.work / "src" / "native", apps / "native")
    shutil.copy2(pyxis.work / "src" / "foreign", apps / "foreign")
    (dest / "etc/enroot/mounts.d/50-site.fstab").write_text(
        f"# the site's software\n{apps} /opt/site none x-create=dir,bind,ro,nosuid 0 -1\n")
    home_bin = pyxis.work / "home" / "bin"
    home_bin.mkdir(parents=True, exist_ok=True)
    shutil.copy2(pyxis.work / "src" / "foreign", home_bin / "foreign")
    # The site's environ.d puts its tools first on the container's PATH.
    (dest / "etc/enroot/environ.d/50-site.env").write_text(
        "PATH=/opt/site:/opt/app/bin:/usr/bin:/bin\n")
    # An image whose own /etc/fstab binds the same host directory (enroot
    # reads it before mounts.d).
    root = pyxis.work / "root-fstab"
    if root.exists():
        shutil.rmtree(root)
    containers.make_root(root, "amd64")
    (root / "etc/fstab").write_text(f"{apps} /opt/imgfstab none x-create=dir,bind,ro 0 -1\n")
    containers.mksquashfs(root, pyxis.slurm.cluster.shared / "fstab.sqsh")
    link = pyxis.slurm.cluster.bin_dir / "enroot"
    before = link.readlink() if link.is_symlink() else None
    link.unlink(missing_ok=True)
    link.symlink_to(script)
    try:
        yield {"apps": apps, "home_bin": home_bin}
    finally:
        link.unlink(missing_ok=True)
        if before is not None:
            link.symlink_to(before)


def test_native_program_in_a_site_mount_runs_in_silence(pyxis: Pyxis,  # noqa: F811
                                                        site: dict[str, Path]) -> None:
    pyxis.use()
    before = len(pyxis.slurm.audit_lines())
    res = pyxis.srun(["--container-image=./clean.sqsh", "/opt/site/native"])
    assert res.returncode == 0, res.stderr
    assert "side-effect program ran" in res.stdout  # enroot mounted it: the host's file ran
    assert PREFIX not in res.stderr, res.stderr
    [rec] = pyxis.records(before)
    assert (rec["action"], rec["rules"], rec["skipped"]) == ("allow", [], None)


def test_foreign_program_in_a_site_mount_is_refused(pyxis: Pyxis,  # noqa: F811
                                                    site: dict[str, Path]) -> None:
    pyxis.use()
    res = pyxis.srun(["--container-image=./clean.sqsh", "/opt/site/foreign"])
    assert res.returncode != 0
    assert f"{PREFIX}ERROR exe-arch-mismatch" in res.stderr, res.stderr
    assert "/opt/site/foreign" in res.stderr
    assert "exe-not-found" not in res.stderr
    # warn mode: it runs, and the kernel refuses the foreign program in the
    # container, as predicted.
    res = pyxis.srun(["-p", "warnp", "--container-image=./clean.sqsh", "/opt/site/foreign"])
    assert res.returncode != 0
    assert f"{PREFIX}ERROR exe-arch-mismatch" in res.stderr
    assert f"{PREFIX}the step runs anyway (partition warnp, mode warn)" in res.stderr
    assert "Exec format error" in res.stderr, res.stderr


def test_home_mounted_by_enroot_mount_home(pyxis: Pyxis,  # noqa: F811
                                           site: dict[str, Path]) -> None:
    """``ENROOT_MOUNT_HOME=y`` in the job's environment (pyxis passes it to
    enroot; its home hook mounts $HOME): the home's foreign program is
    refused. Without it, the program is not in the container at all."""
    pyxis.use()
    program = str(site["home_bin"] / "foreign")
    res = pyxis.slurm.cluster.srun(["--container-image=./clean.sqsh", program],
                                   env={**pyxis.env(), "ENROOT_MOUNT_HOME": "y"}, timeout=180)
    assert res.returncode != 0
    assert f"{PREFIX}ERROR exe-arch-mismatch" in res.stderr and program in res.stderr, \
        res.stderr
    # pyxis' --no-container-mount-home sets ENROOT_MOUNT_HOME=n over the job's.
    res = pyxis.slurm.cluster.srun(
        ["--container-image=./clean.sqsh", "--no-container-mount-home", program],
        env={**pyxis.env(), "ENROOT_MOUNT_HOME": "y"}, timeout=180)
    assert res.returncode != 0
    assert f"{PREFIX}WARNING exe-not-found" in res.stderr, res.stderr
    assert "exe-arch-mismatch" not in res.stderr


def test_the_images_own_fstab_mount(pyxis: Pyxis, site: dict[str, Path]) -> None:  # noqa: F811
    pyxis.use()
    res = pyxis.srun(["--container-image=./fstab.sqsh", "/opt/imgfstab/native"])
    assert res.returncode == 0, res.stderr
    assert "side-effect program ran" in res.stdout and PREFIX not in res.stderr, res.stderr
    res = pyxis.srun(["--container-image=./fstab.sqsh", "/opt/imgfstab/foreign"])
    assert res.returncode != 0
    assert f"{PREFIX}ERROR exe-arch-mismatch" in res.stderr, res.stderr


def test_site_environ_d_path_finds_the_mounted_program(pyxis: Pyxis,  # noqa: F811
                                                       site: dict[str, Path]) -> None:
    """``foreign`` by name: the site's environ.d PATH finds /opt/site/foreign
    (the image has no such program): refused, not a missing-program warning."""
    pyxis.use()
    res = pyxis.srun(["--container-image=./clean.sqsh", "foreign"])
    assert res.returncode != 0
    assert f"{PREFIX}ERROR exe-arch-mismatch" in res.stderr, res.stderr
    assert "/opt/site/foreign" in res.stderr and "exe-not-found" not in res.stderr
    res = pyxis.srun(["--container-image=./clean.sqsh", "native"])
    assert res.returncode == 0, res.stderr
    assert "side-effect program ran" in res.stdout and PREFIX not in res.stderr, res.stderr
