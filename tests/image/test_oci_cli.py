"""OCI bundles (hostile config.json included), ``decide(image=...)`` and
``grace-policy check --image``."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from grace_policy.cli.main import main
from grace_policy.compiled import load_policy
from grace_policy.decide import StepRequest, decide
from grace_policy.image import ImageError
from grace_policy.image.open import open_image
from grace_policy.node import detect

from .budgets import roomy
from .roots import make_root, mksquashfs

HOST = detect()


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory, compile_cache: object) -> Path:
    return make_root(tmp_path_factory.mktemp("oci") / "root", HOST.machine,  # type: ignore[arg-type]
                     cache=compile_cache)


def _bundle(base: Path, root: Path, config: object, raw: bytes | None = None) -> Path:
    bundle = base / "bundle"
    if bundle.exists():
        shutil.rmtree(bundle)
    bundle.mkdir()
    shutil.copytree(root, bundle / "rootfs", symlinks=True)
    (bundle / "config.json").write_bytes(raw if raw is not None else json.dumps(config).encode())
    return bundle


CONFIG = {"ociVersion": "1.0.2", "root": {"path": "rootfs"},
          "process": {"args": ["hello", "--x"], "env": ["PATH=/usr/bin", "A=b=c"],
                      "cwd": "/opt"}}


def test_bundle(root: Path, tmp_path: Path) -> None:
    image = open_image(str(_bundle(tmp_path, root, CONFIG)), budget=roomy())
    assert image.kind == "oci" and image.args == ("hello", "--x") and image.cwd == "/opt"
    # process.env is the whole environment: nothing of the job's.
    assert image.step_env({"PATH": "/host/bin", "SECRET": "x"}) == {"PATH": "/usr/bin",
                                                                    "A": "b=c"}


@pytest.mark.parametrize("config,raw,reason", [
    (None, b"{not json", "not valid JSON"),
    (None, b"[" * 100_000 + b"]" * 100_000, "not valid JSON"),
    (None, b"[]", "not a JSON object"),
    (None, b"\xff\xfe{}", "not valid JSON"),
    ({"root": {"path": ""}}, None, "no root.path"),
    ({"root": "rootfs"}, None, "no root.path"),
    ({"root": {"path": "rootfs"}, "process": {"args": "hello"}}, None, "list of strings"),
    ({"root": {"path": "rootfs"}, "process": {"args": [1]}}, None, "list of strings"),
    ({"root": {"path": "rootfs"}, "process": {"cwd": "rel"}}, None, "absolute"),
    ({"root": {"path": "rootfs"}, "process": []}, None, "not an object"),
    ({"root": {"path": "nosuch"}}, None, "not a directory"),
    (None, b" " * (2 << 20), "larger than"),
])
def test_hostile_bundles(root: Path, tmp_path: Path, config: object, raw: bytes | None,
                         reason: str) -> None:
    bundle = _bundle(tmp_path, root, config, raw)
    with pytest.raises(ImageError, match=reason):
        open_image(str(bundle), budget=roomy())
    # The plugin's entry: a skip with the reason, never an exception.
    verdict = decide(load_policy(None),
                     StepRequest(partition=None, argv=["hello"], env={}, cwd="/", node=HOST,
                                 image=str(bundle)))
    assert verdict.action == "allow" and verdict.skipped and reason in verdict.skipped


def test_bundle_links_out_and_odd_configs(root: Path, tmp_path: Path) -> None:
    bundle = _bundle(tmp_path, root, CONFIG)
    shutil.rmtree(bundle / "rootfs")
    (bundle / "rootfs").symlink_to("/")  # runc refuses a symlinked root (test_oci_runc_root)
    with pytest.raises(ImageError, match="symbolic link"):
        open_image(str(bundle), budget=roomy())
    bundle = _bundle(tmp_path, root, CONFIG)
    os.unlink(bundle / "config.json")
    os.mkfifo(bundle / "config.json")  # must not block
    with pytest.raises(ImageError, match="not a regular file"):
        open_image(str(bundle), budget=roomy())
    os.unlink(bundle / "config.json")
    (bundle / "real.json").write_text(json.dumps(CONFIG))
    (bundle / "config.json").symlink_to("real.json")
    with pytest.raises(ImageError):
        open_image(str(bundle), budget=roomy())


def test_check_image_cli(root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
                         ) -> None:
    bundle = _bundle(tmp_path, root, CONFIG)
    code, out, _ = run(capsys, "check", "--image", str(bundle))  # process.args
    assert code == 0 and f"in image {bundle}" in out and "allow: hello" in out
    sqsh = mksquashfs(root, tmp_path / "img.sqsh", "lzo")
    code, out, _ = run(capsys, "check", "--image", str(sqsh), "--", "hello")
    assert code == 0, out
    code, out, _ = run(capsys, "check", "--image", str(sqsh), "--json", "--", "/bin/true")
    verdict = json.loads(out)
    assert code == 1 and verdict["image"] == str(sqsh)
    assert [f["path"] for f in verdict["findings"]] == [f"{sqsh}:/bin/true"]
    assert f"inside {sqsh}" in verdict["findings"][0]["remediation"]
    other = "aarch64" if HOST.machine == "x86_64" else "x86_64"
    code, out, _ = run(capsys, "check", "--image", str(sqsh), "--arch", other, "--", "hello")
    assert code == 2
    assert f"grace-policy: ERROR image-arch-mismatch: {sqsh}" in out
    platform = "linux/arm64" if other == "aarch64" else "linux/amd64"
    assert platform in out
    cut = tmp_path / "cut.sqsh"
    cut.write_bytes(sqsh.read_bytes()[:5000])
    code, _, err = run(capsys, "check", "--image", str(cut), "--", "hello")
    assert code == 64 and "truncated" in err
    code, out, _ = run(capsys, "explain", "image-arch-mismatch")
    assert code == 0 and out.startswith("image-arch-mismatch:") and "{node_platform}" in out


def test_decide_in_an_image_records_its_identity(root: Path, tmp_path: Path) -> None:
    from grace_policy import fsprobe, verdict_cache

    sqsh = mksquashfs(root, tmp_path / "c.sqsh", "lzo")
    image = open_image(str(sqsh), budget=roomy())
    probes: list[tuple[str, str, str]] = []
    verdict = decide(load_policy(None), StepRequest(partition=None, argv=["hello"],
                                                    env=image.step_env({}), cwd="/", node=HOST,
                                                    image=image), probes=probes)
    assert verdict.action == "allow" and verdict.image == str(sqsh)
    assert verdict_cache.cacheable(verdict)
    # The only file question: the image itself (a verdict-cache key C can
    # replay); the rest are inputs.
    files = [p for p in probes if p[0] in ("s", "l", "r", "D")]
    assert files == [("s", str(sqsh), fsprobe.signature(os.stat(sqsh)))]
    assert fsprobe.still_true(files)  # inputs (env) are the C lookup's, not a file's
    shutil.copy2(sqsh, tmp_path / "other.sqsh")
    os.replace(tmp_path / "other.sqsh", sqsh)  # same bytes, another file
    assert not fsprobe.still_true(files)
