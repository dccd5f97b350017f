"""The rule catalogue: what each rule id means, how severe it is, and what to
tell the user, chosen by the most specific cause the check established.

The texts live in ``data/rules.toml`` so admins can read them next to their
overrides. A clean step has no issues and never touches the catalogue, so the
file is parsed lazily, on the first issue to turn into a finding: tomllib costs
~10 ms to import, which only steps that explain themselves pay.
"""

from __future__ import annotations

import os
import re

from ._record import dataclass
from .findings import SEVERITIES, SEVERITY_RANK, Finding, Issue
from .messages import escape

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs several ms; annotations are strings anyway
    from collections.abc import Iterable, Mapping
    from typing import Any

#: The stable rule ids, in catalogue order. A test checks they match rules.toml.
RULE_IDS = (
    "exe-not-found",
    "exe-format",
    "exe-unreadable",
    "exe-arch-mismatch",
    "interp-missing",
    "lib-not-found",
    "lib-version-missing",
    "elf-invalid",
    "page-align",
    "page-congruence",
    "page-overlap",
    "relro-tail",
    "env-leak",
    "py-ext-arch",
    "py-ext-foreign",
    "py-dist-broken",
    "py-startup-error",
    "check-limit",
    "torch-cpu-only",
    "torchcodec-no-ffmpeg",
    "jit-cache-foreign",
    "page-size-compiled",
    "page-bss-clobber",
    "batch-uncertain",

    "image-arch-mismatch",
    # CUDA kernels and the node's GPUs (issue 26).
    "gpu-arch-missing",
    "gpu-ptx-jit",
    "cuda-driver-too-old",
)

#: Causes the checks may put in ``Issue.causes``, most specific first.
CAUSES = (
    # The file is inside the container image the step runs in (issue 15):
    # the image is what to fix, whatever put the file there.
    "image",
    # ... pulled from a registry by pyxis (issue 25): judged from its manifest.
    "registry",
    "leaked-env",
    "pythonpath",
    "conda",
    "venv",
    "user-local",
    "pip-wheel",
    "jit-cache",
    "jemalloc",
    "bundled-lib",
    "home",
    "system",
)

#: Names a remediation template may use. Config validation rejects others, so
#: an admin's typo is caught at ``config check`` instead of shown to users.
TEMPLATE_FIELDS = frozenset(
    {
        "path",
        "partition",
        "node_arch",
        # Container steps (issue 15): the image file, the path inside it.
        "image",
        "image_arch",
        "node_platform",
        # Registry images (issue 25): the platforms the image has, the manifest.
        "platforms",
        "digest",
        "inner",
        "file_arch",
        "page_size",
        "page_kib",
        "build_hint",
        "name",
        "candidates",
        "candidates_note",
        "glibc",
        "interp",
        "vars",
        "prefix",
        "align",
        "needed_by",
        "detail",
        "limit",
        "error",
        # Python steps (issue 8): torch, torchcodec, JIT caches.
        "version",
        "pin",
        "gpus",
        "cuda_index",
        "index_note",
        "majors",
        "missing",
        "count",
        "files",
        "per_arch",
        "allocator",
        "compiled_page_kib",
        "fix_hint",
        # the installed distribution a file belongs to ("numpy 1.19.0")
        "dist",
        # CUDA kernels (issue 26): what a file holds ("sm_80 sm_90"), the
        # step's GPU ("sm_100"), its TORCH_CUDA_ARCH_LIST spelling ("10.0"),
        # the CUDA version the driver supports, a PTX ISA version, the CUDA
        # release it needs, a library's CUDA major.
        "holds",
        "gpu_arch",
        "arch_list",
        "cuda_driver",
        "ptx_version",
        "cuda_needed",
        "cuda_major",
    }
)

RULES_TOML = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "rules.toml")

_FIELD = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


def template_fields(text: str) -> list[str]:
    """The ``{field}`` names used in ``text``, in order of appearance."""
    return _FIELD.findall(text)


def render(template: str, values: Mapping[str, str]) -> str:
    """Fill ``{field}`` from ``values``; unknown fields stay as written.

    Deliberately not ``str.format``: admin texts may contain stray braces, and
    format specs such as ``{path:>99999999}`` must not be able to do anything.
    """
    if "{" not in template:
        return template

    def sub(match: re.Match[str]) -> str:
        value = values.get(match.group(1))
        return match.group(0) if value is None else value

    return _FIELD.sub(sub, template)


@dataclass(frozen=True)
class Rule:
    id: str
    severity: str
    title: str
    error: str
    explain: str
    #: (cause, text) in catalogue order.
    remedies: tuple[tuple[str, str], ...]
    default_remedy: str
    #: The most severe level allowed (env-leak never rejects on its own).
    max_severity: str = "error"

    def remedy_for(self, causes: Iterable[str]) -> tuple[str, str]:
        """(cause, text) for the first cause with a text, else ("", default)."""
        texts = dict(self.remedies)
        for cause in causes:
            text = texts.get(cause)
            if text is not None:
                return cause, text
        return "", self.default_remedy


def _toml_load(path: str) -> dict[str, Any]:
    try:
        import tomllib
    except ImportError:  # Python < 3.11
        import tomli as tomllib  # type: ignore[no-redef]
    with open(path, "rb") as f:
        return tomllib.load(f)


def parse_rules(data: Mapping[str, Any]) -> dict[str, Rule]:
    """Turn the ``[rules.*]`` tables of a catalogue document into :class:`Rule` s.
    Strict, because a broken catalogue should fail the test suite, not a step."""
    out: dict[str, Rule] = {}
    for rule_id, body in data["rules"].items():
        remedy = dict(body.get("remedy", {}))
        default = remedy.pop("default", "")
        severity = body["severity"]
        max_severity = body.get("max_severity", "error")
        if severity not in SEVERITIES or max_severity not in SEVERITIES:
            raise ValueError(f"{rule_id}: bad severity")
        out[rule_id] = Rule(
            id=rule_id,
            severity=severity,
            title=body["title"],
            error=body.get("error", ""),
            explain=body.get("explain", "").strip(),
            remedies=tuple(remedy.items()),
            default_remedy=default,
            max_severity=max_severity,
        )
    return out


def _clamp(severity: str, most: str) -> str:
    """A severity no more important than ``most``."""
    if SEVERITY_RANK[severity] < SEVERITY_RANK[most]:
        return most
    return severity


def _default_build_hint(partition: str) -> str:
    if partition:
        return f"srun -p {partition} --pty bash"
    return "srun -p PARTITION --pty bash"


class Catalogue:
    """The catalogue with a site's overrides applied.

    Creating one is free; rules.toml is read on first use.
    """

    def __init__(
        self,
        overrides: Mapping[str, Any] | Iterable[Any] = (),
        *,
        build_hint: str = "",
        rules: Mapping[str, Rule] | None = None,
    ) -> None:
        # ``overrides``: RuleOverride objects (policy.rules) or {rule: override}.
        if hasattr(overrides, "items"):  # a mapping, without importing collections.abc
            self._overrides = dict(overrides)
        else:
            self._overrides = {o.rule: o for o in overrides}
        self._build_hint = build_hint
        self._rules: dict[str, Rule] | None = dict(rules) if rules is not None else None

    @classmethod
    def load(
        cls, overrides: Mapping[str, Any] | Iterable[Any] = (), *, build_hint: str = ""
    ) -> Catalogue:
        return cls(overrides, build_hint=build_hint)

    @classmethod
    def for_policy(cls, policy: Any) -> Catalogue:
        """The catalogue as ``policy`` (a :class:`grace_policy.policy.Policy`) has it."""
        return cls(policy.rules, build_hint=policy.site_build_hint)

    @property
    def rules(self) -> dict[str, Rule]:
        if self._rules is None:
            self._rules = parse_rules(_toml_load(RULES_TOML))
        return self._rules

    def ids(self) -> tuple[str, ...]:
        return tuple(self.rules)

    def rule(self, rule_id: str) -> Rule | None:
        return self.rules.get(rule_id)

    def severity(self, rule_id: str) -> str:
        """Effective severity: the admin's if set, capped by the rule's maximum.
        An id the catalogue does not know is a checker bug: warn, never reject."""
        rule = self.rules.get(rule_id)
        if rule is None:
            return "warning"
        override = self._overrides.get(rule_id)
        severity = rule.severity
        if override is not None and override.severity:
            severity = override.severity
        if severity == "off":
            return "off"
        return _clamp(severity, rule.max_severity)

    def _values(self, issue: Issue, context: Mapping[str, str]) -> dict[str, str]:
        raw: dict[str, str] = {k: str(v) for k, v in context.items()}
        raw.update(issue.facts)
        raw.setdefault("path", issue.path)
        page = raw.get("page_size", "")
        if "page_kib" not in raw and page.isdigit():
            raw["page_kib"] = str(int(page) // 1024)
        candidates = raw.get("candidates", "")
        if "candidates_note" not in raw:
            raw["candidates_note"] = (
                f" (skipped, built for another architecture: {candidates})" if candidates else ""
            )
        raw.setdefault("dist", "the package")
        values = {k: escape(v) for k, v in raw.items()}
        if "build_hint" not in values:
            partition = values.get("partition", "")
            hint = self._build_hint or _default_build_hint(partition)
            values["build_hint"] = escape(render(hint, {"partition": partition}))
        return values

    def finding(self, issue: Issue, context: Mapping[str, str]) -> Finding | None:
        """The finding for ``issue``, or None when the site turned its rule off.

        ``context`` carries what the check knows about the step (partition,
        node_arch, page_size, glibc, ...); the issue's own facts win over it.
        Values are escaped before they go into texts because paths and names
        come from files users control.
        """
        severity = self.severity(issue.rule)
        if severity == "off":
            return None
        cap = issue.fact("max_severity")
        if cap in SEVERITY_RANK and cap != "off":
            # The check knows this issue cannot matter as much (e.g. a page
            # finding on the node's own system files): never more than ``cap``.
            severity = _clamp(severity, cap)
        rule = self.rules.get(issue.rule)
        values = self._values(issue, context)
        if rule is None:
            return Finding(
                rule=issue.rule,
                severity=severity,
                path=issue.path,
                predicted_error=issue.predicted_error,
                remediation="",
            )
        cause, text = rule.remedy_for(issue.causes)
        override = self._overrides.get(issue.rule)
        if override is not None and override.text:
            text = override.text
        predicted = issue.predicted_error or render(rule.error, values)
        values.setdefault("error", escape(predicted))
        return Finding(
            rule=issue.rule,
            severity=severity,
            path=issue.path,
            predicted_error=predicted,
            remediation=render(text, values),
            cause=cause,
        )

    def findings(
        self, issues: Iterable[Issue], context: Mapping[str, str]
    ) -> tuple[Finding, ...]:
        """Findings for ``issues``, most important first (stable within a
        severity, so the check's order — executable before libraries — stays)."""
        out = [f for f in (self.finding(i, context) for i in issues) if f is not None]
        out.sort(key=lambda f: SEVERITY_RANK.get(f.severity, len(SEVERITIES)))
        return tuple(out)

    def explain(self, rule_id: str) -> str:
        """Text for ``grace-policy explain RULE``; raises KeyError for an
        unknown id so the command can say so."""
        rule = self.rules[rule_id]
        severity = self.severity(rule_id)
        lines = [f"{rule.id}: {rule.title}", f"severity: {severity}"]
        if severity != rule.severity:
            lines[-1] += f" (catalogue default: {rule.severity})"
        if rule.error:
            lines.append(f"error without grace-policy: {rule.error}")
        lines += ["", rule.explain, "", "what users are told, by cause:"]
        override = self._overrides.get(rule_id)
        if override is not None and override.text:
            lines.append(f"  (site text, all causes) {override.text}")
        else:
            for cause, text in rule.remedies:
                lines.append(f"  {cause}: {text}")
            lines.append(f"  otherwise: {rule.default_remedy}")
        return "\n".join(lines)
