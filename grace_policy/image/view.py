"""A filesystem seen from inside: paths resolve in the view, never on the host.

A container's ``/`` is its image. To judge a step as it will run there, every
path the check reads (``/usr/bin/python3``, ``/etc/ld.so.cache``, a link to
``/lib/x86_64-linux-gnu/libc.so.6``) must be looked up in the image, and a
symlink in it must resolve in it too: an absolute link restarts at the
image's root, ``..`` stops there, and more than :data:`MAX_LINKS` links end in
ELOOP, as the kernel's path walk does. :class:`TreeView` does that walk once
for every kind of image; a kind only says how to look up one name in one
directory (:class:`DirView`: an unpacked root on this host; the squashfs
reader: an image file read without mounting).

:class:`grace_policy.fsprobe.Files` reads through the view of the check in
progress (``files.inside(view)``); nothing here is used on a host step.
"""

from __future__ import annotations

import copy
import errno
import os
import stat as _stat

#: The kernel's limit on symlinks followed in one path walk (MAXSYMLINKS).
MAX_LINKS = 40
#: The longest path (and link target) the walk accepts (PATH_MAX).
MAX_PATH = 4096


def _error(code: int, path: str) -> OSError:
    return OSError(code, os.strerror(code), path)


class Stat:
    """The fields of ``os.stat_result`` a check reads, for files that are not
    on this host's filesystem. ``st_dev`` is the image's own number, so two
    images never share an (st_dev, st_ino) key."""

    __slots__ = (
        "st_ctime_ns",
        "st_dev",
        "st_gid",
        "st_ino",
        "st_mode",
        "st_mtime_ns",
        "st_nlink",
        "st_size",
        "st_uid",
    )

    def __init__(self, mode: int, ino: int, dev: int, size: int, mtime_ns: int) -> None:
        self.st_mode, self.st_ino, self.st_dev, self.st_size = mode, ino, dev, size
        self.st_mtime_ns = self.st_ctime_ns = mtime_ns
        # An image's files belong to whoever the runtime maps its root to.
        self.st_uid, self.st_gid, self.st_nlink = 0, 0, 1

    @property
    def st_mtime(self) -> float:
        return self.st_mtime_ns / 1e9


class Entry:
    """One directory entry, as ``os.DirEntry`` answers (without a stat)."""

    __slots__ = ("_kind", "_tree", "name", "path")

    def __init__(self, name: str, path: str, kind: str, view: TreeView) -> None:
        self.name, self.path, self._kind, self._tree = name, path, kind, view

    def is_symlink(self) -> bool:
        return self._kind == "l"

    def is_dir(self, *, follow_symlinks: bool = True) -> bool:
        if self._kind == "l" and follow_symlinks:
            try:
                return _stat.S_ISDIR(self._tree.stat(self.path).st_mode)
            except OSError:
                return False
        return self._kind == "d"

    def is_file(self, *, follow_symlinks: bool = True) -> bool:
        if self._kind == "l" and follow_symlinks:
            try:
                return _stat.S_ISREG(self._tree.stat(self.path).st_mode)
            except OSError:
                return False
        return self._kind == "f"

    def stat(self, *, follow_symlinks: bool = True):  # type: ignore[no-untyped-def]
        return (self._tree.stat if follow_symlinks else self._tree.lstat)(self.path)


def _kind_of(mode: int) -> str:
    fmt = _stat.S_IFMT(mode)
    if fmt == _stat.S_IFDIR:
        return "d"
    if fmt == _stat.S_IFREG:
        return "f"
    if fmt == _stat.S_IFLNK:
        return "l"
    return "o"


class TreeView:
    """The path walk shared by every image kind. A subclass gives
    :meth:`_root`, :meth:`_child` (one name in one directory node, or None),
    :meth:`_mode`, :meth:`_readlink`, :meth:`_stat`, :meth:`_names` and
    :meth:`_open`; nodes are whatever it likes (a host path, an inode)."""

    #: How findings name the image (its path on the host).
    name: str = ""

    # -- the walk ---------------------------------------------------------

    def _walk(self, path: str, follow_last: bool, strict: bool = True
              ) -> tuple[object, str]:
        """(node, canonical path) of ``path``. Non-strict (realpath): a
        missing component ends the walk with the rest appended as written."""
        if not isinstance(path, str) or "\0" in path:
            raise _error(errno.ENOENT, str(path))
        if len(path) > MAX_PATH:
            raise _error(errno.ENAMETOOLONG, path[:64])
        if not path.startswith("/"):
            # Every path of a check is absolute (relative ones are joined to
            # the step's cwd first); anything else is a caller's mistake.
            path = "/" + path
        todo = [p for p in reversed(path.split("/")) if p and p != "."]
        stack: list[tuple[object, str]] = [(self._root(), "/")]
        links = 0
        while todo:
            name = todo.pop()
            if name == "..":
                if len(stack) > 1:
                    stack.pop()
                continue
            node, where = stack[-1]
            if self._mode(node) != "d":
                if not strict:
                    return node, _join(where, name, todo)
                raise _error(errno.ENOTDIR, path)
            here = where.rstrip("/") + "/" + name
            child = self._child_at(node, name, here)
            if child is None:
                if not strict:
                    return node, _join(where, name, todo)
                raise _error(errno.ENOENT, path)
            if self._mode(child) == "l" and (todo or follow_last):
                links += 1
                if links > MAX_LINKS:
                    raise _error(errno.ELOOP, path)
                target = self._readlink(child)
                if not target or len(target) > MAX_PATH:
                    if not strict:
                        return node, _join(where, name, todo)
                    raise _error(errno.ENOENT, path)
                if target.startswith("/"):
                    del stack[1:]
                todo.extend(p for p in reversed(target.split("/")) if p and p != ".")
                continue
            stack.append((child, here))
        return stack[-1]

    # -- what fsprobe asks --------------------------------------------------

    def stat(self, path: str):  # type: ignore[no-untyped-def]
        node, _ = self._walk(path, True)
        return self._stat(node)

    def lstat(self, path: str):  # type: ignore[no-untyped-def]
        node, _ = self._walk(path, False)
        return self._stat(node)

    def realpath(self, path: str) -> str:
        try:
            return self._walk(path, True, strict=False)[1]
        except OSError:
            # ELOOP: os.path.realpath gives up and returns the path as is.
            return os.path.normpath(path if path.startswith("/") else "/" + path)

    def readlink(self, path: str) -> str:
        node, _ = self._walk(path, False)
        if self._mode(node) != "l":
            raise _error(errno.EINVAL, path)
        return self._readlink(node)

    def listdir(self, path: str) -> list[str]:
        return [name for name, _ in self._listing(path)]

    def scandir(self, path: str) -> list[Entry]:
        base = path.rstrip("/")
        return [Entry(name, f"{base}/{name}", kind, self) for name, kind in self._listing(path)]

    def _listing(self, path: str) -> list[tuple[str, str]]:
        node, _ = self._walk(path, True)
        if self._mode(node) != "d":
            raise _error(errno.ENOTDIR, path)
        return self._names(node)

    def open_regular(self, path: str):  # type: ignore[no-untyped-def]
        from ..fsprobe import NotRegular

        node, _ = self._walk(path, True)
        st = self._stat(node)
        if not _stat.S_ISREG(st.st_mode):
            if _stat.S_ISDIR(st.st_mode):
                raise NotRegular(errno.EISDIR, "Is a directory", path)
            raise NotRegular(0, "not a regular file", path)
        return self._open(node, st), st

    def executable(self, path: str) -> bool:
        try:
            return bool(self.stat(path).st_mode & 0o111)
        except OSError:
            return False

    def record(self) -> list[tuple[str, str, str]]:
        """What the verdict cache records for this view (fsprobe.Files.inside)."""
        return []

    # -- per kind -----------------------------------------------------------

    def _child_at(self, node: object, name: str, here: str) -> object | None:
        """The child ``name`` of ``node``, whose canonical path is ``here``
        (a mount point replaces what the image has there)."""
        return self._child(node, name)

    def _root(self) -> object:
        raise NotImplementedError

    def _child(self, node: object, name: str) -> object | None:
        raise NotImplementedError

    def _mode(self, node: object) -> str:
        raise NotImplementedError

    def _readlink(self, node: object) -> str:
        raise NotImplementedError

    def _stat(self, node: object):  # type: ignore[no-untyped-def]
        raise NotImplementedError

    def _names(self, node: object) -> list[tuple[str, str]]:
        raise NotImplementedError

    def _open(self, node: object, st: object):  # type: ignore[no-untyped-def]
        raise NotImplementedError

    def mounted(self, mounts: list[tuple[str, str]]) -> MountedView:
        """This view with host directories bind-mounted at inner paths."""
        return MountedView(self, mounts)


def _join(where: str, name: str, todo: list[str]) -> str:
    rest = [name, *reversed(todo)]
    return os.path.normpath(where.rstrip("/") + "/" + "/".join(rest))


class DirView(TreeView):
    """An unpacked root on this host (enroot's container directory, an OCI
    bundle's rootfs, a ``mmdebstrap`` tree): each name is an ``lstat`` of the
    real directory, links are read with ``readlink`` and resolved by the
    walk above, so a link to ``/lib/x`` reads ``ROOT/lib/x``.

    Nodes are host paths with no symlink in them below ``root``. The walk
    and the open are two steps: whoever can write the tree could swap a
    directory for a link between them and make the check read a host file,
    which is a file that user can read anyway (the check runs with the
    step's rights); the final open refuses a link (``O_NOFOLLOW``)."""

    def __init__(self, root: str, name: str | None = None) -> None:
        self.root = os.path.realpath(root)
        self.name = name or self.root
        try:  # a bind-mounted file (pyxis mounts the batch script) is a file
            kind = _kind_of(os.stat(self.root).st_mode)
        except (OSError, ValueError):
            kind = "d"
        self._modes: dict[str, str] = {self.root: kind}

    def _root(self) -> object:
        return self.root

    def _child(self, node: object, name: str) -> object | None:
        path = f"{node}/{name}" if node != "/" else f"/{name}"
        known = self._modes.get(path)
        if known is not None:
            return path
        try:
            st = os.lstat(path)
        except (OSError, ValueError):
            return None
        self._modes[path] = _kind_of(st.st_mode)
        return path

    def _mode(self, node: object) -> str:
        return self._modes.get(node, "o")  # type: ignore[call-overload, no-any-return]

    def _readlink(self, node: object) -> str:
        try:
            return os.readlink(node)  # type: ignore[arg-type]
        except OSError:
            return ""

    def _stat(self, node: object):  # type: ignore[no-untyped-def]
        return os.lstat(node)  # type: ignore[arg-type]

    def _names(self, node: object) -> list[tuple[str, str]]:
        out = []
        with os.scandir(node) as it:  # type: ignore[call-overload]
            for e in it:
                try:
                    kind = _kind_of(e.stat(follow_symlinks=False).st_mode)
                except OSError:
                    continue
                self._modes[e.path] = kind
                out.append((e.name, kind))
        return out

    def _open(self, node: object, st: object):  # type: ignore[no-untyped-def]
        from ..fsprobe import HostFile, NotRegular

        fd = os.open(node, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY  # type: ignore[call-overload]
                     | os.O_NOFOLLOW)
        if not _stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise NotRegular(0, "not a regular file", str(node))
        return HostFile(fd)

    def record(self) -> list[tuple[str, str, str]]:
        # An unpacked tree has no single identity a replay could check (any
        # file under it may change): a check in it never becomes a cache
        # entry. CHANGED is the answer no replay gives.
        from ..fsprobe import CHANGED

        return [("s", self.root, CHANGED)]


class MountedView(TreeView):
    """An image with host directories bind-mounted into it, as the runtime
    does (enroot's ``mounts.d`` and ``--container-mounts``, Apptainer's
    ``$HOME``/``--bind``, an OCI bundle's bind mounts): a path at or below a
    mount point is read in the host directory, everything else in the image.
    Links resolve in the container's whole tree: an absolute link in a
    mounted directory restarts at the image's root. Only the mounts the
    caller lists exist; nothing else of the host is visible.

    A check that reads a mounted directory cannot become a cache entry (it
    records :data:`~grace_policy.fsprobe.CHANGED` the first time it enters
    one): the tree has no identity a replay could check."""

    def __init__(self, base: TreeView, mounts: list[tuple[str, str]]) -> None:
        self.base = base
        self.name = base.name
        self.views: list[TreeView] = [base]
        self.points: dict[str, int] = {}
        for inner, host in mounts:
            point = os.path.normpath("/" + inner.lstrip("/"))
            if point == "/":
                continue  # the image's root is the image
            self.views.append(DirView(host))
            self.points[point] = len(self.views) - 1
        #: Directories leading to a mount point that the image lacks: the
        #: runtime creates them (enroot, Apptainer), empty but for the mounts.
        self.virtual = {os.path.dirname(p) for p in self.points}
        for p in list(self.virtual):
            while p not in ("/", ""):
                self.virtual.add(p)
                p = os.path.dirname(p)
        self.virtual.discard("/")
        self.entered: set[int] = set()
        #: The record of the check reading through this copy (:meth:`listen`).
        self.log: list[tuple[str, str, str]] | None = None

    def listen(self, log: list[tuple[str, str, str]] | None) -> MountedView:
        """This view writing into ``log`` (a check's record): a copy, so the
        record of one check never reaches another reading the same image."""
        bound = copy.copy(self)
        bound.log = log
        return bound

    @property
    def budget(self):  # type: ignore[no-untyped-def]
        """The budget the image was opened under (read-only)."""
        return getattr(self.base, "budget", None)

    def _root(self) -> object:
        return (0, self.base._root())

    def _child_at(self, node: object, name: str, here: str) -> object | None:
        index = self.points.get(here)
        if index is not None:
            if index not in self.entered:
                self.entered.add(index)
                if self.log is not None:
                    from ..fsprobe import CHANGED

                    self.log.append(("s", self.views[index].root, CHANGED))  # type: ignore[attr-defined]
            return (index, self.views[index]._root())
        vi, inner = node  # type: ignore[misc]
        child = self.views[vi]._child(inner, name) if vi >= 0 else None
        if child is None:
            return (-1, here) if here in self.virtual else None
        return (vi, child)

    def _mode(self, node: object) -> str:
        vi, inner = node  # type: ignore[misc]
        return "d" if vi < 0 else self.views[vi]._mode(inner)

    def _readlink(self, node: object) -> str:
        vi, inner = node  # type: ignore[misc]
        return "" if vi < 0 else self.views[vi]._readlink(inner)

    def _stat(self, node: object):  # type: ignore[no-untyped-def]
        vi, inner = node  # type: ignore[misc]
        if vi < 0:
            return Stat(_stat.S_IFDIR | 0o755, hash(inner) & 0xFFFFFFFF, 0, 0, 0)
        return self.views[vi]._stat(inner)

    def _names(self, node: object) -> list[tuple[str, str]]:
        vi, inner = node  # type: ignore[misc]
        return [] if vi < 0 else self.views[vi]._names(inner)

    def _open(self, node: object, st: object):  # type: ignore[no-untyped-def]
        vi, inner = node  # type: ignore[misc]
        return self.views[vi]._open(inner, st)

    def _listing(self, path: str) -> list[tuple[str, str]]:
        node, canonical = self._walk(path, True)
        if self._mode(node) != "d":
            raise _error(errno.ENOTDIR, path)
        names = dict(self._names(node))
        base = canonical.rstrip("/")
        for point in self.points:
            parent, _, leaf = point.rpartition("/")
            if (parent or "/") == (base or "/"):
                names[leaf] = "d"
        return list(names.items())

    def record(self) -> list[tuple[str, str, str]]:
        self.entered.clear()  # a new check: entering a mount is noted again
        return self.base.record()

    def close(self) -> None:
        close = getattr(self.base, "close", None)
        if close is not None:
            close()


# -- small files and identities, for every kind of image ---------------------

#: Largest config.json / environment file read (a real one is a few KiB).
MAX_CONFIG_BYTES = 1 << 20
MAX_ENV_BYTES = 64 * 1024
MAX_ENV_VARS = 4096


def identity(st: os.stat_result) -> str:
    """An image file's identity: its content cannot change without one of
    these changing (what the verdict cache keys a container step on)."""
    return f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"


def read_view_file(view: TreeView, path: str, limit: int) -> bytes | None:
    """At most ``limit`` bytes of a regular file in ``view``; None if absent
    or unreadable (links resolve in the view)."""
    try:
        fh, st = view.open_regular(path)
    except OSError:
        return None
    try:
        return fh.pread(min(st.st_size, limit), 0)  # type: ignore[no-any-return]
    except OSError:
        return None
    finally:
        fh.close()


def environment_file(view: TreeView, path: str = "/etc/environment"
                     ) -> tuple[tuple[str, str], ...]:
    """``KEY=VALUE`` lines (``export`` and one level of quotes allowed), as
    enroot sets them for the container's process; comments and anything
    else ignored."""
    data = read_view_file(view, path, MAX_ENV_BYTES)
    if not data:
        return ()
    return parse_env_lines(data.decode("utf-8", "surrogateescape"))


def parse_env_lines(text: str) -> tuple[tuple[str, str], ...]:
    out: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("export "):
            line = line[7:].lstrip()
        name, eq, value = line.partition("=")
        if not eq or not name or not (name[0].isalpha() or name[0] == "_") or not all(
                c.isalnum() or c == "_" for c in name):
            continue
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        out[name] = value
        if len(out) >= MAX_ENV_VARS:
            break
    return tuple(out.items())
