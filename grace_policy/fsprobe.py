"""Every filesystem question a check asks, with the answer it got.

A verdict depends only on the step's inputs (argv[0], cwd, a few environment
variables, the config) and on what the filesystem answered. While a check
runs, each stat, existence test and realpath goes through its :class:`Files`
and is written down in that object's record. When every recorded question
gets the same answer again, the check would reach the same verdict, so the
plugin's C side can reuse a clean verdict without starting Python
(``spank/grace_cache.c`` asks the questions again, with the user's rights,
before trusting an entry).

The record keeps, per path, ``kind`` and for regular files the identity
(device, inode, size, mtime_ns, ctime_ns, mode): a file's content cannot
change without its mtime or ctime changing.

A :class:`Files` is also the one gateway to the files a check reads: every
reader (launch, ELF, loader, ld.so.cache, Python paths, page code) stats,
lists, opens and reads through the one it is handed, as auditwheel's
``ldd(path, root=...)`` takes its root. Each entry (the bridge, ``decide``,
the CLI, the batch judge) makes one and passes it down in the records that
already travel (:class:`~grace_policy.check.CheckInput`,
:class:`~grace_policy.context.StepContext`, :class:`~grace_policy.loader.Loading`,
:class:`~grace_policy.python.finder.Scope`); nothing here is module state
(``tests/test_signatures.py`` holds the package to that). Judging an image
is a new object, ``files.inside(image.view)``: paths are then paths *in*
the view, symlinks resolve inside it, and nothing falls back to the host;
the record holds the image's identity (:meth:`Files.inside`), never inner
paths the C side could not replay. Without a view (the host) each call is
the plain ``os`` call it always was, plus one attribute test.
"""

from __future__ import annotations

import os
import stat as _stat

#: An answer no replay can give: the file changed while the check ran.
CHANGED = "e-1"


class Files:
    """The files one check reads, and the record of what it asked.

    ``view``: None for this host (each call is the plain ``os`` call plus
    the record), else an image's view (:mod:`grace_policy.image.view`):
    paths are paths *in* it, symlinks resolve inside it, nothing falls back
    to the host. ``log``: the record the verdict cache keys on (None: nobody
    listens). One instance is made where a check starts and travels in its
    records (:class:`~grace_policy.context.StepContext`,
    :class:`~grace_policy.loader.Loading`, :class:`~grace_policy.python.finder.Scope`);
    judging an image is a new instance (:meth:`inside`), never a swap
    another reader could see."""

    __slots__ = ("log", "view")

    def __init__(self, view=None,  # type: ignore[no-untyped-def]
                 log: list[tuple[str, str, str]] | None = None) -> None:
        self.view = view
        self.log = log

    @classmethod
    def recorded(cls) -> Files:
        """This host's files, every question written down."""
        return cls(None, [])

    def inside(self, view) -> Files:  # type: ignore[no-untyped-def]
        """The same record, reading ``view`` (None: the host). On entry the
        view writes its own identity into the record (``view.record()``: the
        image file's stat, which the C side can replay, or :data:`CHANGED`
        for a view no replay can vouch for): inner paths are never
        recorded."""
        if view is not None and self.log is not None:
            self.log.extend(view.record())
            if hasattr(view, "listen"):  # a view that writes down what it enters
                view = view.listen(self.log)
        return Files(view, self.log)

    def host(self) -> Files:
        """This host's files, written into the same record (enroot's own
        configuration, read whatever the step's image is)."""
        return self if self.view is None else Files(None, self.log)

    def records(self) -> list[tuple[str, str, str]]:
        """The questions asked, in order, without repeats. A question that
        got two different answers during the check (the file changed under
        it) gets :data:`CHANGED`, so the record never matches."""
        first: dict[tuple[str, str], str] = {}
        for op, path, answer in self.log or ():
            known = first.setdefault((op, path), answer)
            if known != answer:
                first[(op, path)] = CHANGED
        return [(op, path, answer) for (op, path), answer in first.items()]

    def note(self, path: str, st: os.stat_result | None, err: int = 0, op: str = "s") -> None:
        if self.log is not None:
            self.log.append((op, path, signature(st, err)))

    def stat(self, path: str) -> os.stat_result:
        """``os.stat`` that is written down; raises OSError like it."""
        if self.view is not None:
            return self.view.stat(path)  # type: ignore[no-any-return]
        try:
            st = os.stat(path)
        except OSError as exc:
            self.note(path, None, exc.errno or 0)
            raise
        except ValueError:  # NUL in the path: no file can have that name
            self.note(path, None, 2)
            raise FileNotFoundError(2, "No such file or directory", path) from None
        if self.log is not None:
            self.log.append(("s", path, signature(st)))
        return st

    def _try(self, path: str) -> os.stat_result | None:
        try:
            return self.stat(path)
        except OSError:
            return None

    def isdir(self, path: str) -> bool:
        st = self._try(path)
        return st is not None and _stat.S_ISDIR(st.st_mode)

    def isfile(self, path: str) -> bool:
        st = self._try(path)
        return st is not None and _stat.S_ISREG(st.st_mode)

    def exists(self, path: str) -> bool:
        return self._try(path) is not None

    def lstat(self, path: str) -> os.stat_result:
        """``os.lstat`` (in the view); recorded like :meth:`lexists`."""
        if self.view is not None:
            return self.view.lstat(path)  # type: ignore[no-any-return]
        try:
            st = os.lstat(path)
        except OSError as exc:
            self.note(path, None, exc.errno or 0, "l")
            raise
        except ValueError:
            self.note(path, None, 2, "l")
            raise FileNotFoundError(2, "No such file or directory", path) from None
        if self.log is not None:
            self.log.append(("l", path, "L" if _stat.S_ISLNK(st.st_mode) else signature(st)))
        return st

    def lexists(self, path: str) -> bool:
        if self.view is not None:
            try:
                self.view.lstat(path)
            except OSError:
                return False
            return True
        try:
            st = os.lstat(path)
        except OSError as exc:
            self.note(path, None, exc.errno or 0, "l")
            return False
        except ValueError:
            self.note(path, None, 2, "l")
            return False
        if self.log is not None:
            self.log.append(("l", path, "L" if _stat.S_ISLNK(st.st_mode) else signature(st)))
        return True

    def _listed(self, path: str, read):  # type: ignore[no-untyped-def]
        """``read(path)`` recorded with the directory's identity. The
        identity is taken before and after the read: a directory swapped
        under the name in between (or changed: a rename back moves its
        ctime) was not the one recorded, so the record gets :data:`CHANGED`
        and never replays."""
        log = self.log
        try:
            st = os.stat(path)
            result = read(path)
            after = os.stat(path) if log is not None else st
        except OSError as exc:
            self.note(path, None, exc.errno or 0, "D")
            raise
        except ValueError:  # NUL in the path
            self.note(path, None, 2, "D")
            raise FileNotFoundError(2, "No such file or directory", path) from None
        if log is not None:
            answer = dir_signature(st)
            log.append(("D", path, answer if dir_signature(after) == answer else CHANGED))
        return result

    def listdir(self, path: str) -> list[str]:
        """``os.listdir`` that is written down with the directory's identity
        and times: an entry added, removed or renamed changes the
        directory's mtime and ctime, so a replay notices a package installed
        after the verdict. Raises OSError like ``os.listdir``."""
        if self.view is not None:
            return self.view.listdir(path)  # type: ignore[no-any-return]
        return self._listed(path, os.listdir)  # type: ignore[no-any-return]

    def scandir(self, path: str) -> list[os.DirEntry[str]]:
        """``os.scandir`` (entry types without a stat each), written down
        like :meth:`listdir`. Raises OSError like it. In a view the entries
        are :class:`grace_policy.image.view.Entry` (``name``, ``path``,
        ``is_dir()``, ``is_file()``, ``is_symlink()``)."""
        if self.view is not None:
            return self.view.scandir(path)  # type: ignore[no-any-return]
        return self._listed(path, _scan)  # type: ignore[no-any-return]

    def note_input(self, name: str, value: str | None) -> None:
        """A step input the check read beyond the fixed ones (the arguments
        of a Python step: ``argc``, ``argv:N``): a cached verdict must
        depend on it."""
        if self.log is not None:
            self.log.append(("i", name, "-" if value is None else "=" + value))

    def note_env(self, name: str, value: str | None) -> None:
        """An environment variable the check read beyond the fixed inputs
        (``env -S '${VAR}'``): a cached verdict must depend on it too."""
        if self.log is not None:
            self.log.append(("v", name, "-" if value is None else "=" + value))

    def realpath(self, path: str) -> str:
        if self.view is not None:
            return self.view.realpath(path)  # type: ignore[no-any-return]
        result = os.path.realpath(path)
        if self.log is not None:
            self.log.append(("r", path, result))
        return result

    def open_regular(self, path: str):  # type: ignore[no-untyped-def]
        """``(file, stat)`` for a regular file: ``file.pread(length,
        offset)``, ``file.close()``. Raises :class:`NotRegular` for anything
        else and OSError when it cannot be opened.

        On the host: ``stat`` first, so FIFOs, sockets and device nodes are
        refused before any ``open`` (opening some devices has side effects,
        e.g. a watchdog); then ``O_NONBLOCK`` and an ``fstat`` of what was
        actually opened cover a swap between the two calls."""
        if self.view is not None:
            return self.view.open_regular(path)
        before = self.stat(path)
        if not _stat.S_ISREG(before.st_mode):
            raise NotRegular(0, "not a regular file", path)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
        try:
            st = os.fstat(fd)
            if not _stat.S_ISREG(st.st_mode):
                raise NotRegular(0, "not a regular file", path)
            if (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns,
                    st.st_mode) != (before.st_dev, before.st_ino, before.st_size,
                                    before.st_mtime_ns, before.st_ctime_ns, before.st_mode):
                # Swapped between the stat and the open: what we read is not
                # what the record says. This check's verdict may stand, but
                # it must never become a cache entry (an answer no replay
                # can give).
                self.note(path, None, -1)
        except BaseException:
            os.close(fd)
            raise
        return HostFile(fd), st

    def read_file(self, path: str, limit: int) -> bytes:
        """At most ``limit`` bytes from the start of regular file ``path``
        (recorded by its identity). Raises OSError."""
        fh, st = self.open_regular(path)
        try:
            return fh.pread(min(st.st_size, limit), 0)  # type: ignore[no-any-return]
        finally:
            fh.close()

    def executable(self, path: str) -> bool:
        """``access(path, X_OK)`` as the step's user: on the host the
        kernel's answer; in a view, the file's execute bits (the
        container's user is whoever the image maps the job's user to)."""
        if self.view is not None:
            return self.view.executable(path)  # type: ignore[no-any-return]
        return os.access(path, os.X_OK)


#: This host's files, nothing written down: the default of tools and tests
#: that keep no record (immutable: it has no log to append to).
HOST = Files()


def _scan(path: str) -> list[os.DirEntry[str]]:
    with os.scandir(path) as it:
        return list(it)


def signature(st: os.stat_result | None, err: int = 0) -> str:
    """The answer the C side recomputes (keep in step with grace_cache.c)."""
    if st is None:
        return "n" if err in (2, 20) else f"e{err}"
    fmt = _stat.S_IFMT(st.st_mode)
    if fmt == _stat.S_IFDIR:
        return "d"
    if fmt == _stat.S_IFREG:
        return (f"f{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}:"
                f"{st.st_mode & 0o7777:o}")
    return f"o{fmt:o}"


def dir_signature(st: os.stat_result) -> str:
    """The answer of a "D" question (keep in step with grace_cache.c)."""
    if not _stat.S_ISDIR(st.st_mode):
        return signature(st)
    return f"D{st.st_dev}:{st.st_ino}:{st.st_mtime_ns}:{st.st_ctime_ns}"


class HostFile:
    """An open regular file of this host: positional reads on its fd."""

    __slots__ = ("fd",)

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def pread(self, length: int, offset: int) -> bytes:
        return os.pread(self.fd, length, offset)

    def close(self) -> None:
        os.close(self.fd)


class NotRegular(OSError):
    """The path names something other than a regular file (a FIFO, a device,
    a directory): never opened, so nothing can block or have side effects."""


def encode(text: str) -> str:
    """Percent-encode every byte outside printable ASCII (and ``%``) so a
    record is one line of tokens whatever the path holds."""
    if text.isascii() and text.isprintable() and " " not in text and "%" not in text:
        # The common case (every byte in 0x21-0x7E, no "%"): nothing to
        # escape. An entry encodes a few hundred paths; this skips the
        # per-byte loop for all of them.
        return text
    raw = os.fsencode(text)
    return "".join(chr(b) if 0x21 <= b <= 0x7E and b != 0x25 else f"%{b:02X}" for b in raw)


def answer(op: str, path: str) -> str:
    """Ask one recorded question again (what the C side does, for tests and
    for ``grace-policy`` itself)."""
    if op == "r":
        return os.path.realpath(path)
    if op == "D":
        try:
            return dir_signature(os.stat(path))
        except OSError as exc:
            return signature(None, exc.errno or 0)
        except ValueError:
            return signature(None, 2)
    try:
        st = os.lstat(path) if op == "l" else os.stat(path)
    except OSError as exc:
        return signature(None, exc.errno or 0)
    except ValueError:
        return signature(None, 2)
    if op == "l" and _stat.S_ISLNK(st.st_mode):
        return "L"
    return signature(st)


#: Records of the step's inputs (``note_input``/``note_env``), not of files:
#: only the step itself can answer them again (the cache lookup does).
INPUT_OPS = ("i", "v")


def still_true(records: list[tuple[str, str, str]]) -> bool:
    """Whether every recorded file question has the same answer now."""
    return all(answer(op, path) == ans for op, path, ans in records if op not in INPUT_OPS)

