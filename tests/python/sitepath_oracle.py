"""Real CPythons of this machine as the oracle of the sys.path model.

Each interpreter found here (Debian's /usr/bin/python3.11 with Debian's site
patch, pyenv's upstream builds) runs a probe that prints its ``sys.path``,
prefixes, user site and which ``.pth`` ``import`` lines ran, as JSON on one
marked line. :func:`world` builds, once per interpreter, the environments the
tests point it at: venvs (symlinks, copies, system site), a user base, a
HOME with ``~/.local``, PYTHONPATH directories, ``.pth`` files of every kind,
scripts, a package dir with ``__main__``, a symlinked script, a console
script whose ``#!`` names the venv's python, and (3.11+) a conda-like prefix
(a symlink farm around a copy of the real binary).

The Pythons of the Slurm release roots (``tests/slurm/roots.py``: Debian
sid's 3.14 for 26.05, Debian 13's 3.13 for 24.11) are oracles too, when
``GRACE_SLURM_RELEASES`` selects their release: each runs chroot'ed into an
overlay of its cached root (:class:`Runner`), and the test worlds are
bind-mounted into the root at their own paths, so a world path is the same
inside and outside. The model reads the root as a node image
(``NodeProfile.root``), as ``grace-policy check --root`` does.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from grace_policy import budget as _budget
from grace_policy import elf, loader, node
from grace_policy.context import StepContext
from grace_policy.python import interp, sitepath, step

#: (label, executable) of the CPythons looked for on this machine.
CANDIDATES: tuple[tuple[str, str], ...] = (
    ("debian-3.11", "/usr/bin/python3.11"),
    *((f"pyenv-{v}", f"/root/.pyenv/versions/{v}/bin/python{v.rsplit('.', 1)[0]}")
      for v in ("3.8.18", "3.9.18", "3.10.13", "3.11.7", "3.12.1", "3.13.0", "3.7.16")),
)

MARK = "GRACE-ORACLE "
PROBE = (
    "import sys, json, site\n"
    "print(" + repr(MARK) + " + json.dumps({'path': sys.path, 'prefix': sys.prefix,"
    " 'base_prefix': sys.base_prefix, 'exec_prefix': sys.exec_prefix,"
    " 'user_site': site.USER_SITE if site.ENABLE_USER_SITE else None,"
    " 'version': list(sys.version_info[:2]),"
    " 'pth': getattr(sys, '_grace_pth', [])}))\n"
)
#: A .pth import line the real interpreter runs (site.py exec's it); the
#: model must record it, never run it.
PTH_IMPORT = "import sys; sys.__dict__.setdefault('_grace_pth', []).append({name!r})"


#: (label, executable inside the root, Slurm release) of the release roots' Pythons.
ROOT_CANDIDATES: tuple[tuple[str, str, str], ...] = (
    ("sid-3.14", "/usr/bin/python3.14", "26.05"),
    ("trixie-3.13", "/usr/bin/python3.13", "24.11"),
)


def _roots_selected() -> set[str]:
    if os.geteuid() != 0:   # overlay and chroot need root, as the release matrix does
        return set()
    from slurm import roots
    return {r for r in roots.selected() if r != roots.HOST}


def available() -> list[tuple[str, str]]:
    """The CPythons of this machine."""
    return [(label, exe) for label, exe in CANDIDATES if os.access(exe, os.X_OK)]


def oracles() -> list[tuple[str, str]]:
    """:func:`available` and the release roots' Pythons (run them through
    :func:`runner`)."""
    found = available()
    selected = _roots_selected()
    found += [(label, exe) for label, exe, release in ROOT_CANDIDATES if release in selected]
    return found


def version_of(label: str) -> tuple[int, int]:
    major, minor = label.split("-", 1)[1].split(".")[:2]
    return int(major), int(minor)


@dataclass
class Runner:
    """How an oracle interpreter runs: on this machine, or chroot'ed into an
    overlay of a release root (``chroot``: its merged directory)."""

    label: str
    chroot: str | None = None
    binds: list[str] = field(default_factory=list)
    _root: object = None

    def host(self, node_path: str) -> str:
        """Where this host reads a node path (world paths are bound at their own)."""
        if self.chroot is None or any(node_path == b or node_path.startswith(b + "/")
                                      for b in self.binds):
            return node_path
        return self.chroot + node_path

    def world_dir(self, tmp: Path) -> str:
        """``tmp`` made visible at the same path inside the root."""
        if self.chroot is not None:
            inside = Path(self.chroot + str(tmp))
            inside.mkdir(parents=True, exist_ok=True)
            subprocess.run(["mount", "--bind", str(tmp), str(inside)], check=True,
                           capture_output=True)
            self.binds.append(str(tmp))
        return str(tmp)

    def argv(self, argv: list[str], cwd: str) -> tuple[list[str], str | None]:
        if self.chroot is None:
            return argv, cwd
        chroot = shutil.which("chroot", path="/usr/sbin:/usr/bin:/sbin:/bin") or "chroot"
        return ([chroot, self.chroot, "/bin/sh", "-c", 'cd "$1" || exit 97; shift; '
                 'exec "$@"', "sh", cwd, *argv], None)

    def run(self, argv: list[str], env: dict[str, str], cwd: str, stdin: str | None = None,
            timeout: float = 60) -> subprocess.CompletedProcess[str]:
        full, where = self.argv(argv, cwd)
        return subprocess.run(full, env=env, cwd=where,
                              input=stdin if stdin is not None else "",
                              capture_output=True, text=True, timeout=timeout)

    def run_plain(self, argv: list[str], cwd: str) -> subprocess.CompletedProcess[str]:
        env = {"PATH": "/usr/bin:/bin", "HOME": cwd, "LC_ALL": "C.UTF-8",
               "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
        return self.run(argv, env, cwd, timeout=600)

    def profile(self) -> node.NodeProfile:
        found = node.detect()
        return found if self.chroot is None else found.with_overrides(root=self.chroot)


_RUNNERS: dict[str, Runner] = {}


def runner(label: str) -> Runner:
    """The runner of an oracle interpreter; a release root's overlay is
    opened on first use and closed at :func:`close_roots` (or exit)."""
    if label not in _RUNNERS:
        release = next((r for lab, _exe, r in ROOT_CANDIDATES if lab == label), None)
        if release is None:
            _RUNNERS[label] = Runner(label)
        else:
            from corpus import CorpusUnavailable, _give_up
            from slurm import roots
            try:
                opened = roots.open_root(roots.RELEASES[release])
            except CorpusUnavailable as exc:  # no mmdebstrap, offline: skip (fail under CI)
                _give_up(f"Slurm {release} root unavailable: {exc}")
                raise
            _relative_links(opened.path)
            _RUNNERS[label] = Runner(label, chroot=str(opened.path), _root=opened)
    return _RUNNERS[label]


def _relative_links(root: Path) -> None:
    """Debian links ``/usr/lib/python3.X/sitecustomize.py`` to
    ``/etc/python3.X/sitecustomize.py`` by absolute path. Read from outside
    the image, such a link leads to this host's /etc (a limit of reading a
    node image from outside, ``grace-policy check --root``; on the node
    itself it is right), so in the overlay it is made relative: the same
    file to the real interpreter inside."""
    for lib in root.glob("usr/lib/python3*"):
        link = lib / "sitecustomize.py"   # (glob does not match a link it cannot follow)
        target = os.readlink(link) if link.is_symlink() else ""
        if target.startswith("/"):
            link.unlink()
            link.symlink_to(os.path.relpath(target, "/" + str(link.parent.relative_to(root))))


def param(values: tuple, label: str) -> object:
    """A parametrize entry; a release root's cases carry the ``slurm`` mark
    (they need the roots of the Slurm matrix: ``-m "not slurm"`` leaves them out)."""
    import pytest
    marks = (pytest.mark.slurm,) if is_root(label) else ()
    return pytest.param(*values, marks=marks, id=None)


def is_root(label: str) -> bool:
    return any(lab == label for lab, _exe, _r in ROOT_CANDIDATES)


def close_roots() -> None:
    for label, r in list(_RUNNERS.items()):
        if r._root is not None:
            r._root.close()  # type: ignore[attr-defined]
            del _RUNNERS[label]


atexit.register(close_roots)


def run_real(argv: list[str], env: dict[str, str], cwd: str, stdin: str | None = None,
             runner: Runner | None = None) -> dict | None:
    """What the probe printed, or None when the interpreter ran nothing (a
    usage error, -V ...)."""
    proc = (runner or Runner("host")).run(argv, env, cwd, stdin)
    for line in proc.stdout.splitlines():
        if line.startswith(MARK):
            return json.loads(line[len(MARK):])
    if proc.returncode == 0:
        raise AssertionError(f"probe printed nothing: {argv}\n{proc.stdout}\n{proc.stderr}")
    return None


def model(exe: str, args: list[str], env: dict[str, str], cwd: str,
          runner: Runner | None = None,
          ) -> tuple[interp.Interpreter, interp.PyCommand, sitepath.SysPath]:
    profile = (runner or Runner("host")).profile()
    info = elf.read_elf(os.path.realpath(loader.host_path(profile, interp.node_realpath(
        profile, exe))))
    found = interp.identify(exe, info, profile, _budget.Budget(deadline_ms=10_000))
    assert found is not None, exe
    flags, command = interp.parse_python_argv(args, found.version)
    sp = sitepath.sys_path(found, flags, command, StepContext(node=profile, env=env, cwd=cwd,
                                                              budget=_budget.Budget(deadline_ms=10_000)))
    return found, command, sp


def environment(runner: Runner, exe: str, args: list[str], env: dict[str, str], cwd: str
                ) -> tuple[step.Environment, interp.PyFlags]:
    """The model's :class:`step.Environment` of ``exe args`` (judged for the
    runner's node), and the flags it parsed."""
    found, _command, sp = model(exe, args, env, cwd, runner=runner)
    profile = runner.profile()
    budget = _budget.Budget(deadline_ms=20_000)
    real = interp.node_realpath(profile, exe)
    info = elf.read_elf(loader.host_path(profile, real))
    process = loader.Process(exe, info, profile, env, loader.Loading(cwd=cwd, budget=budget))
    flags, _ = interp.parse_python_argv(args, found.version)
    ctx = StepContext(node=profile, env=env, cwd=cwd, budget=budget)
    return step.Environment(found.version, sp, process, ctx, lambda p: ()), flags


@dataclass
class World:
    label: str
    base_exe: str
    version: tuple[int, int]
    root: Path

    @property
    def xy(self) -> str:
        return f"{self.version[0]}.{self.version[1]}"

    def p(self, *parts: str) -> str:
        return str(self.root.joinpath(*parts))

    def venv_python(self, name: str) -> str:
        return self.p(name, "bin", "python")

    def site_packages(self, prefix: str) -> str:
        return f"{prefix}/lib/python{self.xy}/site-packages"


def _write(path: Path, text: str, newline: str = "\n") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline=newline) as f:
        f.write(text)


def _pth_tree(site: Path, world: Path, stdlib: str, tag: str) -> None:
    """The .pth files of one site directory: every kind of line."""
    site.mkdir(parents=True, exist_ok=True)
    real_world = os.path.realpath(world)
    if not os.path.realpath(site).startswith(real_world + os.sep):
        raise AssertionError(f"{site} leads out of the test tree: not written")
    (site / f"{tag}_a").mkdir(exist_ok=True)
    (site / f"{tag}_b").mkdir(exist_ok=True)
    (site / f"{tag}_nested_target").mkdir(exist_ok=True)
    (world / f"abs_{tag}").mkdir(exist_ok=True)
    (world / f"rel_{tag}").mkdir(exist_ok=True)
    (site / f"{tag}_egg.zip").write_bytes(b"PK\x05\x06" + b"\0" * 18)
    _write(site / f"{tag}_a" / "nested.pth", f"{tag}_nested_target\n")
    _write(site / "10-first.pth", "\n".join([
        "# a comment line",
        "",
        "   ",
        f"{tag}_a",
        f"{tag}_a",                                  # duplicate
        f"{tag}_missing",                            # does not exist: not added
        PTH_IMPORT.format(name=f"{tag}/10-first.pth"),
        f"{tag}_egg.zip",                            # a file: exists, added
        os.path.relpath(world / f"rel_{tag}", site),  # ../../.. relative
        f"{tag}_b   ",                               # trailing blanks
        "\timport not-an-import-line",               # not at column 0: a path
    ]) + "\n")
    _write(site / "20-crlf.pth", f"{world / f'abs_{tag}'}\r\n{stdlib}\r\n#x\r\n", newline="")
    _write(site / "30-dup.pth", f"{tag}_b\n{site}\n" + PTH_IMPORT.format(
        name=f"{tag}/30-dup.pth") + "\n")
    _write(site / f".{tag}-hidden.pth", f"{tag}_nested_target\n")  # 3.13+: skipped
    _write(site / "not-a-pth.txt", f"{tag}_nested_target\n")


def build_world(label: str, base_exe: str, root: Path, runner: Runner | None = None) -> World:
    """``root``: a world directory (for a release root, already bound into
    it: :meth:`Runner.world_dir`)."""
    run = runner or Runner("host")
    root.mkdir(parents=True, exist_ok=True)

    def call(argv: list[str]) -> subprocess.CompletedProcess[str]:
        done = run.run(argv, {"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8"}, str(root),
                       timeout=120)
        if done.returncode != 0:
            raise AssertionError(f"{argv}: {done.stderr}")
        return done

    out = call([base_exe, "-S", "-c", "import sys; print(sys.version_info[0],"
                " sys.version_info[1], sys.prefix)"])
    major, minor, prefix = out.stdout.split(maxsplit=2)
    prefix = prefix.strip()
    w = World(label, base_exe, (int(major), int(minor)), root)
    stdlib = f"{prefix}/lib/python{w.xy}"
    for name, opts in (("venv-sym", ["--symlinks"]), ("venv-copy", ["--copies"]),
                       ("venv-sys", ["--symlinks", "--system-site-packages"])):
        if not (root / name).exists():
            call([base_exe, "-m", "venv", "--without-pip", *opts, str(root / name)])
        _pth_tree(Path(w.site_packages(str(root / name))), root, stdlib, name)
    # pyvenv.cfg next to the executable instead of one up (getpath looks one
    # up first, site next to it first), and one with odd spelling
    cfgbin = root / "venv-cfgbin"
    if not cfgbin.exists():
        call([base_exe, "-m", "venv", "--without-pip", "--copies", str(cfgbin)])
        (cfgbin / "pyvenv.cfg").rename(cfgbin / "bin" / "pyvenv.cfg")
    odd = root / "venv-odd"
    if not odd.exists():
        call([base_exe, "-m", "venv", "--without-pip", "--symlinks", str(odd)])
        cfg = (odd / "pyvenv.cfg").read_text().replace(
            "include-system-site-packages = false", "Include-System-Site-Packages=TRUE ")
        (odd / "pyvenv.cfg").write_text("a line without equals\n# home = /nowhere\n" + cfg)
    _pth_tree(Path(w.site_packages(str(odd))), root, stdlib, "venv-odd")
    # a user base (PYTHONUSERBASE) and a HOME with ~/.local
    _pth_tree(Path(w.site_packages(str(root / "userbase"))), root, stdlib, "ub")
    _pth_tree(Path(w.site_packages(str(root / "home-user" / ".local"))), root, stdlib, "hu")
    (root / "home-empty").mkdir(exist_ok=True)
    for d in ("pp1", "pp2", "work/sub", "work/real", "work/app", "work/pp3"):
        (root / d).mkdir(parents=True, exist_ok=True)
    work = root / "work"
    _write(work / "probe_mod.py", PROBE)
    _write(work / "script.py", PROBE)
    _write(work / "real" / "target.py", PROBE)
    _write(work / "app" / "__main__.py", PROBE)
    if not (work / "app.pyz").exists():
        import zipfile
        with zipfile.ZipFile(work / "app.pyz", "w") as z:
            z.writestr("__main__.py", PROBE)
    if not (root / "worklink").is_symlink():
        (root / "worklink").symlink_to("work")
    link = work / "sub" / "linked.py"
    if not link.is_symlink():
        link.symlink_to("../real/target.py")
    dlink = work / "dirlink"
    if not dlink.is_symlink():
        dlink.symlink_to("real")
    # a console script as pip writes it: #! names the venv's python
    tool = root / "venv-sym" / "bin" / "probe-tool"
    _write(tool, f"#!{w.venv_python('venv-sym')}\n" + PROBE)
    tool.chmod(0o755)
    # conda-like prefix: a copy of the real binary (its libpython is found by
    # its absolute RUNPATH), the stdlib's entries linked in; the directories
    # themselves are real, so nothing written below goes through a link into
    # the system's Python
    farm = root / "conda"
    binary = farm / "bin" / f"python{w.xy}"
    if run.chroot is not None:
        # its links name the root's stdlib by absolute path, which this host
        # resolves outside the image: no conda-like prefix for a release root
        return w
    if not binary.exists():
        (farm / "bin").mkdir(parents=True)
        (farm / "lib" / f"python{w.xy}").mkdir(parents=True)
        shutil.copy2(os.path.realpath(base_exe), binary)
        (farm / "bin" / "python").symlink_to(f"python{w.xy}")
        for entry in os.listdir(stdlib):
            if entry not in ("site-packages", "dist-packages"):
                (farm / "lib" / f"python{w.xy}" / entry).symlink_to(f"{stdlib}/{entry}")
        # every directory either site.py would look at (Debian's: dist-packages)
        for d in (f"lib/python{w.xy}/site-packages", f"lib/python{w.xy}/dist-packages",
                  "lib/python3/dist-packages", f"local/lib/python{w.xy}/dist-packages"):
            _pth_tree(farm / d, root, stdlib, "conda-" + d.replace("/", "-"))
    return w
