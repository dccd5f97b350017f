"""What users see: escaped, prefixed, readable, most important first."""

from __future__ import annotations

import pytest

from grace_policy.findings import EnvChanges, Finding, Issue, Verdict
from grace_policy.messages import PREFIX, WIDTH, escape, user_lines
from grace_policy.rules import Catalogue

HOSTILE = [
    ("\x1b[31mred\x1b[0m", "\\x1b[31mred\\x1b[0m"),
    ("a\nb\r\tc", "a\\nb\\r\\tc"),
    ("nul\x00del\x7f", "nul\\x00del\\x7f"),
    ("c1 csi \x9b2J nel \x85", "c1 csi \\x9b2J nel \\x85"),
    ("bidi \u202eevil\u2066x\u2069", "bidi \\u202eevil\\u2066x\\u2069"),
    ("zw\u200bsp\ufeff", "zw\\u200bsp\\ufeff"),
    ("sep\u2028line\u2029para", "sep\\u2028line\\u2029para"),
    (b"raw \xff\xfe bytes".decode("utf-8", "surrogateescape"), "raw \\xff\\xfe bytes"),
    ("lone \ud800 surrogate", "lone \\ud800 surrogate"),
    ("plain /home/u/bin/x-1.0", "plain /home/u/bin/x-1.0"),
    ("unicode ok: café ✓ 日本", "unicode ok: café ✓ 日本"),
    ("back\\slash", "back\\slash"),
]


@pytest.mark.parametrize(("raw", "shown"), HOSTILE)
def test_escape(raw: str, shown: str) -> None:
    assert escape(raw) == shown
    assert escape(escape(raw)) == escape(raw)  # idempotent
    assert escape(raw).isprintable()


def test_escape_bytes_and_non_strings() -> None:
    assert escape(b"ok \xc3\xa9 \xff\x1b") == "ok é \\xff\\x1b"
    assert escape(42) == "42"  # type: ignore[arg-type]


def finding(rule: str, severity: str, path: str, remediation: str = "do this") -> Finding:
    return Finding(rule, severity, path, f"{rule} would break", remediation)


def test_reject_block_per_finding_most_important_first() -> None:
    verdict = Verdict(
        action="reject",
        mode="enforce",
        partition="gb200",
        findings=(
            finding("env-leak", "warning", "/opt/conda"),
            finding("exe-arch-mismatch", "error", "/home/u/.local/bin/uv"),
            finding("relro-tail", "info", "/lib/x.so"),
        ),
    )
    lines = user_lines(verdict, contact="hpc@site")
    assert all(line.startswith(PREFIX) for line in lines)
    text = "\n".join(lines)
    assert text.index("exe-arch-mismatch") < text.index("env-leak")
    assert "relro-tail" not in text  # info is for the audit log, not the terminal
    assert lines[0] == f"{PREFIX}ERROR exe-arch-mismatch: /home/u/.local/bin/uv"
    assert "without this check: exe-arch-mismatch would break" in text
    assert "what to do: do this" in text
    closing = [i for i, line in enumerate(lines) if "step not started" in line]
    assert len(closing) == 1
    assert lines[closing[0]].startswith(f"{PREFIX}step not started: 1 error above")
    assert "explain RULE" in " ".join(lines[closing[0] :])
    assert "hpc@site" in text and "exe-arch-mismatch, env-leak" in text
    with_info = user_lines(verdict, min_severity="info")
    assert any("relro-tail" in line for line in with_info)


def test_hostile_path_cannot_forge_lines_or_control_the_terminal() -> None:
    path = "/home/u/x\ngrace-policy: all good, step allowed\x1b]0;pwned\x07"
    verdict = Verdict(
        action="reject",
        mode="enforce",
        partition="p\x1b[2J",
        findings=(finding("exe-format", "error", path, remediation=f"fix {escape(path)}"),),
        env=EnvChanges(unset=("EVIL\x1b",), set=(("PATH", "/x\n"),)),
    )
    lines = user_lines(verdict)
    for line in lines:
        assert line.isprintable(), line
        assert line.count("grace-policy: ") == 1 or "all good" in line
        assert line.startswith(PREFIX)
    assert not any(line.startswith(PREFIX + "all good") for line in lines)


def test_multi_line_site_text_keeps_its_line_breaks() -> None:
    verdict = Verdict(
        action="warn",
        mode="warn",
        partition="gb200",
        findings=(finding("page-align", "error", "/a.so", remediation="first line\nsecond line"),),
    )
    lines = user_lines(verdict)
    assert any(line.endswith("what to do: first line") for line in lines)
    assert any(line.endswith(" second line") and "what to do" not in line for line in lines)
    assert "runs anyway" in lines[-1] and "mode warn" in lines[-1]


def test_long_texts_are_wrapped_and_long_paths_kept_whole() -> None:
    long_path = "/scratch/" + "d" * 150 + "/lib.so"
    words = " ".join(["word"] * 80)
    verdict = Verdict(
        action="reject",
        mode="enforce",
        partition="gb200",
        findings=(finding("page-align", "error", long_path, remediation=f"{words} {long_path}"),),
    )
    lines = user_lines(verdict)
    assert any(long_path in line for line in lines[1:])  # not broken up
    for line in lines:
        assert len(line) <= WIDTH or long_path in line, line


def test_env_changes_are_explained_even_when_allowed() -> None:
    verdict = Verdict(
        action="allow",
        mode="enforce",
        partition="gb200",
        env=EnvChanges(unset=("CONDA_PREFIX", "VIRTUAL_ENV"), set=(("PATH", "/usr/bin"),)),
    )
    lines = user_lines(verdict)
    text = " ".join(line[len(PREFIX) :] for line in lines)
    assert "CONDA_PREFIX, VIRTUAL_ENV" in text and "PATH" in text
    assert "/usr/bin" not in text  # names only
    assert "step not started" not in text


def test_silent_cases() -> None:
    assert user_lines(Verdict(action="allow", mode="enforce", partition="gb200")) == []
    skipped = Verdict(
        action="allow",
        mode="enforce",
        partition="gb200",
        skipped="container step",
        findings=(finding("exe-format", "error", "/x"),),
    )
    assert user_lines(skipped) == []


def test_reject_from_an_internal_error_says_so_without_details() -> None:
    verdict = Verdict(
        action="reject", mode="enforce", partition="gb200", error="Traceback: KeyError 'x'"
    )
    lines = user_lines(verdict)
    text = " ".join(lines)
    assert "step not started" in text and "could not complete" in text
    assert "Traceback" not in text and "KeyError" not in text


def test_catalogue_adds_titles() -> None:
    cat = Catalogue.load()
    real = cat.finding(
        Issue("exe-arch-mismatch", "/home/u/bin/a", "", ("home",), (("file_arch", "x86_64"),)),
        {"partition": "gb200", "node_arch": "aarch64", "page_size": "65536"},
    )
    assert real is not None
    verdict = Verdict(action="reject", mode="enforce", partition="gb200", findings=(real,))
    lines = user_lines(verdict, catalogue=cat)
    assert lines[1] == f"{PREFIX}  The program is built for another CPU architecture."
    assert len(lines) < 15  # readable, not a wall of text


def test_cleaned_leak_alone_does_not_say_the_step_may_fail() -> None:
    """The leak was the problem and it was removed: telling the user the step
    'may fail as described' would send them looking for a failure that the
    cleaning already prevented."""
    verdict = Verdict(
        action="warn",
        mode="enforce",
        partition="gb200",
        findings=(finding("env-leak", "warning", "/home/ana/venv"),),
        env=EnvChanges(unset=("VIRTUAL_ENV",), set=(("PATH", "/usr/bin"),)),
    )
    lines = user_lines(verdict)
    assert "runs with the cleaned environment" in lines[-1]
    assert not any("may fail" in line for line in lines)


def test_one_page_block_per_file() -> None:
    verdict = Verdict(
        action="reject",
        mode="enforce",
        partition="gb200",
        findings=(finding("page-congruence", "error", "/a"),
                  finding("page-overlap", "warning", "/a"),
                  finding("page-overlap", "warning", "/b")),
    )
    heads = [line for line in user_lines(verdict) if line.startswith(PREFIX + "ERROR")
             or line.startswith(PREFIX + "WARNING")]
    assert heads == [PREFIX + "ERROR page-congruence: /a", PREFIX + "WARNING page-overlap: /b"]
