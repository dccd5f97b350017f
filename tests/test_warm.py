"""grace_policy.warm: after preload() a check imports nothing more.

A pre-started checker imports :data:`grace_policy.warm.STEP` before the
first step and forks a child per step; whatever a check still imports is
paid on the launch path by every child. Each case runs the real bridge
(``slurm_bridge.run_step``, with a compiled config and the verdict-cache
entry, as slurmstepd does) in a fresh ``-I -S`` interpreter, once in the
parent after preload(), in a forked child of a parent that preloaded but
never checked, and in such a child after ``warm.prefault()``, and compares
``sys.modules`` before and after.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from fixtures.build import ElfBuilder

REPO = Path(__file__).resolve().parent.parent
SYSTEM_PYTHON = "/usr/bin/python3"

_SCRIPT = r"""
import os, sys
sys.path.insert(0, sys.argv[1])
from grace_policy import slurm_bridge, warm
assert warm.preload(later=False) == []
config, mode, argv = sys.argv[2], sys.argv[3], tuple(sys.argv[4:])

def check():
    before = set(sys.modules)
    out = slurm_bridge.run_step(slurm_bridge.StepInput(
        config=config, on_error="deny", partition=None, cwd="/", user_mode=None,
        node="n1", argv=argv, env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent"},
        job_id=1, step_id=0, uid=os.geteuid(), batch=False, code="test|-"))
    assert out.action == "allow" and not out.user and not out.log, out
    assert out.cache, "a clean step hands C an entry (the entry's imports count too)"
    return " ".join(sorted(set(sys.modules) - before))

if mode == "first":
    print("new:", check())
else:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        if mode == "prefault":
            assert warm.prefault() > 1000
        os.write(w, check().encode())
        os._exit(0)
    os.close(w)
    got = b""
    while chunk := os.read(r, 4096):
        got += chunk
    assert os.waitpid(pid, 0)[1] == 0
    print("new:", got.decode())
"""


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from grace_policy.compiled import compile_config

    path = tmp_path_factory.mktemp("warm") / "grace-policy.toml"
    path.write_text('mode = "enforce"\ndeadline_ms = 60000\n')
    compile_config(str(path))
    return path


@pytest.fixture(scope="module")
def own_libraries(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An executable with libraries of its own, found through RUNPATH."""
    builder = ElfBuilder(tmp_path_factory.mktemp("warm-exe"))
    for i in range(3):
        builder.library(f"lib/libwarm{i}.so.1")
    return builder.compile("int main(void) { return 0; }\n", "app", runpath=["$ORIGIN/lib"],
                           needed_libs=[f":libwarm{i}.so.1" for i in range(3)],
                           lib_dirs=[builder.path("lib")])


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        pytest.skip(f"no {SYSTEM_PYTHON}")
    where = tmp_path_factory.mktemp("warm-venv") / "venv"
    subprocess.run([SYSTEM_PYTHON, "-m", "venv", "--without-pip", str(where)], check=True,
                   capture_output=True, timeout=120)
    return where


@pytest.mark.parametrize("mode", ["first", "fork", "prefault"])
@pytest.mark.parametrize("kind", ["program", "python", "venv", "own-libraries"])
def test_a_check_after_preload_imports_nothing(kind: str, mode: str, config: Path,
                                               request: pytest.FixtureRequest) -> None:
    if kind == "program":
        argv = ["/bin/true"]
    elif kind == "python":
        if not os.access(SYSTEM_PYTHON, os.X_OK):
            pytest.skip(f"no {SYSTEM_PYTHON}")
        argv = ["python3", "-c", "pass"]
    elif kind == "venv":
        argv = [str(request.getfixturevalue("venv") / "bin" / "python"), "-c", "pass"]
    else:
        argv = [str(request.getfixturevalue("own_libraries"))]
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", _SCRIPT, str(REPO), str(config),
         mode, *argv],
        capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "new:", done.stdout


def test_preload_imports_the_rarer_paths_too() -> None:
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from grace_policy import warm;"
            "print(warm.preload(later=True)); missing = [m for m in warm.STEP + warm.LATER"
            " if m not in sys.modules]; print(missing)")
    done = subprocess.run([sys.executable, "-I", "-S", "-c", code, str(REPO)],
                          capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.split("\n")[:2] == ["[]", "[]"], done.stdout


def test_importing_warm_alone_imports_no_check() -> None:
    # The C prestart imports slurm_bridge and walks PRELOAD itself; warm is
    # for a checker that preloads in one call. Importing it must not start
    # the work preload() is for.
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import grace_policy.warm;"
            "print(' '.join(m for m in sys.modules if m.startswith('grace_policy')))")
    done = subprocess.run([sys.executable, "-I", "-S", "-c", code, str(REPO)],
                          capture_output=True, text=True, timeout=120, check=True)
    assert set(done.stdout.split()) == {"grace_policy", "grace_policy.warm",
                                        "grace_policy.slurm_bridge", "grace_policy._record",
                                        "grace_policy.contract"}


def test_the_node_checker_holds_what_a_container_step_imports() -> None:
    """preload(containers=True), as the node checker calls it: every
    module of CONTAINERS, and then planning a pyxis registry step and the
    root pyxis made from it (after_pull) imports no module of ours that the
    child would pay for on each such step."""
    code = """
import sys
sys.path.insert(0, sys.argv[1])
from grace_policy import warm
print(warm.preload(containers=True))
print([m for m in warm.STEP + warm.CONTAINERS if m not in sys.modules])
before = set(sys.modules)
from grace_policy.budget import Budget
from grace_policy.container import ContainerStep
from grace_policy.container.plan import plan
env = {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent"}
for args in ("", "after_pull=1\\nstep=0\\njob=1\\nslurm_conf=\\n"):
    plan(ContainerStep("pyxis", "127.0.0.1:9#lab/img:x", False, "pyxis", ["tool"], env, "/",
                       args=args, batch=False), Budget())
print(sorted(m for m in set(sys.modules) - before if m.startswith("grace_policy")))
"""
    done = subprocess.run([sys.executable, "-I", "-S", "-c", code, str(REPO)],
                          capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.split("\n")[:3] == ["[]", "[]", "[]"], done.stdout
