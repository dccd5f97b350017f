"""Which recorded filesystem answers no user of the node can change.

A verdict-cache entry may be shared by every user of a node (a node-wide
entry) only when nothing it depends on belongs to a user: every file it
recorded is root's and stays root's, and every directory on the way to it
(each ancestor, and the targets of every symlink met while resolving) is
one no user can add to, remove from or rename in. Then no user can make a
recorded answer false or true for someone else, and every non-root user
gets the same answers: the files give group and others the same rights
(no POSIX ACL), so a user's groups cannot change what the check could read.

This is asked once, by the check that writes the entry (as the job's user,
which needs no rights beyond the stats the check made). Later changes are
the replay's business: a changed mode or ACL of a recorded file changes its
ctime (a miss), and a directory that stops being searchable makes the
replaying user's stat fail (a miss).
"""

from __future__ import annotations

import os
import stat

#: Symlinks followed while resolving one path (the kernel's limit).
_MAX_LINKS = 40
_ACL = "system.posix_acl_access"


def _same_for_all(mode: int, need: int) -> bool:
    """Group and others get the same ``r``/``x`` rights, and at least
    ``need`` (so which groups a user has changes nothing)."""
    group, other = (mode >> 3) & 5, mode & 5
    return group == other and other & need == need


def _has_acl(path: str) -> bool:
    try:
        os.getxattr(path, _ACL, follow_symlinks=False)
    except OSError:
        return False  # ENODATA (none), or a filesystem without ACLs
    return True


class NodeOwned:
    """Answers "can any user change this answer?" for many paths, with the
    directories seen once (memo per instance: one entry's worth)."""

    def __init__(self) -> None:
        self._lstat: dict[str, os.stat_result | int] = {}
        self._acl: dict[str, bool] = {}
        self._dirs: dict[tuple[str, ...], tuple[bool, object]] = {}

    def _lst(self, path: str) -> os.stat_result | int:
        got = self._lstat.get(path)
        if got is None:
            try:
                got = os.lstat(path)
            except OSError as exc:
                got = exc.errno or -1
            except ValueError:
                got = -1
            self._lstat[path] = got
        return got

    def _no_acl(self, path: str) -> bool:
        if path not in self._acl:
            self._acl[path] = not _has_acl(path)
        return self._acl[path]

    def _dir_closed(self, path: str, st: os.stat_result) -> bool:
        """A root directory nobody else can write (entries fixed)."""
        return (stat.S_ISDIR(st.st_mode) and st.st_uid == 0 and not st.st_mode & 0o022
                and _same_for_all(st.st_mode, 1) and self._no_acl(path))

    def _dir_keeps(self, path: str, st: os.stat_result, child: os.stat_result | None) -> bool:
        """Whether no user can replace ``child`` (None: create it) here:
        a closed directory, or a sticky root one (``/tmp``) for an entry of
        root's, which only root may rename or remove."""
        if self._dir_closed(path, st):
            return True
        return (child is not None and stat.S_ISDIR(st.st_mode) and st.st_uid == 0
                and bool(st.st_mode & stat.S_ISVTX) and child.st_uid == 0
                and _same_for_all(st.st_mode, 1) and self._no_acl(path))

    def _walk(self, path: str, follow_last: bool) -> tuple[str, os.stat_result | None] | None:
        """Resolve ``path`` one component at a time; None as soon as a user
        could change the outcome. Else (real path, its lstat or None when
        absent, which then no user can create).

        An entry records a few hundred paths in a few dozen directories:
        the directory part is resolved once (:meth:`_dir_state`), then the
        last component."""
        root = self._lst("/")
        if isinstance(root, int) or not self._dir_closed("/", root):
            return None
        parts = tuple(p for p in path.split("/") if p)
        if not parts:
            return "/", root
        done, state = self._dir_state(parts[:-1], root)
        if done:
            return state  # type: ignore[return-value]
        done, state = self._resolve(state, [parts[-1]], follow_last)  # type: ignore[arg-type]
        if done:
            return state  # type: ignore[return-value]
        return state[0], state[1]  # type: ignore[index]

    def _dir_state(self, parts: tuple[str, ...], root: os.stat_result) -> tuple[bool, object]:
        """Where resolving the leading components ``parts`` of a longer path
        gets to: ``(True, answer)`` when the walk ends there whatever
        follows (a user could change it, or a name is absent for good),
        else ``(False, (real path, lstat, symlinks followed))``. Components
        before the last are always followed, so this is one walk per
        directory for every path below it."""
        if not parts:
            return False, ("/", root, 0)
        got = self._dirs.get(parts)
        if got is None:
            done, state = self._dir_state(parts[:-1], root)
            got = (done, state) if done else self._resolve(state, [parts[-1]], True)  # type: ignore[arg-type]
            self._dirs[parts] = got
        return got

    def _resolve(self, state: tuple[str, os.stat_result, int], pending: list[str],
                 follow_last: bool) -> tuple[bool, object]:
        """Walk ``pending`` from ``state`` (as :meth:`_dir_state` returns it)."""
        current, cur_st, links = state
        root = self._lst("/")
        while pending:
            part = pending.pop(0)
            if part == ".":
                continue
            if part == "..":
                current = os.path.dirname(current) or "/"
                got = self._lst(current)
                if isinstance(got, int):
                    return True, None
                cur_st = got
                continue
            if not stat.S_ISDIR(cur_st.st_mode):
                # ENOTDIR below a root file in a kept directory: absent for good
                return True, ((current, None) if cur_st.st_uid == 0 else None)
            child = current.rstrip("/") + "/" + part
            got = self._lst(child)
            if isinstance(got, int):
                if got not in (2, 20) or not self._dir_closed(current, cur_st):
                    return True, None  # EACCES & co, or a directory users may add to
                return True, (child, None)
            if not self._dir_keeps(current, cur_st, got):
                return True, None
            if stat.S_ISLNK(got.st_mode) and (pending or follow_last):
                links += 1
                if links > _MAX_LINKS:
                    return True, None
                try:
                    target = os.readlink(child)
                except OSError:
                    return True, None
                pending = [p for p in target.split("/") if p] + pending
                if target.startswith("/"):
                    current, cur_st = "/", root  # type: ignore[assignment]
                continue
            current, cur_st = child, got
        return False, (current, cur_st, links)

    def owned(self, op: str, path: str, answer: str) -> bool:
        """Whether no user can change the answer to ``op`` on ``path``."""
        if not path.startswith("/") or answer.startswith("e"):
            return False  # errors (EACCES, a file that changed) depend on who asks
        walked = self._walk(path, follow_last=op != "l")
        if walked is None:
            return False
        real, st = walked
        if st is None:
            return True
        if stat.S_ISLNK(st.st_mode):
            return True  # an "l" question about a link in a kept directory
        if st.st_uid != 0 or st.st_mode & 0o022 or not self._no_acl(real):
            return False
        if stat.S_ISDIR(st.st_mode):
            return _same_for_all(st.st_mode, 5)
        if stat.S_ISREG(st.st_mode):
            return _same_for_all(st.st_mode, 4)
        return False  # devices, FIFOs: not something a verdict should rest on

    def all_owned(self, probes: list[tuple[str, str, str]]) -> bool:
        return all(self.owned(op, path, answer) for op, path, answer in probes)
