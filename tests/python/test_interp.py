"""interp: the argv parser and the interpreter identification, held to real
CPythons (the parser: what the real one runs, with which sys.argv and
sys.flags; identification: sys.version_info of real binaries and venvs)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from grace_policy import elf, node
from grace_policy.budget import Budget
from grace_policy.python import interp

from .sitepath_oracle import available

INTERPRETERS = available()
#: The parser is checked on the oldest and newest here and on Debian's.
PARSE_ON = [(label, exe) for label, exe in INTERPRETERS
            if label in ("debian-3.11", "pyenv-3.8.18", "pyenv-3.10.13", "pyenv-3.13.0")]

MARK = "GRACE-ARGV "


def _probe(kind: str) -> str:
    return ("import sys, json; print(" + repr(MARK) + " + json.dumps({'kind': " + repr(kind)
            + ", 'argv': sys.argv, 'flags': [sys.flags.isolated,"
            " sys.flags.ignore_environment, sys.flags.no_user_site, sys.flags.no_site,"
            " getattr(sys.flags, 'safe_path', 0)]}))")


C = _probe("code")
#: {C} is replaced by a -c probe; s.py, -x.py and probe_mod.py are probes.
ARGVS: list[list[str]] = [
    ["-c", C], ["-c", C, "a", "-v", "--", "-"], ["-Ic", C], ["-c" + C], ["-Ess", "-c", C],
    ["-E", "-I", "-s", "-S", "s.py", "-E"], ["-Es", "s.py", "-x"], ["-m", "probe_mod", "a"],
    ["-mprobe_mod"], ["-Sm", "probe_mod", "-c", "x"], ["-"], [], ["-", "a", "b"],
    ["-V"], ["-V", "-c", C], ["-c", C, "-V"], ["--version"], ["-h"], ["--help"], ["-?"],
    ["--", "-x.py", "y"], ["--", "-"], ["-X", "dev", "-W", "ignore", "s.py"],
    ["-Xdev", "-Wignore", "-OO", "-B", "-u", "-q", "-b", "-R", "s.py"], ["-x", "s.py"],
    ["-z"], ["-J"], ["-Ez", "s.py"], ["--check-hash-based-pycs", "always", "-c", C],
    ["--check-hash-based-pycs", "bogus", "-c", C], ["--check-hash-based-pycs"],
    ["--help-env"], ["--help-all"], ["--bogus"], ["--check-hash"], ["-P", "s.py"],
    ["-IP", "-c", C], ["-c"], ["-m"], ["-W"], ["-i", "-c", C], ["-vv", "s.py"],
    ["-c", C, "-c", "x"], ["-Wd", "-c", C], ["-Xfrozen_modules=off", "-mprobe_mod"],
    ["-d", "s.py"], ["-t", "s.py"], ["-E", "--", "s.py", "--"],
]


def _parse_world(tmp: Path) -> Path:
    work = tmp / "work"
    work.mkdir(exist_ok=True)
    for name in ("s.py", "-x.py"):
        (work / name).write_text("# -x skips this line\n" + _probe("script") + "\n")
    (work / "probe_mod.py").write_text(_probe("module") + "\n")
    return work


def _real_parse(exe: str, argv: list[str], cwd: Path) -> dict | None:
    proc = subprocess.run([exe, *argv], cwd=cwd, input=_probe("stdin") + "\n",
                          env={"PATH": "/usr/bin:/bin", "HOME": str(cwd)},
                          capture_output=True, text=True, timeout=60)
    for line in proc.stdout.splitlines():
        if line.startswith(MARK):
            return json.loads(line[len(MARK):])
    return None


@pytest.mark.parametrize(("label", "exe"), PARSE_ON, ids=[lab for lab, _ in PARSE_ON])
@pytest.mark.parametrize("argv", ARGVS, ids=lambda a: " ".join(
    x if len(x) < 20 else x[:6] + "..." for x in a) or "(no args)")
def test_parse_matches_real_cpython(label: str, exe: str, argv: list[str],
                                    tmp_path: Path) -> None:
    work = _parse_world(tmp_path)
    real = _real_parse(exe, argv, work)
    version = _version(exe)
    flags, command = interp.parse_python_argv(argv, version)
    if real is None:
        assert command.kind == "none", (argv, command)
        return
    assert command.kind == real["kind"], (argv, command)
    if command.kind == "script":
        assert [command.value, *command.args] == real["argv"]
    else:  # sys.argv[0] is "-c", the module's path, or "-" / ""
        assert list(command.args) == real["argv"][1:]
    if command.kind == "code":
        assert command.value == C
    if command.kind == "module":
        assert command.value == "probe_mod"
    got = [int(flags.isolated), int(flags.ignore_env), int(flags.no_user_site),
           int(flags.no_site), int(flags.safe_path)]
    if version < (3, 11):  # no sys.flags.safe_path before 3.11
        got, real["flags"] = got[:4], real["flags"][:4]
    assert got == real["flags"]


def test_parse_without_version_accepts_3_11_options() -> None:
    assert interp.parse_python_argv(["-P", "s.py"])[0].safe_path
    assert interp.parse_python_argv(["-P", "s.py"], (3, 10))[1].kind == "none"


@pytest.mark.parametrize("argv", [[None], [b"-c"], ["-c", None], [""], ["-\udcff", "x"]])
def test_parse_never_raises(argv: list) -> None:
    flags, command = interp.parse_python_argv(argv)
    assert isinstance(flags, interp.PyFlags) and isinstance(command, interp.PyCommand)


_VERSIONS: dict[str, tuple[int, int]] = {}


def _version(exe: str) -> tuple[int, int]:
    if exe not in _VERSIONS:
        out = subprocess.run([exe, "-S", "-c", "import sys; print(*sys.version_info[:2])"],
                             capture_output=True, text=True, check=True).stdout.split()
        _VERSIONS[exe] = (int(out[0]), int(out[1]))
    return _VERSIONS[exe]


def _identify(path: str | Path, profile: node.NodeProfile | None = None,
              ) -> interp.Interpreter | None:
    info = elf.read_elf(os.path.realpath(path))
    return interp.identify(str(path), info, profile or node.detect(), Budget())


# -- identification on real interpreters and venvs ------------------------------

@pytest.mark.parametrize(("label", "exe"), INTERPRETERS, ids=[lab for lab, _ in INTERPRETERS])
def test_identify_real_interpreters_and_their_venvs(label: str, exe: str,
                                                    tmp_path: Path) -> None:
    version = _version(exe)
    xy = f"{version[0]}.{version[1]}"
    names = [exe, os.path.join(os.path.dirname(exe), "python3")]
    for kind in ("--symlinks", "--copies"):
        venv = tmp_path / kind.strip("-")
        subprocess.run([exe, "-m", "venv", "--without-pip", kind, str(venv)], check=True,
                       capture_output=True, timeout=120)
        names += [str(venv / "bin" / "python"), str(venv / "bin" / "python3")]
    for path in names:
        if not os.path.exists(path):
            continue
        found = _identify(path)
        assert found is not None, path
        assert found.version == version, (path, found)
        assert found.executable == path
        assert found.real == os.path.realpath(path)
        assert found.evidence in (f"name python{xy}", "pyvenv.cfg version",
                                  f"lib/python{xy}") or found.evidence.startswith(
                                      f"DT_NEEDED libpython{xy}")


def test_debian_python_is_told_by_its_name(tmp_path: Path) -> None:
    if not os.path.exists("/usr/bin/python3.11"):
        pytest.skip("no Debian python3.11 here")
    found = _identify("/usr/bin/python3")
    assert found is not None
    assert (found.version, found.evidence) == ((3, 11), "name python3.11")
    # a --copies venv of it: a binary named python3, no libpython: the
    # pyvenv.cfg version, confirmed by the stdlib above its home
    venv = tmp_path / "v"
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", "--copies", str(venv)],
                   check=True, capture_output=True)
    found = _identify(venv / "bin" / "python3")
    assert found is not None
    assert (found.version, found.evidence) == ((3, 11), "pyvenv.cfg version")


def test_not_an_interpreter(tmp_path: Path) -> None:
    assert _identify("/bin/bash") is None
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name in ("python", "python3", "python3.11", "python-tool", "python3-config"):
        shutil.copy2("/bin/true", bindir / name)
        # a program merely named like CPython, with no stdlib, no libpython,
        # no pyvenv.cfg: not taken for one
        assert _identify(bindir / name) is None, name
    py2 = [exe for label, exe in INTERPRETERS if "2.7" in exe]
    if os.path.exists("/root/.pyenv/versions/2.7.18/bin/python2.7"):
        py2.append("/root/.pyenv/versions/2.7.18/bin/python2.7")
    for exe in py2:
        assert _identify(exe) is None  # CPython 2 is not modelled


def test_a_stdlib_above_confirms_the_name(tmp_path: Path) -> None:
    prefix = tmp_path / "prefix"
    (prefix / "bin").mkdir(parents=True)
    (prefix / "lib" / "python3.12").mkdir(parents=True)
    (prefix / "lib" / "python3.12" / "os.py").write_text("")
    shutil.copy2("/bin/true", prefix / "bin" / "python3.12")
    (prefix / "bin" / "python3").symlink_to("python3.12")
    (prefix / "bin" / "python").symlink_to("python3")
    shutil.copy2("/bin/true", prefix / "bin" / "python3.9")
    for name in ("python3.12", "python3", "python"):
        found = _identify(prefix / "bin" / name)
        assert found is not None and found.version == (3, 12), name
    assert _identify(prefix / "bin" / "python3.9") is None  # its stdlib is not there
    # a binary named python3 with only a stdlib above: told by the landmark
    shutil.copy2("/bin/true", prefix / "bin" / "python3-copy")
    os.rename(prefix / "bin" / "python3-copy", prefix / "python3")
    found = _identify(prefix / "python3")
    assert found is not None and (found.version, found.evidence) == ((3, 12), "lib/python3.12")
    # two stdlibs and nothing else to choose by: not sure, so None
    (prefix / "lib" / "python3.13").mkdir()
    (prefix / "lib" / "python3.13" / "os.pyc").write_bytes(b"")
    assert _identify(prefix / "python3") is None


def test_identify_in_a_node_image(tmp_path: Path) -> None:
    """--root: the interpreter's links and landmarks are read in the image."""
    image = tmp_path / "image"
    (image / "usr" / "bin").mkdir(parents=True)
    (image / "usr" / "lib" / "python3.12").mkdir(parents=True)
    (image / "usr" / "lib" / "python3.12" / "os.py").write_text("")
    shutil.copy2("/bin/true", image / "usr" / "bin" / "python3.12")
    (image / "usr" / "bin" / "python3").symlink_to("python3.12")
    profile = node.detect().with_overrides(root=str(image))
    info = elf.read_elf(str(image / "usr" / "bin" / "python3.12"))
    found = interp.identify("/usr/bin/python3", info, profile, Budget())
    assert found == interp.Interpreter("/usr/bin/python3", "/usr/bin/python3.12", (3, 12),
                                       "name python3.12")


def test_identify_never_raises_on_odd_paths(tmp_path: Path) -> None:
    info = elf.read_elf("/bin/true")
    for path in ("/nonexistent/python3.11", str(tmp_path / "python3\udcff"), "python3", ""):
        assert interp.identify(path, info, node.detect(), Budget()) is None
    loop = tmp_path / "python3"
    loop.symlink_to("python3")
    assert interp.identify(str(loop), info, node.detect(), Budget()) is None


@pytest.mark.parametrize(("name", "version"), [
    ("python3.11", (3, 11)), ("python3.6m", (3, 6)), ("python3.13t", (3, 13)),
    ("python3.10d", (3, 10)), ("python3", None), ("python", None), ("python3.x", None),
    ("pythonista3.1", None), ("python3.11-config", None), ("python3.", None),
])
def test_version_of_name(name: str, version: tuple[int, int] | None) -> None:
    assert interp.version_of_name(name) == version


def test_uv_style_pyvenv_cfg(tmp_path: Path) -> None:
    """uv and virtualenv write ``version_info = X.Y.Z...`` instead of venv's
    ``version = X.Y.Z``; a --copies venv of a static python is told by it."""
    if not os.path.exists("/usr/bin/python3.11"):
        pytest.skip("no Debian python3.11 here")
    venv = tmp_path / "uv"
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", "--copies", str(venv)],
                   check=True, capture_output=True)
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\nimplementation = CPython\n"
                                     "uv = 0.5.0\nversion_info = 3.11.2\n"
                                     "include-system-site-packages = false\n")
    found = _identify(venv / "bin" / "python3")
    assert found is not None
    assert (found.version, found.evidence) == ((3, 11), "pyvenv.cfg version")
    # the real interpreter agrees
    assert _version(str(venv / "bin" / "python3")) == (3, 11)


def test_the_oracle_has_interpreters() -> None:
    """The oracle tests are generated per interpreter found: none found must
    fail, not pass with nothing run."""
    assert INTERPRETERS, "no CPython 3 of the oracle list is installed"
