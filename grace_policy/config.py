"""Validation of the admin's TOML config.

This is the heavy path (pydantic): it runs for ``grace-policy config check``
and when a step finds no trustworthy compiled form; :mod:`grace_policy.policy`
then stores the result so later steps skip it.

An admin editing a config wants every mistake at once, each with the line to
go to. tomllib reports positions only for syntax errors, so :func:`key_lines`
re-reads the source just far enough to map each dotted key to its line.
"""

from __future__ import annotations

import datetime
import re
import sys
from collections.abc import Iterator, Mapping
from typing import Annotated, Any, Literal, Optional

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from .messages import escape
from .node import parse_cuda_version, parse_glibc, parse_gpu_arch, valid_arch, valid_page_size
from .policy import (
    DEFAULT_ENV_VARS,
    ConfigError,
    EnvPolicy,
    Exemption,
    Limits,
    NodeOverrides,
    PartitionPolicy,
    Policy,
    RuleOverride,
)
from .rules import TEMPLATE_FIELDS, Catalogue, template_fields

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.9/3.10 only
    import tomli as tomllib

__all__ = ["ConfigError", "ConfigModel", "key_lines", "load_config", "validate_config"]

Key = tuple[Any, ...]

# --------------------------------------------------------------------------
# Where each key is in the source


_BARE = re.compile(r"[A-Za-z0-9_-]+")
_ESCAPES = {
    "b": "\b", "t": "\t", "n": "\n", "f": "\f", "r": "\r", "e": "\x1b", '"': '"', "\\": "\\"
}


class _Scanner:
    """Just enough of a TOML reader to know on which line each key is defined.

    It runs only on text tomllib has already accepted, so it can be lenient:
    it never has to report an error, only to stay in step with the real parser
    through strings, multi-line strings, arrays and inline tables.
    """

    def __init__(self, text: str) -> None:
        self.s = text
        self.i = 0
        self.lines: dict[Key, int] = {}
        self.array_tables: dict[Key, int] = {}

    def line(self) -> int:
        return self.s.count("\n", 0, self.i) + 1

    def peek(self, n: int = 1) -> str:
        return self.s[self.i : self.i + n]

    def record(self, key: Key, line: int) -> None:
        for n in range(1, len(key)):
            self.lines.setdefault(key[:n], line)
        self.lines[key] = line

    def skip_ws(self, newlines: bool = False) -> None:
        while self.i < len(self.s):
            c = self.s[self.i]
            if c in " \t" or (newlines and c in "\r\n"):
                self.i += 1
            elif c == "#" and newlines:
                while self.i < len(self.s) and self.s[self.i] != "\n":
                    self.i += 1
            else:
                break

    def basic_string(self) -> str:
        self.i += 1  # opening quote
        out = []
        while self.i < len(self.s):
            c = self.s[self.i]
            if c == '"':
                self.i += 1
                break
            if c == "\\":
                esc = self.s[self.i + 1 : self.i + 2]
                if esc in ("u", "U"):
                    width = 4 if esc == "u" else 8
                    out.append(chr(int(self.s[self.i + 2 : self.i + 2 + width], 16)))
                    self.i += 2 + width
                    continue
                out.append(_ESCAPES.get(esc, esc))
                self.i += 2
                continue
            out.append(c)
            self.i += 1
        return "".join(out)

    def key(self) -> Key:
        parts: list[str] = []
        while True:
            self.skip_ws()
            c = self.peek()
            if c == '"':
                parts.append(self.basic_string())
            elif c == "'":
                end = self.s.index("'", self.i + 1)
                parts.append(self.s[self.i + 1 : end])
                self.i = end + 1
            else:
                m = _BARE.match(self.s, self.i)
                if not m:
                    break
                parts.append(m.group(0))
                self.i = m.end()
            self.skip_ws()
            if self.peek() != ".":
                break
            self.i += 1
        return tuple(parts)

    def skip_string(self) -> None:
        for quote in ('"""', "'''"):
            if self.s.startswith(quote, self.i):
                end = self.i + 3
                while True:
                    end = self.s.index(quote, end)
                    if quote == '"""' and self._escaped(end):
                        end += 1
                        continue
                    break
                # a closing delimiter may be followed by up to two more quotes
                end += 3
                while end < len(self.s) and self.s[end] == quote[0] and end - self.i < 6 + 2:
                    end += 1
                self.i = end
                return
        if self.peek() == '"':
            self.basic_string()
        else:
            self.i = self.s.index("'", self.i + 1) + 1

    def _escaped(self, pos: int) -> bool:
        n = 0
        while pos - 1 - n >= 0 and self.s[pos - 1 - n] == "\\":
            n += 1
        return n % 2 == 1

    def value(self, key: Key) -> None:
        self.skip_ws()
        c = self.peek()
        if c in "\"'":
            self.skip_string()
        elif c == "[":
            self.i += 1
            index = 0
            while True:
                self.skip_ws(newlines=True)
                if self.peek() == "]":
                    self.i += 1
                    return
                self.record((*key, index), self.line())
                self.value((*key, index))
                index += 1
                self.skip_ws(newlines=True)
                if self.peek() == ",":
                    self.i += 1
        elif c == "{":
            self.i += 1
            while True:
                self.skip_ws(newlines=True)
                if self.peek() == "}":
                    self.i += 1
                    return
                line = self.line()
                sub = (*key, *self.key())
                self.record(sub, line)
                self.skip_ws()
                self.i += 1  # '='
                self.value(sub)
                self.skip_ws(newlines=True)
                if self.peek() == ",":
                    self.i += 1
        else:  # number, bool, date: up to a delimiter
            while self.i < len(self.s) and self.s[self.i] not in ",]}\n#":
                self.i += 1

    def run(self) -> dict[Key, int]:
        table: Key = ()
        while True:
            self.skip_ws(newlines=True)
            if self.i >= len(self.s):
                return self.lines
            line = self.line()
            if self.s.startswith("[[", self.i):
                self.i += 2
                name = self.key()
                self.i = self.s.index("]]", self.i) + 2
                index = self.array_tables.get(name, -1) + 1
                self.array_tables[name] = index
                table = (*name, index)
                self.record(name, line)
                self.record(table, line)
            elif self.peek() == "[":
                self.i += 1
                table = self.key()
                self.i = self.s.index("]", self.i) + 1
                self.record(table, line)
            else:
                key = (*table, *self.key())
                self.record(key, line)
                self.skip_ws()
                self.i += 1  # '='
                self.value(key)
            # the rest of the line is whitespace or a comment
            while self.i < len(self.s) and self.s[self.i] != "\n":
                self.i += 1


def key_lines(text: str) -> dict[Key, int]:
    """Map every dotted key path in TOML ``text`` (tables, dotted and quoted keys,
    array items as integer indexes, inline tables) to the line defining it.
    A table defined only implicitly (``[a.b]`` implies ``a``) maps to the first
    line that mentions it. Best effort: an unexpected construct ends the scan
    with what was found so far."""
    scanner = _Scanner(text)
    try:
        return scanner.run()
    except (ValueError, IndexError):
        return scanner.lines


def locate(lines: Mapping[Key, int], key: Key) -> int | None:
    """The line of ``key``, or of its closest enclosing key that has one
    (a missing field is reported where its table is)."""
    for n in range(len(key), 0, -1):
        line = lines.get(tuple(key[:n]))
        if line is not None:
            return line
    return None


def dotted(key: Key) -> str:
    """``("partitions", "gpu.a", "mode")`` → ``partitions."gpu.a".mode``: the
    spelling an admin can search for in their file."""
    parts = []
    for part in key:
        if isinstance(part, int):
            parts.append(f"[{part}]")
        elif _BARE.fullmatch(part):
            parts.append(("." if parts else "") + part)
        else:
            escaped = escape(part.replace("\\", "\\\\").replace('"', '\\"'))
            parts.append(("." if parts else "") + f'"{escaped}"')
    return "".join(parts)


# --------------------------------------------------------------------------
# The schema


_GLIBC = re.compile(r"[0-9]+\.[0-9]+")


def _glibc(value: str) -> str:
    if not _GLIBC.fullmatch(value):
        raise ValueError(f'must look like "2.34", got {value!r}')
    return value


def _abs_path(value: str) -> str:
    if not value.startswith("/"):
        raise ValueError(f"must be an absolute path, got {value!r}")
    return value


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _env_name(value: str) -> str:
    if not _ENV_NAME.fullmatch(value):
        raise ValueError(f"not a variable name: {value!r}")
    return value


def _template(value: str) -> str:
    unknown = [f for f in template_fields(value) if f not in TEMPLATE_FIELDS]
    if unknown:
        known = ", ".join("{" + f + "}" for f in sorted(TEMPLATE_FIELDS))
        raise ValueError(f"unknown template field {{{unknown[0]}}} (known: {known})")
    return value


def _cuda_index(value: str) -> str:
    # The label of a PyTorch wheel index (cu130, cu128, rocm6.4, cpu): it is
    # shown to users inside a URL and a command line.
    ok = 1 <= len(value) <= 16 and value[0].isalpha() and all(
        c.isascii() and (c.isalnum() or c == ".") and not c.isupper() for c in value)
    if not ok:
        raise ValueError("must be a PyTorch wheel index label such as 'cu130' or 'rocm6.4'")
    return value


def _gpu_arch(value: str) -> str:
    parse_gpu_arch(value)  # ValueError names the key's expected form
    return value


def _cuda_driver(value: str) -> str:
    parse_cuda_version(value)
    return value


def _build_hint(value: str) -> str:
    unknown = [f for f in template_fields(value) if f != "partition"]
    if unknown:
        raise ValueError(f"only {{partition}} can be filled in here, not {{{unknown[0]}}}")
    return value


PageSize = Annotated[int, AfterValidator(valid_page_size)]
Arch = Annotated[str, AfterValidator(valid_arch)]
Glibc = Annotated[str, AfterValidator(_glibc)]
AbsPath = Annotated[str, AfterValidator(_abs_path)]
EnvName = Annotated[str, AfterValidator(_env_name)]
Mode = Literal["enforce", "warn", "off"]
Severity = Literal["error", "warning", "info", "off"]
Template = Annotated[str, AfterValidator(_template)]

# pydantic evaluates these annotations at runtime; ``X | None`` fails there on
# Python 3.9, so the optional forms are spelled out once here.
CudaIndex = Annotated[str, AfterValidator(_cuda_index)]
OptCudaIndex = Optional[CudaIndex]
GpuArch = Annotated[str, AfterValidator(_gpu_arch)]
OptGpuArch = Optional[GpuArch]
CudaDriver = Annotated[str, AfterValidator(_cuda_driver)]
OptCudaDriver = Optional[CudaDriver]
OptArch = Optional[Arch]
OptPageSize = Optional[PageSize]
OptGlibc = Optional[Glibc]
OptAbsPath = Optional[AbsPath]
OptMode = Optional[Mode]
OptSeverity = Optional[Severity]
OptTemplate = Optional[Template]


class _Model(BaseModel):
    # strict: "65536" is not a page size and "yes" is not a boolean; a config
    # that means something else than it says should not load.
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class NodeModel(_Model):
    arch: OptArch = None
    page_size: OptPageSize = None
    glibc: OptGlibc = None
    root: OptAbsPath = None
    #: The GPUs' architecture ("sm_100") and the CUDA version the driver
    #: supports ("13.0"); unset: read from NVML on the node.
    gpu_arch: OptGpuArch = None
    cuda_driver: OptCudaDriver = None


Submit = Literal["warn", "enforce"]
OptSubmit = Optional[Submit]


class PartitionModel(_Model):
    mode: OptMode = None
    #: What the submit-host check (cli_filter.lua) does with a job that
    #: would be rejected here: tell the user (warn) or refuse it (enforce).
    submit: OptSubmit = None
    arch: OptArch = None
    page_size: OptPageSize = None
    glibc: OptGlibc = None
    allow_user_lower: bool = False
    cuda_index: OptCudaIndex = None
    gpu_arch: OptGpuArch = None
    cuda_driver: OptCudaDriver = None


class EnvModel(_Model):
    vars: list[EnvName] = Field(default_factory=lambda: list(DEFAULT_ENV_VARS))
    strip: Literal["foreign", "always", "never"] = "foreign"


def _path_glob(value: str) -> str:
    if not value.startswith("/"):
        raise ValueError(f"must be an absolute path or glob, got {value!r}")
    if "[" in value or "{" in value:
        raise ValueError("only *, ** and ? are glob characters here; [ and { are not "
                         f"supported (got {value!r})")
    return value


def _one_line_text(value: str) -> str:
    if not value.strip() or not value.isprintable():
        raise ValueError("must be one printable line of text (it is shown in the audit log)")
    return value


def _name(value: str) -> str:
    if not value or not value.isprintable() or value != value.strip():
        raise ValueError(f"not a user or group name: {value!r}")
    return value


_OptNames = Optional[list[str]]  # spelled out for pydantic on Python 3.9 (see OptArch)


class ExemptModel(_Model):
    """One ``[[rules.RULE.exempt]]``: who or what is released from RULE, why,
    and until when. Every selector given must match."""

    paths: list[Annotated[str, AfterValidator(_path_glob)]] = Field(default_factory=list)
    users: list[Annotated[str, AfterValidator(_name)]] = Field(default_factory=list)
    groups: list[Annotated[str, AfterValidator(_name)]] = Field(default_factory=list)
    #: Refused with a reason: see the validator.
    accounts: _OptNames = None
    until: datetime.date
    reason: Annotated[str, AfterValidator(_one_line_text)]

    @field_validator("accounts")
    @classmethod
    def _no_accounts(cls, value: list[str] | None) -> list[str] | None:
        # Seen on the test cluster (Slurm 22.05): inside an allocation,
        # `SLURM_JOB_ACCOUNT=x srun ...` reaches the step as x, and no SPANK
        # item carries the account, so the plugin has no account a user
        # cannot choose. An account exemption would be one users grant
        # themselves.
        raise ValueError("accounts cannot be exempted: slurmstepd gives the plugin no "
                         "account the user cannot set (SLURM_JOB_ACCOUNT is the user's to "
                         "export); use users or groups")

    @model_validator(mode="after")
    def _selects_something(self) -> ExemptModel:
        if not (self.paths or self.users or self.groups):
            raise ValueError("an exemption needs at least one of paths, users, groups "
                             "(an exemption for everything is severity = \"off\")")
        return self


class RuleModel(_Model):
    severity: OptSeverity = None
    text: OptTemplate = None
    exempt: list[ExemptModel] = Field(default_factory=list)


class AuditModel(_Model):
    path: OptAbsPath = None


class ConfigModel(_Model):
    mode: Mode = "enforce"
    submit: Submit = "warn"
    on_error: Literal["allow", "deny"] = "allow"
    deadline_ms: Annotated[int, Field(ge=1, le=600_000)] = 500
    max_files: Annotated[int, Field(ge=1, le=10_000_000)] = 2000
    max_bytes: Annotated[int, Field(ge=4096, le=1 << 40)] = 64 * 1024 * 1024
    site_build_hint: Annotated[str, AfterValidator(_build_hint)] = ""
    contact: str = ""
    allow_user_lower: bool = False
    node: NodeModel = NodeModel()
    partitions: dict[str, PartitionModel] = Field(default_factory=dict)
    env: EnvModel = EnvModel()
    rules: dict[str, RuleModel] = Field(default_factory=dict)
    audit: AuditModel = AuditModel()


# --------------------------------------------------------------------------
# Checks that need the catalogue


def _catalogue_problems(data: Mapping[str, Any]) -> Iterator[tuple[Key, str]]:
    """Rule ids the catalogue does not know, and severities above a rule's
    maximum. Run on the raw document so they are reported together with
    pydantic's problems, not only once those are fixed."""
    rules = data.get("rules")
    if not isinstance(rules, Mapping):
        return
    catalogue = Catalogue.load()
    ids = catalogue.ids()
    for rule_id, body in rules.items():
        rule = catalogue.rule(rule_id)
        if rule is None:
            yield ("rules", rule_id), f"no such rule (known: {', '.join(ids)})"
            continue
        if rule_id == "check-limit" and isinstance(body, Mapping) and "exempt" in body:
            yield (("rules", rule_id, "exempt"),
                   "check-limit cannot be exempted: it names no program, only a check "
                   "that did not finish (on_error decides those steps)")
        severity = body.get("severity") if isinstance(body, Mapping) else None
        if severity in ("error", "warning", "info") and (
            ("error", "warning", "info").index(severity)
            < ("error", "warning", "info").index(rule.max_severity)
        ):
            yield (
                ("rules", rule_id, "severity"),
                f"{rule_id} can be at most {rule.max_severity!r}: it never stops a step alone",
            )


def _pydantic_problems(exc: ValidationError) -> Iterator[tuple[Key, str]]:
    for err in exc.errors(include_url=False):
        loc = tuple(err["loc"])
        kind = err["type"]
        msg = err["msg"]
        if kind == "extra_forbidden":
            msg = "unknown key"
        elif kind == "missing":
            msg = "required key is missing"
        else:
            if msg.startswith("Value error, "):
                msg = msg[len("Value error, ") :]
            value = err.get("input")
            short = not isinstance(value, str) or (len(value) <= 60 and "\n" not in value)
            if isinstance(value, (str, int, float, bool)) and short and repr(value) not in msg:
                msg = f"{msg} (got {value!r})"
        yield loc, msg


def validate_config(
    data: Mapping[str, Any], *, text: str = "", name: str = "<config>"
) -> ConfigModel:
    """Validate a parsed document. ``text`` (the TOML source) lets errors carry
    line numbers; ``name`` is the file name they start with."""
    problems: list[tuple[Key, str]] = list(_catalogue_problems(data))
    model: ConfigModel | None = None
    try:
        model = ConfigModel.model_validate(data)
    except ValidationError as exc:
        problems.extend(_pydantic_problems(exc))
    if problems or model is None:
        lines = key_lines(text) if text else {}
        rendered = []
        for key, msg in problems:
            line = locate(lines, key)
            where = f"{name}:{line}" if line is not None else name
            text_line = f"{where}: {dotted(key)}: {msg}" if key else f"{where}: {msg}"
            rendered.append((line or 0, text_line))
        rendered.sort(key=lambda item: item[0])
        raise ConfigError([r for _, r in rendered])
    return model


def _opt_version(parse: Any, text: str | None) -> tuple[int, int] | None:
    return None if text is None else parse(text)  # type: ignore[no-any-return]


def to_policy(model: ConfigModel, source: str | None = None) -> Policy:
    """The lean, frozen form of a validated config."""
    return Policy(
        mode=model.mode,
        submit=model.submit,
        on_error=model.on_error,
        limits=Limits(
            deadline_ms=model.deadline_ms, max_files=model.max_files, max_bytes=model.max_bytes
        ),
        site_build_hint=model.site_build_hint,
        contact=model.contact,
        allow_user_lower=model.allow_user_lower,
        node=NodeOverrides(
            arch=model.node.arch,
            page_size=model.node.page_size,
            glibc=parse_glibc(model.node.glibc),
            root=model.node.root,
            gpu_arch=_opt_version(parse_gpu_arch, model.node.gpu_arch),
            cuda_driver=_opt_version(parse_cuda_version, model.node.cuda_driver),
        ),
        partitions=tuple(
            PartitionPolicy(
                name=name,
                mode=p.mode,
                submit=p.submit,
                node=NodeOverrides(arch=p.arch, page_size=p.page_size, glibc=parse_glibc(p.glibc),
                                   gpu_arch=_opt_version(parse_gpu_arch, p.gpu_arch),
                                   cuda_driver=_opt_version(parse_cuda_version,
                                                            p.cuda_driver)),
                allow_user_lower=p.allow_user_lower,
                cuda_index=p.cuda_index,
            )
            for name, p in model.partitions.items()
        ),
        rules=tuple(
            RuleOverride(rule=rule_id, severity=r.severity, text=r.text)
            for rule_id, r in model.rules.items()
        ),
        env=EnvPolicy(vars=tuple(model.env.vars), strip=model.env.strip),
        audit_path=model.audit.path,
        exemptions=tuple(
            Exemption(rule=rule_id, until=e.until.isoformat(), reason=e.reason,
                      paths=tuple(e.paths), users=tuple(e.users), groups=tuple(e.groups),
                      where=f"rules.{rule_id}.exempt[{i}]")
            for rule_id, r in model.rules.items()
            for i, e in enumerate(r.exempt)
        ),
        source=source,
    )


_SYNTAX_LINE = re.compile(r"at line (\d+)")


def parse_toml(text: str, name: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        message = str(exc)
        m = _SYNTAX_LINE.search(message)
        where = f"{name}:{m.group(1)}" if m else name
        raise ConfigError(f"{where}: TOML syntax: {message}") from None


def load_config(path: str) -> Policy:
    """Read, parse and validate ``path``; raise :class:`ConfigError` listing every
    problem, one line each, ``FILE:LINE: dotted.key: what is wrong``."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise ConfigError(f"{path}:{line}: not valid UTF-8") from None
    data = parse_toml(text, path)
    model = validate_config(data, text=text, name=path)
    return to_policy(model, source=path)
