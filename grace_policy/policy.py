"""The admin's configuration in the form the plugin uses at every step launch.

Validating TOML with pydantic costs ~150 ms, far too much for each step, so a
validated config is *compiled* once into a small JSON document and this
module loads that document in microseconds. The compiled form is trusted only
when it still describes the TOML on disk (same device, inode, size, mtime and
ctime) and when no ordinary user could have written it: a cache file a user
can poison would let them lower the mode of a partition.

Nothing here imports pydantic, structlog or pyelftools; ``config`` (heavy) is
imported only when no trustworthy compiled form exists.
"""

from __future__ import annotations

import os
import stat

from . import __version__
from . import _json as json
from ._record import dataclass, field
from .findings import MODES

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs ~4 ms to import; annotations are strings anyway
    from typing import Any

#: Bumped when the compiled document changes shape, so an old compiled file
#: is recompiled instead of misread.
COMPILED_FORMAT = 2

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


def _parse_glibc(text: str | None) -> tuple[int, int] | None:
    if not text:
        return None
    major, _, minor = text.partition(".")
    return int(major), int(minor)


@dataclass(frozen=True)
class NodeOverrides:
    """Facts about the node that replace detected ones. ``None`` keeps what was
    detected (or what the less specific layer said)."""

    arch: str | None = None
    page_size: int | None = None
    glibc: tuple[int, int] | None = None
    root: str | None = None

    @property
    def empty(self) -> bool:
        return self.arch is None and self.page_size is None and self.glibc is None and (
            self.root is None
        )

    def layered(self, top: NodeOverrides) -> NodeOverrides:
        """``top``'s values where set, ours elsewhere."""
        return NodeOverrides(
            arch=top.arch if top.arch is not None else self.arch,
            page_size=top.page_size if top.page_size is not None else self.page_size,
            glibc=top.glibc if top.glibc is not None else self.glibc,
            root=top.root if top.root is not None else self.root,
        )

    def apply(self, profile: Any) -> Any:
        """Return ``profile`` (a :class:`grace_policy.node.NodeProfile`) with
        these overrides applied."""
        if self.empty:
            return profile
        return profile.with_overrides(
            machine=self.arch, page_size=self.page_size, glibc=self.glibc, root=self.root
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "arch": self.arch,
            "page_size": self.page_size,
            "glibc": f"{self.glibc[0]}.{self.glibc[1]}" if self.glibc else None,
            "root": self.root,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> NodeOverrides:
        return cls(
            arch=data.get("arch"),
            page_size=data.get("page_size"),
            glibc=_parse_glibc(data.get("glibc")),
            root=data.get("root"),
        )


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


# --------------------------------------------------------------------------
# The compiled form on disk


def _stat_key(st: os.stat_result) -> list[int]:
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def compiled_path_for(path: str, cache_dir: str | None = None) -> str:
    """Where the compiled form of ``path`` lives: next to the TOML by default
    (the admin's directory, which users cannot write), or in ``cache_dir`` under
    a name derived from the TOML's absolute path so several configs can share
    one directory."""
    if cache_dir is None:
        return path + ".compiled.json"
    import hashlib  # only with a cache_dir: keeps the default path lean

    digest = hashlib.sha256(os.path.abspath(path).encode("utf-8", "surrogateescape"))
    return os.path.join(cache_dir, f"grace-policy-{digest.hexdigest()[:20]}.json")


def _read_trusted(cache: str, toml_st: os.stat_result) -> dict[str, Any] | None:
    """The compiled document if it may be believed, else None.

    Believed only when the file is a regular file (not followed through a
    symlink), owned by root or by the TOML's owner, writable by nobody else,
    and records exactly the TOML's current identity. Whoever can write the
    TOML itself can already set any policy, so trusting its owner adds no
    power.
    """
    try:
        fd = os.open(cache, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        if st.st_uid not in (0, toml_st.st_uid):
            return None
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            return None
        if st.st_size > 4 * 1024 * 1024:
            return None
        chunks = []
        remaining = st.st_size + 1
        while remaining > 0:
            chunk = os.read(fd, remaining)
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        doc = json.loads(b"".join(chunks))
    except ValueError:
        return None
    if not isinstance(doc, dict):
        return None
    if doc.get("format") != COMPILED_FORMAT or doc.get("version") != __version__:
        return None
    if doc.get("source_stat") != _stat_key(toml_st):
        return None
    policy = doc.get("policy")
    return policy if isinstance(policy, dict) else None


def _write_compiled(out: str, policy: Policy, toml_st: os.stat_result) -> None:
    """Write atomically (temp file + rename) so a reader never sees half a
    document; mode 0644 because every user's step must read it."""
    doc = {
        "format": COMPILED_FORMAT,
        "version": __version__,
        "source": policy.source,
        "source_stat": _stat_key(toml_st),
        "policy": policy.to_json(),
    }
    import tempfile  # writing happens once per config change, not per step

    data = json.dumps(doc, indent=1).encode() + b"\n"
    directory = os.path.dirname(out) or "."
    fd, tmp = tempfile.mkstemp(prefix=".grace-policy-", suffix=".tmp", dir=directory)
    try:
        os.fchmod(fd, 0o644)
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
        os.fsync(fd)
        os.close(fd)
        fd = -1
        os.replace(tmp, out)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _stat_config(path: str) -> os.stat_result:
    try:
        return os.stat(path)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config: {exc.strerror or exc}") from None


def _validate(path: str) -> Policy:
    from .config import load_config  # heavy (pydantic): only without a compiled form

    return load_config(path)


def load_policy(path: str | None, *, cache_dir: str | None = None) -> Policy:
    """The policy for ``path``; the default policy when ``path`` is None.

    Fast path: a trustworthy compiled form (see :func:`_read_trusted`). Slow
    path: validate the TOML with pydantic. Nothing is ever written: this runs
    inside every step (as root for root's steps), and the config's directory
    is the admin's; compiling is ``grace-policy config check --compile``
    (:func:`compile_config`). A missing or invalid file raises
    :class:`ConfigError`; the caller then follows ``on_error``.
    """
    if path is None:
        return DEFAULT_POLICY
    st = _stat_config(path)
    cache = compiled_path_for(path, cache_dir)
    doc = _read_trusted(cache, st)
    if doc is not None:
        try:
            return Policy.from_json(doc, source=path)
        except (KeyError, TypeError, ValueError, AttributeError):
            pass  # damaged: validate again (the admin recompiles)
    return _validate(path)


def compile_config(path: str, out: str | None = None) -> Policy:
    """Validate ``path`` and write its compiled form to ``out`` (default: next to
    it). For ``grace-policy config check --compile``, run by the admin, so
    errors writing the file are raised, not swallowed."""
    st = _stat_config(path)
    policy = _validate(path)
    if _stat_key(_stat_config(path)) != _stat_key(st):
        raise ConfigError(f"{path}: changed while it was being validated; run again")
    try:
        _write_compiled(out or compiled_path_for(path), policy, st)
    except OSError as exc:
        raise ConfigError(f"{out or compiled_path_for(path)}: cannot write: {exc}") from None
    return policy
