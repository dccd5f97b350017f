"""The squashfs reader against the real tools, and verdicts in an image
against the same root unpacked.

Images are made here by ``mksquashfs`` (squashfs-tools) from roots with real
compiled programs and the real glibc; ``unsquashfs -lls``/``-cat`` on the
same file is the oracle for every name, mode, size, link target and byte.
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
from pathlib import Path

import pytest
from test_hostile import no_hang

from grace_policy import fsprobe
from grace_policy.budget import Budget, BudgetExceeded
from grace_policy.check import CheckInput, check, check_step
from grace_policy.image import ImageError
from grace_policy.image.open import open_image
from grace_policy.image.squashfs import SquashView
from grace_policy.node import NodeProfile, detect
from grace_policy.rules import RULES_TOML, _toml_load, parse_rules

from .budgets import roomy
from .roots import make_root, mksquashfs

KNOWN_RULES = set(parse_rules(_toml_load(RULES_TOML)))

pytestmark = pytest.mark.skipif(shutil.which("mksquashfs") is None,
                                reason="mksquashfs not installed (squashfs-tools)")

HOST = detect()
GRACE64 = NodeProfile("aarch64", 65536, (2, 36))
GRACE4 = NodeProfile("aarch64", 4096, (2, 36))

#: (name, mksquashfs options): enroot's lzo, the other compressors, small
#: blocks (files over many blocks), no fragments, uncompressed tables.
VARIANTS = {
    "lzo": ("lzo",),
    "gzip": ("gzip",),
    "xz": ("xz",),
    "gzip-4k-blocks": ("gzip", "-b", "4096"),
    "lzo-no-fragments": ("lzo", "-no-fragments"),
    "xz-uncompressed": ("xz", "-noI", "-noD", "-noF", "-noX"),
    "gzip-always-fragments": ("gzip", "-always-use-fragments"),
}


@pytest.fixture(scope="module")
def roots(tmp_path_factory: pytest.TempPathFactory, compile_cache: object) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("sq-roots")
    out = {"x86_64": make_root(base / "x86_64", "x86_64", cache=compile_cache)}
    if shutil.which("aarch64-linux-gnu-gcc"):
        out["aarch64"] = make_root(base / "aarch64", "aarch64", cache=compile_cache)
    return out


@pytest.fixture(scope="module")
def images(roots: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
           ) -> dict[tuple[str, str], Path]:
    base = tmp_path_factory.mktemp("sq-images")
    out = {}
    for arch, root in roots.items():
        for name, (comp, *extra) in VARIANTS.items():
            out[(arch, name)] = mksquashfs(root, base / f"{arch}-{name}.sqsh", comp, *extra)
    return out


def _lls(image: Path) -> dict[str, tuple[str, int, str]]:
    """path -> (mode string, size, link target) from ``unsquashfs -lls``."""
    text = subprocess.run(["unsquashfs", "-lls", "-d", "", str(image)], check=True,
                          capture_output=True, text=True).stdout
    out = {}
    for line in text.splitlines():
        words = line.split(None, 5)  # mode owner size date time [path [-> target]]
        if len(words) < 5 or words[0][0] not in "-dlcbps":
            continue
        path = words[5] if len(words) == 6 else ""
        target = ""
        if words[0][0] == "l" and " -> " in path:
            path, target = path.split(" -> ", 1)
        out[path or "/"] = (words[0], int(words[2]), target)
    return out


def _walk(view: SquashView, path: str = "/") -> list[str]:
    out = []
    for entry in sorted(view.scandir(path), key=lambda e: e.name):
        inner = path.rstrip("/") + "/" + entry.name
        out.append(inner)
        if entry.is_dir(follow_symlinks=False):
            out += _walk(view, inner)
    return out


def _mode_string(mode: int) -> str:
    import stat

    return stat.filemode(mode)


#: (variant, lzo decoder): every variant with the default decoders, and the
#: lzo ones again with the pure-Python decoder liblzo2's absence falls back to.
READER_CASES = [(v, "native") for v in VARIANTS] + [
    ("lzo", "python"), ("lzo-no-fragments", "python")]


@pytest.fixture()
def lzo_decoder(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Pin the lzo decoder: liblzo2 (asserted present: squashfs-tools
    depends on it) or the pure-Python fallback."""
    from grace_policy.image import native

    monkeypatch.setattr(native, "_loaded", {})
    if request.param == "python":
        native._loaded["lzo"] = None
    else:
        assert native.lzo() is not None, "liblzo2.so.2 not found (squashfs-tools needs it)"
    return request.param  # type: ignore[no-any-return]


@pytest.mark.parametrize(("variant", "lzo_decoder"), READER_CASES, indirect=["lzo_decoder"])
def test_reader_matches_unsquashfs(images: dict[tuple[str, str], Path], variant: str,
                                   lzo_decoder: str) -> None:
    for (arch, name), path in images.items():
        if name != variant:
            continue
        image = open_image(str(path), budget=roomy())
        view = image.view
        assert isinstance(view, SquashView) and image.kind == "squashfs"
        expected = _lls(path)
        assert len(expected) > 20
        assert set(_walk(view)) == {p for p in expected if p != "/"}
        for inner, (mode, size, target) in expected.items():
            st = view.lstat(inner)
            assert _mode_string(st.st_mode) == mode, (arch, variant, inner)
            if mode[0] == "l":
                assert view.readlink(inner) == target, inner
            if mode[0] == "-":
                assert st.st_size == size, inner
                fh, _ = view.open_regular(inner)
                try:
                    data = fh.pread(size + 10, 0)
                    cat = subprocess.run(["unsquashfs", "-cat", str(path), inner.lstrip("/")],
                                         check=True, capture_output=True).stdout
                    assert data == cat, (arch, variant, inner)
                    # Positional reads across block boundaries.
                    for off in (0, 1, 4095, 4096, 131071, 131072, size // 2, size - 1):
                        if 0 <= off < size:
                            assert fh.pread(70000, off) == cat[off:off + 70000], (inner, off)
                finally:
                    fh.close()
        assert dict(image.env)["IMAGE_VAR"] == "from-image"
        view.close()  # type: ignore[attr-defined]


ARGVS = (["hello"], ["script"], ["tool"], ["/bin/true"], ["/usr/bin/loop1"],
         ["/usr/bin/escape"], ["/usr/bin/abs"], ["/usr/bin/up"], ["sh"])


def _verdict(report) -> tuple[object, ...]:  # type: ignore[no-untyped-def]
    return (report.exe, report.limit, tuple((i.rule, i.path.split(":", 1)[1], i.predicted_error)
                                            for i in report.issues))


@pytest.mark.parametrize("variant", ["lzo", "gzip-4k-blocks", "xz-uncompressed"])
def test_verdicts_match_the_unpacked_root(roots: dict[str, Path],
                                          images: dict[tuple[str, str], Path],
                                          variant: str) -> None:
    for arch, root in roots.items():
        tree = open_image(str(root), budget=roomy())
        packed = open_image(str(images[(arch, variant)]), budget=roomy())
        nodes = [HOST] if arch == HOST.machine else []
        if arch == "aarch64":
            nodes += [GRACE4, GRACE64]
        if arch != HOST.machine:
            nodes.append(HOST)  # the foreign image: image-arch-mismatch
        for node in nodes:
            for argv in (*ARGVS, ["tool4k"]):
                a = check_step(argv, tree.step_env({}), "/", node, image=tree)
                b = check_step(argv, packed.step_env({}), "/", node, image=packed)
                got_a = _verdict(a) if a.issues and a.issues[0].rule != "image-arch-mismatch" \
                    else [(i.rule, i.fact("image_arch")) for i in a.issues]
                got_b = _verdict(b) if b.issues and b.issues[0].rule != "image-arch-mismatch" \
                    else [(i.rule, i.fact("image_arch")) for i in b.issues]
                assert got_a == got_b, (arch, node, argv)
    # What the verdicts are, so the comparison is not between two blanks.
    x86 = open_image(str(images[("x86_64", variant)]), budget=roomy())
    if HOST.machine == "x86_64":
        assert check_step(["hello"], x86.step_env({}), "/", HOST, image=x86).issues == ()
        assert [i.rule for i in check_step(["/bin/true"], {}, "/", HOST, image=x86).issues] \
            == ["exe-not-found"]
    if ("aarch64", variant) in images:
        arm = open_image(str(images[("aarch64", variant)]), budget=roomy())
        bad = check_step(["tool4k"], arm.step_env({}), "/", GRACE64, image=arm)
        assert {i.rule for i in bad.issues} & {"page-align", "page-congruence"}
        assert bad.issues[0].path == f"{images[('aarch64', variant)]}:/opt/app/tool4k"
        assert check_step(["tool"], arm.step_env({}), "/", GRACE64, image=arm).issues == ()
        if HOST.machine == "x86_64":
            foreign = check_step(["tool"], arm.step_env({}), "/", HOST, image=arm)
            assert [i.rule for i in foreign.issues] == ["image-arch-mismatch"]


def test_cache_record_is_the_image_identity(images: dict[tuple[str, str], Path],
                                            tmp_path: Path) -> None:
    copy = tmp_path / "img.sqsh"
    shutil.copy2(images[("x86_64", "lzo")], copy)
    image = open_image(str(copy), budget=roomy())
    files = fsprobe.Files.recorded()
    check(CheckInput(["hello"], image.step_env({}), "/", HOST, image=image, files=files))
    # Only the image file, as the C side can replay it: no inner path (the
    # rest are the step's inputs: env variables the GPU decision read).
    record = [r for r in files.records() if r[0] not in ("v", "i")]
    assert record == [("s", str(copy), fsprobe.signature(os.stat(copy)))]
    assert fsprobe.still_true(record)
    os.utime(copy, ns=(1, 1))
    assert not fsprobe.still_true(record)


def test_truncated_and_corrupt_images(images: dict[tuple[str, str], Path],
                                      tmp_path: Path) -> None:
    data = images[("x86_64", "gzip")].read_bytes()
    cut = tmp_path / "cut.sqsh"
    (used,) = struct.unpack_from("<Q", data, 40)  # bytes_used: mksquashfs pads past it
    assert used <= len(data)
    for size in (0, 4, 50, 95, 96, 200, 4096, used // 3, used // 2, used - 1):
        cut.write_bytes(data[:size])
        with pytest.raises(ImageError):
            open_image(str(cut), budget=roomy())
    # A corrupt middle (the superblock intact): findings, never an exception.
    for start in range(200, len(data) - 4096, max(1, len(data) // 23)):
        bad = bytearray(data)
        bad[start:start + 4096] = bytes(4096)
        cut.write_bytes(bytes(bad))
        try:
            image = open_image(str(cut), budget=roomy())
        except ImageError:
            continue
        for argv in (["hello"], ["script"], ["tool"]):
            report = check_step(argv, image.step_env({}), "/", HOST, image=image,
                                budget=Budget(60_000))
            # Whatever the zeroed block held: findings of rules users can
            # look up (no internal error dressed as one), never a limit
            # (60 s is far beyond a 2 MiB image).
            assert {i.rule for i in report.issues} <= KNOWN_RULES, report.issues
            assert report.limit is None, report.limit
        image.view.close()  # type: ignore[attr-defined]


def test_hundred_thousand_files(tmp_path: Path, compile_cache: object) -> None:
    root = make_root(tmp_path / "root", "x86_64", cache=compile_cache)
    big = root / "usr" / "share" / "many"
    big.mkdir(parents=True)
    for i in range(100_000):
        (big / f"f{i:06d}").touch()
    image = open_image(str(mksquashfs(root, tmp_path / "big.sqsh", "gzip")), budget=roomy())
    env = {"PATH": "/usr/share/many:/usr/bin"}
    # The 100,000-entry directory first on PATH is read through (~140 ms
    # here) and the program found after it, clean.
    with no_hang(120):
        report = check_step(["hello"], env, "/", HOST, image=image, budget=Budget(60_000))
    assert report.limit is None and report.issues == () and report.exe == "/usr/bin/hello"
    # With a deadline it cannot meet, the check stops at the deadline with
    # the limit said (check-limit), not after the directory.
    # The image is read under the step's budget from its first byte, so the
    # limit may come while it is opened or while the check reads it.
    tiny = Budget(deadline_ms=1)
    with no_hang(10):
        try:
            small = open_image(str(tmp_path / "big.sqsh"), budget=tiny)
            limit = check_step(["hello"], env, "/", HOST, image=small, budget=tiny).limit
        except BudgetExceeded as exc:
            limit = str(exc)
    assert limit is not None and "deadline of 1 ms" in limit, limit
    with pytest.raises(ImageError):
        open_image(str(tmp_path / "big.sqsh"), max_inodes=1000, budget=roomy())


@pytest.mark.parametrize("comp", ["zstd", "lz4"])
def test_other_compressions(roots: dict[str, Path], tmp_path: Path, comp: str) -> None:
    from grace_policy.image import native
    from grace_policy.image.squashfs import _zstd

    try:
        path = mksquashfs(roots["x86_64"], tmp_path / f"{comp}.sqsh", comp)
    except subprocess.CalledProcessError:
        pytest.skip(f"this mksquashfs has no {comp}")
    if comp == "zstd" and (_zstd() is not None or native.zstd() is not None):
        image = open_image(str(path), budget=roomy())
        assert check_step(["hello"], image.step_env({}), "/", HOST, image=image).issues == ()
        fh, st = image.view.open_regular("/usr/bin/hello")  # type: ignore[attr-defined]
        cat = subprocess.run(["unsquashfs", "-cat", str(path), "usr/bin/hello"], check=True,
                             capture_output=True).stdout
        assert fh.pread(st.st_size + 1, 0) == cat
        fh.close()
        return
    # No decoder here: refused by name at open, never misread.
    with pytest.raises(ImageError, match=f"{comp}-compressed"):
        open_image(str(path), budget=roomy())


def test_empty_directory_read_first_hides_no_other(tmp_path: Path) -> None:
    """An empty directory has no listing: squashfs gives it the position
    where the next directory's listing starts. Read first, it must not stand
    for that directory (a Debian root's /tmp hid /usr/bin, so /bin/sh was
    "missing" and the image's architecture was taken from the program)."""
    tree = tmp_path / "tree"
    for i in range(6):
        (tree / f"d{i}" / "empty").mkdir(parents=True)
        (tree / f"d{i}" / "full").mkdir()
        (tree / f"d{i}" / "full" / f"file{i}").write_text("x")
        (tree / f"e{i}").mkdir()
    image = mksquashfs(tree, tmp_path / "t.sqsh", "gzip")
    want = {str(p.relative_to(tree)): sorted(os.listdir(p))
            for p in tree.rglob("*") if p.is_dir()}
    assert any(not names for names in want.values())
    for first in sorted(d for d, names in want.items() if not names):
        view = open_image(str(image), budget=roomy()).view
        assert view.listdir("/" + first) == []
        got = {d: sorted(view.listdir("/" + d)) for d in want}
        assert got == want, first
