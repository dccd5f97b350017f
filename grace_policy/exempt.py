"""Which findings the admin's exemptions release, for whom, until when.

An exemption (``[[rules.RULE.exempt]]``) names files (globs), users and/or
groups, every one given having to match, and a last day. What it is matched
against comes only from what a user cannot choose inside slurmstepd:

* the uid is Slurm's (``S_JOB_UID``), names come from the node's NSS;
* the groups are the credentials the check runs with (Slurm set them from
  the job's credential before dropping privileges), not the environment;
* a path matches only if neither the file nor any directory above it,
  followed as the loader would (real path) and as written, is writable by
  the job's user: a user who could put a file at an exempted path could
  otherwise exempt their own build by copying it there.

Accounts are not selectors: on Slurm 22.05 the step's ``SLURM_JOB_ACCOUNT``
is whatever the user exported (config.py refuses them and says so).

An exempted finding is kept on the verdict (``Verdict.exempted``) for the
audit line, and such a verdict is never a verdict-cache entry: a replayed
clean allow would outlive the exemption's last day.

Globs: ``*`` and ``?`` stay within one path component, ``**`` spans any
number of them; no other character is special. Written here instead of
``fnmatch`` because that imports ``re`` and lets ``*`` cross ``/``.
"""

from __future__ import annotations

import os
import stat
import time

from ._record import dataclass, field

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from .findings import Finding
    from .policy import Exemption, Policy


@dataclass(frozen=True)
class Who:
    """The job's user as slurmstepd established it."""

    uid: int
    #: egid and supplementary gids the check runs with.
    gids: tuple[int, ...] = ()
    _names: dict = field(default_factory=dict, compare=False)

    @classmethod
    def current(cls, uid: int | None = None) -> Who:
        """The credentials this process runs with (the step's, inside slurmstepd)."""
        gids = (os.getegid(), *os.getgroups())
        return cls(uid=os.geteuid() if uid is None else uid,
                   gids=tuple(dict.fromkeys(gids)))

    def user_names(self) -> tuple[str, ...]:
        got = self._names.get("user")
        if got is None:
            got = (str(self.uid),)
            try:
                import pwd

                got = (pwd.getpwuid(self.uid).pw_name, *got)
            except (KeyError, OSError, ImportError, OverflowError):
                pass
            self._names["user"] = got
        return got

    def group_names(self) -> tuple[str, ...]:
        got = self._names.get("groups")
        if got is None:
            names: list[str] = []
            try:
                import grp
            except ImportError:
                grp = None  # type: ignore[assignment]
            for gid in self.gids:
                names.append(str(gid))
                if grp is not None:
                    try:
                        names.append(grp.getgrgid(gid).gr_name)
                    except (KeyError, OSError, OverflowError):
                        pass
            got = tuple(names)
            self._names["groups"] = got
        return got


@dataclass(frozen=True)
class Exempted:
    """A finding an exemption released: what the audit line records."""

    rule: str
    path: str
    reason: str
    until: str
    where: str

    def to_json(self) -> dict[str, str]:
        return {"rule": self.rule, "path": self.path, "reason": self.reason,
                "until": self.until, "where": self.where}


def today_utc(now: float | None = None) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(time.time() if now is None else now))


def glob_match(pattern: str, path: str) -> bool:
    """``pattern`` against ``path``, component-wise (see the module text)."""
    stars, marks = pattern.find("*"), pattern.find("?")
    cut = min(i for i in (stars, marks, len(pattern)) if i >= 0)
    if not path.startswith(pattern[:cut]):
        return False  # the literal prefix decides most non-matches at once
    if cut == len(pattern):
        return path == pattern
    return _match_parts(pattern.split("/"), path.split("/"))


def _match_parts(pat: Sequence[str], parts: Sequence[str]) -> bool:
    # Iterative over components with backtracking only at "**": bounded by
    # len(pat) * len(parts) (both path-length sized).
    memo: dict[tuple[int, int], bool] = {}

    def go(i: int, j: int) -> bool:
        key = (i, j)
        if key in memo:
            return memo[key]
        if i == len(pat):
            result = j == len(parts)
        elif pat[i] == "**":
            result = any(go(i + 1, k) for k in range(j, len(parts) + 1))
        elif j == len(parts):
            result = False
        else:
            result = _match_word(pat[i], parts[j]) and go(i + 1, j + 1)
        memo[key] = result
        return result

    return go(0, 0)


def _match_word(pat: str, word: str) -> bool:
    """``*`` and ``?`` within one component (classic two-pointer match)."""
    p = w = 0
    star = -1
    mark = 0
    while w < len(word):
        if p < len(pat) and (pat[p] == "?" or pat[p] == word[w]):
            p += 1
            w += 1
        elif p < len(pat) and pat[p] == "*":
            star, mark = p, w
            p += 1
        elif star >= 0:
            p = star + 1
            mark += 1
            w = mark
        else:
            return False
    while p < len(pat) and pat[p] == "*":
        p += 1
    return p == len(pat)


def _writable_by(st: os.stat_result, who: Who) -> bool:
    """Whether ``who`` can change this inode (content, or entries if a dir)."""
    if stat.S_ISLNK(st.st_mode):
        return st.st_uid == who.uid  # a link's mode bits mean nothing
    if st.st_uid == who.uid:
        return True  # an owner can always chmod it writable
    if st.st_mode & stat.S_IWOTH:
        return True
    return bool(st.st_mode & stat.S_IWGRP) and st.st_gid in who.gids


def _can_replace(parent: os.stat_result, entry: os.stat_result, who: Who) -> bool:
    """Whether ``who`` can rename, remove or replace ``entry`` in ``parent``.
    In a sticky directory (``/tmp``) only the entry's or the directory's
    owner can."""
    if not _writable_by(parent, who):
        return False
    if parent.st_mode & stat.S_ISVTX:
        return who.uid in (entry.st_uid, parent.st_uid)
    return True


def user_controlled(path: str, who: Who) -> bool:
    """Whether the job's user could change what ``path`` is: replace any
    component of it, or write the file itself. Errors count as controlled
    (an exemption must be shown safe, not assumed)."""
    if not path.startswith("/"):
        return True
    if who.uid == 0:
        return False  # root writes the config: there is no one to keep out
    try:
        current = "/"
        parent = os.lstat(current)
        st = parent
        for part in path.split("/"):
            if not part:
                continue
            current = current.rstrip("/") + "/" + part
            st = os.lstat(current)
            if _can_replace(parent, st, who):
                return True
            parent = st
        return _writable_by(st, who)
    except (OSError, ValueError):
        return True


def _real(path: str, memo: dict[str, str | None]) -> str | None:
    if path not in memo:
        try:
            memo[path] = os.path.realpath(path)
        except (OSError, ValueError):
            memo[path] = None
    return memo[path]


def _path_selected(patterns: Sequence[str], path: str, who: Who,
                   memo: dict[str, str | None]) -> bool:
    if not path or not path.startswith("/"):
        return False
    real = _real(path, memo)
    if real is None:
        return False
    for candidate in dict.fromkeys((path, real)):
        if any(glob_match(p, candidate) for p in patterns):
            # Both the path as found and the file it is must be out of the
            # user's reach, or they could aim one at their own build.
            return not user_controlled(path, who) and not user_controlled(real, who)
    return False


def matches(ex: Exemption, finding: Finding, who: Who, today: str,
            memo: dict[str, str | None] | None = None) -> bool:
    if finding.rule != ex.rule or today > ex.until:
        return False
    if ex.users and not set(ex.users).intersection(who.user_names()):
        return False
    if ex.groups and not set(ex.groups).intersection(who.group_names()):
        return False
    return not ex.paths or _path_selected(ex.paths, finding.path, who,
                                          {} if memo is None else memo)


def apply(policy: Policy, findings: Iterable[Finding], who: Who | None,
          today: str | None = None) -> tuple[tuple[Finding, ...], tuple[Exempted, ...]]:
    """The findings left after the policy's exemptions, and those released.
    Without a ``who`` (the caller does not know the user) nothing is released."""
    findings = tuple(findings)
    if not policy.exemptions or who is None:
        return findings, ()
    day = today or today_utc()
    kept: list[Finding] = []
    released: list[Exempted] = []
    memo: dict[str, str | None] = {}  # one realpath per finding path, not per exemption
    for finding in findings:
        ex = next((e for e in policy.exemptions if matches(e, finding, who, day, memo)), None)
        if ex is None:
            kept.append(finding)
        else:
            released.append(Exempted(rule=finding.rule, path=finding.path, reason=ex.reason,
                                     until=ex.until, where=ex.where))
    return tuple(kept), tuple(released)
