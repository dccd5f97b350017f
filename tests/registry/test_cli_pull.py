"""``grace-policy check --image REGISTRY#IMAGE --pull``: the image's files,
pulled by the user's own real ``enroot import`` (4.1.2, built from the
pinned tarball) from Debian's real registry, judged like a local ``.sqsh``.

The case only a pull can settle: an image whose config says ``amd64`` while
its programs are aarch64 (an image assembled by hand, or a build that copied
the wrong artefacts). Its manifest passes on an x86_64 node; its program
would die with ``Exec format error``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from image.roots import make_root
from local_registry import LocalRegistry, oci_image

REPO = Path(__file__).resolve().parents[2]
PREFIX = "grace-policy: "

#: enroot import writes the image with mksquashfs; the roots need the cross gcc.
pytestmark = [pytest.mark.cross, pytest.mark.skipif(shutil.which("mksquashfs") is None,
                                                    reason="mksquashfs (squashfs-tools)")]


@pytest.fixture(scope="module")
def reg(tmp_path_factory: pytest.TempPathFactory, compile_cache: object
        ) -> Iterator[LocalRegistry]:
    work = tmp_path_factory.mktemp("pull")
    registry = LocalRegistry(work / "reg")
    try:
        x86 = make_root(work / "root-x86_64", "x86_64", cache=compile_cache)
        arm = make_root(work / "root-aarch64", "aarch64", cache=compile_cache)
        # "liar": the config says amd64, the files are aarch64's.
        oci_image(work / "layout", "liar", {"x86_64": arm})
        oci_image(work / "layout", "clean", {"x86_64": x86})
        registry.push(work / "layout", "liar", "lab/img")
        registry.push(work / "layout", "clean", "lab/img")
        yield registry
    finally:
        registry.stop()


def _check(site: Path, home: Path, *argv: str, path: str | None = None
           ) -> subprocess.CompletedProcess[str]:
    """The CLI as a user on an x86_64 login node whose PATH has enroot;
    enroot's plain-HTTP switch as that user's own import needs it."""
    home.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XDG_", "ENROOT_"))}
    env.update(PYTHONPATH=str(REPO), HOME=str(home), TMPDIR=str(home),
               PATH=path if path is not None else f"{site / 'bin'}:{os.environ['PATH']}",
               ENROOT_ALLOW_HTTP="y")
    return subprocess.run([sys.executable, "-m", "grace_policy", "check", "--arch", "x86_64",
                           "--page-size", "4096", "--glibc", "2.36", *argv],
                          capture_output=True, text=True, timeout=600, cwd=REPO, env=env)


def test_the_manifest_alone_passes_the_liar(enroot_site: Path, reg: LocalRegistry,
                                            tmp_path: Path) -> None:
    got = _check(enroot_site, tmp_path / "home", "--image", f"{reg.address}#lab/img:liar", "--",
                 "/opt/app/tool")
    assert got.returncode == 0, got.stdout + got.stderr


def test_pull_judges_the_files_the_manifest_hides(enroot_site: Path, reg: LocalRegistry,
                                                  tmp_path: Path) -> None:
    mark = reg.mark()
    ref = f"{reg.address}#lab/img:liar"
    got = _check(enroot_site, tmp_path / "home", "--image", f"docker://{ref}", "--pull", "--",
                 "/opt/app/tool")
    assert got.returncode == 2, got.stdout + got.stderr
    assert f"{PREFIX}ERROR image-arch-mismatch: {ref}" in got.stdout, got.stdout
    assert "holds aarch64 programs" in got.stdout, "judged from its files, not its config"
    assert ref in got.stdout, "findings name the image the user asked for"
    assert "grace-pull-" not in got.stdout, "not the scratch file"
    assert reg.blob_gets(mark), "enroot pulled the layer"
    assert not list((tmp_path / "home").glob("grace-pull-*")), "the scratch pull is removed"


def test_pull_of_a_clean_image_allows(enroot_site: Path, reg: LocalRegistry,
                                      tmp_path: Path) -> None:
    got = _check(enroot_site, tmp_path / "home", "--image", f"{reg.address}#lab/img:clean",
                 "--pull", "--json", "--", "/opt/app/tool")
    assert got.returncode == 0, got.stdout + got.stderr
    assert json.loads(got.stdout)["action"] == "allow"


def test_pull_without_enroot_says_so(enroot_site: Path, reg: LocalRegistry,
                                     tmp_path: Path) -> None:
    got = _check(enroot_site, tmp_path / "home", "--image", f"{reg.address}#lab/img:clean",
                 "--pull", "--", "/opt/app/tool", path="/usr/bin:/bin")
    assert got.returncode == 64, got.stdout + got.stderr
    assert "enroot is not on PATH" in got.stderr
    assert "Traceback" not in got.stderr


def test_a_failed_import_is_reported_not_judged(enroot_site: Path, reg: LocalRegistry,
                                                tmp_path: Path) -> None:
    got = _check(enroot_site, tmp_path / "home", "--image", f"{reg.address}#lab/img:missing",
                 "--pull", "--", "/opt/app/tool")
    assert got.returncode == 64, got.stdout + got.stderr
    assert "`enroot import` failed" in got.stderr
    assert "Traceback" not in got.stderr


def test_pull_needs_a_registry_image(tmp_path: Path) -> None:
    got = _check(tmp_path, tmp_path / "home", "--image", str(tmp_path / "a.sqsh"), "--pull",
                 "--", "/bin/true")
    assert got.returncode == 64
    assert "--pull: only with a registry --image" in got.stderr
