"""The root pyxis has just made from a registry image, judged through the
entry the checker calls (grace_policy/container/plan.py ``plan``) with the
``after_pull`` lines spank/grace_container.c adds for the request its
task_init sends (issue 25 item 2; grace_policy/container/named.py
``plan_after_pull``).

The roots are made by the real enroot 4.1.2 (``enroot create --name``, as
pyxis' task_init runs it) from squashfs images of real compiled roots
(tests/image/roots.py), so where the root is comes from enroot, not from
this test. Before the change the same request was a registry plan (the
manifest only): no image, nothing of the files judged.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from test_named_container import (  # noqa: F401  (fixtures)
    _CONF,
    _create,
    _judge,
    _slurm_conf,
    enroot_env,
    images,
    site,
)

from grace_policy.container import ContainerStep, Plan
from grace_policy.container.plan import plan
from grace_policy.node import NodeProfile

REF = "127.0.0.1:5000#lab/img:liar"
REASON = f"pyxis container step (image {REF}), as pyxis unpacked it"

pytestmark = [pytest.mark.cross,
              pytest.mark.skipif(shutil.which("mksquashfs") is None,
                                 reason="mksquashfs not installed (squashfs-tools)")]


def _pyxis(argv: list[str], env: dict[str, str], args: str) -> Plan:
    """The plan of a pyxis step of the registry image ``REF``."""
    return plan(ContainerStep("pyxis", REF, False, REASON, argv, env, "/", args=args))


def _args(job: int = 12, step: int = 0, conf: Path | None = None, **more: str) -> str:
    """container_args as grace_container_after_pull writes them."""
    lines = {**more, "after_pull": "1", "job": str(job), "step": str(step),
             "slurm_conf": str(conf or _CONF["path"])}
    return "".join(f"{k}={v}\n" for k, v in lines.items())


def test_programs_of_another_architecture_are_found(enroot_env: dict[str, str],  # noqa: F811
                                                    images: dict[str, Path]) -> None:  # noqa: F811
    """An amd64 image by its index whose tool is aarch64: the root pyxis
    made for step 12.0 is judged, the program named in it."""
    root = _create(enroot_env, "pyxis_12.0", images["x86_64"])
    clean = _pyxis(["tool"], enroot_env, _args())
    assert clean.image is not None and clean.image.kind == "dir"
    assert clean.image.path == os.path.realpath(root) and clean.registry is None
    assert clean.env["PATH"] == "/opt/app:/usr/local/bin:/usr/bin:/bin"
    assert list(_judge(clean).issues) == []
    shutil.copy2(images["aarch64-tool"], root / "opt/app/tool")
    report = _judge(_pyxis(["tool"], enroot_env, _args()))
    assert [(i.rule, i.path) for i in report.issues] == [
        ("exe-arch-mismatch", f"{os.path.realpath(root)}:/opt/app/tool")]
    # Without the after_pull line, the same step is the manifest's business.
    before = _pyxis(["tool"], enroot_env, "")
    assert before.image is None and before.registry is not None


def test_an_arm64_image_for_4k_pages(enroot_env: dict[str, str],  # noqa: F811
                                     images: dict[str, Path]) -> None:  # noqa: F811
    """The index says arm64, right for a GB200 node; its program was linked
    for 4 KiB pages: only its ELF says so."""
    root = _create(enroot_env, "pyxis_12.0", images["aarch64"])
    todo = _pyxis(["/opt/app/tool4k"], enroot_env, _args())
    assert todo.image is not None and todo.image.path == os.path.realpath(root)
    gb200 = NodeProfile("aarch64", 65536, (2, 36))
    rules = [i.rule for i in _judge(todo, gb200).issues]
    assert "page-congruence" in rules, rules
    native = _pyxis(["/opt/app/tool"], enroot_env, _args())
    assert [i.rule for i in _judge(native, gb200).issues] == []


def test_names_pyxis_gives(enroot_env: dict[str, str], images: dict[str, Path],  # noqa: F811
                           tmp_path: Path) -> None:
    """pyxis 0.24.0 user_init: ``pyxis_JOB.STEP``, with container_scope=job
    ``pyxis_JOB_JOB.STEP``; ``--container-name=NAME[:FLAG]`` the named
    one, whatever its flag (pyxis created it just now, even with
    ``:create``). No root there: a skip, never a guess."""
    conf = tmp_path / "slurm.conf"
    missing = _pyxis(["tool"], enroot_env, _args())
    assert missing.image is None and "pyxis_12.0 is not there" in str(missing.skipped)
    _slurm_conf(tmp_path, "container_scope=job")
    root = _create(enroot_env, "pyxis_12_12.3", images["x86_64"])
    todo = _pyxis(["tool"], enroot_env, _args(step=3, conf=conf))
    assert todo.image is not None and todo.image.path == os.path.realpath(root)
    named = _create(enroot_env, "pyxis_12_demo", images["x86_64"])
    todo = _pyxis(["tool"], enroot_env, _args(conf=conf, name="demo:create"))
    assert todo.image is not None and todo.image.path == os.path.realpath(named)
    _slurm_conf(tmp_path, "")
    gone = _pyxis(["tool"], enroot_env, _args(conf=conf, name="demo"))
    assert "pyxis_demo is not there" in str(gone.skipped)
    bad = _pyxis(["tool"], enroot_env, _args(conf=conf, name="a/b"))
    assert "name pyxis gave the container is not known" in str(bad.skipped)
