"""Reading the audit log back: every line the plugin wrote, in every file an
admin hands over (the live log, rotated copies, gzip-compressed ones), into
one summary of what the plugin did.

The log is written by root through descriptors users cannot reach, but a
line can still be torn (a full disk, a crash between two writes, a copy
taken mid-write), a file can hold other programs' lines (a shared log
directory, a misdirected logger), and a reader must assume the worst of any
string in it: paths and programs are named by users. So nothing here
raises on content: a line that is not a complete JSON object is *torn*, an
object that is not a grace-policy decision is *foreign*, a decision whose
fields have the wrong types or values is *invalid*, an enormous line is
*oversized*; each is counted and skipped. Strings are kept as they are and
escaped only where they are printed (the CLI) or labelled (metrics).

Not on the launch path: this module may import what it likes.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import zlib
from collections import Counter
from collections.abc import Iterable, Iterator
from datetime import datetime, timezone
from typing import Any

from ._record import dataclass, field
from .findings import ACTIONS, MODES

#: A decision line is a few hundred bytes; a line beyond this is not one.
MAX_LINE = 1 << 20
#: Distinct paths, programs or error texts remembered; more are counted as
#: "other" so a hostile log cannot exhaust memory.
MAX_KEYS = 50_000
_GZIP_MAGIC = b"\x1f\x8b"
_loads = json.JSONDecoder().decode
_OPT_STR_KEYS = ("error", "skipped", "program", "node", "job_id", "failure")
_CHUNK = 1 << 16
SKIP_KINDS = ("torn", "foreign", "invalid", "oversized")


@dataclass(frozen=True)
class Decision:
    """One decision line, checked."""

    time: float
    stamp: str
    uid: int
    partition: str | None
    mode: str
    action: str
    rules: list[str]
    paths: list[str]
    elapsed_ms: float | None
    error: str | None
    skipped: str | None
    cache_hit: bool
    program: str | None
    enforce_action: str | None
    #: (rule, path, reason, until, where)
    exempt: list[tuple[str, str, str, str, str]]
    node: str | None
    job_id: str | None
    #: Set on the lines C writes when the check gave no verdict and on_error
    #: decided (contract.FAILURES: timeout, python, config,
    #: plugstack, env, check, internal); their mode is null.
    failure: str | None = None
    step_id: str | None = None
    #: ``before_pull``/``after_pull`` on a registry image's two judgements
    #: (audit.PHASES), else None.
    phase: str | None = None


def parse_time(text: str) -> float | None:
    """``2026-12-01T08:00:00.123456Z`` (audit.iso_utc) → epoch seconds."""
    if not isinstance(text, str) or not text.endswith("Z") or len(text) > 40:
        return None
    try:
        return datetime.fromisoformat(text[:-1] + "+00:00").timestamp()
    except ValueError:
        return None


def _opt_str(value: Any) -> bool:
    return value is None or isinstance(value, str)


def _opt_strs(obj: dict[str, Any]) -> bool:
    for key in _OPT_STR_KEYS:
        value = obj.get(key)
        if value is not None and not isinstance(value, str):
            return False
    return True


def _str_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(x, str) for x in value)


def classify(line: bytes) -> tuple[str, Decision | None]:
    """(kind, decision): kind is ``decision`` or one of :data:`SKIP_KINDS`."""
    try:
        obj = _loads(line.decode("utf-8"))
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return "torn", None
    if not isinstance(obj, dict) or obj.get("event") != "decision":
        return "foreign", None
    try:
        return "decision", _decision(obj)
    except (KeyError, TypeError, ValueError):
        return "invalid", None


def _decision(obj: dict[str, Any]) -> Decision:
    when = parse_time(obj["time"])
    uid = obj["uid"]
    action, mode = obj["action"], obj["mode"]
    elapsed = obj.get("elapsed_ms")
    enforce = obj.get("enforce_action")
    exempt_raw = obj.get("exempt") or []
    failure = obj.get("failure")
    if (when is None or type(uid) is not int or uid < 0 or action not in ACTIONS
            or not (mode in MODES or (mode is None and isinstance(failure, str)))
            or not _opt_str(obj.get("partition"))
            or not _str_list(obj["rules"]) or not _str_list(obj["paths"])
            or not (elapsed is None or (type(elapsed) in (int, float) and math.isfinite(elapsed)
                                        and elapsed >= 0))
            or not _opt_strs(obj)
            or not (enforce is None or enforce in ACTIONS)
            or obj.get("phase") not in (None, "before_pull", "after_pull")
            or obj.get("cache") not in (None, "hit")
            or not isinstance(exempt_raw, list)):
        raise ValueError("not a decision")
    exempt = []
    for item in exempt_raw:
        if not isinstance(item, dict):
            raise ValueError("bad exempt entry")
        values = tuple(item.get(k, "") for k in ("rule", "path", "reason", "until", "where"))
        if not all(isinstance(v, str) for v in values):
            raise ValueError("bad exempt entry")
        exempt.append(values)
    return Decision(
        time=when, stamp=obj["time"], uid=uid, partition=obj.get("partition"), mode=mode,
        action=action, rules=obj["rules"], paths=obj["paths"],
        elapsed_ms=None if elapsed is None else float(elapsed), error=obj.get("error"),
        skipped=obj.get("skipped"), cache_hit=obj.get("cache") == "hit",
        program=obj.get("program"), enforce_action=enforce, exempt=exempt,
        node=obj.get("node"), job_id=obj.get("job_id"), failure=failure,
        step_id=obj.get("step_id"), phase=obj.get("phase"))


def read_lines(path: str) -> Iterator[tuple[str, bytes]]:
    """(kind, line) for every line of ``path``: kind ``line`` for a complete
    line, ``torn`` for a last line without its newline, ``oversized``.
    gzip is recognised by its magic bytes, not the name. I/O and gzip errors
    propagate (OSError, EOFError, zlib.error, gzip.BadGzipFile) after the
    lines read so far."""
    with open(path, "rb") as raw:
        head = raw.read(2)
        raw.seek(0)
        stream: Any = gzip.GzipFile(fileobj=raw, mode="rb") if head == _GZIP_MAGIC else raw
        pending = b""
        skipping = False
        while True:
            chunk = stream.read(_CHUNK)
            if not chunk:
                break
            start = 0
            while True:
                nl = chunk.find(b"\n", start)
                if nl < 0:
                    if not skipping:
                        pending += chunk[start:]
                        if len(pending) > MAX_LINE:
                            yield "oversized", b""
                            pending, skipping = b"", True
                    break
                if skipping:
                    skipping = False
                else:
                    line = pending + chunk[start:nl]
                    if len(line) > MAX_LINE:
                        yield "oversized", b""
                    elif line.strip():
                        yield "line", line
                pending = b""
                start = nl + 1
        if pending.strip() and not skipping:
            yield "torn", pending


def _percentile(sorted_values: list[float], q: float) -> float | None:
    """Nearest rank: the smallest value with at least q of all at or below it."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(q * len(sorted_values)))
    return sorted_values[rank - 1]


def _median(sorted_values: list[float]) -> float | None:
    n = len(sorted_values)
    if not n:
        return None
    mid = n // 2
    return sorted_values[mid] if n % 2 else (sorted_values[mid - 1] + sorted_values[mid]) / 2


def timing(values: list[float]) -> dict[str, Any]:
    values = sorted(values)
    return {"count": len(values), "median": _median(values), "p99": _percentile(values, 0.99),
            "max": values[-1] if values else None, "sum": round(sum(values), 3)}


class _Bounded(Counter):
    """A Counter that stops learning new keys at MAX_KEYS (then counts "other")."""

    def add(self, key: Any, n: int = 1) -> None:
        if key in self or len(self) < MAX_KEYS:
            self[key] += n
        else:
            self[("other",) if isinstance(key, tuple) else "(other)"] += n


def program_name(program: str | None) -> str | None:
    """Batch steps run slurmd's copy of the script, a new path per job
    (``.../job00042/slurm_script``): one name for all of them."""
    if program and program.endswith("/slurm_script"):
        parent = os.path.basename(os.path.dirname(program))
        if parent.startswith("job"):
            return "(batch script)"
    return program


@dataclass(frozen=True)
class Filters:
    since: float | None = None
    until: float | None = None
    partitions: frozenset[str] = frozenset()
    uids: frozenset[int] = frozenset()

    def keep(self, d: Decision) -> bool:
        if self.since is not None and d.time < self.since:
            return False
        if self.until is not None and d.time >= self.until:
            return False
        if self.partitions and (d.partition or "") not in self.partitions:
            return False
        return not self.uids or d.uid in self.uids


@dataclass
class Report:
    """Everything the CLI prints and the metrics file exports."""

    filters: Filters = field(default_factory=Filters)
    files: list[dict[str, Any]] = field(default_factory=list)
    lines: Counter = field(default_factory=Counter)
    first: Decision | None = None
    last: Decision | None = None
    steps: int = 0
    actions: Counter = field(default_factory=Counter)
    #: (partition, mode, action) -> steps
    by_partition: Counter = field(default_factory=Counter)
    #: (partition, rule) -> steps
    rules: Counter = field(default_factory=Counter)
    paths: _Bounded = field(default_factory=_Bounded)
    path_rules: dict[str, set[str]] = field(default_factory=dict)
    programs: _Bounded = field(default_factory=_Bounded)
    #: uid -> Counter of actions
    users: dict[int, Counter] = field(default_factory=dict)
    cache_hits: int = 0
    judged: int = 0
    skipped: Counter = field(default_factory=Counter)
    errors: _Bounded = field(default_factory=_Bounded)
    #: failure kind -> steps on_error decided in C (no verdict at all); each
    #: is one of the ``errors`` too
    failures: Counter = field(default_factory=Counter)
    #: partition -> steps with an error
    error_partitions: Counter = field(default_factory=Counter)
    times_all: list[float] = field(default_factory=list)
    times_hit: list[float] = field(default_factory=list)
    times_miss: list[float] = field(default_factory=list)
    #: (rule, path, reason, until, where) -> steps
    exempted: _Bounded = field(default_factory=_Bounded)
    # What enforce would have refused in warn partitions.
    would_refuse: Counter = field(default_factory=Counter)  # partition -> steps
    would_refuse_rules: Counter = field(default_factory=Counter)
    would_refuse_programs: _Bounded = field(default_factory=_Bounded)
    would_refuse_users: Counter = field(default_factory=Counter)
    #: warn-mode steps from an older plugin that did not record enforce_action
    would_refuse_unknown: int = 0
    #: A registry image's step is judged twice per node (audit.PHASES): its
    #: user_init line waits here, keyed by (node, job, step), until the line
    #: from after the pull stands for it; one never followed counts itself.
    before_pull: dict[tuple[Any, ...], Decision] = field(default_factory=dict)
    after_pull: set[tuple[Any, ...]] = field(default_factory=set)

    # -- reading ------------------------------------------------------------
    def read(self, paths: Iterable[str]) -> Report:
        for path in paths:
            self.read_file(path)
        for decision in self.before_pull.values():
            self.add(decision)
        self.before_pull.clear()
        return self

    def offer(self, d: Decision) -> None:
        """Count ``d`` as a step, unless it is one of a step's two judgements
        and the other, from after the pull, stands for the step (in whichever
        order the files hold them)."""
        if d.phase is None:
            self.add(d)
            return
        key = (d.node, d.job_id, d.step_id)
        if d.phase == "after_pull":
            self.after_pull.add(key)
            if self.before_pull.pop(key, None) is not None:
                self.lines["judged_again_after_pull"] += 1
            self.add(d)
        elif key in self.after_pull:
            self.lines["judged_again_after_pull"] += 1
        else:
            self.before_pull[key] = d

    def read_file(self, path: str) -> None:
        info: dict[str, Any] = {"path": path, "lines": 0, "decisions": 0, "error": None,
                                "skipped_by_mtime": False}
        self.files.append(info)
        since = self.filters.since
        try:
            st = os.stat(path)
            if since is not None and st.st_mtime < since - 1:
                # Written to for the last time before the window: nothing in it
                # can be inside (rotated copies are the bulk of the data).
                info["skipped_by_mtime"] = True
                return
            for kind, line in read_lines(path):
                info["lines"] += 1
                self.lines["total"] += 1
                if kind != "line":
                    self.lines[kind] += 1
                    continue
                what, decision = classify(line)
                if decision is None:
                    self.lines[what] += 1
                    continue
                self.lines["decisions"] += 1
                info["decisions"] += 1
                if not self.filters.keep(decision):
                    self.lines["filtered_out"] += 1
                    continue
                self.offer(decision)
        except (OSError, EOFError, zlib.error, gzip.BadGzipFile) as exc:
            info["error"] = (f"{exc.strerror}" if isinstance(exc, OSError) and exc.strerror
                             else f"{type(exc).__name__}: {exc}")

    def add(self, d: Decision) -> None:
        self.steps += 1
        if self.first is None or d.time < self.first.time:
            self.first = d
        if self.last is None or d.time >= self.last.time:
            self.last = d
        part = d.partition or ""
        self.actions[d.action] += 1
        self.by_partition[(part, d.mode or "unchecked", d.action)] += 1
        self.users.setdefault(d.uid, Counter())[d.action] += 1
        if d.failure is not None:
            self.failures[d.failure] += 1
        elif d.skipped:
            self.skipped[d.skipped] += 1
        else:
            self.judged += 1
        if d.cache_hit:
            self.cache_hits += 1
        for rule in dict.fromkeys(d.rules):
            self.rules[(part, rule)] += 1
        for path in dict.fromkeys(d.paths):
            self.paths.add(path)
            if path in self.paths and len(self.path_rules) < MAX_KEYS:
                self.path_rules.setdefault(path, set()).update(d.rules)
        program = program_name(d.program)
        if d.rules and program is not None:
            self.programs.add(program)
        if d.error or d.failure is not None:
            # C's failure lines are check errors too (their reason is the
            # "error"): the failures are a part of the errors, never more.
            self.errors.add((d.error or f"(failure {d.failure})")[:300])
            self.error_partitions[part] += 1
        if d.elapsed_ms is not None:
            self.times_all.append(d.elapsed_ms)
            (self.times_hit if d.cache_hit else self.times_miss).append(d.elapsed_ms)
        for ex in d.exempt:
            self.exempted.add(ex)
        if d.mode == "warn":
            if d.enforce_action is None and not d.skipped:
                self.would_refuse_unknown += 1
            elif d.enforce_action == "reject":
                self.would_refuse[part] += 1
                for rule in dict.fromkeys(d.rules):
                    self.would_refuse_rules[rule] += 1
                self.would_refuse_programs.add(program or "(unknown)")
                self.would_refuse_users[d.uid] += 1

    # -- results ------------------------------------------------------------
    def to_json(self, user_name: Any = None, top: int = 10) -> dict[str, Any]:
        def name(uid: int) -> str | None:
            return user_name(uid) if user_name else None

        partitions: dict[str, dict[str, Any]] = {}
        for (part, mode, action), n in sorted(self.by_partition.items()):
            entry = partitions.setdefault(part, {"steps": 0, "modes": {}, "actions": {},
                                                 "errors": 0, "would_refuse": 0})
            entry["steps"] += n
            entry["modes"][mode] = entry["modes"].get(mode, 0) + n
            entry["actions"][action] = entry["actions"].get(action, 0) + n
        for part, entry in partitions.items():
            entry["actions"] = {a: entry["actions"].get(a, 0) for a in ACTIONS}
            entry["errors"] = self.error_partitions.get(part, 0)
            entry["would_refuse"] = self.would_refuse.get(part, 0)
            entry["rules"] = {r: n for (p, r), n in sorted(self.rules.items()) if p == part}
        rules: Counter = Counter()
        for (_, rule), n in self.rules.items():
            rules[rule] += n
        users = sorted(self.users.items(),
                       key=lambda kv: (-kv[1]["reject"], -kv[1]["warn"], -sum(kv[1].values()),
                                       kv[0]))
        return {
            "files": self.files,
            "period": {
                "first": self.first.stamp if self.first else None,
                "last": self.last.stamp if self.last else None,
                "since": _iso(self.filters.since), "until": _iso(self.filters.until),
            },
            "filters": {"partitions": sorted(self.filters.partitions),
                        "uids": sorted(self.filters.uids)},
            "lines": {k: self.lines.get(k, 0)
                      for k in ("total", "decisions", "filtered_out", "judged_again_after_pull",
                                *SKIP_KINDS)},
            "steps": self.steps,
            "actions": {a: self.actions.get(a, 0) for a in ACTIONS},
            "partitions": partitions,
            "rules": dict(sorted(rules.items(), key=lambda kv: (-kv[1], kv[0]))),
            "paths": [{"path": p, "steps": n, "rules": sorted(self.path_rules.get(p, ()))}
                      for p, n in _top(self.paths, top)],
            "programs": [{"program": p, "steps": n} for p, n in _top(self.programs, top)],
            "users": [{"uid": uid, "user": name(uid), "steps": sum(c.values()),
                       **{a: c.get(a, 0) for a in ACTIONS}} for uid, c in users[:top]],
            "cache": {"hits": self.cache_hits, "judged": self.judged,
                      "hit_rate": round(self.cache_hits / self.judged, 4) if self.judged
                      else None},
            "skipped": dict(sorted(self.skipped.items())),
            "errors": {"steps": sum(self.errors.values()),
                       "reasons": [{"reason": r, "steps": n} for r, n in _top(self.errors, top)]},
            "failures": {"steps": sum(self.failures.values()),
                         "kinds": dict(sorted(self.failures.items()))},
            "time_ms": {"all": timing(self.times_all), "cache_hit": timing(self.times_hit),
                        "checked": timing(self.times_miss)},
            "exempted": [{"rule": e[0], "path": e[1], "reason": e[2], "until": e[3],
                          "where": e[4], "steps": n} for e, n in _top(self.exempted, top * 5)],
            "would_refuse": {
                "steps": sum(self.would_refuse.values()),
                "partitions": dict(sorted(self.would_refuse.items())),
                "rules": dict(sorted(self.would_refuse_rules.items(),
                                     key=lambda kv: (-kv[1], kv[0]))),
                "programs": [{"program": p, "steps": n}
                             for p, n in _top(self.would_refuse_programs, top)],
                "users": [{"uid": u, "user": name(u), "steps": n}
                          for u, n in _top(self.would_refuse_users, top)],
                "unknown": self.would_refuse_unknown,
            },
        }


def _top(counter: Counter, n: int) -> list[tuple[Any, int]]:
    return sorted(counter.items(), key=lambda kv: (-kv[1], str(kv[0])))[:n]


def _iso(when: float | None) -> str | None:
    if when is None:
        return None
    return datetime.fromtimestamp(when, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
