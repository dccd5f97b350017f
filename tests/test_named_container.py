"""A pyxis step that reuses a named enroot container (``--container-name``),
judged as the container is now (grace_policy/container/named.py).

The oracle for where the container is: the real enroot 4.1.2 (built from
the pinned tarball, tests/slurm/containers.py), whose ``enroot create
--name pyxis_NAME IMG.sqsh`` makes the root, with the job's HOME /
XDG_DATA_HOME / enroot.conf, exactly where pyxis' ``enroot list -f`` looks.
Roots are real: glibc and programs compiled for x86_64 and aarch64
(tests/image/roots.py). What the C side hands over is what
spank/grace_container.c writes: ``name=NAME[:FLAG]`` and ``job=ID`` lines
in ``container_args``, and ``local`` 0 for every named step.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "slurm"))

from image.roots import make_root

from grace_policy.check import check_step
from grace_policy.container import ContainerStep
from grace_policy.container.named import split
from grace_policy.container.plan import plan
from grace_policy.node import NodeProfile

HOST = NodeProfile("x86_64", 4096, (2, 36))
#: The slurm.conf of the test in progress (the enroot_env fixture's).
_CONF: dict[str, Path] = {}
REASON = "pyxis container step (container name demo)"

pytestmark = [pytest.mark.cross,
              pytest.mark.skipif(shutil.which("mksquashfs") is None,
                                 reason="mksquashfs not installed (squashfs-tools)")]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A site's enroot 4.1.2 (its enroot.conf in ``site/etc/enroot``)."""
    import containers

    return containers.site_enroot_or_skip(tmp_path_factory.mktemp("site"))


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory, compile_cache: object) -> dict[str, Path]:
    from image.roots import mksquashfs

    work = tmp_path_factory.mktemp("images")
    out: dict[str, Path] = {}
    for arch in ("x86_64", "aarch64"):
        root = make_root(work / f"root-{arch}", arch, cache=compile_cache)
        out[arch] = mksquashfs(root, work / f"{arch}.sqsh", "lzo")
        out[f"{arch}-tool"] = root / "opt/app/tool"
    return out


@pytest.fixture
def enroot_env(site: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The job's environment (HOME of its own), with the site's enroot
    first on slurmstepd's PATH (this process's: where pyxis finds enroot)."""
    monkeypatch.setenv("PATH", f"{site / 'bin'}:{os.environ['PATH']}")
    # slurmstepd's slurm.conf (what C hands over): pyxis without a scope,
    # so this machine's own /etc/slurm never decides.
    _slurm_conf(tmp_path, "")
    monkeypatch.setitem(_CONF, "path", tmp_path / "slurm.conf")
    home = tmp_path / "home"
    home.mkdir()
    return {"HOME": str(home), "PATH": "/host/bin", "PWD": str(tmp_path)}


def _slurm_conf(where: Path, pyxis_args: str) -> None:
    (where / "plugstack.conf").write_text(
        f"required /usr/lib/slurm/spank_pyxis.so runtime_path=/run/pyxis {pyxis_args}\n"
        "required /usr/lib/slurm/spank_grace_policy.so\n")
    (where / "slurm.conf").write_text(f"ClusterName=t\nPlugStackConfig={where}/plugstack.conf\n")


def _create(env: dict[str, str], name: str, image: Path) -> Path:
    """``enroot create --name NAME IMG`` as pyxis' task_init runs it, and the
    root it made: the one new directory of that name under the test's
    tree (enroot prints no data path; nothing here guesses it)."""
    run = {**env, "PATH": os.environ["PATH"]}
    base = Path(env["PWD"])
    before = set(base.rglob(name))
    subprocess.run(["enroot", "create", "--name", name, str(image)], env=run, check=True,
                   capture_output=True, timeout=120)
    listed = subprocess.run(["enroot", "list"], env=run, capture_output=True, text=True,
                            check=True, timeout=60).stdout.split()
    found = [p for p in set(base.rglob(name)) - before if p.is_dir() and not p.is_symlink()]
    assert name in listed and len(found) == 1, (listed, found)
    return found[0]


def _args(name: str, job: int = 7, conf: Path | None = None, **more: str) -> str:
    """container_args as grace_container.c writes them for a named step."""
    named = {"name": name, "job": str(job), "slurm_conf": str(conf or _CONF["path"])}
    return "".join(f"{k}={v}\n" for k, v in {**more, **named}.items())


def _judge(todo, node: NodeProfile = HOST):  # type: ignore[no-untyped-def]
    assert todo.skipped is None and todo.image is not None, todo.skipped
    return check_step(list(todo.argv), todo.env, todo.cwd, node, image=todo.image)


def test_changed_by_hand_is_judged_as_it_is_now(enroot_env: dict[str, str],
                                                images: dict[str, Path]) -> None:
    """A clean x86_64 container runs in silence; after an aarch64 program is
    copied into its root, the same step is refused at that path (the image
    it was made from is still clean). The old code skipped both."""
    root = _create(enroot_env, "pyxis_demo", images["x86_64"])
    todo = plan(ContainerStep("pyxis", None, False, REASON, ["tool"], enroot_env, "/",
                              args=_args("demo")))
    assert todo.image is not None and todo.image.kind == "dir"
    assert todo.image.path == os.path.realpath(root)
    # The container's /etc/environment over the job's (PATH withheld by pyxis).
    assert todo.env["PATH"] == "/opt/app:/usr/local/bin:/usr/bin:/bin"
    assert todo.env["IMAGE_VAR"] == "from-image"
    assert list(_judge(todo).issues) == []
    shutil.copy2(images["aarch64-tool"], root / "opt/app/tool")
    report = _judge(plan(ContainerStep("pyxis", None, False, REASON, ["tool"], enroot_env, "/",
                                       args=_args("demo"))))
    assert [(i.rule, i.path) for i in report.issues] == [
        ("exe-arch-mismatch", f"{os.path.realpath(root)}:/opt/app/tool")]


def test_flags_as_pyxis_reads_them(enroot_env: dict[str, str], images: dict[str, Path]) -> None:
    """pyxis args.c/user_init: ``:create`` on an existing container,
    ``:exec`` or no image without one, a bad flag: pyxis' own errors, so
    skips; ``:no_exec`` reuses the root; a name with a local image and no
    container yet: the image is judged (pyxis makes the container from it)."""
    _create(enroot_env, "pyxis_demo", images["x86_64"])

    def go(name: str, image: str | None = None):  # type: ignore[no-untyped-def]
        return plan(ContainerStep("pyxis", image, False, REASON, ["tool"], enroot_env, "/",
                                  args=_args(name)))

    assert go("demo:no_exec").image is not None
    assert go("demo:auto").image is not None
    assert go("demo:exec").image is not None  # running or not: pyxis decides
    assert ":create (pyxis' error)" in str(go("demo:create").skipped)
    assert ":exec (pyxis' error)" in str(go("other:exec").skipped)
    assert "no image is given" in str(go("other").skipped)
    assert "unknown flag" in str(go("demo:bogus").skipped)
    assert "cannot use this container name" in str(go("a/b").skipped)
    fresh = go("other", str(images["aarch64"]))
    assert fresh.image is not None and fresh.image.kind == "squashfs"
    assert fresh.image.path == str(images["aarch64"])
    # A registry image for a new container: the image path's business.
    pulled = go("other", "ubuntu:24.04")
    assert pulled.image is None and pulled.skipped is None and pulled.registry is not None
    assert split("x:y:z") is None and split("x") == ("x", "auto")


def test_data_path_follows_xdg_and_enroot_conf(enroot_env: dict[str, str], site: Path,
                                               images: dict[str, Path], tmp_path: Path) -> None:
    """enroot's own rules: XDG_DATA_HOME of the job's environment, or
    ENROOT_DATA_PATH from enroot.conf; the job's ENROOT_DATA_PATH never
    (pyxis withholds it)."""
    env = {**enroot_env, "XDG_DATA_HOME": str(tmp_path / "xdg")}
    root = _create(env, "pyxis_demo", images["x86_64"])
    assert str(root).startswith(str(tmp_path / "xdg"))
    todo = plan(ContainerStep("pyxis", None, False, REASON, ["tool"],
                              {**env, "ENROOT_DATA_PATH": str(tmp_path / "nowhere")}, "/",
                              args=_args("demo")))
    assert todo.image is not None and todo.image.path == os.path.realpath(root)
    conf = site / "etc/enroot/enroot.conf"
    saved = conf.read_text()
    try:
        conf.write_text(saved + f"ENROOT_DATA_PATH {tmp_path}/site-data/$USERX\n")
        env2 = {**enroot_env, "USERX": "u1"}
        root2 = _create(env2, "pyxis_demo", images["aarch64"])
        assert str(root2) == f"{tmp_path}/site-data/u1/pyxis_demo"
        todo = plan(ContainerStep("pyxis", None, False, REASON, ["tool"], env2, "/",
                                  args=_args("demo")))
        assert todo.image is not None and todo.image.path == str(root2)
        assert [i.rule for i in _judge(todo).issues] == ["image-arch-mismatch"]
    finally:
        conf.write_text(saved)


def test_job_scoped_names(enroot_env: dict[str, str], images: dict[str, Path],
                          tmp_path: Path) -> None:
    """``container_scope=job`` on pyxis' plugstack line: the container of
    ``--container-name=demo`` in job 42 is ``pyxis_42_demo``; the global
    ``pyxis_demo`` is not it."""
    _create(enroot_env, "pyxis_demo", images["x86_64"])
    conf = tmp_path / "slurm.conf"
    _slurm_conf(tmp_path, "container_scope=job")
    todo = plan(ContainerStep("pyxis", None, False, REASON, ["tool"], enroot_env, "/",
                              args=_args("demo", job=42, conf=conf)))
    assert "pyxis_42_demo does not exist" in str(todo.skipped)
    root = _create(enroot_env, "pyxis_42_demo", images["aarch64"])
    todo = plan(ContainerStep("pyxis", None, False, REASON, ["tool"], enroot_env, "/",
                              args=_args("demo", job=42, conf=conf)))
    assert todo.image is not None and todo.image.path == os.path.realpath(root)
    # The job's SLURM_CONF is not slurmstepd's: it changes nothing.
    other = tmp_path / "other"
    other.mkdir()
    _slurm_conf(other, "")
    todo = plan(ContainerStep("pyxis", None, False, REASON, ["tool"],
                              {**enroot_env, "SLURM_CONF": str(conf)}, "/",
                              args=_args("demo", job=42, conf=other / "slurm.conf")))
    assert todo.image is not None and todo.image.path.endswith("/pyxis_demo")
    _slurm_conf(tmp_path, "container_scope=global")
    todo = plan(ContainerStep("pyxis", None, False, REASON, ["tool"], enroot_env, "/",
                              args=_args("demo", job=42, conf=conf)))
    assert todo.image is not None and todo.image.path.endswith("/pyxis_demo")


def test_hostile_root(enroot_env: dict[str, str], images: dict[str, Path],
                      tmp_path: Path) -> None:
    """The user owns the root: a FIFO as /etc/environment does not block, a
    config.json does not make it a bundle, a link out of the root resolves
    inside it, the container's mounts and
    --container-workdir apply as for an image; a file in place of the root
    is no container."""
    root = _create(enroot_env, "pyxis_demo", images["x86_64"])
    (root / "etc/environment").unlink()
    os.mkfifo(root / "etc/environment")
    # Not an OCI bundle for that (its root.path would be the user's choice).
    (root / "config.json").write_text('{"root": {"path": "/"}, "process": {"args": ["x"]}}')
    (root / "opt/app/tool").unlink()
    (root / "opt/app/tool").symlink_to("/usr/bin/true")  # the host's: never read
    outside = tmp_path / "outside"
    outside.mkdir()
    shutil.copy2(images["aarch64-tool"], outside / "tool")
    todo = plan(ContainerStep("pyxis", None, False, REASON, ["/opt/app/tool"], enroot_env, "/",
                              args=_args("demo", mounts=f"{outside}:/mnt/x", workdir="/mnt/x")))
    assert todo.cwd == "/mnt/x" and todo.image is not None and todo.image.kind == "dir"
    assert "PATH" not in todo.env  # no environment file read, the job's PATH withheld
    assert [i.rule for i in _judge(todo).issues] == ["exe-not-found"]
    mounted = _judge(plan(ContainerStep("pyxis", None, False, REASON, ["/mnt/x/tool"], enroot_env,
                                        "/", args=_args("demo", mounts=f"{outside}:/mnt/x"))))
    assert [i.rule for i in mounted.issues] == ["exe-arch-mismatch"]
    shutil.rmtree(root)
    root.write_text("not a directory\n")
    assert "does not exist" in str(plan(ContainerStep("pyxis", None, False, REASON, ["tool"],
                                                      enroot_env, "/", args=_args("demo"))).skipped)
