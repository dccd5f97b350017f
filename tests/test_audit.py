"""The audit log: same line shape from both writers, intact lines under
concurrency and hostile input, and failures returned instead of raised."""

from __future__ import annotations

import datetime
import json
import multiprocessing
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from grace_policy import audit
from grace_policy.findings import EnvChanges, Finding, Verdict

ROOT = Path(__file__).resolve().parent.parent
ISO = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{6})?Z")

CLEAN = Verdict(action="allow", mode="enforce", partition="gb200")
FOUND = Verdict(
    action="reject",
    mode="enforce",
    partition="gb200",
    findings=(
        Finding("exe-arch-mismatch", "error", "/home/u/.local/bin/uv", "Exec format error", "fix"),
        Finding("lib-not-found", "error", "/home/u/.local/bin/uv", "no libfoo", "fix"),
        Finding("page-align", "error", "/opt/x.so", "not page-aligned", "fix"),
    ),
    env=EnvChanges(unset=("CONDA_PREFIX",), set=(("PATH", "/secret/value"),)),
)
IDS = {"job_id": 17, "step_id": "0", "uid": 1000, "node": "gn001", "elapsed_ms": 2.5}


def read_lines(path: Path) -> list[dict]:
    raw = path.read_bytes()
    assert raw.endswith(b"\n")
    return [json.loads(line) for line in raw.decode("ascii").split("\n")[:-1]]


def test_clean_and_finding_lines_have_the_same_keys_and_format(tmp_path: Path) -> None:
    log = tmp_path / "audit.jsonl"
    assert audit.write_decision(str(log), CLEAN, **IDS) is None
    assert audit.write_decision(str(log), FOUND, **IDS) is None
    clean, found = read_lines(log)
    expected = {*audit.FIELDS, "time", "event"}
    assert set(clean) == set(found) == expected
    for line in (clean, found):
        assert ISO.fullmatch(line["time"])
        assert line["event"] == "decision"
        ids = (line["job_id"], line["step_id"], line["uid"], line["node"])
        assert ids == ("17", "0", 1000, "gn001")
        assert line["elapsed_ms"] == 2.5
    assert found["rules"] == ["exe-arch-mismatch", "lib-not-found", "page-align"]
    assert found["paths"] == ["/home/u/.local/bin/uv", "/opt/x.so"]
    assert found["env_unset"] == ["CONDA_PREFIX"] and found["env_set"] == ["PATH"]
    assert "/secret/value" not in log.read_text()  # names only
    assert clean["rules"] == [] and clean["error"] is None


def test_both_writers_render_identical_text() -> None:
    # Same fields through structlog and through the lean writer: byte for byte
    # equal once the timestamps (taken at different instants) are aligned.
    fields = audit.record_fields(FOUND, IDS)  # type: ignore[arg-type]
    via_structlog = audit._structlog_line(fields)
    stamp = json.loads(via_structlog)["time"]
    via_lean = audit._lean_line(fields)
    lean_stamp = json.loads(via_lean)["time"]
    assert via_lean.replace(lean_stamp, stamp) == via_structlog


@pytest.mark.parametrize(
    "now", [0.0, 1700000000.0, 1700000000.5, 1700000000.123456, 1700000000.9999996, 1e9 + 1e-6]
)
def test_lean_timestamp_matches_datetime(now: float) -> None:
    expected = (
        datetime.datetime.fromtimestamp(now, tz=datetime.timezone.utc)
        .isoformat()
        .replace("+00:00", "Z")
    )
    assert audit.iso_utc(now) == expected


def test_clean_path_does_not_import_structlog(tmp_path: Path) -> None:
    log = tmp_path / "a.jsonl"
    paths = [str(ROOT), *(p for p in sys.path if p)]
    prog = (
        f"import sys; sys.path[:0] = {paths!r}\n"
        "from grace_policy import audit\n"
        "from grace_policy.findings import Verdict, Finding\n"
        f"audit.write_decision({str(log)!r}, Verdict('allow', 'enforce', 'p'))\n"
        "print('structlog' in sys.modules, 'datetime' in sys.modules, end=' ')\n"
        f"audit.write_decision({str(log)!r}, Verdict('reject', 'enforce', 'p',"
        " (Finding('page-align', 'error', '/x', 'e', 'r'),)))\n"
        "print('structlog' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-I", "-S", "-c", prog], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "False False True"
    assert len(read_lines(log)) == 2


HOSTILE_PATHS = [
    "/home/u/a\nb",
    "/home/u/\x1b[2J\x07\x00",
    "/home/u/\u2028\u2029\u202e",
    b"/home/u/\xff\xfe\x80".decode("utf-8", "surrogateescape"),
    "/home/u/\ud800lone",
    '/home/u/"quoted"\\slash',
    "/home/u/" + "x" * 70000,
]


def test_hostile_input_stays_one_valid_ascii_line(tmp_path: Path) -> None:
    log = tmp_path / "h.jsonl"
    for path in HOSTILE_PATHS:
        for clean in (True, False):
            verdict = Verdict(
                action="allow" if clean else "warn",
                mode="warn",
                partition=path,
                findings=() if clean else (Finding("exe-format", "warning", path, "e", "r"),),
                env=EnvChanges(unset=(path,)),
                error=None if clean else path,
            )
            assert audit.write_decision(str(log), verdict, job_id=path, node=path) is None
    raw = log.read_bytes()
    lines = raw.split(b"\n")[:-1]
    assert len(lines) == 2 * len(HOSTILE_PATHS)
    for line, path in zip(lines[::2], HOSTILE_PATHS):
        assert line.isascii()
        assert json.loads(line)["partition"] == path  # nothing lost, nothing added


def _writer(path: str, who: int, count: int) -> None:
    for i in range(count):
        # Alternate the writers; big lines (far over PIPE_BUF) make interleaving
        # visible if a line were ever written in more than one piece.
        verdict = FOUND if i % 2 else CLEAN
        big = f"/scratch/{who}/{i}/" + "p" * (20000 + who * 1000)
        verdict = Verdict(
            action=verdict.action,
            mode=verdict.mode,
            partition=verdict.partition,
            findings=tuple(
                Finding(f.rule, f.severity, big, f.predicted_error, f.remediation)
                for f in verdict.findings
            ),
        )
        err = audit.write_decision(path, verdict, job_id=who, step_id=i)
        assert err is None, err


def test_concurrent_appends_from_several_processes_stay_whole(tmp_path: Path) -> None:
    log = str(tmp_path / "c.jsonl")
    ctx = multiprocessing.get_context("fork")
    writers, count = 6, 60
    procs = [ctx.Process(target=_writer, args=(log, w, count)) for w in range(writers)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    lines = read_lines(Path(log))
    assert len(lines) == writers * count
    seen = {(line["job_id"], line["step_id"]) for line in lines}
    assert seen == {(str(w), str(i)) for w in range(writers) for i in range(count)}


def test_no_path_writes_nothing(tmp_path: Path) -> None:
    assert audit.write_decision(None, FOUND) is None
    assert audit.write_decision("", CLEAN) is None
    assert list(tmp_path.iterdir()) == []


def test_unwritable_paths_return_a_reason_instead_of_raising(tmp_path: Path) -> None:
    missing_dir = str(tmp_path / "no" / "audit.jsonl")
    err = audit.write_decision(missing_dir, FOUND)
    assert err is not None and missing_dir in err and "No such file" in err
    file_as_dir = tmp_path / "file"
    file_as_dir.write_text("")
    err = audit.write_decision(str(file_as_dir / "x.jsonl"), CLEAN)
    assert err is not None and "Not a directory" in err
    assert audit.write_decision(str(tmp_path), CLEAN) is not None  # a directory
    if os.path.exists("/dev/full"):  # every write fails with ENOSPC
        for verdict in (CLEAN, FOUND):
            err = audit.write_decision("/dev/full", verdict)
            assert err is not None and "cannot write" in err


def test_fifo_without_reader_does_not_block(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    err = audit.write_decision(str(fifo), CLEAN)
    assert err is not None and "cannot open" in err


def test_permission_denied(tmp_path: Path) -> None:
    """An audit path the writer may not create: an error string, no raise.
    Root may write anywhere, so as root (CI) the write is made by a forked
    child that has dropped to nobody, as the check does in slurmstepd."""
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    tmp_path.chmod(0o755)
    target = str(locked / "a.jsonl")
    if os.geteuid() != 0:
        err = audit.write_decision(target, CLEAN)
        assert err is not None and "Permission denied" in err
        return
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read_fd)
            os.setgid(65534)
            os.setuid(65534)
            err = audit.write_decision(target, CLEAN) or ""
            os.write(write_fd, err.encode())
        finally:
            os._exit(0)
    os.close(write_fd)
    with os.fdopen(read_fd) as fh:
        err = fh.read()
    os.waitpid(pid, 0)
    assert "Permission denied" in err, err
    assert not os.path.exists(target)


def test_new_log_is_not_world_readable(tmp_path: Path) -> None:
    log = tmp_path / "new.jsonl"
    old = os.umask(0o022)
    try:
        audit.write_decision(str(log), CLEAN)
    finally:
        os.umask(old)
    assert log.stat().st_mode & 0o777 == 0o640


def test_the_plugins_check_renders_its_line_for_c_and_writes_nothing(tmp_path: Path) -> None:
    """In slurmstepd the check hands its decision line to C (which writes it
    once the verdict is applied, or its own failure line instead): the check
    itself never writes, so a step leaves one line whatever C then does."""
    from grace_policy import slurm_bridge

    log = tmp_path / "audit.jsonl"
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640)
    try:
        step = slurm_bridge.StepInput(
            config=None, on_error="allow", partition="gb200", cwd="/", user_mode=None,
            node="gn001", argv=("/bin/true",), env={}, job_id=17, step_id=0, uid=1000,
            batch=False, audit_path=str(log), audit_fd=fd)
        line, problem = slurm_bridge._audit(step, FOUND, 2.5, "/bin/true")
    finally:
        os.close(fd)
    assert problem is None and log.read_bytes() == b""
    assert line is not None and line.endswith("\n") and line.count("\n") == 1
    record = json.loads(line)
    assert (record["job_id"], record["program"], record["rules"][0]) == (
        "17", "/bin/true", "exe-arch-mismatch")
    # Byte for byte what the writer would have written (but the time).
    assert audit.write_decision(str(log), FOUND, job_id=17, step_id="0", uid=1000,
                                node="gn001", elapsed_ms=2.5, program="/bin/true") is None
    written = log.read_text()
    assert written.replace(json.loads(written)["time"], record["time"]) == line
    # Not configured: nothing rendered.
    unset = slurm_bridge.StepInput(**{**step.__dict__, "audit_fd": -1})
    assert slurm_bridge._audit(unset, FOUND, 2.5) == (None, None)
