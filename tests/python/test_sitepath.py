"""The sys.path model held to real CPythons (tests/python/sitepath_oracle.py).

Every case runs the real interpreter with the same executable, arguments,
environment and working directory as the model gets, and compares the whole
``sys.path`` (order included), ``sys.prefix``/``base_prefix``/``exec_prefix``,
the user site, and which ``.pth`` import lines the real one executed with the
ones the model recorded (and did not run).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from grace_policy import fsprobe
from grace_policy import node as _node
from grace_policy.budget import Budget, BudgetExceeded
from grace_policy.context import StepContext
from grace_policy.python import interp, sitepath

from . import sitepath_oracle as oracle
from .sitepath_oracle import PROBE, World, build_world, model, run_real

INTERPRETERS = oracle.oracles()
#: The interpreters of this machine (the start-up failure tests run them directly).
HOST_INTERPRETERS = [(lab, exe) for lab, exe in INTERPRETERS if not oracle.is_root(lab)]
#: Interpreters that get the whole matrix; the others a cross-section (every
#: environment, the main flags, fewer executables).
FULL = {"debian-3.11", "pyenv-3.11.7", "sid-3.14"}

EXES = ("base", "venv-sym", "venv-copy", "venv-sys", "conda", "venv-cfgbin", "venv-odd")
ENVS = ("plain", "pythonpath", "userbase", "home-local", "nousersite", "pythonhome",
        "safepath")
FLAGS: dict[str, list[str]] = {"none": [], "s": ["-s"], "E": ["-E"], "I": ["-I"],
                               "S": ["-S"], "P": ["-P"], "Es": ["-Es"]}
#: Environments tried with fewer flags.
ENVS_EXTRA = ("pythonpath-empty", "home-slash", "userbase-rel", "pythonhome2")
CMDS = ("module", "script", "linked", "dir", "stdin", "dash", "abs-script",
        "console-script", "zip", "module-symcwd", "script-symcwd", "module-pp")

Case = tuple[str, str, str, str, str, str]


def _cases() -> list[Case]:
    out: list[Case] = []
    for label, exe in INTERPRETERS:
        full = label in FULL
        for e in EXES:
            if not full and e in ("venv-copy", "venv-cfgbin", "venv-odd"):
                continue
            if e == "conda" and oracle.is_root(label):
                continue  # see sitepath_oracle.build_world
            few = e in ("venv-copy", "venv-cfgbin", "venv-odd") or (not full and e == "conda")
            for env in ENVS + ENVS_EXTRA:
                if few and env not in ("plain", "pythonpath", "home-local", "pythonhome",
                                       "pythonhome2"):
                    continue
                for fl in FLAGS:
                    if few and fl not in ("none", "E", "I", "S"):
                        continue
                    if not full and fl not in ("none", "I", "S") and not (
                            fl == "E" and env in ("pythonpath", "userbase")):
                        continue
                    if env in ENVS_EXTRA and (fl not in ("none", "E") or not full):
                        continue
                    out.append((label, exe, e, env, fl, "code"))
            if e not in ("base", "venv-sym"):
                continue
            for cmd in CMDS:
                if cmd == "console-script" and e != "venv-sym":
                    continue
                for fl in ("none", "I", "P", "S"):
                    if cmd.startswith("module") and fl == "I":
                        continue  # neither cwd nor PYTHONPATH: nothing to run
                    if cmd in ("module", "module-symcwd") and fl == "P" and _ge311(label):
                        continue  # cwd is not on sys.path: nothing to run
                    if cmd == "console-script" and fl != "none":
                        continue
                    if not full and fl in ("P", "S"):
                        continue
                    out.append((label, exe, e, "home-local", fl, cmd))
    return out


def _ge311(label: str) -> bool:
    ver = label.split("-")[1].split(".")
    return (int(ver[0]), int(ver[1])) >= (3, 11)


CASES = _cases()
_WORLDS: dict[str, World] = {}
_REAL: dict[Case, dict | BaseException | None] = {}


def _world(label: str, exe: str, tmp_path_factory: pytest.TempPathFactory,
           session: pytest.Session | None = None) -> World:
    """The world of one interpreter, built on first use; the real runs of its
    selected cases are made then, in parallel (independent processes)."""
    if label not in _WORLDS:
        runner = oracle.runner(label)
        root = Path(runner.world_dir(tmp_path_factory.mktemp(label)))
        w = _WORLDS[label] = build_world(label, exe, root, runner)
        selected = None
        if session is not None:
            selected = {tuple(item.callspec.params[k] for k in _PARAMS)
                        for item in session.items
                        if getattr(item, "originalname", "") == _MATRIX_TEST}
        mine = [c for c in CASES if c[0] == label and (selected is None or c in selected)]

        def real(case: Case) -> dict | BaseException | None:
            try:
                _, _, argv, env, cwd, stdin = _setup(w, *case[2:])
                return run_real(argv, env, cwd, stdin, runner)
            except BaseException as exc:  # reported by the case's own test
                return exc

        with ThreadPoolExecutor(max_workers=4) as pool:
            for case, result in zip(mine, pool.map(real, mine)):
                _REAL[case] = result
    return _WORLDS[label]


def _setup(w: World, exe_kind: str, env_kind: str, flag_kind: str, cmd: str,
           ) -> tuple[str, list[str], list[str], dict[str, str], str, str | None]:
    exe = {"base": w.base_exe, "conda": w.p("conda", "bin", "python")}.get(
        exe_kind) or w.venv_python(exe_kind)
    env = {"PATH": "/usr/bin:/bin", "HOME": w.p("home-empty"), "LC_ALL": "C.UTF-8"}
    base_prefix = str(Path(os.path.realpath(w.base_exe)).parent.parent)
    env.update({
        "plain": {},
        "pythonpath": {"PYTHONPATH": f"{w.p('pp1')}::pp3:/nonexistent:{w.p('pp1')}/:"
                       f"{w.p('pp2')}/../pp2"},
        "userbase": {"PYTHONUSERBASE": w.p("userbase"), "HOME": w.p("home-user")},
        "home-local": {"HOME": w.p("home-user")},
        "nousersite": {"HOME": w.p("home-user"), "PYTHONNOUSERSITE": "1"},
        "pythonhome": {"PYTHONHOME": base_prefix, "HOME": w.p("home-user")},
        "safepath": {"PYTHONSAFEPATH": "1", "HOME": w.p("home-user")},
        "pythonpath-empty": {"PYTHONPATH": "", "PYTHONHOME": "", "HOME": w.p("home-user")},
        "home-slash": {"HOME": w.p("home-user") + "//"},
        "userbase-rel": {"PYTHONUSERBASE": "../userbase"},
        "pythonhome2": {"PYTHONHOME": f"{base_prefix}:{base_prefix}"},
    }[env_kind])
    flags = FLAGS[flag_kind]
    stdin = None
    cwd = w.p("work")
    if cmd == "code":
        args = [*flags, "-c", PROBE]
    elif cmd == "module":
        args = [*flags, "-m", "probe_mod"]
    elif cmd == "script":
        args = [*flags, "script.py"]
    elif cmd == "linked":
        args = [*flags, "sub/linked.py"]
    elif cmd == "dir":
        args = [*flags, "app"]
    elif cmd == "module-pp":  # found through PYTHONPATH, so -I/-P can run it too
        env["PYTHONPATH"] = cwd
        args = [*flags, "-m", "probe_mod"]
    elif cmd == "zip":
        args = [*flags, "app.pyz"]
    elif cmd in ("module-symcwd", "script-symcwd"):
        cwd = w.p("worklink")
        args = [*flags, "-m", "probe_mod"] if cmd == "module-symcwd" else [*flags, "script.py"]
    elif cmd == "abs-script":
        args = [*flags, w.p("work", "dirlink", "target.py")]
    elif cmd == "stdin":
        args, stdin = [*flags], PROBE
    elif cmd == "dash":
        args, stdin = [*flags, "-", "x"], PROBE
    elif cmd == "console-script":
        tool = w.p("venv-sym", "bin", "probe-tool")
        return exe, [tool], [tool], env, cwd, None
    else:
        raise AssertionError(cmd)
    return exe, args, [exe, *args], env, cwd, stdin


_PARAMS = ("label", "base_exe", "exe_kind", "env_kind", "flag_kind", "cmd")
_MATRIX_TEST = "test_sys_path_matches_real_cpython"


@pytest.mark.parametrize(_PARAMS, [oracle.param(c, c[0]) for c in CASES],
                         ids=lambda v: v if not str(v).startswith("/") else "")
def test_sys_path_matches_real_cpython(label: str, base_exe: str, exe_kind: str,
                                       env_kind: str, flag_kind: str, cmd: str,
                                       tmp_path_factory: pytest.TempPathFactory,
                                       request: pytest.FixtureRequest) -> None:
    w = _world(label, base_exe, tmp_path_factory, request.session)
    case = (label, base_exe, exe_kind, env_kind, flag_kind, cmd)
    real = _REAL.get(case)
    if isinstance(real, BaseException):
        raise real
    exe, args, _, env, cwd, _ = _setup(w, exe_kind, env_kind, flag_kind, cmd)
    found, command, sp = model(exe, args, env, cwd, runner=oracle.runner(label))
    if real is None:  # the real interpreter ran nothing (-P before 3.11)
        assert command.kind == "none"
        return
    assert command.kind != "none"
    assert found.version == tuple(real["version"])
    assert sp.paths == real["path"], "\n".join(sp.notes)
    assert sp.prefix == real["prefix"]
    assert sp.base_prefix == real["base_prefix"]
    assert sp.exec_prefix == real["exec_prefix"]
    assert sp.user_site == real["user_site"]
    # the real interpreter ran these .pth import lines; the model lists them
    assert [line.split("append(")[1][1:-2] for _, line in sp.pth_imports
            if "_grace_pth" in line] == real["pth"]
    assert sp.venv == (real["prefix"] if real["prefix"] != real["base_prefix"] else None)
    kinds = {e.kind for e in sp.entries}
    assert kinds <= {"script-dir", "cwd", "pythonpath", "stdlib-zip", "stdlib", "lib-dynload",
                     "user-site", "site-packages", "pth"}
    for e in sp.entries:
        assert e.system == e.path.startswith(sitepath.SYSTEM_PYTHON_DIRS)


# -- what the entries say, on the real layouts ---------------------------------

def _one(label_wanted: str, tmp_path_factory: pytest.TempPathFactory) -> World:
    for label, exe in INTERPRETERS:
        if label == label_wanted:
            return _world(label, exe, tmp_path_factory)
    pytest.skip(f"{label_wanted} is not installed here")


def test_entry_kinds_and_origins_in_a_venv(tmp_path_factory: pytest.TempPathFactory) -> None:
    w = _one("pyenv-3.11.7", tmp_path_factory)
    env = {"HOME": w.p("home-user"), "PYTHONPATH": "pp3"}
    _, _, sp = model(w.venv_python("venv-sys"), ["script.py"], env, w.p("work"))
    by_path = {e.path: e for e in sp.entries}
    assert sp.entries[0] == sitepath.PathEntry(w.p("work"), "script-dir", "script.py", False)
    assert by_path[w.p("work", "pp3")].kind == "pythonpath"
    assert by_path[w.p("work", "pp3")].origin == "PYTHONPATH"
    venv_site = w.site_packages(w.p("venv-sys"))
    user_site = w.site_packages(w.p("home-user", ".local"))
    assert by_path[venv_site].kind == "site-packages"
    assert by_path[venv_site].origin == "venv"
    assert by_path[user_site].kind == "user-site"
    assert by_path[user_site].origin == "HOME"
    pth_entry = by_path[f"{venv_site}/venv-sys_a"]
    assert (pth_entry.kind, pth_entry.origin) == ("pth", f"{venv_site}/10-first.pth")
    assert sp.site_dirs[:2] == (venv_site, user_site)
    assert sp.venv == w.p("venv-sys") and sp.system_site
    stdlib = [e for e in sp.entries if e.kind == "stdlib"]
    assert len(stdlib) == 1 and stdlib[0].origin == "pyvenv.cfg"


def test_debian_system_dirs_are_the_nodes(tmp_path_factory: pytest.TempPathFactory) -> None:
    w = _one("debian-3.11", tmp_path_factory)
    _, _, sp = model("/usr/bin/python3", ["-c", "pass"], {"HOME": w.p("home-user")}, "/")
    systems = {e.path: e.system for e in sp.entries}
    assert systems["/usr/lib/python3.11"] and systems["/usr/lib/python3/dist-packages"]
    assert not systems[w.site_packages(w.p("home-user", ".local"))]


def test_pythonhome_that_does_not_exist_is_a_note(tmp_path: Path) -> None:
    found = interp.identify("/usr/bin/python3", _elf("/usr/bin/python3"), _node.detect(),
                            Budget())
    if found is None:
        pytest.skip("no /usr/bin/python3")
    sp = sitepath.sys_path(found, interp.PyFlags(), interp.PyCommand("code", "pass"),
                           StepContext(node=_node.detect(),
                                       env={"PYTHONHOME": str(tmp_path / "nope")}, cwd="/",
                                       budget=Budget()))
    assert any("PYTHONHOME" in n for n in sp.notes)
    assert sp.paths[1] == str(tmp_path / "nope" / "lib" / "python311.zip")


def _elf(path: str):
    from grace_policy import elf
    return elf.read_elf(os.path.realpath(path))


# -- hostile and odd inputs: a note or a bounded read, never an exception ------

def _fake_python(tmp_path: Path) -> tuple[interp.Interpreter, Path]:
    """A prefix laid out as CPython's, with a site-packages to fill."""
    prefix = tmp_path / "prefix"
    std = prefix / "lib" / "python3.11"
    (std / "lib-dynload").mkdir(parents=True)
    (std / "os.py").write_text("")
    site = std / "site-packages"
    site.mkdir()
    exe = prefix / "bin" / "python3.11"
    exe.parent.mkdir()
    exe.write_bytes(b"")
    return interp.Interpreter(str(exe), str(exe), (3, 11), "test"), site


def test_hostile_pth_files(tmp_path: Path) -> None:
    it, site = _fake_python(tmp_path)
    (site / "bin.pth").write_bytes(bytes(range(256)) * 40)
    (site / "loop").symlink_to("loop")
    (site / "loop.pth").write_text("loop\n")
    (site / "nul.pth").write_bytes(b"a\0b\n")
    (site / "dir.pth").mkdir()
    (site / b"\xff\xfe-name.pth".decode("utf-8", "surrogateescape")).write_text("/\n")
    (site / "dangling.pth").symlink_to("nowhere")
    sp = sitepath.sys_path(it, interp.PyFlags(), interp.PyCommand("code", "pass"),
                           StepContext(node=_node.detect(), env={"HOME": str(tmp_path)},
                                       cwd=str(tmp_path), budget=Budget()))
    assert str(site) in sp.paths
    assert str(site / "loop") not in sp.paths  # a symlink loop does not exist
    assert "/" in sp.paths  # the non-UTF-8-named .pth was read


def test_garbage_pyvenv_cfg(tmp_path: Path) -> None:
    it, _site = _fake_python(tmp_path)
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(it.executable)
    (venv / "pyvenv.cfg").write_bytes(b"\xff\x00home\n=\n" * 1000)
    vit = interp.Interpreter(str(venv / "bin" / "python"), it.executable, (3, 11), "test")
    sp = sitepath.sys_path(vit, interp.PyFlags(), interp.PyCommand("code", "pass"),
                           StepContext(node=_node.detect(), env={}, cwd="/", budget=Budget()))
    assert sp.venv == str(venv)
    assert sp.base_prefix == str(tmp_path / "prefix")


def test_many_pth_files_end_in_budget_exceeded(tmp_path: Path) -> None:
    it, site = _fake_python(tmp_path)
    for i in range(300):
        (site / f"p{i:03}.pth").write_text("x\n")
    with pytest.raises(BudgetExceeded):
        sitepath.sys_path(it, interp.PyFlags(), interp.PyCommand("code", "pass"),
                          StepContext(node=_node.detect(), env={}, cwd="/",
                                      budget=Budget(max_files=100)))


def test_what_the_model_read_is_recorded(tmp_path: Path) -> None:
    it, site = _fake_python(tmp_path)
    (site / "a.pth").write_text("sub\n")
    (site / "sub").mkdir()
    files = fsprobe.Files.recorded()
    sitepath.sys_path(it, interp.PyFlags(), interp.PyCommand("code", "pass"),
                      StepContext(node=_node.detect(),
                                  env={"PYTHONPATH": "/x", "HOME": str(tmp_path)}, cwd="/",
                                  budget=Budget(), files=files))
    records = files.records()
    paths = {(op, p) for op, p, _ in records}
    assert ("s", str(site / "a.pth")) in paths
    assert ("v", "PYTHONPATH") in paths and ("v", "HOME") in paths
    assert ("D", str(site)) in paths


def test_node_image_root(tmp_path: Path) -> None:
    """With --root, node paths are read inside the image first."""
    image = tmp_path / "image"
    _it, site = _fake_python(image)
    node_prefix = "/" + str((image / "prefix").relative_to(image))
    (site / "a.pth").write_text("/opt/extra\n")
    (image / "opt" / "extra").mkdir(parents=True)
    node_it = interp.Interpreter(node_prefix + "/bin/python3.11", node_prefix
                                 + "/bin/python3.11", (3, 11), "test")
    profile = _node.detect().with_overrides(root=str(image))
    sp = sitepath.sys_path(node_it, interp.PyFlags(), interp.PyCommand("code", "pass"),
                           StepContext(node=profile, env={}, cwd="/", budget=Budget()))
    assert sp.paths == ["", f"{node_prefix}/lib/python311.zip",
                        f"{node_prefix}/lib/python3.11",
                        f"{node_prefix}/lib/python3.11/lib-dynload",
                        f"{node_prefix}/lib/python3.11/site-packages", "/opt/extra"]


def test_free_threaded_build_directories(tmp_path: Path) -> None:
    """python3.13t: getpath's STDLIB_SUBDIR/ZIP_LANDMARK and site's paths
    carry the "t" (no free-threaded CPython is installable here, so this
    follows Modules/getpath.py and Lib/site.py of 3.13)."""
    prefix = tmp_path / "ft"
    std = prefix / "lib" / "python3.13t"
    (std / "lib-dynload").mkdir(parents=True)
    (std / "os.py").write_text("")
    (std / "site-packages").mkdir()
    (prefix / "bin").mkdir()
    import shutil
    shutil.copy2("/bin/true", prefix / "bin" / "python3.13t")
    found = interp.identify(str(prefix / "bin" / "python3.13t"), _elf("/bin/true"),
                            _node.detect(), Budget())
    assert found is not None and found.version == (3, 13)
    home = tmp_path / "home"
    sp = sitepath.sys_path(found, interp.PyFlags(), interp.PyCommand("code", "pass"),
                           StepContext(node=_node.detect(), env={"HOME": str(home)}, cwd="/",
                                       budget=Budget()))
    assert sp.paths == ["", f"{prefix}/lib/python313t.zip", str(std), f"{std}/lib-dynload",
                        f"{std}/site-packages"]
    assert sp.user_site == f"{home}/.local/lib/python3.13t/site-packages"


def test_home_unset_is_a_note(tmp_path: Path) -> None:
    it, _ = _fake_python(tmp_path)
    sp = sitepath.sys_path(it, interp.PyFlags(), interp.PyCommand("code", "pass"),
                           StepContext(node=_node.detect(), env={}, cwd="/", budget=Budget()))
    assert sp.user_site is None
    assert any("HOME" in n for n in sp.notes)
    # with -s nobody would have looked: no note
    sp = sitepath.sys_path(it, interp.PyFlags(no_user_site=True), interp.PyCommand("code", "pass"),
                           StepContext(node=_node.detect(), env={}, cwd="/", budget=Budget()))
    assert not sp.notes


def test_too_many_pth_lines_is_a_note(tmp_path: Path) -> None:
    it, site = _fake_python(tmp_path)
    (site / "big.pth").write_text("#\n" * (sitepath.MAX_PTH_LINES + 5))
    sp = sitepath.sys_path(it, interp.PyFlags(), interp.PyCommand("code", "pass"),
                           StepContext(node=_node.detect(), env={"HOME": str(tmp_path)}, cwd="/",
                                       budget=Budget()))
    assert any(".pth lines" in n for n in sp.notes)


# -- what stops the real interpreter before it runs anything --------------------

def _startup_failure(argv: list[str], env: dict[str, str]) -> str:
    import subprocess
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0, proc.stdout
    return proc.stderr


@pytest.mark.parametrize(("label", "exe"), HOST_INTERPRETERS,
                         ids=[lab for lab, _ in HOST_INTERPRETERS])
@pytest.mark.parametrize("what", ["pth", "pyvenv.cfg"])
def test_non_utf8_site_file_stops_cpython(label: str, exe: str, what: str,
                                          tmp_path: Path) -> None:
    """A .pth or pyvenv.cfg that is not UTF-8 makes site.py raise at start-up
    (Fatal Python error: init_import_site) under a UTF-8 or C locale: the
    model says so in startup_error."""
    import subprocess
    venv = tmp_path / "v"
    subprocess.run([exe, "-m", "venv", "--without-pip", str(venv)], check=True,
                   capture_output=True, timeout=120)
    site_dir = next(venv.glob("lib/python3*/site-packages"))
    if what == "pth":
        (site_dir / "x.pth").write_bytes(b"okdir\n\xff\xfe latin-1\n")
    else:
        with open(venv / "pyvenv.cfg", "ab") as f:
            f.write(b"# \xff\n")
    exe_v = str(venv / "bin" / "python")
    env = {"HOME": str(tmp_path), "LC_ALL": "C.UTF-8", "PATH": "/usr/bin:/bin"}
    stderr = _startup_failure([exe_v, "-c", "pass"], env)
    assert "UnicodeDecodeError" in stderr
    _, _, sp = model(exe_v, ["-c", "pass"], env, str(tmp_path))
    assert sp.startup_error is not None
    assert sp.startup_error.split(" (")[0] in stderr  # CPython's own words
    assert "UnicodeDecodeError" in sp.startup_error
    # -S: site is not imported, nothing fails
    import subprocess as sp_
    assert sp_.run([exe_v, "-S", "-c", "pass"], env=env, timeout=60).returncode == 0
    _, _, sp = model(exe_v, ["-S", "-c", "pass"], env, str(tmp_path))
    assert sp.startup_error is None


@pytest.mark.parametrize(("label", "exe"), HOST_INTERPRETERS,
                         ids=[lab for lab, _ in HOST_INTERPRETERS])
def test_pythonhome_without_stdlib_stops_cpython(label: str, exe: str, tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path), "PYTHONHOME": str(tmp_path / "nope"), "PATH": "/usr/bin"}
    stderr = _startup_failure([exe, "-c", "pass"], env)
    _, _, sp = model(exe, ["-c", "pass"], env, str(tmp_path))
    assert sp.startup_error is not None
    assert sp.startup_error.split(" (")[0] in stderr  # CPython's own words
    # -E: PYTHONHOME is ignored, the interpreter starts
    import subprocess
    assert subprocess.run([exe, "-E", "-c", "pass"], env=env, timeout=60).returncode == 0
    _, _, sp = model(exe, ["-E", "-c", "pass"], env, str(tmp_path))
    assert sp.startup_error is None
