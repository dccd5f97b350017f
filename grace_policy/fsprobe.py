"""Every filesystem question a check asks, with the answer it got.

A verdict depends only on the step's inputs (argv[0], cwd, a few environment
variables, the config) and on what the filesystem answered. While a check
runs, each stat, existence test and realpath goes through this module and is
written down. When every recorded question gets the same answer again, the
check would reach the same verdict, so the plugin's C side can reuse a clean
verdict without starting Python (``spank/grace_cache.c`` asks the questions
again, with the user's rights, before trusting an entry).

The record keeps, per path, ``kind`` and for regular files the identity
(device, inode, size, mtime_ns, ctime_ns, mode): a file's content cannot
change without its mtime or ctime changing.

It is also the one gateway to the files a check reads: every reader (launch,
ELF, loader, ld.so.cache, Python paths, page code) stats, lists, opens and
reads through here, so one switch, :class:`using`, points a whole check at
another filesystem: an unpacked image root or an image file read without
mounting (:mod:`grace_policy.image`). Without a view (``None``, the host) each
call is the plain ``os`` call it always was, plus one global test. Inside a
view, paths are paths *in* the view, symlinks resolve inside it, and nothing
falls back to the host; the record then holds the image's identity (see
:meth:`using.__enter__`), never inner paths the C side could not replay.
"""

from __future__ import annotations

import os
import stat as _stat

#: The questions of the check in progress, or None when nobody listens.
_log: list[tuple[str, str, str]] | None = None

#: The filesystem the check reads: None for this host (the fast path), else a
#: view object (:class:`grace_policy.image.view.View`).
_view = None  # type: ignore[var-annotated]


def recording() -> list[tuple[str, str, str]] | None:
    """The record of the check in progress (appended to as it reads), or
    None when nobody listens; :class:`grace_policy.context.StepContext`
    carries it."""
    return _log


def current_view():  # type: ignore[no-untyped-def]
    """The view in use, or None for the host."""
    return _view


class using:
    """Point every question of the check at ``view`` (None: the host) until
    the block ends. On entry the view writes its own identity into the record
    (``view.record()``: the image file's stat, which the C side can replay, or
    :data:`CHANGED` for a view no replay can vouch for): inner paths are never
    recorded."""

    def __init__(self, view) -> None:  # type: ignore[no-untyped-def]
        self.view = view
        self.before = None

    def __enter__(self):  # type: ignore[no-untyped-def]
        global _view
        self.before = _view
        _view = self.view
        if self.view is not None and _log is not None:
            _log.extend(self.view.record())
        return self.view

    def __exit__(self, *exc: object) -> None:
        global _view
        _view = self.before


def start() -> None:
    global _log
    _log = []


#: An answer no replay can give: the file changed while the check ran.
CHANGED = "e-1"


def stop() -> list[tuple[str, str, str]]:
    """The questions asked since :func:`start`, in order, without repeats. A
    question that got two different answers during the check (the file
    changed under it) gets :data:`CHANGED`, so the record never matches."""
    global _log
    out, _log = _log or [], None
    first: dict[tuple[str, str], str] = {}
    for op, path, answer in out:
        known = first.setdefault((op, path), answer)
        if known != answer:
            first[(op, path)] = CHANGED
    return [(op, path, answer) for (op, path), answer in first.items()]


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


def note(path: str, st: os.stat_result | None, err: int = 0, op: str = "s") -> None:
    if _log is not None:
        _log.append((op, path, signature(st, err)))


def stat(path: str) -> os.stat_result:
    """``os.stat`` that is written down; raises OSError like it."""
    if _view is not None:
        return _view.stat(path)  # type: ignore[no-any-return]
    try:
        st = os.stat(path)
    except OSError as exc:
        note(path, None, exc.errno or 0)
        raise
    except ValueError:  # NUL in the path: no file can have that name
        note(path, None, 2)
        raise FileNotFoundError(2, "No such file or directory", path) from None
    note(path, st)
    return st


def _try(path: str) -> os.stat_result | None:
    try:
        return stat(path)
    except OSError:
        return None


def isdir(path: str) -> bool:
    st = _try(path)
    return st is not None and _stat.S_ISDIR(st.st_mode)


def isfile(path: str) -> bool:
    st = _try(path)
    return st is not None and _stat.S_ISREG(st.st_mode)


def exists(path: str) -> bool:
    return _try(path) is not None


def lstat(path: str) -> os.stat_result:
    """``os.lstat`` (in the view); recorded like :func:`lexists`."""
    if _view is not None:
        return _view.lstat(path)  # type: ignore[no-any-return]
    try:
        st = os.lstat(path)
    except OSError as exc:
        note(path, None, exc.errno or 0, "l")
        raise
    except ValueError:
        note(path, None, 2, "l")
        raise FileNotFoundError(2, "No such file or directory", path) from None
    if _log is not None:
        _log.append(("l", path, "L" if _stat.S_ISLNK(st.st_mode) else signature(st)))
    return st


def lexists(path: str) -> bool:
    if _view is not None:
        try:
            _view.lstat(path)
        except OSError:
            return False
        return True
    try:
        st = os.lstat(path)
    except OSError as exc:
        note(path, None, exc.errno or 0, "l")
        return False
    except ValueError:
        note(path, None, 2, "l")
        return False
    if _log is not None:
        _log.append(("l", path, "L" if _stat.S_ISLNK(st.st_mode) else signature(st)))
    return True


def _listed(path: str, read):  # type: ignore[no-untyped-def]
    """``read(path)`` recorded with the directory's identity. The identity
    is taken before and after the read: a directory swapped under the name
    in between (or changed: a rename back moves its ctime) was not the one
    recorded, so the record gets :data:`CHANGED` and never replays."""
    try:
        st = os.stat(path)
        result = read(path)
        after = os.stat(path) if _log is not None else st
    except OSError as exc:
        note(path, None, exc.errno or 0, "D")
        raise
    except ValueError:  # NUL in the path
        note(path, None, 2, "D")
        raise FileNotFoundError(2, "No such file or directory", path) from None
    if _log is not None:
        answer = dir_signature(st)
        _log.append(("D", path, answer if dir_signature(after) == answer else CHANGED))
    return result


def listdir(path: str) -> list[str]:
    """``os.listdir`` that is written down with the directory's identity and
    times: an entry added, removed or renamed changes the directory's mtime
    and ctime, so a replay notices a package installed after the verdict.
    Raises OSError like ``os.listdir``."""
    if _view is not None:
        return _view.listdir(path)  # type: ignore[no-any-return]
    return _listed(path, os.listdir)  # type: ignore[no-any-return]


def _scan(path: str) -> list[os.DirEntry[str]]:
    with os.scandir(path) as it:
        return list(it)


def scandir(path: str) -> list[os.DirEntry[str]]:
    """``os.scandir`` (entry types without a stat each), written down like
    :func:`listdir`. Raises OSError like it. In a view the entries are
    :class:`grace_policy.image.view.Entry` (``name``, ``path``, ``is_dir()``,
    ``is_file()``, ``is_symlink()``)."""
    if _view is not None:
        return _view.scandir(path)  # type: ignore[no-any-return]
    return _listed(path, _scan)  # type: ignore[no-any-return]


def dir_signature(st: os.stat_result) -> str:
    """The answer of a "D" question (keep in step with grace_cache.c)."""
    if not _stat.S_ISDIR(st.st_mode):
        return signature(st)
    return f"D{st.st_dev}:{st.st_ino}:{st.st_mtime_ns}:{st.st_ctime_ns}"


def note_input(name: str, value: str | None) -> None:
    """A step input the check read beyond the fixed ones (the arguments of a
    Python step: ``argc``, ``argv:N``): a cached verdict must depend on it."""
    if _log is not None:
        _log.append(("i", name, "-" if value is None else "=" + value))


def note_env(name: str, value: str | None) -> None:
    """An environment variable the check read beyond the fixed inputs
    (``env -S '${VAR}'``): a cached verdict must depend on it too."""
    if _log is not None:
        _log.append(("v", name, "-" if value is None else "=" + value))


def realpath(path: str) -> str:
    if _view is not None:
        return _view.realpath(path)  # type: ignore[no-any-return]
    result = os.path.realpath(path)
    if _log is not None:
        _log.append(("r", path, result))
    return result


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


def open_regular(path: str):  # type: ignore[no-untyped-def]
    """``(file, stat)`` for a regular file: ``file.pread(length, offset)``,
    ``file.close()``. Raises :class:`NotRegular` for anything else and
    OSError when it cannot be opened.

    On the host: ``stat`` first, so FIFOs, sockets and device nodes are
    refused before any ``open`` (opening some devices has side effects, e.g.
    a watchdog); then ``O_NONBLOCK`` and an ``fstat`` of what was actually
    opened cover a swap between the two calls."""
    if _view is not None:
        return _view.open_regular(path)
    before = stat(path)
    if not _stat.S_ISREG(before.st_mode):
        raise NotRegular(0, "not a regular file", path)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    try:
        st = os.fstat(fd)
        if not _stat.S_ISREG(st.st_mode):
            raise NotRegular(0, "not a regular file", path)
        if (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_mode) != (
                before.st_dev, before.st_ino, before.st_size, before.st_mtime_ns,
                before.st_ctime_ns, before.st_mode):
            # Swapped between the stat and the open: what we read is not what
            # the record says. This check's verdict may stand, but it must
            # never become a cache entry (an answer no replay can give).
            note(path, None, -1)
    except BaseException:
        os.close(fd)
        raise
    return HostFile(fd), st


def read_file(path: str, limit: int) -> bytes:
    """At most ``limit`` bytes from the start of regular file ``path``
    (recorded by its identity). Raises OSError."""
    fh, st = open_regular(path)
    try:
        return fh.pread(min(st.st_size, limit), 0)  # type: ignore[no-any-return]
    finally:
        fh.close()


def executable(path: str) -> bool:
    """``access(path, X_OK)`` as the step's user: on the host the kernel's
    answer; in a view, the file's execute bits (the container's user is
    whoever the image maps the job's user to)."""
    if _view is not None:
        return _view.executable(path)  # type: ignore[no-any-return]
    return os.access(path, os.X_OK)


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
