"""The admin's configuration in the form the plugin uses at every step launch:
frozen dataclasses, and their JSON form (what :mod:`grace_policy.compiled`
stores on disk so a step never pays for validating TOML).

Nothing here imports pydantic, structlog or pyelftools. ``config`` (heavy)
builds these objects from the TOML; ``compiled`` loads them in microseconds.
"""

from __future__ import annotations

from ._record import dataclass, field
from .findings import MODES
from .node import parse_cuda_version, parse_glibc, parse_gpu_arch, version_text

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs ~4 ms to import; annotations are strings anyway
    from typing import Any

#: How strict each mode is; a user option may only move down this scale.
_MODE_RANK = {"off": 0, "warn": 1, "enforce": 2}

DEFAULT_ENV_VARS = (
    "CONDA_PREFIX",
    "CONDA_DEFAULT_ENV",
    "CONDA_EXE",
    "CONDA_PYTHON_EXE",
    "CONDA_SHLVL",
    "_CE_CONDA",
    "_CE_M",
    "VIRTUAL_ENV",
    "VIRTUAL_ENV_PROMPT",
)


class ConfigError(Exception):
    """The config cannot be used. Defined here, not in ``config``, so the plugin
    can catch it without importing pydantic.

    ``problems`` holds one line per problem (``FILE:LINE: key: message``);
    ``str()`` joins them with newlines.
    """

    def __init__(self, problems: list[str] | str) -> None:
        if isinstance(problems, str):
            problems = [problems]
        self.problems: list[str] = list(problems)
        super().__init__("\n".join(self.problems))


def _glibc_of(text: str | None) -> tuple[int, int] | None:
    """The glibc version a compiled document records; a damaged one fails
    loudly (ValueError) rather than dropping the override."""
    version = parse_glibc(text)
    if text and version is None:
        raise ValueError(f"bad glibc version {text!r} in compiled policy")
    return version


@dataclass(frozen=True)
class NodeOverrides:
    """Facts about the node that replace detected ones. ``None`` keeps what was
    detected (or what the less specific layer said)."""

    arch: str | None = None
    page_size: int | None = None
    glibc: tuple[int, int] | None = None
    root: str | None = None
    #: The node's GPUs' compute capability (config ``gpu_arch``), e.g. (10, 0).
    gpu_arch: tuple[int, int] | None = None
    #: The CUDA version its driver supports (config ``cuda_driver``).
    cuda_driver: tuple[int, int] | None = None

    @property
    def empty(self) -> bool:
        return self.arch is None and self.page_size is None and self.glibc is None and (
            self.root is None and self.gpu_arch is None and self.cuda_driver is None
        )

    def layered(self, top: NodeOverrides) -> NodeOverrides:
        """``top``'s values where set, ours elsewhere."""
        return NodeOverrides(
            arch=top.arch if top.arch is not None else self.arch,
            page_size=top.page_size if top.page_size is not None else self.page_size,
            glibc=top.glibc if top.glibc is not None else self.glibc,
            root=top.root if top.root is not None else self.root,
            gpu_arch=top.gpu_arch if top.gpu_arch is not None else self.gpu_arch,
            cuda_driver=top.cuda_driver if top.cuda_driver is not None else self.cuda_driver,
        )

    def apply(self, profile: Any) -> Any:
        """Return ``profile`` (a :class:`grace_policy.node.NodeProfile`) with
        these overrides applied."""
        if self.empty:
            return profile
        return profile.with_overrides(
            machine=self.arch, page_size=self.page_size, glibc=self.glibc, root=self.root,
            gpu_arch=self.gpu_arch, cuda_driver=self.cuda_driver,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "arch": self.arch,
            "page_size": self.page_size,
            "glibc": f"{self.glibc[0]}.{self.glibc[1]}" if self.glibc else None,
            "root": self.root,
            "gpu_arch": version_text(self.gpu_arch),
            "cuda_driver": version_text(self.cuda_driver),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> NodeOverrides:
        return cls(
            arch=data.get("arch"),
            page_size=data.get("page_size"),
            glibc=_glibc_of(data.get("glibc")),
            root=data.get("root"),
            gpu_arch=_opt(parse_gpu_arch, data.get("gpu_arch")),
            cuda_driver=_opt(parse_cuda_version, data.get("cuda_driver")),
        )


def _opt(parse: Any, text: str | None) -> tuple[int, int] | None:
    """A compiled document's version text; a damaged one raises ValueError."""
    return None if text is None else parse(text)  # type: ignore[no-any-return]


def _submit(value: Any, optional: bool = False) -> Any:
    if value is None and optional:
        return None
    if value not in ("warn", "enforce"):
        raise ValueError("bad submit action in compiled policy")
    return value


@dataclass(frozen=True)
class PartitionPolicy:
    """What the admin said about one partition. ``mode`` None means the
    top-level mode applies."""

    name: str
    mode: str | None = None
    node: NodeOverrides = field(default_factory=NodeOverrides)
    allow_user_lower: bool = False
    #: The PyTorch wheel index that matches the partition's CUDA (``cu130``).
    cuda_index: str | None = None
    #: The submit-host check's action for this partition (None: the top level's).
    submit: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"mode": self.mode, "allow_user_lower": self.allow_user_lower,
                               "cuda_index": self.cuda_index, "submit": self.submit}
        out.update(self.node.to_json())
        out.pop("root", None)
        return out

    @classmethod
    def from_json(cls, name: str, data: dict[str, Any]) -> PartitionPolicy:
        return cls(
            name=name,
            mode=data.get("mode"),
            node=NodeOverrides.from_json(data),
            allow_user_lower=bool(data.get("allow_user_lower", False)),
            cuda_index=data.get("cuda_index"),
            submit=_submit(data.get("submit"), optional=True),
        )


@dataclass(frozen=True)
class RuleOverride:
    """An admin's change to one catalogue rule: a severity (``off`` drops the
    rule) and/or a remediation text that replaces the catalogue's."""

    rule: str
    severity: str | None = None
    text: str | None = None


@dataclass(frozen=True)
class Exemption:
    """An admin's release of one rule for some files and/or people, until a
    date (grace_policy/exempt.py applies it). Every selector given must match;
    ``until`` is the last day (UTC, ``YYYY-MM-DD``) on which it applies."""

    rule: str
    until: str
    reason: str
    paths: tuple[str, ...] = ()
    users: tuple[str, ...] = ()
    groups: tuple[str, ...] = ()
    #: Where the admin wrote it (``rules.RULE.exempt[N]``), named in the audit line.
    where: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"rule": self.rule, "until": self.until, "reason": self.reason,
                "paths": list(self.paths), "users": list(self.users),
                "groups": list(self.groups), "where": self.where}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Exemption:
        until = data["until"]
        if not (isinstance(until, str) and len(until) == 10 and until[4] == "-"):
            raise ValueError("bad exemption date in compiled policy")
        selectors = [tuple(str(x) for x in data.get(k) or ()) for k in ("paths", "users", "groups")]
        if not any(selectors):
            raise ValueError("exemption without a selector in compiled policy")
        return cls(rule=str(data["rule"]), until=until, reason=str(data["reason"]),
                   paths=selectors[0], users=selectors[1], groups=selectors[2],
                   where=str(data.get("where", "")))


@dataclass(frozen=True)
class EnvPolicy:
    vars: tuple[str, ...] = DEFAULT_ENV_VARS
    #: foreign | always | never
    strip: str = "foreign"


@dataclass(frozen=True)
class Limits:
    deadline_ms: int = 500
    max_files: int = 2000
    max_bytes: int = 64 * 1024 * 1024


@dataclass(frozen=True)
class Policy:
    """The compiled, validated config. Build it with :func:`load_policy`; the
    default instance is what applies when no config file is given."""

    mode: str = "enforce"
    #: What cli_filter.lua does on the submit host with a job the check
    #: would reject: ``warn`` (tell, then queue) or ``enforce`` (refuse).
    submit: str = "warn"
    on_error: str = "allow"
    limits: Limits = field(default_factory=Limits)
    site_build_hint: str = ""
    #: Free text telling users whom to ask (mail address, ticket URL).
    contact: str = ""
    #: Whether a user option may lower the mode on partitions not listed.
    allow_user_lower: bool = False
    node: NodeOverrides = field(default_factory=NodeOverrides)
    partitions: tuple[PartitionPolicy, ...] = ()
    rules: tuple[RuleOverride, ...] = ()
    env: EnvPolicy = field(default_factory=EnvPolicy)
    #: No longer read by the plugin (plugstack.conf's ``audit=`` is the one
    #: audit setting); kept so ``config check`` can say so.
    audit_path: str | None = None
    #: ``[[rules.RULE.exempt]]`` entries, in file order.
    exemptions: tuple[Exemption, ...] = ()
    #: The TOML this was compiled from, for messages; None for the default.
    source: str | None = field(default=None, compare=False)

    def partition(self, name: str | None) -> PartitionPolicy | None:
        if not name:
            return None
        for part in self.partitions:
            if part.name == name:
                return part
        return None

    def mode_for(self, partition: str | None, requested: str | None = None) -> str:
        """The mode for a step in ``partition``.

        ``requested`` is a mode a user asked for through a plugin option; it is
        honoured only if it is *lower* than the admin's mode and the admin
        allowed lowering there. Anything else the user asks for is ignored, so
        nothing a user sets can make a partition laxer than the admin wants.
        """
        part = self.partition(partition)
        mode = self.mode
        allow_lower = self.allow_user_lower
        if part is not None:
            if part.mode is not None:
                mode = part.mode
            allow_lower = part.allow_user_lower
        if (
            requested is not None
            and allow_lower
            and requested in _MODE_RANK
            and _MODE_RANK[requested] < _MODE_RANK[mode]
        ):
            return requested
        return mode

    def submit_for(self, partition: str | None) -> str:
        """The submit-host action for jobs to ``partition``."""
        part = self.partition(partition)
        if part is not None and part.submit is not None:
            return part.submit
        return self.submit

    def node_overrides_for(self, partition: str | None) -> NodeOverrides:
        """``[node]`` with the partition's facts on top: the partition entry is
        the more specific statement about the nodes a step lands on."""
        part = self.partition(partition)
        if part is None:
            return self.node
        return self.node.layered(part.node)

    def rule_override(self, rule: str) -> RuleOverride | None:
        for override in self.rules:
            if override.rule == rule:
                return override
        return None

    @property
    def deadline_ms(self) -> int:
        return self.limits.deadline_ms

    @property
    def max_files(self) -> int:
        return self.limits.max_files

    @property
    def max_bytes(self) -> int:
        return self.limits.max_bytes

    def to_json(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "submit": self.submit,
            "on_error": self.on_error,
            "deadline_ms": self.limits.deadline_ms,
            "max_files": self.limits.max_files,
            "max_bytes": self.limits.max_bytes,
            "site_build_hint": self.site_build_hint,
            "contact": self.contact,
            "allow_user_lower": self.allow_user_lower,
            "node": self.node.to_json(),
            "partitions": {p.name: p.to_json() for p in self.partitions},
            "rules": {
                r.rule: {"severity": r.severity, "text": r.text} for r in self.rules
            },
            "env": {"vars": list(self.env.vars), "strip": self.env.strip},
            "audit_path": self.audit_path,
            "exemptions": [e.to_json() for e in self.exemptions],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any], source: str | None = None) -> Policy:
        """Rebuild from :meth:`to_json`. The input is a validated document, but a
        damaged one must still fail loudly (KeyError/TypeError/ValueError) rather
        than produce a laxer policy, so the checks below are deliberate."""
        mode = data["mode"]
        on_error = data["on_error"]
        if mode not in MODES or on_error not in ("allow", "deny"):
            raise ValueError("bad mode in compiled policy")
        partitions = tuple(
            PartitionPolicy.from_json(name, p) for name, p in data["partitions"].items()
        )
        for part in partitions:
            if part.mode is not None and part.mode not in MODES:
                raise ValueError("bad partition mode in compiled policy")
        env = data["env"]
        return cls(
            mode=mode,
            submit=_submit(data.get("submit", "warn")),
            on_error=on_error,
            limits=Limits(
                deadline_ms=int(data["deadline_ms"]),
                max_files=int(data["max_files"]),
                max_bytes=int(data["max_bytes"]),
            ),
            site_build_hint=str(data.get("site_build_hint", "")),
            contact=str(data.get("contact", "")),
            allow_user_lower=bool(data.get("allow_user_lower", False)),
            node=NodeOverrides.from_json(data["node"]),
            partitions=partitions,
            rules=tuple(
                RuleOverride(rule=r, severity=v.get("severity"), text=v.get("text"))
                for r, v in data["rules"].items()
            ),
            env=EnvPolicy(vars=tuple(env["vars"]), strip=env["strip"]),
            audit_path=data.get("audit_path"),
            exemptions=tuple(Exemption.from_json(e) for e in data.get("exemptions", ())),
            source=source,
        )


DEFAULT_POLICY = Policy()
