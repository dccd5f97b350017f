"""``grace-policy check --image docker://...`` on a login node: the answer
from the registry's manifest and config, as the user's own ``enroot
import`` would read them (run as a process, against the real registry)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from local_registry import LocalRegistry, oci_image

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def reg(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRegistry]:
    work = tmp_path_factory.mktemp("cli")
    registry = LocalRegistry(work / "reg")
    try:
        oci_image(work / "layout", "arm", {"aarch64": None},
                  env=["PATH=/opt/arm/bin:/usr/bin", "LANG=C.UTF-8"])
        oci_image(work / "layout", "both", {"x86_64": None, "aarch64": None})
        registry.push(work / "layout", "arm", "lab/img")
        registry.push(work / "layout", "both", "lab/img", multi=True)
        yield registry
    finally:
        registry.stop()


def _check(*argv: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "grace_policy", "check", *argv],
                          capture_output=True, text=True, timeout=120, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO), **env})


def test_login_node_answers_from_the_manifest(reg: LocalRegistry, tmp_path: Path) -> None:
    env = {"ENROOT_ALLOW_HTTP": "y", "HOME": str(tmp_path)}
    got = _check("--image", f"docker://{reg.address}/lab/img:arm", "--arch", "x86_64",
                 "--page-size", "4096", "--json", "--", "/bin/true", env=env)
    assert got.returncode == 2, got.stderr
    out = json.loads(got.stdout)
    assert out["findings"][0]["rule"] == "image-arch-mismatch"
    assert out["registry"]["platforms"] == ["linux/arm64"]
    assert out["registry"]["digest"].startswith("sha256:")
    assert out["registry"]["env"] == ["PATH=/opt/arm/bin:/usr/bin", "LANG=C.UTF-8"]
    # The bare enroot form, for an arm64 partition: the list's arm64 entry.
    got = _check("--image", f"{reg.address}#lab/img:both", "--arch", "aarch64",
                 "--page-size", "65536", "--", "/bin/true", env=env)
    assert got.returncode == 0, got.stdout + got.stderr
    assert "platforms linux/amd64, linux/arm64" in got.stdout
    assert "(linux/arm64)" in got.stdout
    # Without ENROOT_ALLOW_HTTP the user's enroot would speak TLS and fail:
    # the check says so and follows on_error (allow by default).
    got = _check("--image", f"{reg.address}#lab/img:arm", "--arch", "x86_64",
                 "--page-size", "4096", "--json", "--", "/bin/true",
                 env={"HOME": str(tmp_path), "ENROOT_ALLOW_HTTP": ""})
    assert "TLS" in json.loads(got.stdout)["error"]


def test_a_local_path_is_still_a_file(tmp_path: Path) -> None:
    got = _check("--image", str(tmp_path / "nope.sqsh"), "--arch", "x86_64",
                 "--page-size", "4096", "--", "/bin/true", env={})
    assert got.returncode == 64 and "cannot read" in got.stderr
