"""runc's program lookup (grace_policy/image/runc.py) on real files, read
through an image view as the container step's check reads them.

What these would show without the model: a name runc cannot find predicted
as slurmstepd's ``execve(): tool`` on ``/tool``, and a name found through a
relative or empty PATH entry taken as found (Go 1.19 refuses it)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from grace_policy import fsprobe
from grace_policy.check import check_step
from grace_policy.image import Image
from grace_policy.image.runc import RUN_FAILED, go_quote, look_path
from grace_policy.image.view import DirView
from grace_policy.node import NodeProfile


def _root(tmp_path: Path) -> Path:
    root = tmp_path / "rootfs"
    (root / "opt/app/bin").mkdir(parents=True)
    (root / "work").mkdir()
    (root / "usr/bin/tool-dir").mkdir(parents=True)  # a directory is passed over
    plain = root / "usr/bin/plain"
    plain.write_text("#!/bin/sh\n")
    plain.chmod(0o644)  # no execute bit: passed over
    tool = root / "opt/app/bin/tool"
    shutil.copy2("/bin/true", tool)
    shutil.copy2("/bin/true", root / "work/local")
    return root


def _look(root: Path, name: str, path: str | None, cwd: str = "/"):  # type: ignore[no-untyped-def]
    env = {} if path is None else {"PATH": path}
    files = fsprobe.Files().inside(DirView(str(root), name=str(root.parent)))
    return look_path(name, env, cwd, None, files)


def test_bare_names_follow_path_as_go_lookpath(tmp_path: Path) -> None:
    root = _root(tmp_path)
    assert _look(root, "tool", "/usr/bin:/opt/app/bin") == ("/opt/app/bin/tool", None)
    assert _look(root, "tool", "/opt//app/bin/") == ("/opt/app/bin/tool", None)
    missing = f'{RUN_FAILED}exec: "tool": executable file not found in $PATH'
    assert _look(root, "tool", "/usr/bin:/bin") == (None, missing)
    assert _look(root, "tool", None) == (None, missing)  # no PATH: nothing searched
    assert _look(root, "tool-dir", "/usr/bin")[0] is None
    assert _look(root, "plain", "/usr/bin")[0] is None
    # Found through an empty or relative entry: Go 1.19's ErrDot.
    dot = f'{RUN_FAILED}exec: "local": cannot run executable found relative to current directory'
    assert _look(root, "local", ":/usr/bin", cwd="/work") == (None, dot)
    assert _look(root, "local", "/usr/bin:.", cwd="/work") == (None, dot)


def test_names_with_a_slash_are_not_searched(tmp_path: Path) -> None:
    root = _root(tmp_path)
    assert _look(root, "/opt/app/bin/tool", "") == ("/opt/app/bin/tool", None)
    assert _look(root, "./local", "", cwd="/work") == ("/work/./local", None)
    assert _look(root, "/nope", "/opt/app/bin") == (
        None, f'{RUN_FAILED}exec: "/nope": stat /nope: no such file or directory')
    assert _look(root, "/usr/bin/plain", "") == (
        None, f'{RUN_FAILED}exec: "/usr/bin/plain": permission denied')


@pytest.mark.parametrize(("text", "quoted"), [
    ("tool", '"tool"'), ('a"b\\c', '"a\\"b\\\\c"'), ("a\nb\tc\x01", '"a\\nb\\tc\\x01"'),
    ("caf\u00e9", '"caf\u00e9"'), ("bad\udcff", '"bad\\xff"'),
])
def test_go_quote(text: str, quoted: str) -> None:
    assert go_quote(text) == quoted


def test_oci_step_not_found_predicts_runcs_error(tmp_path: Path) -> None:
    root = _root(tmp_path)
    bundle = str(root.parent)
    img = Image(path=bundle, kind="oci", view=DirView(str(root), name=bundle),
                env=(("PATH", "/usr/bin:/bin"),), env_replaces=True, args=("tool",), cwd="/")
    node = NodeProfile(machine="x86_64", page_size=4096, glibc=(2, 36))
    report = check_step(["tool"], {"PATH": "/usr/bin:/bin"}, "/", node, image=img)
    [issue] = report.issues
    assert (issue.rule, issue.path) == ("exe-not-found", f"{bundle}:tool")
    assert issue.predicted_error == (f'{RUN_FAILED}exec: "tool": executable file not '
                                     'found in $PATH')
    report = check_step(["tool"], {"PATH": "/opt/app/bin"}, "/", node, image=img)
    assert report.exe == "/opt/app/bin/tool"
    assert not [i for i in report.issues if i.rule == "exe-not-found"]
