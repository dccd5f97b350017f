"""grace_policy.auditlog, grace_policy.metrics and ``grace-policy report`` on
lines whose content is chosen to hurt: the reader never raises, counts what
it skips, and prints or labels nothing raw. (The report over real audit
logs from the real plugin is tests/slurm/test_rollout.py.)"""

from __future__ import annotations

import gzip
import json
import os
import time
from pathlib import Path

import pytest

from grace_policy import audit, auditlog, metrics
from grace_policy.cli.main import main
from grace_policy.findings import Finding, Verdict


def _line(**over: object) -> str:
    verdict = Verdict(action="warn", mode="warn", partition="warnp", findings=(
        Finding("exe-arch-mismatch", "error", "/home/u/tool", "Exec format error", "fix"),))
    fields = audit.record_fields(verdict, {"job_id": 1, "step_id": 0, "uid": 0, "node": "n",
                                           "elapsed_ms": 2.5, "program": "/home/u/tool"})
    fields.update(event="decision", time="2026-12-01T08:00:00Z")
    fields.update(over)
    return json.dumps(fields, sort_keys=True)


def test_a_line_the_writer_wrote_is_a_decision() -> None:
    kind, d = auditlog.classify(_line().encode())
    assert kind == "decision" and d is not None
    assert (d.uid, d.partition, d.mode, d.action, d.enforce_action, d.program, d.rules) == (
        0, "warnp", "warn", "warn", "reject", "/home/u/tool", ["exe-arch-mismatch"])


@pytest.mark.parametrize(("text", "kind"), [
    (b"", "torn"),
    (b"not json", "torn"),
    (b'{"event": "decision", "time": "2026-12-01T08:', "torn"),
    (b"[1, 2]", "foreign"),
    (b'{"event": "other"}', "foreign"),
    (b'{"msg": "hello"}', "foreign"),
    (b"\xff\xfe\x00{", "torn"),
])
def test_what_is_not_a_decision(text: bytes, kind: str) -> None:
    assert auditlog.classify(text)[0] == kind


def test_nesting_beyond_the_parser_is_skipped_not_fatal() -> None:
    assert auditlog.classify(b"[" * 100000 + b"]" * 100000)[0] == "torn"


@pytest.mark.parametrize("over", [
    {"uid": "0"}, {"uid": True}, {"uid": -1}, {"action": "explode"}, {"mode": "lax"},
    {"rules": "exe-arch-mismatch"}, {"rules": [1]}, {"paths": None},
    {"elapsed_ms": "fast"}, {"elapsed_ms": float("nan")}, {"elapsed_ms": -1},
    {"time": "yesterday"}, {"time": "2026-12-01T08:00:00"}, {"cache": "miss"},
    {"enforce_action": "maybe"}, {"exempt": [1]}, {"exempt": [{"rule": 3}]},
    {"partition": 7}, {"program": ["x"]}, {"phase": "during_pull"},
])
def test_a_decision_with_wrong_fields_is_invalid(over: dict[str, object]) -> None:
    assert auditlog.classify(_line(**over).encode())[0] == "invalid"


def test_old_lines_without_the_new_fields_still_count(tmp_path: Path) -> None:
    old = json.loads(_line())
    for key in ("program", "enforce_action", "exempt"):
        del old[key]
    log = tmp_path / "old.log"
    log.write_text(json.dumps(old) + "\n")
    data = auditlog.Report().read([str(log)]).to_json()
    assert data["steps"] == 1
    assert data["would_refuse"]["steps"] == 0 and data["would_refuse"]["unknown"] == 1


def _pulled(phase: str, action: str, job: int = 1, node: str = "n") -> str:
    return _line(phase=phase, action=action, job_id=str(job), node=node, mode="enforce",
                 rules=[] if action == "allow" else ["exe-arch-mismatch"])


@pytest.mark.parametrize("reverse", [False, True])
def test_a_registry_step_judged_twice_is_one_step(tmp_path: Path, reverse: bool) -> None:
    """user_init's manifest judgement, then the root after the pull: one
    step, counted by the second (in whichever order rotated files hold
    them); a first judgement never followed (no after-pull, pyxis failed)
    is still a step; the same job on another node is another step."""
    lines = [_pulled("before_pull", "allow"), _pulled("after_pull", "reject"),
             _pulled("before_pull", "allow", job=2),
             _pulled("before_pull", "allow", node="m"), _pulled("after_pull", "allow", node="m")]
    log = tmp_path / "audit.log"
    log.write_text("\n".join(reversed(lines) if reverse else lines) + "\n")
    data = auditlog.Report().read([str(log)]).to_json()
    assert data["steps"] == 3
    assert data["actions"] == {"allow": 2, "warn": 0, "reject": 1}
    assert data["lines"]["judged_again_after_pull"] == 2


def test_the_bridge_marks_only_a_registry_images_two_judgements() -> None:
    from grace_policy.slurm_bridge import StepInput, _phase

    def step(**container: object) -> StepInput:
        return StepInput(None, "allow", None, "/", None, "n", ("x",), {}, 1, 0, 0, False,
                         **container)  # type: ignore[arg-type]

    assert _phase(step(), pulled=False) is None
    assert _phase(step(container_kind="pyxis", container_local=True), pulled=False) is None
    assert _phase(step(container_kind="pyxis"), pulled=True) == "before_pull"
    # A reused --container-name container: its root judged once, no pull.
    assert _phase(step(container_kind="pyxis"), pulled=False) is None
    after = step(container_kind="pyxis", container_args="mounts=\nafter_pull=1\n")
    assert _phase(after, pulled=False) == "after_pull"
    assert "phase" not in json.loads(_line())


def test_files_plain_gzip_truncated_missing_empty(tmp_path: Path) -> None:
    plain = tmp_path / "a.log"
    plain.write_text(_line() + "\n\n" + _line() + "\r\n")
    packed = tmp_path / "b.log.1"  # gzip by content, whatever the name
    with gzip.open(packed, "wb") as f:
        f.write((_line() + "\n").encode() * 50)
    cut = tmp_path / "c.log.2.gz"
    blob = packed.read_bytes()
    cut.write_bytes(blob[: len(blob) // 2 + 10])
    empty = tmp_path / "d.log"
    empty.write_bytes(b"")
    report = auditlog.Report().read([str(plain), str(packed), str(cut), str(empty),
                                     str(tmp_path / "missing.log"), str(tmp_path)])
    data = report.to_json()
    files = {Path(f["path"]).name: f for f in data["files"]}
    assert (files["a.log"]["decisions"], files["a.log"]["error"]) == (2, None)
    assert (files["b.log.1"]["decisions"], files["b.log.1"]["error"]) == (50, None)
    assert files["c.log.2.gz"]["error"]  # truncated gzip: what was read counts
    assert 0 <= files["c.log.2.gz"]["decisions"] < 50
    assert (files["d.log"]["lines"], files["d.log"]["error"]) == (0, None)
    assert files["missing.log"]["error"] == "No such file or directory"
    assert files[tmp_path.name]["error"] == "Is a directory"
    assert data["steps"] == 52 + files["c.log.2.gz"]["decisions"]


def test_oversized_and_torn_tail(tmp_path: Path) -> None:
    log = tmp_path / "a.log"
    with open(log, "wb") as f:
        f.write(b"y" * (auditlog.MAX_LINE + 5) + b"\n")
        f.write(_line().encode() + b"\n")
        f.write(b"z" * (3 * auditlog.MAX_LINE))  # oversized and never ends
    data = auditlog.Report().read([str(log)]).to_json()
    assert data["lines"]["oversized"] == 2 and data["lines"]["torn"] == 0
    assert data["steps"] == 1


def test_memory_stays_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(auditlog, "MAX_KEYS", 5)
    log = tmp_path / "a.log"
    log.write_text("".join(_line(paths=[f"/p/{i}"], program=f"/p/{i}") + "\n"
                           for i in range(20)))
    report = auditlog.Report().read([str(log)])
    assert len(report.paths) == 6 and report.paths["(other)"] == 15
    assert len(report.programs) == 6


def test_file_older_than_since_is_not_read(tmp_path: Path) -> None:
    log = tmp_path / "a.log.5.gz"
    with gzip.open(log, "wb") as f:
        f.write((_line() + "\n").encode())
    os.utime(log, (time.time() - 10 * 86400,) * 2)
    report = auditlog.Report(filters=auditlog.Filters(since=time.time() - 86400))
    data = report.read([str(log)]).to_json()
    assert data["files"][0]["skipped_by_mtime"] is True and data["lines"]["total"] == 0


def test_batch_scripts_are_one_program() -> None:
    assert auditlog.program_name("/var/spool/slurmd/job00042/slurm_script") == "(batch script)"
    assert auditlog.program_name("/home/u/slurm_script") == "/home/u/slurm_script"


def test_percentiles_nearest_rank() -> None:
    t = auditlog.timing([float(x) for x in range(1, 201)])
    assert (t["median"], t["p99"], t["max"], t["count"]) == (100.5, 198.0, 200.0, 200)
    assert auditlog.timing([])["median"] is None


def _hostile_log(tmp_path: Path) -> Path:
    log = tmp_path / "a.log"
    names = ['a"b', "c\\d", "e\nf", "\x1b[2Jg", "ü"]
    log.write_text("".join(_line(partition=n, paths=[f"/x/{n}"], program=f"/x/{n}",
                                 rules=[f"rule-{n}"], error=f"err {n}") + "\n" for n in names)
                   + "".join(_line(mode=None, failure=f"kind {n}", error=f"why {n}") + "\n"
                             for n in names))
    return log


def test_cli_escapes_everything_from_the_log(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    log = _hostile_log(tmp_path)
    assert main(["report", str(log)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out
    assert all(line.isprintable() for line in out.splitlines())
    assert "\\x1b[2Jg" in out and "e\\nf" in out
    assert "rule-\\x1b[2Jg" in out  # rule ids too, in every list they appear
    assert "kind \\x1b[2Jg 1" in out  # and the kinds of C's failure lines


def test_failures_decided_in_c_are_counted_apart(tmp_path: Path) -> None:
    """C's on_error lines (mode null, a failure kind) are steps, with their
    action, counted by kind; a line with mode null and no failure is not a
    decision."""
    log = tmp_path / "a.log"
    log.write_text(_line() + "\n"
                   + _line(mode=None, failure="timeout", action="allow", rules=[],
                           error="no verdict within timeout_ms=2000") + "\n"
                   + _line(mode=None, failure="timeout", action="reject", rules=[]) + "\n"
                   + _line(mode=None, failure="python", action="allow", rules=[]) + "\n"
                   + _line(mode=None) + "\n")
    data = auditlog.Report().read([str(log)]).to_json()
    assert data["steps"] == 4 and data["lines"]["invalid"] == 1
    assert data["failures"] == {"steps": 3, "kinds": {"python": 1, "timeout": 2}}
    assert data["cache"]["judged"] == 1  # failures are not judged steps
    assert data["actions"] == {"allow": 2, "warn": 1, "reject": 1}
    text = metrics.render(auditlog.Report().read([str(log)]))
    assert 'grace_policy_failure_steps{kind="timeout"} 2' in text


def test_a_failure_line_is_one_failing_step(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    """C's failure line (a failed env edit: "error" the reason, "failure" the
    kind) is one step whose check failed, in every count the report shows;
    the plugin's real line is held to the same in tests/slurm/test_faults.py."""
    log = tmp_path / "a.log"
    log.write_text(_line(mode=None, failure="env", action="allow", rules=[], paths=[],
                         error="cannot remove VIRTUAL_ENV from the step's environment")
                   + "\n" + _line(mode=None, failure="timeout", action="allow", rules=[],
                                  paths=[]) + "\n")
    assert main(["report", str(log)]) == 0
    out = capsys.readouterr().out
    counted = [line for line in out.splitlines() if "on_error decided" in line]
    assert counted == ["  check errors (on_error decided): 2, of which without a verdict "
                       "(decided in the plugin): 2 (env 1, timeout 1)"], out
    data = auditlog.Report().read([str(log)]).to_json()
    assert data["failures"] == {"steps": 2, "kinds": {"env": 1, "timeout": 1}}
    # a failure without an error text (another writer's) is still one error
    assert data["errors"]["steps"] == 2 == data["partitions"]["warnp"]["errors"]


def test_cli_usage_and_unreadable(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    conf = tmp_path / "slurm.conf"
    conf.write_text(f"PlugStackConfig={tmp_path / 'plugstack.conf'}\n")
    (tmp_path / "plugstack.conf").write_text(
        "required /usr/lib/slurm/spank_grace_policy.so config=/etc/gp.toml\n")
    monkeypatch.setenv("SLURM_CONF", str(conf))
    assert main(["report"]) == 64  # no AUDIT, and no audit= on the plugin's line
    assert "names no audit= for the plugin" in capsys.readouterr().err
    assert main(["report", "--since", "last tuesday", str(tmp_path)]) == 64
    assert main(["report", "--user", "no-such-user-here", str(tmp_path)]) == 64
    assert main(["report", str(tmp_path / "missing")]) == 2
    assert "missing: No such file or directory" in capsys.readouterr().err


def test_metrics_labels_escaped() -> None:
    assert metrics.label('a"b\\c\nd') == 'a\\"b\\\\c\\nd'
    assert metrics.label(None) == ""


@pytest.mark.network
def test_node_exporter_accepts_hostile_labels(tmp_path: Path, node_exporter: Path) -> None:
    """The real consumer reads the file, and each hostile partition name comes
    back as the label value it was."""
    from tests.slurm.test_rollout import _metrics_samples, _scrape

    report = auditlog.Report().read([str(_hostile_log(tmp_path))])
    prom_dir = tmp_path / "tf"
    prom_dir.mkdir()
    metrics.write(str(prom_dir / "g.prom"), metrics.render(report))
    scraped = _metrics_samples(_scrape(node_exporter, prom_dir))
    assert scraped["node_textfile_scrape_error"] == 0
    for name in ('a"b', "c\\d", "e\nf", "\x1b[2Jg", "ü"):
        key = f'grace_policy_would_refuse_steps{{partition="{metrics.label(name)}"}}'
        assert scraped[key] == 1, key
