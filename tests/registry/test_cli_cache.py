"""``grace-policy check --image REGISTRY#IMAGE`` without ``--pull``: the
image's files judged from the user's enroot cache when it already holds
every layer, by the real enroot 4.1.2 (built from the pinned tarball)
against Debian's real registry; the manifest answer, with a hint, when it
does not, or when a cache entry is not what enroot's name says.

The cache is filled the way a user fills it: one real ``check --pull``
(the user's own ``enroot import``, which keeps every blob it fetched in
``$HOME/.cache/enroot``). The registry's access log tells whether a layer
crossed the network.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from image.roots import make_root
from local_registry import LocalRegistry, oci_image, single_manifest

REPO = Path(__file__).resolve().parents[2]
PREFIX = "grace-policy: "

pytestmark = [pytest.mark.cross, pytest.mark.skipif(
    shutil.which("mksquashfs") is None or shutil.which("zstd") is None,
    reason="mksquashfs (squashfs-tools) and zstd")]


class Images:
    def __init__(self, registry: LocalRegistry, layout: Path) -> None:
        self.registry = registry
        self.layout = layout

    def ref(self, tag: str) -> str:
        return f"{self.registry.address}#lab/img:{tag}"

    def layers(self, tag: str) -> list[str]:
        """The cache file names of the tag's layers (enroot's: the hex)."""
        _, manifest = single_manifest(self.layout, tag)
        return [str(layer["digest"]).split(":", 1)[1]  # type: ignore[index]
                for layer in manifest["layers"]]  # type: ignore[union-attr]


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory, compile_cache: object
           ) -> Iterator[Images]:
    work = tmp_path_factory.mktemp("cache")
    registry = LocalRegistry(work / "reg")
    try:
        arm = make_root(work / "root-aarch64", "aarch64", cache=compile_cache)
        # "liar": the config says amd64, the files are aarch64's; "liar3" is
        # the same with two more (small) layers.
        oci_image(work / "layout", "liar", {"x86_64": arm})
        oci_image(work / "layout", "liar3", {"x86_64": arm},
                  more=[{"etc/one": b"1\n"}, {"etc/two": b"2\n"}])
        # "listed": a two-platform list whose amd64 entry holds aarch64 files.
        oci_image(work / "layout", "listed", {"aarch64": arm, "x86_64": arm})
        registry.push(work / "layout", "liar", "lab/img")
        registry.push(work / "layout", "liar3", "lab/img")
        registry.push(work / "layout", "listed", "lab/img", multi=True)
        yield Images(registry, work / "layout")
    finally:
        registry.stop()


def _check(site: Path, home: Path, *argv: str, **extra: str
           ) -> subprocess.CompletedProcess[str]:
    """The CLI as a user on an x86_64 login node whose PATH has enroot."""
    home.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XDG_", "ENROOT_"))}
    env.update(PYTHONPATH=str(REPO), HOME=str(home), TMPDIR=str(home),
               PATH=f"{site / 'bin'}:{os.environ['PATH']}", ENROOT_ALLOW_HTTP="y", **extra)
    return subprocess.run([sys.executable, "-m", "grace_policy", "check", "--arch", "x86_64",
                           "--page-size", "4096", "--glibc", "2.36", *argv],
                          capture_output=True, text=True, timeout=600, cwd=REPO, env=env)


def _filled(site: Path, images: Images, tag: str, home: Path) -> Path:
    """The user's enroot cache after one real ``check --pull`` of ``tag``."""
    got = _check(site, home, "--image", images.ref(tag), "--pull", "--", "/opt/app/tool")
    assert got.returncode == 2, got.stdout + got.stderr
    cache = home / ".cache" / "enroot"
    for name in images.layers(tag):
        assert (cache / name).is_file(), f"enroot keeps layer {name} in {cache}"
    return cache


def _layer_gets(images: Images, tag: str, since: int) -> list[str]:
    names = images.layers(tag)
    return [path for path in images.registry.blob_gets(since)
            if any(path.endswith(name) for name in names)]


def test_a_full_cache_judges_the_files_without_fetching_a_layer(
        enroot_site: Path, images: Images, tmp_path: Path) -> None:
    home = tmp_path / "home"
    _filled(enroot_site, images, "liar", home)
    mark = images.registry.mark()
    got = _check(enroot_site, home, "--image", images.ref("liar"), "--", "/opt/app/tool")
    assert got.returncode == 2, got.stdout + got.stderr
    assert f"{PREFIX}ERROR image-arch-mismatch: {images.ref('liar')}" in got.stdout, got.stdout
    assert "holds aarch64 programs" in got.stdout, "judged from its files, not its config"
    assert "from your enroot cache" in got.stdout, got.stdout
    assert "Traceback" not in got.stderr
    assert _layer_gets(images, "liar", mark) == [], "no layer fetched from the registry"
    assert not list(home.glob("grace-cache-*")), "the scratch import is removed"

    mark = images.registry.mark()
    got = _check(enroot_site, home, "--image", images.ref("liar"), "--json", "--",
                 "/opt/app/tool")
    assert got.returncode == 2, got.stdout + got.stderr
    out = json.loads(got.stdout)
    assert out["action"] == "reject"
    assert out["registry"]["contents"] == "cache"
    assert out["registry"]["digest"].startswith("sha256:")
    assert out["registry"]["cache"]["held"] == out["registry"]["cache"]["layers"] == 1
    assert _layer_gets(images, "liar", mark) == []


def test_the_cache_enroot_is_told_to_use(enroot_site: Path, images: Images,
                                         tmp_path: Path) -> None:
    """``ENROOT_CACHE_PATH`` in the user's environment: enroot keeps its
    blobs there, and that is where the check looks."""
    home, elsewhere = tmp_path / "home", tmp_path / "elsewhere"
    got = _check(enroot_site, home, "--image", images.ref("liar"), "--pull", "--",
                 "/opt/app/tool", ENROOT_CACHE_PATH=str(elsewhere))
    assert got.returncode == 2, got.stdout + got.stderr
    assert not (home / ".cache" / "enroot").exists()
    got = _check(enroot_site, home, "--image", images.ref("liar"), "--", "/opt/app/tool",
                 ENROOT_CACHE_PATH=str(elsewhere))
    assert got.returncode == 2, got.stdout + got.stderr
    assert f"from your enroot cache ({elsewhere}," in got.stdout, got.stdout
    got = _check(enroot_site, home, "--image", images.ref("liar"), "--", "/opt/app/tool")
    assert got.returncode == 0, "the default cache holds nothing"


def test_an_empty_cache_leaves_the_manifest_answer_and_says_pull(
        enroot_site: Path, images: Images, tmp_path: Path) -> None:
    got = _check(enroot_site, tmp_path / "home", "--image", images.ref("liar"), "--",
                 "/opt/app/tool")
    assert got.returncode == 0, got.stdout + got.stderr
    lines = [line for line in got.stdout.splitlines() if "--pull would judge the files" in line]
    assert len(lines) == 1, got.stdout
    assert "holds 0 of its 1 layer(s)" in lines[0]
    got = _check(enroot_site, tmp_path / "home", "--image", images.ref("liar"), "--json",
                 "--", "/opt/app/tool")
    out = json.loads(got.stdout)
    assert out["action"] == "allow"
    assert out["registry"]["contents"] == "manifest"
    assert out["registry"]["cache"]["held"] == 0


def test_a_cache_without_one_layer_leaves_the_manifest_answer(
        enroot_site: Path, images: Images, tmp_path: Path) -> None:
    home = tmp_path / "home"
    cache = _filled(enroot_site, images, "liar3", home)
    (cache / images.layers("liar3")[1]).unlink()
    mark = images.registry.mark()
    got = _check(enroot_site, home, "--image", images.ref("liar3"), "--", "/opt/app/tool")
    assert got.returncode == 0, got.stdout + got.stderr
    assert "holds 2 of its 3 layer(s)" in got.stdout, got.stdout
    assert "--pull would judge the files" in got.stdout
    assert _layer_gets(images, "liar3", mark) == [], "nothing pulled without --pull"
    assert not (cache / images.layers("liar3")[1]).exists(), "the user's cache is not written"


def _damage(kind: str, path: Path, tmp_path: Path) -> str:
    """Spoil one cached layer; the words the note should have."""
    if kind == "truncated":
        data = path.read_bytes()
        path.write_bytes(data[:len(data) // 2])
        return "is not a whole zstd stream"
    if kind == "other":
        other = subprocess.run(["zstd", "-q", "-c"], input=b"not this layer",
                               capture_output=True, check=True).stdout
        path.write_bytes(other)
        return "its diff_id differs"
    if kind == "symlink":
        kept = tmp_path / "kept"
        path.rename(kept)
        path.symlink_to(kept)
        return "is a symbolic link"
    if kind == "fifo":
        path.unlink()
        os.mkfifo(path)
        return "is not a regular file"
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["truncated", "other", "symlink", "fifo"])
def test_a_spoiled_cache_entry_is_a_note_not_a_traceback(
        enroot_site: Path, images: Images, tmp_path: Path, kind: str) -> None:
    home = tmp_path / "home"
    cache = _filled(enroot_site, images, "liar3", home)
    words = _damage(kind, cache / images.layers("liar3")[2], tmp_path)
    got = _check(enroot_site, home, "--image", images.ref("liar3"), "--", "/opt/app/tool")
    assert "Traceback" not in got.stderr, got.stderr
    assert got.returncode == 0, got.stdout + got.stderr
    notes = [line for line in got.stdout.splitlines() if line.startswith(f"{PREFIX}note: ")]
    assert len(notes) == 1 and words in notes[0], got.stdout
    assert "--pull would judge the files" in notes[0]
    assert not list(home.glob("grace-cache-*")), "the scratch import is removed"


def test_a_cache_path_that_is_a_file_holds_nothing(
        enroot_site: Path, images: Images, tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / ".cache").mkdir(parents=True)
    (home / ".cache" / "enroot").write_text("not a directory\n")
    got = _check(enroot_site, home, "--image", images.ref("liar"), "--", "/opt/app/tool")
    assert "Traceback" not in got.stderr, got.stderr
    assert got.returncode == 0, got.stdout + got.stderr
    assert "holds 0 of its 1 layer(s)" in got.stdout, got.stdout


def test_pull_names_what_it_judged(enroot_site: Path, images: Images, tmp_path: Path) -> None:
    got = _check(enroot_site, tmp_path / "home", "--image", images.ref("liar"), "--pull",
                 "--json", "--", "/opt/app/tool")
    assert got.returncode == 2, got.stdout + got.stderr
    out = json.loads(got.stdout)
    assert out["registry"]["contents"] == "pull"
    assert out["registry"]["digest"].startswith("sha256:")


def test_a_list_entry_is_imported_from_the_cache_by_its_digest(
        enroot_site: Path, images: Images, tmp_path: Path) -> None:
    """A tag that is a manifest list: the pull and the cache import both
    name the node's entry by its digest, which --json reports."""
    home = tmp_path / "home"
    got = _check(enroot_site, home, "--image", images.ref("listed"), "--pull", "--json", "--",
                 "/opt/app/tool")
    assert got.returncode == 2, got.stdout + got.stderr
    pulled = json.loads(got.stdout)["registry"]
    assert pulled["contents"] == "pull" and pulled["list_digest"].startswith("sha256:")
    assert pulled["digest"] != pulled["list_digest"]
    mark = images.registry.mark()
    got = _check(enroot_site, home, "--image", images.ref("listed"), "--json", "--",
                 "/opt/app/tool")
    assert got.returncode == 2, got.stdout + got.stderr
    cached = json.loads(got.stdout)["registry"]
    assert (cached["contents"], cached["digest"]) == ("cache", pulled["digest"])
    gets = images.registry.blob_gets(mark)
    assert len(gets) == 1, f"only the config, read by the manifest check: {gets}"


def test_a_terminal_is_told_while_the_cache_is_unpacked(
        enroot_site: Path, images: Images, tmp_path: Path) -> None:
    """An import from the cache takes as long as unpacking the image: a
    person at a terminal gets one line on stderr before it starts; a
    script's capture (the other tests) gets none."""
    import pty

    home = tmp_path / "home"
    _filled(enroot_site, images, "liar", home)
    quiet = _check(enroot_site, home, "--image", images.ref("liar"), "--", "/opt/app/tool")
    assert "unpacking" not in quiet.stderr, quiet.stderr
    main, side = pty.openpty()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XDG_", "ENROOT_"))}
    env.update(PYTHONPATH=str(REPO), HOME=str(home), TMPDIR=str(home),
               PATH=f"{enroot_site / 'bin'}:{os.environ['PATH']}", ENROOT_ALLOW_HTTP="y")
    try:
        got = subprocess.run([sys.executable, "-m", "grace_policy", "check", "--arch", "x86_64",
                              "--page-size", "4096", "--glibc", "2.36", "--image",
                              images.ref("liar"), "--", "/opt/app/tool"],
                             stdout=subprocess.PIPE, stderr=side, text=True, timeout=600,
                             cwd=REPO, env=env)
        os.close(side)
        said = b""
        while True:
            try:
                chunk = os.read(main, 4096)
            except OSError:  # EIO: the terminal's other side is closed
                break
            if not chunk:
                break
            said += chunk
    finally:
        os.close(main)
    assert got.returncode == 2, got.stdout
    lines = [line for line in said.decode().splitlines() if "unpacking" in line]
    assert len(lines) == 1 and lines[0].startswith(PREFIX), said
    assert "1 cached layer(s)" in lines[0]
