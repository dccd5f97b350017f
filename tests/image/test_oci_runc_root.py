"""Which root an OCI bundle runs in, with Debian's real runc (1.1) as the
oracle (issue 27, R10): ``root.path`` outside the bundle (``../x``, an
absolute path) is accepted and run, so the check judges it (before, such a
bundle was a skip: the step ran unjudged); a symlink anywhere in
``root.path`` (the root itself, a directory on the way, inside the bundle
or out) is refused by runc ("invalid rootfs"), so nothing runs and the
check says why it did not judge. Each layout is run by runc and opened by
:func:`grace_policy.image.oci.open_bundle`; they must agree."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from grace_policy.image import ImageError
from grace_policy.image.oci import open_bundle

pytestmark = pytest.mark.skipif(
    shutil.which("runc") is None or os.geteuid() != 0,
    reason="runc (bash packaging/install-deps.sh) and root are needed to run bundles")

SAY_C = '#include <unistd.h>\nint main(void){write(1,"RAN\\n",4);return 0;}\n'


@pytest.fixture(scope="module")
def layout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``real/rootfs`` (a static /bin/sh that says RAN), and beside it a
    bundle whose ``rootlink`` links to it, ``sub/parent`` to ``real``, and
    ``abslink`` to ``real`` from outside."""
    base = tmp_path_factory.mktemp("runcroot")
    rootfs = base / "real" / "rootfs"
    (rootfs / "bin").mkdir(parents=True)
    src = base / "say.c"
    src.write_text(SAY_C)
    done = subprocess.run(["gcc", "-static", "-O1", "-o", str(rootfs / "bin" / "sh"), str(src)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"no static build here: {done.stderr[-300:]}")
    bundle = base / "bundle"
    (bundle / "sub").mkdir(parents=True)
    (bundle / "rootlink").symlink_to("../real/rootfs")
    (bundle / "sub" / "parent").symlink_to("../../real")
    (base / "abslink").symlink_to(base / "real")
    shutil.copytree(rootfs, bundle / "rootfs")
    subprocess.run(["runc", "spec"], cwd=bundle, check=True, capture_output=True)
    return base


def _runc(base: Path, root_path: str) -> subprocess.CompletedProcess[str]:
    bundle = base / "bundle"
    config = json.loads((bundle / "config.json").read_text())
    config["root"]["path"] = root_path
    config["process"].update(terminal=False, args=["/bin/sh"])
    (bundle / "config.json").write_text(json.dumps(config))
    return subprocess.run(["runc", "--root", str(base / "state"), "run", "--bundle",
                           str(bundle), f"grace-{uuid.uuid4().hex[:12]}"],
                          capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize("root_path,accepted", [
    ("rootfs", True),
    ("rootfs/../rootfs", True),
    ("../real/rootfs", True),
    ("ABS/real/rootfs", True),
    ("rootlink", False),
    ("sub/parent/rootfs", False),
    ("ABS/abslink/rootfs", False),
])
def test_the_root_runc_uses_is_the_one_judged(layout: Path, root_path: str,
                                              accepted: bool) -> None:
    root_path = root_path.replace("ABS", str(layout))
    res = _runc(layout, root_path)
    if accepted:
        assert res.returncode == 0 and res.stdout == "RAN\n", res.stderr
        img = open_bundle(str(layout / "bundle"))
        where = layout / ("bundle/rootfs" if root_path.startswith("rootfs") else "real/rootfs")
        assert img.view.root == str(where)  # type: ignore[attr-defined]
    else:
        assert res.returncode != 0 and "invalid rootfs" in res.stderr, res.stderr
        with pytest.raises(ImageError, match="symbolic link"):
            open_bundle(str(layout / "bundle"))
