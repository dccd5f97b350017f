"""Every rule inside an image: a real Debian arm64 CPython's imports and an
embedded jemalloc, judged in a squashfs image as in the same root unpacked.

(The node-root model, ``NodeProfile(root=...)``, is no oracle here: it finds
argv[0] on the host, so ``/usr/bin/python3.11`` there is this machine's.)"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from corpus import debian_arm64_python_or_skip, jemalloc_or_skip
from fixtures.build import src

from grace_policy.check import check_step
from grace_policy.image.open import open_image
from grace_policy.node import NodeProfile

from .budgets import roomy
from .roots import make_root, mksquashfs

GRACE4 = NodeProfile("aarch64", 4096, (2, 36))
GRACE64 = NodeProfile("aarch64", 65536, (2, 36))

pytestmark = pytest.mark.skipif(shutil.which("mksquashfs") is None,
                                reason="mksquashfs not installed (squashfs-tools)")

COMMANDS = (
    ["/usr/bin/python3.11", "-c", "import json"],
    ["/usr/bin/python3.11", "-c", "import hashlib, ssl"],
    ["/usr/bin/python3.11", "-c", "import ctypes, sqlite3, decimal"],
    ["/usr/bin/python3.11", "-m", "zipfile"],
)


def _inner(report) -> list[tuple[str, str]]:  # type: ignore[no-untyped-def]
    return sorted((i.rule, i.path.split(":", 1)[-1] if ":" in i.path else i.path)
                  for i in report.issues)


@pytest.mark.network
def test_python_in_image_as_in_the_root(tmp_path: Path) -> None:
    root = debian_arm64_python_or_skip()
    sqsh = open_image(str(mksquashfs(root, tmp_path / "py.sqsh", "gzip")), budget=roomy())
    tree = open_image(str(root), budget=roomy())
    env = {"PATH": "/usr/bin:/bin", "HOME": "/root"}
    judged = 0
    for node in (GRACE4, GRACE64):
        for argv in COMMANDS:
            a = check_step(argv, env, "/", node, image=tree)
            b = check_step(argv, env, "/", node, image=sqsh)
            assert a.limit is None and b.limit is None
            assert a.exe == b.exe == "/usr/bin/python3.11"
            assert _inner(a) == _inner(b), (node, argv)
            assert [i.predicted_error for i in a.issues] == [i.predicted_error for i in b.issues]
            judged += len(a.issues)
    # Not three blanks: that root lacks libssl (Debian splits it out), which
    # import ssl/hashlib meet as a missing library in lib-dynload.
    hashlib = check_step(COMMANDS[1], env, "/", GRACE64, image=sqsh)
    assert any(r == "lib-not-found" and "lib-dynload/_ssl" in p for r, p in _inner(hashlib))
    assert judged


@pytest.mark.network
@pytest.mark.cross
def test_embedded_jemalloc_in_image(tmp_path: Path, compile_cache: object) -> None:
    root = make_root(tmp_path / "root", "aarch64", cache=compile_cache)
    lib = jemalloc_or_skip(12)
    app = root / "opt/app/jem"
    subprocess.run(["aarch64-linux-gnu-gcc", "-O1", "-o", str(app), str(src("jemalloc_use.c")),
                    str(lib), "-lpthread", "-Wl,-z,max-page-size=65536"],
                   check=True, capture_output=True)
    os.chmod(app, 0o755)
    image = open_image(str(mksquashfs(root, tmp_path / "jem.sqsh", "lzo")), budget=roomy())
    on64 = check_step(["jem"], image.step_env({}), "/", GRACE64, image=image)
    assert [i.rule for i in on64.issues] == ["page-size-compiled"]
    assert on64.issues[0].path == f"{tmp_path / 'jem.sqsh'}:/opt/app/jem"
    assert "<jemalloc>: Unsupported system page size" in on64.issues[0].predicted_error
    assert check_step(["jem"], image.step_env({}), "/", GRACE4, image=image).issues == ()
