"""``grace-policy report AUDIT...``: what the plugin did, read from its audit
log, before an admin turns a partition from warn to enforce and after.

Reads the files given (the live log, rotated copies, gzip-compressed ones:
``report /var/log/slurm/grace-policy.jsonl*``), skips and counts what is not a
decision, and prints a summary that reads at a glance, or ``--json``.
``--metrics FILE`` also writes it for node_exporter's textfile collector.

Exit codes: 0 done, 2 a file could not be read at all, 64 usage error.
"""

from __future__ import annotations

import argparse
import sys

from .common import UsageError, err

EX_UNREADABLE = 2
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def configure_parser(sub: argparse._SubParsersAction, name: str, help_text: str) -> None:
    parser = sub.add_parser(
        name, help=help_text, description=help_text,
        epilog="Times: 2026-12-01, 2026-12-01T08:00 (UTC unless an offset is given), or "
               "relative to now: 90m, 12h, 7d, 2w. Exit codes: 0 done, 2 a file could "
               "not be read at all, 64 usage error.")
    parser.add_argument("audit", nargs="*", metavar="AUDIT",
                        help="audit log files: the live one, rotated and .gz copies "
                             "(default: plugstack.conf's audit= FILE and FILE* next to it)")
    parser.add_argument("--since", metavar="TIME", help="only decisions at or after TIME")
    parser.add_argument("--until", metavar="TIME", help="only decisions before TIME")
    parser.add_argument("--partition", action="append", default=[], metavar="P",
                        help="only this partition (repeatable; '' for steps without one)")
    parser.add_argument("--user", action="append", default=[], metavar="USER",
                        help="only this user, by name or uid (repeatable)")
    parser.add_argument("--json", action="store_true", help="the report as JSON")
    parser.add_argument("--top", type=int, default=10, metavar="N",
                        help="how many paths, programs, users, reasons to list (default 10)")
    parser.add_argument("--metrics", metavar="FILE",
                        help="also write the Prometheus text format to FILE (atomically), "
                             "for node_exporter's textfile collector")


def parse_when(text: str, now: float) -> float:
    """An absolute ISO date/time (UTC unless it says otherwise) or a span
    back from ``now``."""
    from datetime import datetime, timezone

    text = text.strip()
    unit = _UNITS.get(text[-1:])
    if unit is not None and text[:-1].isdigit():
        return now - int(text[:-1]) * unit
    try:
        when = datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith("Z") else text)
    except ValueError:
        raise UsageError(f"not a time: {text!r} (2026-12-01, 2026-12-01T08:00, 12h, 7d)") \
            from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return when.timestamp()


def _plugstack_logs() -> list[str]:
    """No AUDIT given: the log plugstack.conf's ``audit=`` names (the one
    audit setting) and its rotated copies next to it (``audit.log*``)."""
    import glob

    from .. import plugstack

    main = plugstack.locate(plugstack.slurm_conf_path())
    logs = [e.audit for e in plugstack.read(main).lines if e.audit]
    if not logs:
        raise UsageError(f"no AUDIT file given, and {main} names no audit= for the plugin "
                         "(e.g. grace-policy report /var/log/slurm/grace-policy.jsonl*)")
    out: list[str] = []
    for log in dict.fromkeys(logs):
        out.extend(p for p in sorted(glob.glob(glob.escape(log) + "*")) if p not in out)
    return out or list(dict.fromkeys(logs))


def _uids(users: list[str]) -> frozenset[int]:
    import pwd

    out = set()
    for user in users:
        if user.isdigit():
            out.add(int(user))
            continue
        try:
            out.add(pwd.getpwnam(user).pw_uid)
        except KeyError:
            raise UsageError(f"no such user: {user!r} (give a uid for users this host "
                             "does not know)") from None
    return frozenset(out)


def _user_name(uid: int) -> str | None:
    import pwd

    try:
        return pwd.getpwuid(uid).pw_name
    except (KeyError, OverflowError):
        return None


def execute(args: argparse.Namespace, rest: list[str] | None) -> int:
    import time

    from .. import auditlog

    files = list(args.audit) + list(rest or []) or _plugstack_logs()
    if args.top < 1:
        raise UsageError("--top must be at least 1")
    now = time.time()
    filters = auditlog.Filters(
        since=parse_when(args.since, now) if args.since else None,
        until=parse_when(args.until, now) if args.until else None,
        partitions=frozenset(args.partition), uids=_uids(args.user))
    report = auditlog.Report(filters=filters).read(files)
    data = report.to_json(user_name=_user_name, top=args.top)
    if args.metrics:
        from .. import metrics

        try:
            metrics.write(args.metrics, metrics.render(report))
        except OSError as exc:
            from ..messages import escape

            err(f"report: cannot write {escape(args.metrics)}: {exc.strerror or exc}")
            return EX_UNREADABLE
    if args.json:
        import json

        json.dump(data, sys.stdout, indent=1, sort_keys=True, ensure_ascii=True)
        sys.stdout.write("\n")
    else:
        for line in human(data):
            print(line)
    unreadable = [f for f in data["files"] if f["error"] and not f["lines"]]
    for f in data["files"]:
        if f["error"]:
            from ..messages import escape

            err(f"report: {escape(f['path'])}: {escape(f['error'])}"
                + (f" (after {f['lines']} lines)" if f["lines"] else ""))
    return EX_UNREADABLE if unreadable else 0


def _pct(n: int, total: int) -> str:
    return f"{100.0 * n / total:.0f}%" if total else "-"


def _ms(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.1f} ms" if value < 1000 else f"{value / 1000:.2f} s"


def _who(entry: dict[str, object]) -> str:
    from ..messages import escape

    name = entry.get("user")
    return escape(str(name)) if name else f"uid {entry['uid']}"


def human(data: dict) -> list[str]:
    """The report as lines that read at a glance. Every string from the log
    is escaped: paths and programs are named by users."""
    from ..messages import escape

    out: list[str] = []
    lines = data["lines"]
    period = data["period"]
    n_files = len(data["files"])
    span = (f"from {period['first']} to {period['last']}" if period["first"]
            else "(no decisions)")
    out.append(f"grace-policy report: {data['steps']} step{'s' if data['steps'] != 1 else ''} "
               f"{span}, "
               f"{n_files} file{'s' if n_files != 1 else ''}")
    window = [f"{k} {period[k]}" for k in ("since", "until") if period[k]]
    chosen = data["filters"]
    if chosen["partitions"]:
        window.append("partition " + ", ".join(escape(p) or "''" for p in chosen["partitions"]))
    if chosen["uids"]:
        window.append("uid " + ", ".join(str(u) for u in chosen["uids"]))
    if window:
        out.append(f"  only: {'; '.join(window)} "
                   f"({lines['filtered_out']} other decisions left out)")
    bad = [f"{lines[k]} {k}" for k in ("torn", "foreign", "invalid", "oversized") if lines[k]]
    if bad:
        out.append(f"  skipped lines (not counted): {', '.join(bad)}")
    skipped_files = [f for f in data["files"] if f["skipped_by_mtime"]]
    if skipped_files:
        out.append(f"  {len(skipped_files)} file(s) not read: last written before --since")
    if not data["steps"]:
        return out
    acts = data["actions"]
    total = data["steps"]
    out.append("")
    out.append(f"steps: {total}   allow {acts['allow']} ({_pct(acts['allow'], total)})   "
               f"warn {acts['warn']} ({_pct(acts['warn'], total)})   "
               f"reject {acts['reject']} ({_pct(acts['reject'], total)})")
    cache = data["cache"]
    skipped = ", ".join(f"{escape(k)} {v}" for k, v in data["skipped"].items())
    out.append(f"  checked {cache['judged']}, from the verdict cache {cache['hits']} "
               f"({_pct(cache['hits'], cache['judged'])})"
               + (f"; not judged: {skipped}" if skipped else ""))
    t = data["time_ms"]
    out.append(f"  check time: median {_ms(t['all']['median'])}, p99 {_ms(t['all']['p99'])}"
               f" (cache hits: median {_ms(t['cache_hit']['median'])}; full checks: median "
               f"{_ms(t['checked']['median'])}, p99 {_ms(t['checked']['p99'])})")
    # A line C writes when the check gave no verdict (a timeout, a failed
    # env edit) carries the reason as "error" and its kind as "failure": the
    # step is one of the check errors, and the failures say which of them
    # the plugin decided; two separate counts would show it twice.
    failures = data["failures"]
    errors = data["errors"]
    if errors["steps"]:
        line = f"  check errors (on_error decided): {errors['steps']}"
        if failures["steps"]:
            kinds = ", ".join(f"{escape(k)} {n}" for k, n in failures["kinds"].items())
            line += (f", of which without a verdict (decided in the plugin): "
                     f"{failures['steps']} ({kinds})")
        out.append(line)
        for e in errors["reasons"]:
            out.append(f"    {e['steps']:>6}  {escape(e['reason'])}")

    out.append("")
    out.append("by partition:")
    rows = [("PARTITION", "MODE", "STEPS", "ALLOW", "WARN", "REJECT", "ERRORS",
             "ENFORCE WOULD REFUSE")]
    for part, p in data["partitions"].items():
        modes = "/".join(sorted(p["modes"]))
        refuse = str(p["would_refuse"]) if "warn" in p["modes"] else "-"
        rows.append((escape(part) or "(none)", modes, str(p["steps"]),
                     *(str(p["actions"][a]) for a in ("allow", "warn", "reject")),
                     str(p["errors"]), refuse))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        out.append("  " + "  ".join(c.ljust(w) if i < 2 else c.rjust(w)
                                    for i, (c, w) in enumerate(zip(r, widths))).rstrip())

    refuse = data["would_refuse"]
    if refuse["steps"] or refuse["unknown"]:
        out.append("")
        out.append(f"enforce would have refused {refuse['steps']} step"
                   f"{'s' if refuse['steps'] != 1 else ''} in warn partitions:")
        if refuse["rules"]:
            out.append("  rules: " + ", ".join(f"{escape(r)} {n}"
                                               for r, n in refuse["rules"].items()))
        for p in refuse["programs"]:
            out.append(f"  {p['steps']:>6}  {escape(p['program'])}")
        if refuse["users"]:
            out.append("  users: " + ", ".join(f"{_who(u)} {u['steps']}"
                                               for u in refuse["users"]))
        if refuse["unknown"]:
            out.append(f"  ({refuse['unknown']} warn steps logged by an older plugin "
                       "say nothing about enforce)")

    if data["rules"]:
        out.append("")
        out.append("rules (steps):")
        for rule, n in data["rules"].items():
            out.append(f"  {n:>6}  {escape(rule)}")
    if data["paths"]:
        out.append("")
        out.append("paths that tripped most (steps):")
        for p in data["paths"]:
            rules = ", ".join(escape(r) for r in p["rules"])
            out.append(f"  {p['steps']:>6}  {escape(p['path'])}  [{rules}]")
    if data["programs"]:
        out.append("")
        out.append("programs that tripped most (steps):")
        for p in data["programs"]:
            out.append(f"  {p['steps']:>6}  {escape(p['program'])}")
    if data["exempted"]:
        out.append("")
        out.append("exemptions used (steps):")
        for e in data["exempted"]:
            out.append(f"  {e['steps']:>6}  {escape(e['where'])} until {escape(e['until'])}: "
                       f"{escape(e['path'])} ({escape(e['reason'])})")
    users = [u for u in data["users"] if u["warn"] or u["reject"]]
    if users:
        out.append("")
        out.append("users with warned or refused steps:")
        for u in users:
            out.append(f"  {_who(u)}: {u['steps']} steps, warn {u['warn']}, "
                       f"reject {u['reject']}")
    return out

