"""Login-node answers for Python environments of another architecture (issue 16).

A user on this x86_64 host asks about an aarch64 64 KiB node. A venv made
with the distribution's python (``/usr/bin/python3.11 -m venv``: its
``bin/python`` links to ``/usr/bin/python3.11``), a user site, a
``PYTHONPATH`` directory, a console script or a ``.pth`` directory is run on
the node by the node's *own* python at that path, which imports the files on
shared storage. Every environment here is real: venvs made by
``/usr/bin/python3.11 -m venv``, pinned PyPI wheels for both machines
(:mod:`python.wheels`).

The node's side is real too: Debian 12's arm64 CPython 3.11.2 (the same
build as this host's, for the node's machine) runs the same command under
``qemu-aarch64 -p 65536``, started as the venv's ``bin/python`` (``-0``)
as the kernel would start it there, with the node's ``/usr`` from its
unpacked packages (``-L``) and the rest of the filesystem shared, as /home
is. A predicted reject must be a command that fails there with the
predicted error; allow and warn must be commands that run, and a warned
package must really fail when imported. The other way round, for an
x86_64 node judged as if from an aarch64 host (``root_is_native`` False),
this host's own python is the node's interpreter and runs the command, and
the check with this host detected as the node (what the plugin does on it)
gives the predicted verdict.
The plugin itself on a real 64 KiB node, with Slurm, gives the same
verdicts on the same kinds of environment in ``tests/test_grace_node.py``.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from corpus import _give_up, debian_arm64_python_or_skip
from fixtures.build import ElfBuilder
from roomy import ROOMY

from grace_policy.cli.main import main
from grace_policy.decide import StepRequest, decide
from grace_policy.elf import read_elf
from grace_policy.findings import Verdict
from grace_policy.node import NodeProfile, detect, host_machine
from python import envs, torch_layouts
from python.wheels import copy_site

pytestmark = [pytest.mark.network, pytest.mark.qemu, pytest.mark.cross,
              pytest.mark.skipif(host_machine() != "x86_64",
                                 reason="this host's python plays the x86_64 node and the "
                                        "x86_64 login node")]

SYSTEM_PYTHON = "/usr/bin/python3.11"
#: The Grace node, asked about from this x86_64 host.
GRACE = NodeProfile(machine="aarch64", page_size=65536, glibc=(2, 36), root="/",
                    root_is_native=False)
#: An x86_64 node asked about from an aarch64 host: the same model with the
#: roles swapped (this host's files stand for the aarch64 login node's).
X86 = NodeProfile(machine="x86_64", page_size=4096, glibc=(2, 36), root="/",
                  root_is_native=False)


def _system_python_or_skip() -> None:
    try:
        out = subprocess.run([SYSTEM_PYTHON, "-c", "import sys; print(sys.version_info[:2])"],
                             capture_output=True, text=True, timeout=60).stdout
    except OSError:
        out = ""
    if out.strip() != "(3, 11)":
        _give_up(f"{SYSTEM_PYTHON} (Debian 12's CPython 3.11) is not on this host")


def system_venv(path: Path, *opts: str) -> Path:
    """A venv made by the distribution's python, as a user makes one."""
    subprocess.run([SYSTEM_PYTHON, "-m", "venv", "--without-pip", *opts, str(path)],
                   check=True, capture_output=True, timeout=120)
    return path / "bin" / "python"


def site_of(prefix: Path) -> Path:
    return prefix / "lib" / "python3.11" / "site-packages"


@dataclass
class World:
    root: Path
    node_root: Path     # Debian arm64 /usr with CPython 3.11 (the node's own python)
    qemu: str

    def p(self, *parts: str) -> str:
        return str(self.root.joinpath(*parts))

    def env(self, **extra: str) -> dict[str, str]:
        return {"PATH": "/usr/bin:/bin", "HOME": self.p("home"), "LANG": "C.UTF-8", **extra}


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    _system_python_or_skip()
    qemu = shutil.which("qemu-aarch64")
    if qemu is None:
        _give_up("qemu-aarch64 not installed (apt-get install qemu-user)")
    node_root = debian_arm64_python_or_skip()
    root = tmp_path_factory.mktemp("login")
    w = World(root, node_root, qemu)
    # A venv of the system python holding an x86_64 wheel (pip on the login
    # node) and an aarch64 one; a console script pip would write for it.
    venv = system_venv(root / "venv-x86")
    copy_site("bcrypt-4.1.2-abi3-x86_64", site_of(root / "venv-x86"))
    copy_site("markupsafe-2.1.5-aarch64", site_of(root / "venv-x86"))
    tool = root / "venv-x86" / "bin" / "hash-tool"
    tool.write_text(f"#!{venv}\nimport sys\nfrom bcrypt import gensalt\n"
                    "print('tool ran')\n")
    tool.chmod(0o755)
    # A clean environment for the node: aarch64 wheels only.
    system_venv(root / "venv-arm")
    copy_site("bcrypt-4.1.2-abi3-aarch64", site_of(root / "venv-arm"))
    copy_site("markupsafe-2.1.5-aarch64", site_of(root / "venv-arm"))
    # markupsafe's x86_64 speedups: a submodule with a pure-Python fallback.
    system_venv(root / "venv-mu-x86")
    copy_site("markupsafe-2.1.5-x86_64", site_of(root / "venv-mu-x86"))
    # A .pth file pointing at a directory on shared storage.
    system_venv(root / "venv-pth")
    copy_site("bcrypt-4.1.2-abi3-x86_64", root / "pth-target")
    (site_of(root / "venv-pth") / "shared.pth").write_text(f"{root / 'pth-target'}\n")
    # A venv made with --copies: the user's own copy of the x86_64 binary.
    system_venv(root / "venv-copies", "--copies")
    # pip install --user: PYTHONUSERBASE and ~/.local; PYTHONPATH directories.
    copy_site("bcrypt-4.1.2-abi3-x86_64", site_of(root / "userbase-x86"))
    copy_site("bcrypt-4.1.2-abi3-aarch64", site_of(root / "userbase-arm"))
    copy_site("bcrypt-4.1.2-abi3-x86_64", site_of(root / "home" / ".local"))
    copy_site("bcrypt-4.1.2-abi3-x86_64", root / "pp-x86")
    copy_site("bcrypt-4.1.2-abi3-aarch64", root / "pp-arm")
    (root / "work").mkdir()
    return w


def predict(node: NodeProfile, argv: list[str], env: dict[str, str], cwd: str) -> Verdict:
    return decide(ROOMY, StepRequest(partition=None, argv=argv, env=env, cwd=cwd, node=node))


def interpreter_argv(argv: list[str]) -> list[str]:
    """What the kernel executes for ``argv``: a script's ``#!`` interpreter
    with the script as its first argument."""
    with open(argv[0], "rb") as f:
        head = f.readline()
    if head.startswith(b"#!"):
        return [head[2:].decode().strip(), *argv]
    return argv


def run_on_grace(w: World, argv: list[str], env: dict[str, str],
                 cwd: str) -> subprocess.CompletedProcess[str]:
    """``argv`` as the aarch64 64 KiB node runs it: its own CPython under
    the program's name (the venv's bin/python stays the executable getpath
    starts from), the node's /usr, shared storage elsewhere."""
    args = interpreter_argv(argv)
    python = str(w.node_root / "usr" / "bin" / "python3.11")
    return subprocess.run([w.qemu, "-p", "65536", "-L", str(w.node_root), "-0", args[0],
                           python, *args[1:]], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=300)


def run_on_x86(argv: list[str], env: dict[str, str],
               cwd: str) -> subprocess.CompletedProcess[str]:
    """``argv`` as an x86_64 node runs it: this host is one."""
    return subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=120)


@dataclass(frozen=True)
class Case:
    argv: tuple[str, ...]
    action: str
    rules: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    #: a package the node cannot import although the step runs (warn)
    broken: str = ""


def _argv(w: World, words: tuple[str, ...]) -> list[str]:
    return [w.p(a[1:]) if a.startswith("@") else a for a in words]


def _env(w: World, extra: dict[str, str]) -> dict[str, str]:
    return w.env(**{k: w.p(v[1:]) if v.startswith("@") else v for k, v in extra.items()})


#: From this x86_64 host for the aarch64 64 KiB node. "@x" is a path in the world.
GRACE_CASES = {
    # the Done-when cases
    "venv-x86-ext-imported": Case(("@venv-x86/bin/python", "-c", "import bcrypt"), "reject",
                                  ("py-ext-arch",)),
    "venv-unused-broken": Case(("@venv-x86/bin/python", "-c", "import markupsafe._speedups"),
                               "warn", ("py-dist-broken",), broken="bcrypt"),
    "user-site-x86": Case((SYSTEM_PYTHON, "-c", "import bcrypt"), "reject", ("py-ext-arch",),
                          {"PYTHONUSERBASE": "@userbase-x86"}),
    "clean-arm-venv": Case(("@venv-arm/bin/python", "-c",
                            "import bcrypt, markupsafe._speedups; print(bcrypt.gensalt()[:4])"),
                           "allow", ()),
    # every other kind of environment the distribution's python starts
    "home-local-x86": Case(("/usr/bin/python3", "-c", "import bcrypt"), "reject",
                           ("py-ext-arch",)),
    "pythonpath-x86": Case((SYSTEM_PYTHON, "-s", "-c", "import bcrypt"), "reject",
                           ("py-ext-arch",), {"PYTHONPATH": "@pp-x86"}),
    "pythonpath-arm": Case((SYSTEM_PYTHON, "-s", "-c", "import bcrypt"), "allow", (),
                           {"PYTHONPATH": "@pp-arm"}),
    "user-site-arm": Case((SYSTEM_PYTHON, "-c", "import bcrypt"), "allow", (),
                          {"PYTHONUSERBASE": "@userbase-arm"}),
    "console-script": Case(("@venv-x86/bin/hash-tool",), "reject", ("py-ext-arch",)),
    "pth-dir-x86": Case(("@venv-pth/bin/python", "-c", "import bcrypt"), "reject",
                        ("py-ext-arch",)),
    "foreign-submodule": Case(("@venv-mu-x86/bin/python", "-c", "import markupsafe"),
                              "warn", ("py-ext-foreign",)),
    # the distribution's standard library is the node's: its extension
    # modules (lib-dynload) are not judged from here
    "stdlib-only": Case(("@venv-arm/bin/python", "-c", "import _decimal, _json, json, ctypes"),
                        "allow", ()),
}


def _answer_is_what_the_node_does(world: World, case: Case, node: NodeProfile,
                                  run: Callable[..., subprocess.CompletedProcess[str]],
                                  broken_error: str, also_here: bool = False) -> None:
    """The prediction for ``node`` is ``case``'s, and ``run`` (the node's
    own interpreter) does what it predicts: a refused step fails with the
    predicted error word for word, a warned one's broken module fails to
    import (``broken_error`` in its stderr). ``also_here``: this host is
    such a node, so the plugin's own verdict here must agree too."""
    argv, env, cwd = _argv(world, case.argv), _env(world, case.env), world.p("work")
    verdict = predict(node, argv, env, cwd)
    got = (verdict.action, tuple(dict.fromkeys(f.rule for f in verdict.findings)))
    assert got == (case.action, case.rules), verdict.findings
    if also_here:
        here = predict(detect(), argv, env, cwd)
        assert (here.action, tuple(dict.fromkeys(f.rule for f in here.findings))) == got
    real = run(argv, env, cwd)
    if case.action == "reject":
        assert real.returncode != 0, real.stdout
        errors = [f.predicted_error for f in verdict.findings if f.severity == "error"]
        assert any(e in real.stderr for e in errors), (errors, real.stderr)
    else:
        assert real.returncode == 0, real.stderr
    if case.broken:
        again = run([argv[0], "-c", f"import {case.broken}"], env, cwd)
        assert again.returncode != 0 and broken_error in again.stderr, again.stderr


@pytest.mark.parametrize("name", GRACE_CASES)
def test_grace_answer_is_what_the_node_does(world: World, name: str) -> None:
    _answer_is_what_the_node_does(world, GRACE_CASES[name], GRACE,
                                  functools.partial(run_on_grace, world), "ImportError")


def test_a_foreign_submodule_falls_back_on_the_node(world: World) -> None:
    """Why it is a warning: markupsafe imports its pure-Python escape when
    the speedups are not there, and the node's python does exactly that."""
    argv = [world.p("venv-mu-x86/bin/python"), "-c",
            "import markupsafe, sys; print('speedups' if 'markupsafe._speedups' in "
            "sys.modules else 'native')"]
    real = run_on_grace(world, argv, world.env(), world.p("work"))
    assert real.returncode == 0 and real.stdout.strip() == "native", real.stderr


def test_a_users_own_interpreter_is_judged_as_the_file_it_is(world: World) -> None:
    # A --copies venv holds a copy of this host's x86_64 binary: the node
    # executes that very file.
    copy = world.p("venv-copies/bin/python")
    assert read_elf(os.path.realpath(copy)).machine_name == "x86_64"
    verdict = predict(GRACE, [copy, "-c", "import json"], world.env(), world.p("work"))
    assert verdict.action == "reject"
    assert [f.rule for f in verdict.findings] == ["exe-arch-mismatch"]
    # Debian's aarch64 CPython unpacked in a user directory (a tarball build,
    # in effect): it runs there, and its user site is judged with every rule.
    own = str(world.node_root / "usr" / "bin" / "python3.11")
    env = world.env(PYTHONUSERBASE=world.p("userbase-x86"))
    verdict = predict(GRACE, [own, "-c", "import bcrypt"], env, world.p("work"))
    assert verdict.action == "reject"
    assert [f.rule for f in verdict.findings] == ["py-ext-arch"]
    real = subprocess.run([world.qemu, "-p", "65536", "-L", str(world.node_root), own, "-c",
                           "import bcrypt"], env=env, cwd=world.p("work"),
                          capture_output=True, text=True, timeout=300)
    assert real.returncode != 0 and verdict.findings[0].predicted_error in real.stderr
    env = world.env(PYTHONUSERBASE=world.p("userbase-arm"))
    assert predict(GRACE, [own, "-c", "import bcrypt"], env, world.p("work")).action == "allow"
    # For an x86_64 node the same file cannot start.
    verdict = predict(X86, [own, "-c", "import bcrypt"], env, world.p("work"))
    assert [f.rule for f in verdict.findings] == ["exe-arch-mismatch"]


#: The other way: an x86_64 node judged from an aarch64 host. This host's
#: python plays the x86_64 node's own, and runs each command for real.
X86_CASES = {
    "venv-arm-ext-imported": Case(("@venv-arm/bin/python", "-c", "import bcrypt"), "reject",
                                  ("py-ext-arch", "py-dist-broken")),
    "venv-x86-imported": Case(("@venv-x86/bin/python", "-c", "import bcrypt"), "warn",
                              ("py-dist-broken",), broken="markupsafe._speedups"),
    "user-site-arm": Case((SYSTEM_PYTHON, "-c", "import bcrypt"), "reject", ("py-ext-arch",),
                          {"PYTHONUSERBASE": "@userbase-arm"}),
    "user-site-x86": Case((SYSTEM_PYTHON, "-c", "import bcrypt"), "allow", (),
                          {"PYTHONUSERBASE": "@userbase-x86"}),
    "pythonpath-arm": Case((SYSTEM_PYTHON, "-s", "-c", "import bcrypt"), "reject",
                           ("py-ext-arch",), {"PYTHONPATH": "@pp-arm"}),
    "console-script": Case(("@venv-x86/bin/hash-tool",), "warn", ("py-dist-broken",)),
}


@pytest.mark.parametrize("name", X86_CASES)
def test_x86_answer_is_what_the_node_does(world: World, name: str) -> None:
    # This host's python plays the x86_64 node's own.
    _answer_is_what_the_node_does(world, X86_CASES[name], X86, run_on_x86, "Error",
                                  also_here=True)


def test_a_shell_step_in_an_active_system_venv(world: World) -> None:
    """``bash job.sh`` with the venv active: the node's python of that venv
    will most likely run; what would fail in it is a warning."""
    env = world.env(VIRTUAL_ENV=world.p("venv-x86"),
                    PATH=f"{world.p('venv-x86/bin')}:/usr/bin:/bin")
    verdict = predict(GRACE, ["/bin/bash", "-c", "python -c 'import bcrypt'"], env,
                      world.p("work"))
    assert verdict.action == "warn"
    assert {f.rule for f in verdict.findings} == {"py-dist-broken"}
    assert any("bcrypt" in f.path for f in verdict.findings)


NODE_ARGS = ["--arch", "aarch64", "--page-size", "65536", "--glibc", "2.36"]


def test_env_says_which_interpreter_it_assumed(world: World, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    env_file = tmp_path / "env"
    env_file.write_text(f"HOME={world.p('home')}\nPATH=/usr/bin:/bin\n")
    code = main(["env", *NODE_ARGS, "--env-file", str(env_file), "--import", "bcrypt",
                 world.p("venv-x86")])
    out = capsys.readouterr().out
    assert code == 1, out
    assert ("grace-policy: interpreter assumed there: the node's own aarch64 CPython 3.11 "
            f"at {SYSTEM_PYTHON} ({world.p('venv-x86/bin/python3')} links there; a "
            "distribution path") in out
    assert "grace-policy: bcrypt 4.1.2: would fail to import" in out
    assert "the interpreter cannot run there" not in out
    code = main(["env", *NODE_ARGS, "--env-file", str(env_file), "--json", world.p("venv-arm")])
    data = json.loads(capsys.readouterr().out)
    assert code == 0, data
    assumed = data["assumed_interpreter"]
    assert (assumed["kind"], assumed["real"], assumed["machine"], assumed["version"]) == (
        "node-build", SYSTEM_PYTHON, "aarch64", "3.11")
    # A user's own interpreter: the file itself, and why it cannot run.
    code = main(["env", *NODE_ARGS, "--env-file", str(env_file), world.p("venv-copies")])
    out = capsys.readouterr().out
    assert code == 2, out
    assert "itself, CPython 3.11" in out and "built for x86_64 (a user's own interpreter" in out
    assert "exe-arch-mismatch" in out
    # The same venv for an x86_64 node asked from here: judged as it is.
    code = main(["env", "--arch", "x86_64", "--page-size", "4096", "--env-file",
                 str(env_file), world.p("venv-x86")])
    out = capsys.readouterr().out
    assert f"interpreter assumed there: {SYSTEM_PYTHON} itself" in out
    assert code == 1 and "markupsafe 2.1.5: would fail to import" in out, out


def test_check_names_the_assumed_interpreter(world: World,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["check", *NODE_ARGS, "--cwd", world.p("work"), "--",
                 world.p("venv-x86/bin/python"), "-c", "import bcrypt"])
    out = capsys.readouterr().out
    assert code == 2, out
    assert "ERROR py-ext-arch" in out
    assert ("grace-policy: note: judged as the node's own aarch64 CPython 3.11 at "
            f"{SYSTEM_PYTHON}") in out


def test_an_aarch64_interpreter_built_here_agrees(world: World, elf_builder: ElfBuilder
                                                  ) -> None:
    """The same site-packages behind an aarch64 interpreter file (the path
    the check took before for a user's own interpreter) gives the same
    verdicts as behind the distribution's python."""
    base = envs.base_python(elf_builder, "base", "3.11")
    for site_key, imports, action in (("bcrypt-4.1.2-abi3-x86_64", "import bcrypt", "reject"),
                                      ("bcrypt-4.1.2-abi3-aarch64", "import bcrypt", "allow"),
                                      ("bcrypt-4.1.2-abi3-x86_64", "import json", "warn")):
        own = envs.make_venv(base, elf_builder.path(f"own-{site_key}-{action}"))
        copy_site(site_key, envs.site_packages(own.parent.parent))
        system = system_venv(world.root / f"sys-{site_key}-{action}")
        copy_site(site_key, site_of(system.parent.parent))
        got = [predict(GRACE, [str(py), "-c", imports], world.env(), world.p("work"))
               for py in (own, system)]
        assert [v.action for v in got] == [action, action], got
        own_rules, system_rules = ([f.rule for f in v.findings] for v in got)
        assert own_rules == system_rules, got


def _torch_cpu(site: Path) -> None:
    shutil.copytree(torch_layouts.cpu_files(), site, dirs_exist_ok=True)


def _torchcodec(site: Path) -> None:
    shutil.copytree(torch_layouts.torchcodec_site(), site, dirs_exist_ok=True)


#: The rules of particular packages, for a system-python venv seen from
#: here: (fill the site, the command's imports, extra env, the rule and the
#: action expected).
SPECIAL = {
    "torch-cpu-on-a-gpu-step": (_torch_cpu, "import torch", {"SLURM_GPUS_ON_NODE": "4"},
                                "torch-cpu-only", "warn"),
    "torchcodec-without-ffmpeg": (_torchcodec, "import torchcodec", {}, "torchcodec-no-ffmpeg",
                                  "reject"),
    "x86-jit-cache": (_torch_cpu, "import torch", {"TORCH_EXTENSIONS_DIR": "@jit"},
                      "jit-cache-foreign", "warn"),
}


@pytest.mark.parametrize("name", SPECIAL)
def test_package_rules_in_a_system_venv(world: World, elf_builder: ElfBuilder,
                                        name: str) -> None:
    """torch CPU-only on a GPU step, torchcodec with no FFmpeg for it, an
    x86_64 JIT cache: seen from here in a venv of the distribution's python
    as in the same files behind an aarch64 interpreter file."""
    fill, imports, extra, rule, action = SPECIAL[name]
    jit = elf_builder.path(f"jit-{name}")
    torch_ext = jit / "py311_cpu" / "fused_adam" / "fused_adam.so"
    torch_ext.parent.mkdir(parents=True)
    torch_ext.write_bytes(elf_builder.library("build/libfused.so", arch="x86_64").read_bytes())
    env = world.env(**{k: str(jit) if v == "@jit" else v for k, v in extra.items()})
    system = system_venv(world.root / f"special-{name}")
    fill(site_of(system.parent.parent))
    base = envs.base_python(elf_builder, "base", "3.11")
    own = envs.make_venv(base, elf_builder.path(f"own-{name}"))
    fill(envs.site_packages(own.parent.parent))
    got = [predict(GRACE, [str(py), "-c", imports], env, world.p("work")) for py in (system, own)]
    rules = [sorted({f.rule for f in v.findings}) for v in got]
    assert rules[0] == rules[1] and rule in rules[0], [v.findings for v in got]
    assert got[0].action == got[1].action == action
