"""The rule catalogue: consistent data, cause-specific texts, site overrides."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from grace_policy.findings import Issue
from grace_policy.policy import Policy, RuleOverride
from grace_policy.rules import (
    CAUSES,
    RULE_IDS,
    RULES_TOML,
    TEMPLATE_FIELDS,
    Catalogue,
    _toml_load,
    render,
    template_fields,
)

ROOT = Path(__file__).resolve().parent.parent

CONTEXT = {"partition": "gb200", "node_arch": "aarch64", "page_size": "65536", "glibc": "2.34"}


def arch_issue(*causes: str, path: str = "/home/u/.local/bin/uv") -> Issue:
    return Issue(
        rule="exe-arch-mismatch",
        path=path,
        predicted_error="",
        causes=causes,
        facts=(("file_arch", "x86_64"),),
    )


def test_catalogue_ids_are_the_stable_list() -> None:
    assert Catalogue.load().ids() == RULE_IDS


def test_every_rule_is_complete_and_uses_only_known_fields_and_causes() -> None:
    raw = _toml_load(RULES_TOML)["rules"]
    assert set(raw) == set(RULE_IDS)
    for rule_id, body in raw.items():
        assert set(body) <= {"severity", "max_severity", "title", "error", "explain", "remedy"}
        assert body["title"] and body["explain"].strip(), rule_id
        remedy = body["remedy"]
        assert remedy.get("default"), rule_id
        assert set(remedy) - {"default"} <= set(CAUSES), rule_id
        texts = [body["title"], body["error"], body["explain"], *remedy.values()]
        for text in texts:
            assert set(template_fields(text)) <= TEMPLATE_FIELDS, (rule_id, text)


def test_default_severities_follow_what_each_failure_does() -> None:
    cat = Catalogue.load()
    assert cat.severity("exe-arch-mismatch") == "error"
    assert cat.severity("page-align") == "error"
    assert cat.severity("page-congruence") == "error"
    assert cat.severity("relro-tail") == "info"
    assert cat.severity("env-leak") in ("info", "warning")
    assert cat.severity("no-such-rule") == "warning"  # a checker bug never rejects


@pytest.mark.parametrize(
    ("causes", "expected_cause", "word"),
    [
        (("leaked-env", "venv", "home"), "leaked-env", "unset CONDA_PREFIX"),
        (("venv", "leaked-env"), "venv", "venv"),
        (("user-local", "home"), "user-local", "~/.local"),
        (("made-up-cause", "home"), "home", "home directory"),
        (("made-up-cause",), "", "build"),
        ((), "", "build"),
    ],
)
def test_first_cause_with_a_text_wins(
    causes: tuple[str, ...], expected_cause: str, word: str
) -> None:
    finding = Catalogue.load().finding(arch_issue(*causes), CONTEXT)
    assert finding is not None
    assert finding.cause == expected_cause
    assert word in finding.remediation
    assert finding.severity == "error"
    assert finding.predicted_error == "cannot execute binary file: Exec format error"
    assert "/home/u/.local/bin/uv" in finding.remediation
    assert "{" not in finding.remediation  # every field filled for this rule


def test_default_build_hint_and_site_hint_with_partition() -> None:
    plain = Catalogue.load().finding(arch_issue("home"), CONTEXT)
    assert plain is not None and "srun -p gb200 --pty bash" in plain.remediation
    site = Catalogue.for_policy(
        Policy(site_build_hint="salloc -p {partition} -N1 --gpus=1")
    ).finding(arch_issue("home"), CONTEXT)
    assert site is not None and "salloc -p gb200 -N1 --gpus=1" in site.remediation


def test_page_kib_and_candidates_note_are_derived() -> None:
    cat = Catalogue.load()
    issue = Issue(
        rule="lib-not-found",
        path="/scratch/u/venv/lib/python3.11/site-packages/x/_x.so",
        predicted_error="",
        causes=("pip-wheel",),
        facts=(("name", "libfoo.so.1"), ("candidates", "/opt/x86/libfoo.so.1")),
    )
    finding = cat.finding(issue, CONTEXT)
    assert finding is not None
    assert "libfoo.so.1" in finding.predicted_error
    assert "another architecture: /opt/x86/libfoo.so.1" in finding.remediation
    assert "PyTorch wheel index" in finding.remediation
    none = cat.finding(Issue("lib-not-found", "/x", "", (), (("name", "libz.so"),)), CONTEXT)
    assert none is not None and "another architecture" not in none.remediation
    page = cat.finding(Issue("page-align", "/x.so", "", ()), CONTEXT)
    assert page is not None and "64 KiB" in page.remediation


def test_overrides_severity_text_and_off() -> None:
    cat = Catalogue.load(
        [
            RuleOverride("relro-tail", severity="off"),
            RuleOverride("exe-arch-mismatch", severity="warning", text="ask {partition} team"),
            RuleOverride("env-leak", severity="error"),
            RuleOverride("page-align", text="relink {path} {unknown_field} {path:>999999999}"),
        ]
    )
    assert cat.finding(Issue("relro-tail", "/x", ""), CONTEXT) is None
    arch = cat.finding(arch_issue("leaked-env"), CONTEXT)
    assert arch is not None
    assert (arch.severity, arch.remediation) == ("warning", "ask gb200 team")
    assert cat.severity("env-leak") == "warning"  # capped: a leak never rejects alone
    page = cat.finding(Issue("page-align", "/a.so", ""), CONTEXT)
    assert page is not None
    assert page.remediation == "relink /a.so {unknown_field} {path:>999999999}"
    assert "site text" in cat.explain("exe-arch-mismatch")
    assert "catalogue default: error" in cat.explain("exe-arch-mismatch")


def test_catalogue_accepts_a_mapping_of_overrides() -> None:
    cat = Catalogue.load({"page-overlap": RuleOverride("page-overlap", severity="error")})
    assert cat.severity("page-overlap") == "error"


def test_hostile_values_are_escaped_in_texts() -> None:
    issue = arch_issue("home", path="/home/u/bin/\x1b[2Jevil\nGRACE: ok\u202e")
    finding = Catalogue.load().finding(issue, CONTEXT)
    assert finding is not None
    assert "\x1b" not in finding.remediation and "\n" not in finding.remediation
    assert "\u202e" not in finding.remediation
    assert "\\x1b[2Jevil\\nGRACE: ok\\u202e" in finding.remediation
    assert finding.path == issue.path  # the raw path stays for JSON and audit


def test_render_leaves_unknown_and_odd_braces_alone() -> None:
    assert render("{a} {b} {} {{a}} {0} {a.b}", {"a": "A"}) == "A {b} {} {A} {0} {a.b}"
    assert render("no fields", {}) == "no fields"


def test_findings_sorted_most_important_first_and_stable() -> None:
    issues = [
        Issue("relro-tail", "/r", ""),
        Issue("exe-not-found", "/w", ""),
        Issue("lib-not-found", "/e1", "", (), (("name", "a"),)),
        Issue("page-align", "/e2", ""),
    ]
    found = Catalogue.load().findings(issues, CONTEXT)
    assert [f.path for f in found] == ["/e1", "/e2", "/w", "/r"]


def test_explain_every_rule_and_unknown() -> None:
    cat = Catalogue.load()
    for rule_id in RULE_IDS:
        text = cat.explain(rule_id)
        assert text.startswith(f"{rule_id}: ")
        assert "otherwise:" in text
    with pytest.raises(KeyError):
        cat.explain("nope")


def test_catalogue_is_not_read_until_needed() -> None:
    # A clean step creates a catalogue at most and asks it nothing: no tomllib.
    prog = (
        f"import sys; sys.path[:0] = {[str(ROOT), *sys.path]!r}\n"
        "from grace_policy.rules import Catalogue\n"
        "cat = Catalogue.load()\n"
        "print('tomllib' in sys.modules, end=' ')\n"
        "cat.severity('page-align')\n"
        "print('tomllib' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-I", "-S", "-c", prog], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "False True"


@pytest.mark.parametrize("rule", sorted(
    name for name, r in _toml_load(RULES_TOML)["rules"].items()
    if "system" in r.get("remedy", {})))
def test_a_system_library_inside_an_image_is_the_image_s(rule: str) -> None:
    """Inside an image, a library the causes call "system" is the image's own
    (image_issues puts "image" first): the text names the image, never "the
    node's system image"."""
    image = "/shared/app.sqsh"
    issue = Issue(rule=rule, path=f"{image}:/usr/lib/libfoo.so.1", predicted_error="",
                  causes=("image", "system"),
                  facts=(("image", image), ("inner", "/usr/lib/libfoo.so.1"),
                         ("detail", "segments 2 and 3 share a page"),
                         ("file_arch", "x86_64"), ("name", "libbar.so.2")))
    finding = Catalogue.load().finding(issue, CONTEXT)
    assert finding is not None and finding.cause == "image"
    assert f"/usr/lib/libfoo.so.1 inside {image}" in finding.remediation
    assert "system image" not in finding.remediation
    assert "{" not in finding.remediation
