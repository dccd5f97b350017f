"""``mksquashfs`` with a cache keyed by what the image will hold.

Why: a warm ``make test`` ran mksquashfs 200 times, 3.4 of its ~25 CPU
minutes (process accounting, issue 28), on trees that were the same as the
previous run's: the tests build their image trees afresh each run from
cached parts (compiled fixtures, Debian roots, wheels). On this 2-core
machine that CPU is the warm run's time.

The key is mksquashfs' own version line, its arguments, and each entry of
the tree in sorted order: the path below the root, the type, the permission
bits, owner and group, a file's size and sha256, a link's target, a
device's numbers, the extended attributes, and which entries are hard links
of one another. Not the times: the trees are new each run, so an image
from the cache carries the times of the tree it was first made from (no
test reads an image's times). Anything the walk cannot read makes the call
run mksquashfs as before, uncached.

The image is copied out of the cache (a test may change or remove its
copy); entries not used for :data:`KEEP_DAYS` days are removed when a new
one is stored.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

from corpus import cache_root, mark_used, prune_unused

KEEP_DAYS = 14
TIMEOUT = 300


@functools.cache
def _version() -> str:
    done = subprocess.run(["mksquashfs", "-version"], capture_output=True, text=True,
                          check=False, timeout=30)
    return (done.stdout or done.stderr).strip().splitlines()[0] if done.returncode == 0 else ""


def _tree_key(root: Path, args: tuple[str, ...]) -> str | None:
    h = hashlib.sha256()
    h.update(f"{_version()}\0{len(args)}\0".encode())
    for a in args:
        h.update(a.encode() + b"\0")
    inodes: dict[tuple[int, int], str] = {}
    try:
        todo = [""]
        while todo:
            rel = todo.pop()
            path = os.path.join(root, rel) if rel else str(root)
            st = os.lstat(path)
            kind = stat.S_IFMT(st.st_mode)
            h.update(f"{rel}\0{kind:o}\0{stat.S_IMODE(st.st_mode):o}\0{st.st_uid}\0"
                     f"{st.st_gid}\0".encode())
            for name in sorted(os.listxattr(path, follow_symlinks=False)):
                value = os.getxattr(path, name, follow_symlinks=False)
                h.update(name.encode() + b"=" + value.hex().encode() + b"\0")
            if kind != stat.S_IFDIR and st.st_nlink > 1:
                first = inodes.setdefault((st.st_dev, st.st_ino), rel)
                h.update(f"link-of\0{first}\0".encode())
                if first != rel:
                    continue
            if kind == stat.S_IFDIR:
                names = sorted(os.listdir(path), reverse=True)
                todo.extend(f"{rel}/{n}" if rel else n for n in names)
            elif kind == stat.S_IFREG:
                with open(path, "rb") as fh:
                    h.update(f"{st.st_size}\0".encode() + hashlib.file_digest(fh, "sha256")
                             .digest())
            elif kind == stat.S_IFLNK:
                h.update(os.readlink(path).encode() + b"\0")
            elif kind in (stat.S_IFCHR, stat.S_IFBLK):
                h.update(f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}\0".encode())
    except OSError:
        return None
    return h.hexdigest()


def mksquashfs(root: Path, out: Path, *args: str) -> Path:
    """``mksquashfs ROOT OUT -noappend -quiet -no-progress ARGS``, from the
    cache when the same tree was squashed with the same arguments before."""
    argv = ["mksquashfs", str(root), str(out), "-noappend", "-quiet", "-no-progress", *args]
    key = _tree_key(root, tuple(args)) if _version() else None
    if key is None:
        subprocess.run(argv, check=True, capture_output=True, timeout=TIMEOUT)
        return out
    cache = cache_root() / "squashfs"
    cached = cache / f"{key}.sqsh"
    if out.exists() or out.is_symlink():
        out.unlink()
    try:
        shutil.copyfile(cached, out)
        mark_used(cached)
        return out
    except FileNotFoundError:
        pass
    subprocess.run(argv, check=True, capture_output=True, timeout=TIMEOUT)
    cache.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=cache, prefix=".new-", suffix=".sqsh")
    os.close(fd)
    try:
        shutil.copyfile(out, tmp)
        os.replace(tmp, cached)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    prune_unused(cache, "*.sqsh", KEEP_DAYS)
    return out
