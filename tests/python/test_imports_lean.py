"""The py-imports modules keep heavy modules off the launch path."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HEAVY = {"ast", "re", "typing", "dataclasses", "json", "tomllib", "email", "csv", "inspect",
         "importlib.metadata", "packaging", "sysconfig", "zipfile", "tokenize"}


@pytest.mark.parametrize("module", ["usage", "suffixes", "finder", "dists", "markers"])
def test_no_heavy_imports(module: str) -> None:
    code = ("import sys; sys.path.insert(0, sys.argv[1]); before = set(sys.modules);"
            f"import grace_policy.python.{module};"
            "new = sorted(set(sys.modules) - before); print(' '.join(new))")
    out = subprocess.run([sys.executable, "-S", "-E", "-c", code, str(REPO)],
                         capture_output=True, text=True, check=True, timeout=60).stdout
    pulled = set(out.split())
    assert f"grace_policy.python.{module}" in pulled
    assert not pulled & HEAVY, sorted(pulled & HEAVY)
