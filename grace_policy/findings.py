"""What a check produces: findings, environment changes and the verdict.

These are plain frozen dataclasses so the C bridge, the CLI and the audit log
all read the same facts, and so a verdict can be compared in tests.
"""

from __future__ import annotations

from ._record import dataclass, field

#: Severities, most important first. "off" findings are dropped before a verdict.
SEVERITIES = ("error", "warning", "info", "off")
SEVERITY_RANK = {name: i for i, name in enumerate(SEVERITIES)}

#: Actions, least permissive last.
ACTIONS = ("allow", "warn", "reject")

#: Modes an admin sets per partition.
MODES = ("enforce", "warn", "off")


@dataclass(frozen=True)
class Issue:
    """A raw problem found by the checks, before the rule catalogue gives it a
    severity and a remediation text.

    ``cause`` names the most specific explanation the checks could establish
    (for example ``leaked-env``, ``user-local``, ``conda``); the catalogue picks
    the remediation text for the first cause it has a text for.
    ``facts`` fills the templates (``{path}``, ``{file_arch}``, ...).
    """

    rule: str
    path: str
    predicted_error: str
    causes: tuple[str, ...] = ()
    facts: tuple[tuple[str, str], ...] = ()

    def fact(self, key: str, default: str = "") -> str:
        for k, v in self.facts:
            if k == key:
                return v
        return default


@dataclass(frozen=True)
class Finding:
    """An issue after the catalogue: what a user and the audit log see."""

    rule: str
    severity: str
    path: str
    predicted_error: str
    remediation: str
    cause: str = ""

    def to_json(self) -> dict[str, str]:
        return {
            "rule": self.rule,
            "severity": self.severity,
            "path": self.path,
            "predicted_error": self.predicted_error,
            "remediation": self.remediation,
        }


@dataclass(frozen=True)
class EnvChanges:
    """Edits to the step environment: applied by the plugin with
    spank_unsetenv/spank_setenv, printed by the CLI."""

    unset: tuple[str, ...] = ()
    set: tuple[tuple[str, str], ...] = ()

    @property
    def empty(self) -> bool:
        return not self.unset and not self.set

    def apply(self, env: dict[str, str]) -> dict[str, str]:
        out = dict(env)
        for key in self.unset:
            out.pop(key, None)
        out.update(self.set)
        return out

    def to_json(self) -> dict[str, object]:
        return {"unset": list(self.unset), "set": dict(self.set)}


@dataclass(frozen=True)
class Verdict:
    action: str
    mode: str
    partition: str | None
    findings: tuple[Finding, ...] = ()
    env: EnvChanges = field(default_factory=EnvChanges)
    #: Set when the check itself failed and ``on_error`` decided the action.
    error: str | None = None
    #: Set when the step was not judged (container step, mode off, ...).
    skipped: str | None = None
    #: Findings an admin's exemption released (grace_policy.exempt.Exempted),
    #: for the audit line; they no longer count towards ``action``.
    exempted: tuple = ()
    #: The container image the step was judged in (its path), None on the host.
    image: str | None = None

    @property
    def rule_ids(self) -> tuple[str, ...]:
        return tuple(f.rule for f in self.findings)

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {
            "action": self.action,
            "mode": self.mode,
            "partition": self.partition,
            "findings": [f.to_json() for f in self.findings],
            "env": self.env.to_json(),
        }
        if self.error:
            out["error"] = self.error
        if self.skipped:
            out["skipped"] = self.skipped
        if self.exempted:
            out["exempted"] = [e.to_json() for e in self.exempted]
        if self.image:
            out["image"] = self.image
        return out
