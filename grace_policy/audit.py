"""The audit log: one JSON object per line per decision.

Steps on a node write concurrently, so each line goes out in a single
``os.write`` on an ``O_APPEND`` descriptor: the kernel appends it whole, and
lines from different steps never interleave.

Decisions with findings or errors go through structlog (its processors are
the ones admins may want to extend). A clean allow is by far the most common
decision and must not pay ~80-100 ms to import structlog, so it is written by
:func:`_lean_line`, which produces the same keys in the same format; a test
holds the two writers to that.

Nothing is escaped beyond what ``json.dumps(ensure_ascii=True)`` does: that
already turns control characters, newlines and undecodable bytes (surrogates)
into ``\\uXXXX``, so every line stays one valid JSON line whatever the input.
"""

from __future__ import annotations

import os
import time

from . import _json as json
from .findings import Verdict

TYPE_CHECKING = False
if TYPE_CHECKING:  # keep typing off the clean path; annotations are strings
    from collections.abc import Mapping
    from typing import Any, TypedDict, Unpack

    class Where(TypedDict, total=False):
        """Which step a line is about: :func:`record_fields`' keywords."""

        job_id: str | int | None
        step_id: str | int | None
        uid: int | None
        node: str | None
        elapsed_ms: float | None
        program: str | None
        phase: str | None

#: Every line has exactly these keys (None where not applicable), so tools can
#: rely on them; ``time`` and ``event`` are added by the writers.
FIELDS = (
    "job_id",
    "step_id",
    "uid",
    "node",
    "partition",
    "mode",
    "action",
    "rules",
    "paths",
    "env_unset",
    "env_set",
    "elapsed_ms",
    "error",
    "skipped",
    "program",
    "enforce_action",
    "exempt",
    "image",
)
EVENT = "decision"
#: The optional ``phase`` key of a pyxis registry-image step, judged twice on
#: each node: from the manifest in user_init, then from the root pyxis made,
#: in task_init (spank/grace_afterpull.c). Other lines have no ``phase``.
PHASES = ("before_pull", "after_pull")

#: Arguments shared by both writers so their output is byte-compatible.
_DUMPS: dict[str, Any] = {"sort_keys": True, "ensure_ascii": True, "default": str}

_OPEN_FLAGS = os.O_APPEND | os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC | os.O_NONBLOCK


def record_fields(verdict: Verdict, where: Where) -> dict[str, Any]:
    """The fields of one decision line (all of :data:`FIELDS`). Env changes are
    logged by name only: values may hold secrets.

    ``where``: which step (:class:`Where`; a missing key is None, ``node``
    and ``uid`` then this host's and this process'). ``program``: the
    step's argv[0] as given. ``enforce_action``: what mode
    enforce would have done with the same findings (for a warn partition,
    what rolling enforce out there would refuse; None when nothing was
    judged). ``exempt``: findings an exemption released, with its reason."""
    job_id, step_id = where.get("job_id"), where.get("step_id")
    elapsed_ms = where.get("elapsed_ms")
    node = where.get("node")
    if node is None:
        node = os.uname().nodename
    uid = where.get("uid")
    if uid is None:
        uid = os.getuid()
    paths = list(dict.fromkeys(f.path for f in verdict.findings))
    fields = {
        "job_id": None if job_id is None else str(job_id),
        "step_id": None if step_id is None else str(step_id),
        "uid": uid,
        "node": node,
        "partition": verdict.partition,
        "mode": verdict.mode,
        "action": verdict.action,
        "rules": list(verdict.rule_ids),
        "paths": paths,
        "env_unset": list(verdict.env.unset),
        "env_set": [k for k, _ in verdict.env.set],
        "elapsed_ms": None if elapsed_ms is None else round(float(elapsed_ms), 3),
        "error": verdict.error,
        "skipped": verdict.skipped,
        "program": where.get("program"),
        "enforce_action": enforce_action(verdict),
        "exempt": [e.to_json() for e in verdict.exempted],
        # The container image the step was judged in (issue 15), else None.
        "image": verdict.image,
    }
    if where.get("phase"):
        # Only on a step judged twice (a registry image: before the pull and
        # again after it, :data:`PHASES`), so report counts the step once.
        fields["phase"] = where["phase"]
    return fields


def enforce_action(verdict: Verdict) -> str | None:
    """The action mode ``enforce`` would have taken on this verdict's findings
    (the same severities, after exemptions); None when no check ran."""
    if verdict.mode == "off" or verdict.skipped == "mode off":
        return None
    if verdict.action == "reject" or any(f.severity == "error" for f in verdict.findings):
        return "reject"
    if verdict.action == "warn":
        return "warn"
    return "allow"


def iso_utc(now: float | None = None) -> str:
    """The timestamp exactly as structlog's ``TimeStamper(fmt="iso", utc=True)``
    writes it (``datetime.isoformat`` with ``Z``: microseconds omitted when
    zero), without importing datetime on the clean path."""
    if now is None:
        now = time.time()
    seconds = int(now)
    micros = round((now - seconds) * 1_000_000)
    if micros >= 1_000_000:
        seconds, micros = seconds + 1, micros - 1_000_000
    base = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))
    return f"{base}.{micros:06d}Z" if micros else f"{base}Z"


def _lean_line(fields: Mapping[str, Any], now: float | None = None) -> str:
    event = dict(fields)
    event["event"] = EVENT
    event["time"] = iso_utc(now)
    return json.dumps(event, **_DUMPS)


class _Kept:
    """A structlog logger that keeps the rendered line instead of writing it:
    the caller writes it with one ``os.write`` (structlog's WriteLogger goes
    through a buffered file object, which may split a long line into several
    writes that interleave with another step's on a shared O_APPEND file), or
    hands it to the plugin's C side to write (:func:`render_decision`)."""

    def __init__(self) -> None:
        self.line = ""

    def msg(self, message: str) -> None:
        self.line = message

    info = warning = error = msg


def _structlog_line(fields: Mapping[str, Any]) -> str:
    import structlog  # only decisions that explain something pay for this

    kept = _Kept()
    logger = structlog.wrap_logger(
        kept,
        processors=[
            structlog.processors.TimeStamper(fmt="iso", utc=True, key="time"),
            structlog.processors.JSONRenderer(**_DUMPS),
        ],
        wrapper_class=structlog.BoundLogger,
        context_class=dict,
    )
    logger.info(EVENT, **fields)
    return kept.line


def _write_all(fd: int, data: bytes) -> None:
    n = os.write(fd, data)
    if n != len(data):
        # A regular file only writes short when the disk fills up; the rest
        # cannot be appended atomically any more, so say so instead of
        # completing a line another step may already have interleaved with.
        raise OSError(28, f"short write ({n} of {len(data)} bytes)")


def needs_structlog(verdict: Verdict) -> bool:
    """Clean decisions (nothing found, nothing failed) take the lean writer."""
    return bool(verdict.findings or verdict.error)


def render_decision(verdict: Verdict, **where: Unpack[Where]) -> str:
    """The decision line of ``verdict``, newline included, without writing
    it: the plugin's check hands it to slurmstepd, which writes it only once
    the verdict has been applied (a failed env edit writes C's failure line
    instead), so every judgement leaves exactly one line (a registry image's
    step is judged twice per node, lines marked by ``phase``). Raises what building
    the record raises; :func:`write_decision` is the never-raising writer."""
    fields = record_fields(verdict, where)
    line = None
    if needs_structlog(verdict):
        try:
            line = _structlog_line(fields)
        except ImportError:
            pass
    return (line if line is not None else _lean_line(fields)) + "\n"


def write_decision(
    path: str | None,
    verdict: Verdict,
    *,
    mode: int = 0o640,
    fd: int | None = None,
    **where: Unpack[Where],
) -> str | None:
    """Append one line for ``verdict`` to ``path`` (``where``: the step's
    ids, node, time and program, as :func:`record_fields` takes them).

    Never raises: the audit log must not decide whether a step runs. Returns
    None on success, else a one-line reason for the caller to log once. A
    ``path`` of None (no ``[audit] path`` in the config) writes nothing.

    ``fd``: an O_APPEND descriptor of ``path`` opened by someone else; it is
    written to and left open, and ``path`` only names it in messages.
    """
    if not path:
        return None
    given = fd
    try:
        data = render_decision(verdict, **where).encode("ascii")
        if fd is None:
            fd = os.open(path, _OPEN_FLAGS, mode)
    except OSError as exc:
        return f"audit log {path}: cannot open: {exc.strerror or exc}"
    except Exception as exc:  # a bug in building the record must not fail the step
        return f"audit log {path}: {type(exc).__name__}: {exc}"
    try:
        _write_all(fd, data)
    except OSError as exc:
        return f"audit log {path}: cannot write: {exc.strerror or exc}"
    except Exception as exc:
        return f"audit log {path}: {type(exc).__name__}: {exc}"
    finally:
        if given is None:
            os.close(fd)
    return None
