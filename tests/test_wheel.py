"""``pip install .`` ships the whole package: a wheel built from the
checkout holds every module of grace_policy/ and the rules data (a
hand-kept package list once left out batch/ and container/, so the
installed CLI failed on ``check --batch`` and ``--image``)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_wheel_holds_every_module(tmp_path: Path) -> None:
    # A copy: setuptools builds in the source tree (build/, *.egg-info),
    # and a build/lib left there by an earlier build would be packed too.
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, src / name)
    shutil.copytree(REPO / "grace_policy", src / "grace_policy",
                    ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "-w", str(tmp_path), str(src)],
                   check=True, capture_output=True, cwd=tmp_path)
    [wheel] = tmp_path.glob("grace_policy-*.whl")
    shipped = set(zipfile.ZipFile(wheel).namelist())
    want = {p.relative_to(REPO).as_posix() for p in (REPO / "grace_policy").rglob("*")
            if p.suffix in (".py", ".toml") and "__pycache__" not in p.parts}
    assert "grace_policy/batch/walk.py" in want and "grace_policy/data/rules.toml" in want
    assert want - shipped == set()
