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
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from grace_policy import budget as _budget
from grace_policy import elf, node
from grace_policy.python import interp, sitepath

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


def available() -> list[tuple[str, str]]:
    return [(label, exe) for label, exe in CANDIDATES if os.access(exe, os.X_OK)]


def run_real(argv: list[str], env: dict[str, str], cwd: str, stdin: str | None = None,
             ) -> dict | None:
    """What the probe printed, or None when the interpreter ran nothing (a
    usage error, -V ...)."""
    proc = subprocess.run(argv, env=env, cwd=cwd, input=stdin if stdin is not None else "",
                          capture_output=True, text=True, timeout=60)
    for line in proc.stdout.splitlines():
        if line.startswith(MARK):
            return json.loads(line[len(MARK):])
    if proc.returncode == 0:
        raise AssertionError(f"probe printed nothing: {argv}\n{proc.stdout}\n{proc.stderr}")
    return None


def model(exe: str, args: list[str], env: dict[str, str], cwd: str,
          ) -> tuple[interp.Interpreter, interp.PyCommand, sitepath.SysPath]:
    profile = node.detect()
    info = elf.read_elf(os.path.realpath(exe))
    found = interp.identify(exe, info, profile, _budget.Budget(deadline_ms=10_000))
    assert found is not None, exe
    flags, command = interp.parse_python_argv(args, found.version)
    sp = sitepath.sys_path(found, flags, command, env, cwd, profile,
                           _budget.Budget(deadline_ms=10_000))
    return found, command, sp


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


def build_world(label: str, base_exe: str, root: Path) -> World:
    root.mkdir(parents=True, exist_ok=True)
    out = subprocess.run([base_exe, "-S", "-c", "import sys; print(sys.version_info[0],"
                          " sys.version_info[1], sys.prefix)"],
                         capture_output=True, text=True, check=True)
    major, minor, prefix = out.stdout.split(maxsplit=2)
    prefix = prefix.strip()
    w = World(label, base_exe, (int(major), int(minor)), root)
    stdlib = f"{prefix}/lib/python{w.xy}"
    for name, opts in (("venv-sym", ["--symlinks"]), ("venv-copy", ["--copies"]),
                       ("venv-sys", ["--symlinks", "--system-site-packages"])):
        if not (root / name).exists():
            subprocess.run([base_exe, "-m", "venv", "--without-pip", *opts, str(root / name)],
                           check=True, capture_output=True, timeout=120)
        _pth_tree(Path(w.site_packages(str(root / name))), root, stdlib, name)
    # pyvenv.cfg next to the executable instead of one up (getpath looks one
    # up first, site next to it first), and one with odd spelling
    cfgbin = root / "venv-cfgbin"
    if not cfgbin.exists():
        subprocess.run([base_exe, "-m", "venv", "--without-pip", "--copies", str(cfgbin)],
                       check=True, capture_output=True, timeout=120)
        (cfgbin / "pyvenv.cfg").rename(cfgbin / "bin" / "pyvenv.cfg")
    odd = root / "venv-odd"
    if not odd.exists():
        subprocess.run([base_exe, "-m", "venv", "--without-pip", "--symlinks", str(odd)],
                       check=True, capture_output=True, timeout=120)
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
