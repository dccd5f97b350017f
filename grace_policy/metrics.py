"""The report as a Prometheus text-format file for node_exporter's textfile
collector (``--collector.textfile.directory``).

Written by ``grace-policy report --metrics FILE`` (a timer or cron job on
each node), never by the plugin: a step would have to update shared
counters under a lock, as root, on the launch path of every job, and the
audit log already holds every decision. The values describe the report's
window (``--since``/``--until``; the audit files given), so they are
gauges, not counters: a rotated-away log must not look like a counter
reset. ``grace_policy_report_window_start_seconds`` says which window.

The file is replaced atomically (temporary file in the same directory, then
rename): the collector never reads half of it.
"""

from __future__ import annotations

import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .auditlog import Report


def label(value: object) -> str:
    """A label value as the text format wants it: backslash, quote and
    newline escaped; everything else (UTF-8) kept."""
    text = "" if value is None else str(value)
    text = text.encode("utf-8", "replace").decode("utf-8")
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(pairs: dict[str, object]) -> str:
    if not pairs:
        return ""
    return "{" + ",".join(f'{k}="{label(v)}"' for k, v in pairs.items()) + "}"


def _num(value: float | int | None) -> str:
    if value is None:
        return "NaN"
    if isinstance(value, int):
        return str(value)
    return repr(float(value))


class _Out:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def family(self, name: str, kind: str, help_text: str,
               samples: list[tuple[dict[str, object], float | int | None]],
               suffix: str = "") -> None:
        self.lines.append(f"# HELP {name} {help_text}")
        self.lines.append(f"# TYPE {name} {kind}")
        for labels, value in samples:
            self.lines.append(f"{name}{suffix}{_labels(labels)} {_num(value)}")

    def sample(self, name: str, labels: dict[str, object], value: float | int | None) -> None:
        self.lines.append(f"{name}{_labels(labels)} {_num(value)}")


def render(report: Report, now: float | None = None) -> str:
    data = report.to_json()
    out = _Out()
    steps = [({"partition": part, "mode": mode, "action": action}, n)
             for (part, mode, action), n in sorted(report.by_partition.items())]
    out.family("grace_policy_steps", "gauge",
               "Steps judged in the report window, by partition, mode and action.", steps)
    out.family("grace_policy_rule_steps", "gauge",
               "Steps with a finding of this rule in the report window.",
               [({"partition": p, "rule": r}, n) for (p, r), n in sorted(report.rules.items())])
    out.family("grace_policy_would_refuse_steps", "gauge",
               "Steps in warn partitions that mode enforce would have refused.",
               [({"partition": p}, n) for p, n in sorted(report.would_refuse.items())])
    out.family("grace_policy_error_steps", "gauge",
               "Steps whose check failed (on_error decided them).",
               [({"partition": p}, n) for p, n in sorted(report.error_partitions.items())])
    out.family("grace_policy_failure_steps", "gauge",
               "Steps the check gave no verdict for (on_error decided in the plugin), "
               "by kind: timeout, python, config, plugstack, env, check, internal; "
               "a part of grace_policy_error_steps.",
               [({"kind": k}, n) for k, n in sorted(report.failures.items())])
    out.family("grace_policy_cache_hit_steps", "gauge",
               "Steps answered from the verdict cache without starting Python.",
               [({}, report.cache_hits)])
    out.family("grace_policy_exempted_steps", "gauge",
               "Findings released by an exemption, by rule and config entry.",
               [({"rule": r, "where": w}, n) for (r, w), n in _exempt_totals(report)])
    times = data["time_ms"]["all"]
    out.lines.append("# HELP grace_policy_check_seconds Time a step's check took "
                     "(median, p99) in the report window.")
    out.lines.append("# TYPE grace_policy_check_seconds summary")
    for q, key in (("0.5", "median"), ("0.99", "p99")):
        value = times[key]
        out.sample("grace_policy_check_seconds", {"quantile": q},
                   None if value is None else value / 1000.0)
    out.sample("grace_policy_check_seconds_sum", {}, times["sum"] / 1000.0)
    out.sample("grace_policy_check_seconds_count", {}, times["count"])
    out.family("grace_policy_audit_lines_skipped", "gauge",
               "Audit lines the report could not use, by why.",
               [({"reason": k}, data["lines"][k])
                for k in ("torn", "foreign", "invalid", "oversized")])
    out.family("grace_policy_audit_files_unreadable", "gauge",
               "Audit files given to the report that could not be read to the end.",
               [({}, sum(1 for f in data["files"] if f["error"]))])
    window_start = report.filters.since if report.filters.since is not None else (
        report.first.time if report.first else None)
    out.family("grace_policy_report_window_start_seconds", "gauge",
               "Start of the report window (Unix time).", [({}, window_start)])
    out.family("grace_policy_last_decision_seconds", "gauge",
               "Time of the newest decision in the window (Unix time).",
               [({}, report.last.time if report.last else None)])
    out.family("grace_policy_report_generated_seconds", "gauge",
               "When this file was written (Unix time).",
               [({}, time.time() if now is None else now)])
    return "\n".join(out.lines) + "\n"


def _exempt_totals(report: Report) -> list[tuple[tuple[str, str], int]]:
    totals: dict[tuple[str, str], int] = {}
    for key, n in report.exempted.items():
        if len(key) == 5:  # not the ("other",) bucket
            rule_where = (key[0], key[4])
            totals[rule_where] = totals.get(rule_where, 0) + n
    return sorted(totals.items())


def write(path: str, text: str) -> None:
    """Replace ``path`` atomically, mode 0644 (the collector runs as another user)."""
    from .atomicfile import replace

    replace(path, text.encode("utf-8"), suffix=".prom.tmp")

