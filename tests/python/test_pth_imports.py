""".pth import lines, held to real CPythons: the modules the model counts as
imported at start-up (``Environment.pth_imports``) are the ones site.py's
``exec`` of those lines put in ``sys.modules``.

Standard-library modules no start-up imports on its own are the marks; the
lines take every shape seen in real site directories (virtualenv's
``import _virtualenv``, several statements after ``;``, distutils-precedence's
``and``-guarded ``__import__``), next to lines that look like imports and are
not (indented, commented, no blank after ``import``, a hidden file on 3.13+).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from . import sitepath_oracle as oracle

ALL = oracle.oracles()
MARKS = ("colorsys", "sched", "tabnanny", "netrc", "quopri", "stringprep")
MARK = "GRACE-PTH "
PROBE = (f"import sys, json\nprint({MARK!r} + json.dumps(sorted(n for n in {MARKS!r}"
         " if n in sys.modules)))\n")
PTH_FILES = {
    "10-hooks.pth": (
        "import colorsys\n"
        "import os; var = 'GRACE_PTH_SWITCH'; enabled = os.environ.get(var, 'local') =="
        " 'local'; enabled and __import__('sched').scheduler\n"
        "  import tabnanny\n"            # indented: a path line
        "#import tabnanny\n"
        "importtabnanny\n"               # no blank after import: a path line
    ),
    "20-tab.pth": "import\tstringprep, os.path; from netrc import netrc\n",
    ".hidden.pth": "import quopri\n",   # 3.13+ skips hidden .pth files
}
_WORLDS: dict[str, dict[str, str]] = {}


def _world(label: str, exe: str, runner: oracle.Runner,
           tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    if label in _WORLDS:
        return _WORLDS[label]
    root = Path(runner.world_dir(tmp_path_factory.mktemp(f"pth-{label}")))
    done = runner.run_plain([exe, "-m", "venv", "--without-pip", str(root / "venv")],
                            str(root))
    assert done.returncode == 0, done.stderr
    xy = "{}.{}".format(*oracle.version_of(label))
    site = Path(runner.host(str(root))) / "venv" / "lib" / f"python{xy}" / "site-packages"
    for name, text in PTH_FILES.items():
        (site / name).write_text(text)
    w = {"python": str(root / "venv" / "bin" / "python"), "cwd": str(root)}
    _WORLDS[label] = w
    return w


@pytest.mark.parametrize("flags", [[], ["-I"], ["-S"]], ids=["plain", "I", "S"])
@pytest.mark.parametrize(("label", "exe"), [oracle.param(i, i[0]) for i in ALL],
                         ids=[lab for lab, _ in ALL])
def test_pth_import_lines_match_real_cpython(label: str, exe: str, flags: list[str],
                                             tmp_path_factory: pytest.TempPathFactory
                                             ) -> None:
    runner = oracle.runner(label)
    w = _world(label, exe, runner, tmp_path_factory)
    env = {"PATH": "/usr/bin:/bin", "HOME": w["cwd"], "LC_ALL": "C.UTF-8"}
    args = [*flags, "-c", PROBE]
    proc = runner.run([w["python"], *args], env, w["cwd"])
    real = next((json.loads(line[len(MARK):]) for line in proc.stdout.splitlines()
                 if line.startswith(MARK)), None)
    assert real is not None, proc.stderr
    e, pflags = oracle.environment(runner, w["python"], args, env, w["cwd"])
    model = set() if pflags.no_site else set(e.pth_imports())
    assert sorted(model & set(MARKS)) == real
    if not flags:   # the world is what the test means it to be
        hidden = ["quopri"] if oracle.version_of(label) < (3, 13) else []
        assert real == sorted(["colorsys", "netrc", "sched", "stringprep", *hidden])
