"""The image view: paths resolve inside the image, never on the host."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from grace_policy import fsprobe
from grace_policy.budget import Budget
from grace_policy.check import CheckInput, check, check_step
from grace_policy.image.open import open_image
from grace_policy.image.view import DirView
from grace_policy.node import NodeProfile, detect

from .budgets import roomy
from .roots import make_root

HOST = detect()
GRACE64 = NodeProfile("aarch64", 65536, (2, 36))
GRACE4 = NodeProfile("aarch64", 4096, (2, 36))


@pytest.fixture(scope="module")
def x86_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_root(tmp_path_factory.mktemp("x86") / "root", "x86_64")


@pytest.fixture(scope="module")
def arm_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_root(tmp_path_factory.mktemp("arm") / "root", "aarch64")


def test_links_resolve_inside(x86_root: Path) -> None:
    view = DirView(str(x86_root))
    real = os.stat(x86_root / "usr/bin/hello")
    for path in ("/usr/bin/hello", "/bin/hello", "/usr/bin/abs", "/usr/bin/up",
                 "/bin/../bin/abs", "/../../usr/bin/hello"):
        st = view.stat(path)
        assert (st.st_ino, st.st_dev) == (real.st_ino, real.st_dev), path
        assert view.realpath(path) == "/usr/bin/hello", path
    assert view.realpath("/lib64/ld-linux-x86-64.so.2") == \
        "/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"
    with pytest.raises(OSError) as loop:
        view.stat("/usr/bin/loop1")
    assert loop.value.errno == errno.ELOOP
    # A link to a path that exists only on the host does not reach the host.
    assert os.path.exists("/etc/hostname") or os.path.exists("/etc")
    with pytest.raises(FileNotFoundError):
        view.stat("/usr/bin/escape")
    assert view.lstat("/usr/bin/escape").st_mode & 0o170000 == 0o120000
    assert sorted(view.listdir("/bin"))[:3] == ["abs", "escape", "hello"]
    kinds = {e.name: (e.is_symlink(), e.is_file()) for e in view.scandir("/usr/bin")}
    assert kinds["abs"] == (True, True) and kinds["escape"] == (True, False)


def test_fsprobe_uses_the_view_and_records_no_inner_path(x86_root: Path) -> None:
    view = DirView(str(x86_root))
    host = fsprobe.Files.recorded()
    inside = host.inside(view)
    assert inside.isfile("/usr/bin/hello")
    assert not inside.exists("/etc/hostname")
    assert inside.realpath("/bin/abs") == "/usr/bin/hello"
    assert host.view is None  # the host's object is untouched
    record = host.records()
    # A tree has no identity a replay can vouch for: one CHANGED answer, so
    # the check never becomes a cache entry; no inner path is recorded.
    assert record == [("s", str(x86_root), fsprobe.CHANGED)]


def test_clean_step_in_image(x86_root: Path) -> None:
    image = open_image(str(x86_root), budget=roomy())
    env = image.step_env({"PATH": "/nonexistent", "HOME": "/root"})
    assert env["PATH"] == "/opt/app:/usr/local/bin:/usr/bin:/bin"
    assert env["IMAGE_VAR"] == "from-image"
    report = check_step(["hello"], env, "/", HOST, image=image)
    assert report.issues == () and report.limit is None
    assert report.exe == "/usr/bin/hello"
    names = {o.path for o in report.tree.objects}  # type: ignore[union-attr]
    assert "/lib/x86_64-linux-gnu/libc.so.6" in names
    script = check_step(["script"], env, "/", HOST, image=image)
    assert script.issues == () and [h.kind for h in script.hops] == ["script", "elf"]


def test_host_program_decides_nothing(x86_root: Path) -> None:
    # /usr/bin/python3 and /bin/true exist on this host, not in the image.
    image = open_image(str(x86_root), budget=roomy())
    for prog in ("/bin/true", "true", "/usr/bin/escape"):
        report = check_step([prog], image.step_env({}), "/", HOST, image=image)
        assert [i.rule for i in report.issues] == ["exe-not-found"], prog
        assert report.issues[0].path.startswith(f"{x86_root}:/"), report.issues
    # A link loop inside the image fails as execve would (ELOOP), as on the host.
    loop = check_step(["/usr/bin/loop1"], {}, "/", HOST, image=image)
    assert [i.rule for i in loop.issues] == ["exe-unreadable"]
    assert "symbolic links" in loop.issues[0].fact("detail")


@pytest.mark.cross
def test_foreign_image_is_one_finding(arm_root: Path) -> None:
    image = open_image(str(arm_root), budget=roomy())
    node = HOST if HOST.machine != "aarch64" else NodeProfile("x86_64", 4096, (2, 36))
    report = check_step(["/opt/app/tool"], image.step_env({}), "/", node, image=image)
    assert [i.rule for i in report.issues] == ["image-arch-mismatch"]
    issue = report.issues[0]
    assert issue.path == str(arm_root)
    assert issue.fact("image_arch") == "aarch64" and issue.fact("inner") == "/bin/sh"


@pytest.mark.cross
def test_page_rules_inside_image(arm_root: Path) -> None:
    image = open_image(str(arm_root), budget=roomy())
    env = image.step_env({})
    assert check_step(["tool"], env, "/", GRACE64, image=image).issues == ()
    assert check_step(["tool4k"], env, "/", GRACE4, image=image).issues == ()
    bad = check_step(["tool4k"], env, "/", GRACE64, image=image)
    rules = [i.rule for i in bad.issues]
    assert "page-congruence" in rules or "page-align" in rules, rules
    issue = bad.issues[0]
    assert issue.path == f"{arm_root}:/opt/app/tool4k"
    assert issue.causes[0] == "image"
    # System files of an image are the image's: never softened to info.
    assert issue.fact("max_severity") != "info"


def test_budget_ends_a_deep_walk(tmp_path: Path) -> None:
    root = tmp_path / "r"
    (root / "d").mkdir(parents=True)
    for i in range(200):
        (root / "d" / f"l{i}").symlink_to(f"l{i + 1}")
    view = DirView(str(root))
    with pytest.raises(OSError) as exc:
        view.stat("/d/l0")
    assert exc.value.errno == errno.ELOOP
    report = check_step(["/d/l0"], {}, "/", HOST, image=open_image(str(root), budget=roomy()),
                        budget=Budget(2000))
    assert report.issues and report.limit is None


def test_image_glibc_is_its_ld_so(x86_root: Path) -> None:
    import re
    import subprocess

    from grace_policy.image.step import image_glibc

    ldso = x86_root / "lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"
    if HOST.machine != "x86_64":
        pytest.skip("runs the image's x86_64 ld.so --version as the oracle")
    said = subprocess.run([str(ldso), "--version"], capture_output=True, text=True,
                          check=True).stdout
    m = re.search(r"release version (\d+)\.(\d+)", said)
    assert m
    inside = fsprobe.Files().inside(DirView(str(x86_root)))
    assert image_glibc(HOST, None, inside) == (int(m.group(1)), int(m.group(2)))
    empty = x86_root.parent / "empty"
    empty.mkdir(exist_ok=True)
    assert image_glibc(HOST, None, fsprobe.Files().inside(DirView(str(empty)))) is None


def test_mounts_are_seen_where_the_runtime_mounts_them(x86_root: Path, tmp_path: Path) -> None:
    from .roots import mksquashfs

    home = tmp_path / "home-u"
    (home / "bin").mkdir(parents=True)
    (home / "bin" / "mine").symlink_to("/usr/bin/hello")  # resolves in the container
    (home / "bin" / "script").write_text("#!/usr/bin/sh\n")
    (home / "bin" / "script").chmod(0o755)
    sqsh = mksquashfs(x86_root, tmp_path / "i.sqsh", "gzip")
    image = open_image(str(sqsh), budget=roomy()).with_mounts([("/home/u", str(home))])
    view = image.view
    assert "u" in view.listdir("/home") if view.lstat("/home") else True  # type: ignore[attr-defined]
    assert view.realpath("/home/u/bin/mine") == "/usr/bin/hello"  # type: ignore[attr-defined]
    files = fsprobe.Files.recorded()
    report = check(CheckInput(["/home/u/bin/script"], image.step_env({}), "/home/u", HOST,
                              image=image, files=files))
    record = files.records()
    assert report.issues == () and [h.kind for h in report.hops] == ["script", "elf"]
    # The image's identity, and the mount that was read: never a cache entry.
    assert record[0][0] == "s" and record[0][1] == str(sqsh)
    assert (str(home), fsprobe.CHANGED) in {(p, a) for _op, p, a in record}
    # Only what is mounted: the rest of the host stays invisible.
    assert [i.rule for i in check_step(["/bin/true"], {}, "/", HOST, image=image).issues] == \
        ["exe-not-found"]
    plain = open_image(str(sqsh), budget=roomy())
    files = fsprobe.Files.recorded()
    check(CheckInput(["hello"], plain.step_env({}), "/", HOST, image=plain, files=files))
    assert [r for r in files.records() if r[0] not in ("v", "i")] == \
        [("s", str(sqsh), fsprobe.signature(os.stat(sqsh)))]


def test_the_host_and_an_image_never_read_through_each_other(x86_root: Path,
                                                             tmp_path: Path) -> None:
    """The check's files are an object: judging an image makes another one
    (``files.inside``) and nothing is swapped, so a host check after an
    image check (and an image check after a host one) reads its own files
    while both write into the one record (issue 28)."""
    if HOST.machine != "x86_64":
        pytest.skip("runs the x86_64 image's programs as the host's")
    import shutil

    host_only = tmp_path / "host-only"
    shutil.copy2("/bin/true", host_only)
    image = open_image(str(x86_root), budget=roomy())
    files = fsprobe.Files.recorded()
    inside = files.inside(image.view)
    assert inside.isfile("/usr/bin/hello") and not inside.isfile(str(host_only))
    assert files.isfile(str(host_only)) and files.view is None and inside.log is files.log

    first = check(CheckInput(["hello"], image.step_env({}), "/", HOST, image=image, files=files))
    host = check(CheckInput([str(host_only)], {"PATH": "/usr/bin"}, str(tmp_path), HOST,
                            files=files))
    again = check(CheckInput([str(host_only)], image.step_env({}), "/", HOST, image=image,
                             files=files))
    assert first.issues == () and host.issues == ()
    assert [i.rule for i in again.issues] == ["exe-not-found"]  # the host's file is not there
    assert files.view is None
    recorded = {path for _op, path, _answer in files.records()}
    assert str(host_only) in recorded and str(x86_root) in recorded
    assert "/usr/bin/hello" not in recorded  # no inner path reaches the record
