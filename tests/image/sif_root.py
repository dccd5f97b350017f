"""A Debian sid root holding Apptainer, to build real SIF files in the tests.

Apptainer is not packaged for Debian 12; sid has 1.4.5 (it needs glibc 2.38,
so it cannot run on this host directly). ``mmdebstrap --variant=essential``
makes a small root with it, pinned by version, cached under
``~/.cache/grace-policy-tests/apptainer-sid``. ``apptainer build`` works
there once the root's ``/`` is a mount point (field notes §9): every build
runs in its own mount namespace (``unshare -m``) that binds the root onto
itself, so nothing stays mounted on the host.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path

from corpus import CorpusUnavailable, _cached_tree

MIRROR = "http://deb.debian.org/debian"
APPTAINER = "1.4.5-2"
PACKAGES = (f"apptainer={APPTAINER}", "squashfs-tools")


def apptainer_root() -> Path:
    def build(work: Path) -> Path:
        target = work / "root"
        done = subprocess.run(
            ["mmdebstrap", "--mode=root", "--variant=essential", "--quiet",
             f"--include={','.join(PACKAGES)}",
             '--aptopt=Acquire::Check-Valid-Until "false"', "sid", str(target), MIRROR],
            capture_output=True, text=True, timeout=1200, check=False)
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
            raise CorpusUnavailable(f"mmdebstrap of apptainer failed: {' | '.join(tail)}")
        return target

    return _cached_tree("apptainer-sid", {"packages": list(PACKAGES), "mirror": MIRROR},
                        build)


def _in_root(root: Path, script: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    setup = (f"set -e; mount --bind {shlex.quote(str(root))} {shlex.quote(str(root))}; "
             f"mount -t proc proc {shlex.quote(str(root / 'proc'))}; "
             f"mount --rbind /dev {shlex.quote(str(root / 'dev'))}; "
             f"mount -t tmpfs tmpfs {shlex.quote(str(root / 'tmp'))}; "
             f"exec chroot {shlex.quote(str(root))} /bin/sh -ec {shlex.quote(script)}")
    return subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", setup],
                          capture_output=True, text=True, timeout=timeout, check=False,
                          env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root",
                               "LANG": "C.UTF-8"})


def build_sif(tree: Path, out: Path) -> Path:
    """``apptainer build OUT TREE`` (a sandbox directory) in the root; the
    tree is copied in and the SIF copied out (the root's /tmp is a tmpfs of
    the build's own namespace)."""
    root = apptainer_root()
    hosts = root / "etc" / "hosts"  # apptainer build reads it; essential roots have none
    if not hosts.exists():
        hosts.write_text("127.0.0.1 localhost\n")
    # One staging directory per call: the unit and Slurm parts of make test
    # build SIFs of the same names in this one cached root at once.
    (root / "var" / "tmp").mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f"grace-{out.stem}-", dir=root / "var" / "tmp"))
    try:
        shutil.copytree(tree, stage / "tree", symlinks=True)
        done = _in_root(root, f"apptainer -s build --force /var/tmp/{stage.name}/img.sif "
                              f"/var/tmp/{stage.name}/tree")
        if done.returncode != 0:
            raise RuntimeError(f"apptainer build failed: {done.stderr.strip()[-800:]}")
        shutil.copy2(stage / "img.sif", out)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return out


def sif_list(sif: Path) -> str:
    """``apptainer sif list`` of ``sif`` (the oracle for its layout)."""
    root = apptainer_root()
    fd, name = tempfile.mkstemp(prefix=f"grace-list-{sif.stem}-", suffix=".sif",
                                dir=root / "var" / "tmp")
    os.close(fd)
    stage = Path(name)
    shutil.copy2(sif, stage)
    try:
        done = _in_root(root, f"apptainer sif list /var/tmp/{stage.name}; "
                              f"apptainer sif header /var/tmp/{stage.name}")
    finally:
        stage.unlink()
    if done.returncode != 0:
        raise RuntimeError(f"apptainer sif list failed: {done.stderr.strip()[-800:]}")
    return done.stdout
