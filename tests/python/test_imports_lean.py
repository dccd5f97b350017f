"""The py-imports modules keep heavy modules off the launch path."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HEAVY = {"ast", "re", "typing", "dataclasses", "json", "tomllib", "email", "csv", "inspect",
         "importlib.metadata", "packaging", "sysconfig", "zipfile", "tokenize"}


@pytest.mark.parametrize("module", ["usage", "suffixes", "finder", "dists", "markers", "step",
                                    "interp", "sitepath", "judge", "contents", "nodepath",
                                    "torch_build", "torchcodec", "jitcache", "gpus", "editable"])
def test_no_heavy_imports(module: str) -> None:
    code = ("import sys; sys.path.insert(0, sys.argv[1]); before = set(sys.modules);"
            f"import grace_policy.python.{module};"
            "new = sorted(set(sys.modules) - before); print(' '.join(new))")
    out = subprocess.run([sys.executable, "-S", "-E", "-c", code, str(REPO)],
                         capture_output=True, text=True, check=True, timeout=60).stdout
    pulled = set(out.split())
    assert f"grace_policy.python.{module}" in pulled
    assert not pulled & HEAVY, sorted(pulled & HEAVY)


@pytest.mark.parametrize("argv", [["/bin/true"], ["/bin/ls", "-l"]])
def test_a_step_that_is_no_python_imports_none_of_it(argv: list[str]) -> None:
    # Every step pays for what the launch check imports: a program that
    # cannot be a Python (by its name and real name) stops at names.py.
    code = ("import sys; sys.path.insert(0, sys.argv[1]);"
            "from grace_policy.decide import StepRequest, decide;"
            "from grace_policy.policy import Policy;"
            "v = decide(Policy(), StepRequest(partition=None, argv=sys.argv[2:],"
            " env={'PATH': '/usr/bin'}, cwd='/', node=None)); assert v.action == 'allow', v;"
            "print(' '.join(m for m in sys.modules if m.startswith('grace_policy.python')))")
    out = subprocess.run([sys.executable, "-S", "-E", "-c", code, str(REPO), *argv],
                         capture_output=True, text=True, check=True, timeout=60).stdout
    # python.gpus: whether the step has GPUs is asked of every step (its
    # kernels are judged only then; nothing of grace_policy.cuda is imported
    # here: tests/test_cuda_check.py).
    assert sorted(out.split()) == ["grace_policy.python", "grace_policy.python.gpus",
                           "grace_policy.python.names"]
