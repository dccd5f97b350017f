"""What the user sees on their terminal or in their batch output file.

Everything shown here can contain text users (or whoever wrote the files a job
runs) control: file names, ELF strings, environment values. A name with an
escape sequence could rewrite the terminal, a newline could forge a second
``grace-policy:`` line, and bidi controls can make a path read differently from
what it is. So every such string goes through :func:`escape` first.
"""

from __future__ import annotations

import re

from .findings import SEVERITY_RANK, Verdict

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

PREFIX = "grace-policy: "

#: Width the text is wrapped to, prefix included: readable in a terminal and
#: in a batch output file.
WIDTH = 100

# C0 controls, DEL, C1 controls, lone surrogates (undecodable bytes kept by
# surrogateescape), and invisible characters that reorder or hide text: bidi
# embeddings/overrides/isolates, zero-width marks, line/paragraph separators,
# the BOM.
_UNSAFE = re.compile(
    "[\x00-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2064\u2066-\u2069"
    "\ufeff\ud800-\udfff]"
)
_NAMED = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}


def _escape_char(match: re.Match[str]) -> str:
    ch = match.group(0)
    named = _NAMED.get(ch)
    if named is not None:
        return named
    code = ord(ch)
    if 0xDC80 <= code <= 0xDCFF:  # a raw byte that was not UTF-8
        return f"\\x{code - 0xDC00:02x}"
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}"


def escape(text: str | bytes) -> str:
    """``text`` made safe to print on one line: controls, ESC, DEL, C1,
    invisible reordering characters and undecodable bytes become ``\\xNN`` /
    ``\\uNNNN``, newline ``\\n``. Bytes are decoded as UTF-8 with
    surrogateescape first, so invalid bytes show as ``\\xNN``.

    Backslashes are kept as they are, which makes escaping idempotent: text
    escaped once (for example a remediation with an escaped path in it) can
    safely be escaped again.
    """
    if isinstance(text, bytes):
        text = text.decode("utf-8", "surrogateescape")
    elif not isinstance(text, str):
        text = str(text)
    if text.isprintable():  # everything _UNSAFE matches is non-printable
        return text
    return _UNSAFE.sub(_escape_char, text)


def _wrap(text: str, width: int) -> list[str]:
    """Greedy word wrap; a word longer than ``width`` (a long path) is kept whole
    so it can still be copied."""
    lines: list[str] = []
    current = ""
    for word in text.split(" "):
        if not word:
            continue
        if current and len(current) + 1 + len(word) > width:
            lines.append(current)
            current = word
        else:
            current = f"{current} {word}" if current else word
    if current:
        lines.append(current)
    return lines


def _block(label: str, text: str, indent: str = "  ") -> list[str]:
    """``label`` then ``text`` wrapped, continuation lines indented under it.
    Newlines in ``text`` (an admin's multi-line remediation) start new lines;
    they are split before escaping so they stay line breaks."""
    out: list[str] = []
    head = f"{indent}{label}"
    cont = " " * len(head)
    width = max(40, WIDTH - len(PREFIX) - len(head))
    first = True
    for para in text.split("\n"):
        for line in _wrap(escape(para), width) or ([""] if first else []):
            out.append(PREFIX + (head if first else cont) + line)
            first = False
    return out


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def user_lines(
    verdict: Verdict,
    *,
    catalogue: Any = None,
    contact: str = "",
    min_severity: str = "warning",
) -> list[str]:
    """The lines to show the user for ``verdict``, each starting ``grace-policy: ``.

    One block per finding at ``min_severity`` or above, most important first:
    the file and rule id, what would go wrong, what to do. Then what was removed
    from the environment, and for a rejection, that the step did not start and
    whom to ask. ``catalogue`` (a :class:`grace_policy.rules.Catalogue`) adds
    each rule's title; ``contact`` is the site's ``contact`` setting.
    An allowed step with nothing to report gives no lines at all.
    """
    if verdict.skipped:
        return []
    limit = SEVERITY_RANK.get(min_severity, 1)
    shown = sorted(
        (f for f in verdict.findings if SEVERITY_RANK.get(f.severity, 9) <= limit),
        key=lambda f: SEVERITY_RANK.get(f.severity, 9),
    )
    # One page-size block per file: a 4 KiB build usually breaks two or three
    # page rules at once, all with the same fix (relink); the audit log and
    # --json keep every finding.
    paged: set[str] = set()
    for finding in list(shown):
        if finding.rule.startswith("page-"):
            if finding.path in paged:
                shown.remove(finding)
            paged.add(finding.path)
    lines: list[str] = []
    for finding in shown:
        lines.append(f"{PREFIX}{finding.severity.upper()} {finding.rule}: {escape(finding.path)}")
        rule = catalogue.rule(finding.rule) if catalogue is not None else None
        if rule is not None and rule.title:
            lines.extend(_block("", rule.title + "."))
        if finding.predicted_error:
            lines.extend(_block("without this check: ", finding.predicted_error))
        if finding.remediation:
            lines.extend(_block("what to do: ", finding.remediation))

    env = verdict.env
    if not env.empty:
        changed = [escape(k) for k in env.unset]
        adjusted = [escape(k) for k, _ in env.set]
        text = ""
        if changed:
            text = "removed from the step's environment: " + ", ".join(changed)
        if adjusted:
            text += ("; " if text else "") + "entries removed from " + ", ".join(adjusted)
        text += " (they pointed at an environment that cannot be used on this node)"
        lines.extend(_block("", text, indent=""))

    who = escape(contact) if contact else "your cluster admins"
    where = f"partition {escape(verdict.partition)}" if verdict.partition else "this partition"
    if verdict.action == "reject":
        if shown:
            ids = ", ".join(dict.fromkeys(f.rule for f in shown))
            errors = sum(1 for f in shown if f.severity == "error")
            what = _plural(errors, "error") if errors else "the problems"
            lines.extend(
                _block(
                    "",
                    f"step not started: {what} above would make it fail on this node "
                    f"({where}, mode {verdict.mode}).",
                    indent="",
                )
            )
            text = (
                f"More on a rule: 'grace-policy explain RULE'. If this is wrong, contact {who} "
                f"quoting {ids}."
            )
        else:
            text = (
                "step not started: the launch check could not complete on this node and the "
                f"site stops steps in that case. Please tell {who}."
            )
        lines.extend(_block("", text, indent=""))
    elif verdict.action == "warn" and shown:
        if all(f.rule == "env-leak" for f in shown) and not env.empty:
            # The leak is what was wrong, and it was cleaned: nothing is
            # expected to fail, so do not say it might.
            text = f"the step runs with the cleaned environment ({where})."
        else:
            text = (f"the step runs anyway ({where}, mode {verdict.mode}), but may fail as "
                    "described.")
        lines.extend(_block("", text, indent=""))
    return lines
