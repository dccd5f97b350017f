"""Rolling the plugin out, on the real Slurm: exemptions, one audit setting
that ``config check`` explains, and ``grace-policy report`` / its metrics
file read back from audit logs the plugin itself wrote (then rotated,
gzipped by the real gzip, and mixed with torn, foreign and hostile lines).

Expiry is tested with dates in the config (yesterday, today, tomorrow in
UTC), never by waiting.
"""

from __future__ import annotations

import datetime
import gzip
import json
import math
import os
import shutil
import socket
import statistics
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from .cluster import DEFAULT_PARTITION
from .harness import SlurmEnv

pytestmark = pytest.mark.slurm

PREFIX = "grace-policy: "
REASON = "vendor build, runs on 64 KiB pages (ticket 7)"


def _days(n: int) -> str:
    return (datetime.datetime.now(datetime.timezone.utc).date()
            + datetime.timedelta(days=n)).isoformat()


def _cli(env: SlurmEnv, *args: str, extra_env: dict[str, str] | None = None
         ) -> subprocess.CompletedProcess[str]:
    """The installed launcher, as an admin runs it."""
    return subprocess.run([str(env.prefix / "bin" / "grace-policy"), *args],
                          env=extra_env or {}, capture_output=True, text=True, check=False,
                          timeout=120)


def _config(env: SlurmEnv, name: str, text: str) -> Path:
    path = env.configs["base"].parent / f"{name}.toml"
    path.write_text(text)
    path.chmod(0o644)
    done = _cli(env, "config", "check", "--compile", "--plugstack", "none", str(path))
    assert done.returncode == 0, done.stdout + done.stderr
    return path


def _fresh_log(env: SlurmEnv, name: str) -> Path:
    d = env.cluster.root.parent / f"audit-{name}"
    if d.exists():
        shutil.rmtree(d)
    d.mkdir()
    d.chmod(0o755)
    return d / "audit.log"


def _fresh_cache(env: SlurmEnv, name: str) -> Path:
    d = env.cluster.root.parent / f"cache-rollout-{name}"
    if d.exists():
        shutil.rmtree(d)
    return d


def _records(log: Path) -> list[dict[str, object]]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines()]


def _step(slurm: SlurmEnv, log: Path, argv: list[str], **kw: object
          ) -> tuple[subprocess.CompletedProcess[str], dict[str, object]]:
    """One srun and the one audit line it added."""
    before = len(_records(log))
    res = slurm.cluster.srun(argv, **kw)  # type: ignore[arg-type]
    new = _records(log)[before:]
    assert len(new) == 1, (new, res.stderr)
    return res, new[0]


# -- exemptions ---------------------------------------------------------------

EXEMPT_CONFIG = """\
mode = "enforce"
deadline_ms = 5000
[node]
page_size = 65536
[[rules.page-congruence.exempt]]
paths = ["{vendor}/tool*"]
until = {until}
reason = "{reason}"
[[rules.page-overlap.exempt]]
paths = ["{vendor}/tool*"]
until = {until}
reason = "{reason}"
[[rules.page-congruence.exempt]]
users = ["{user}"]
until = {until}
reason = "porting work"
[[rules.page-overlap.exempt]]
users = ["{user}"]
until = {until}
reason = "porting work"
"""


@pytest.fixture
def vendor(slurm: SlurmEnv) -> Path:
    """A root-owned vendor tree with a 4 KiB build (fine on this host, refused
    on the simulated 64 KiB node), a second copy outside the exemption, and a
    copy at an exempted name that belongs to nobody."""
    d = slurm.files / "vendor"
    if d.exists():
        shutil.rmtree(d)
    d.mkdir()
    d.chmod(0o755)
    for name in ("tool", "other", "tool-mine"):
        shutil.copy2(slurm.files / "native-4k", d / name)
        (d / name).chmod(0o755)
    os.chown(d / "tool-mine", 65534, 65534)
    return d


def _exempt_config(slurm: SlurmEnv, vendor: Path, until: str, user: str = "no-such-user"
                   ) -> Path:
    return _config(slurm, "exempt", EXEMPT_CONFIG.format(vendor=vendor, until=until,
                                                         reason=REASON, user=user))


def test_exemption_lets_exactly_the_program_through_until_its_date(
        slurm: SlurmEnv, vendor: Path) -> None:
    log = _fresh_log(slurm, "exempt")
    slurm.set_plugin_line(slurm.plugin, f"config={_exempt_config(slurm, vendor, _days(1))}",
                          f"audit={log}", f"cache_dir={_fresh_cache(slurm, 'exempt')}")
    try:
        # The exempted program runs (it leaves its file), twice: the second
        # time is no verdict-cache hit (an exempted verdict is never cached).
        for _ in range(2):
            out = slurm.side_file("exempt-tool.out")
            res, rec = _step(slurm, log, [str(vendor / "tool"), str(out)], user="nobody")
            assert res.returncode == 0, res.stderr
            assert out.read_text() == "executed\n"
            assert PREFIX not in res.stderr
            assert "cache" not in rec
            assert (rec["action"], rec["enforce_action"], rec["uid"]) == ("allow", "allow", 65534)
            # Released: no page finding on the tool itself (the node's own
            # libraries may have info-level ones on a simulated 64 KiB node:
            # Debian 13's libc is not 64 KiB-congruent).
            found = list(zip(rec["rules"], rec["paths"]))  # type: ignore[call-overload]
            assert ("page-congruence", str(vendor / "tool")) not in found, found
            assert rec["program"] == str(vendor / "tool")
            assert rec["exempt"] == [
                {"rule": "page-congruence", "path": str(vendor / "tool"), "reason": REASON,
                 "until": _days(1), "where": "rules.page-congruence.exempt[0]"},
                {"rule": "page-overlap", "path": str(vendor / "tool"), "reason": REASON,
                 "until": _days(1), "where": "rules.page-overlap.exempt[0]"},
            ]
        # The same bytes elsewhere, and a copy at an exempted name that the
        # user owns (so could have put there): refused, not run.
        for name in ("other", "tool-mine"):
            out = slurm.side_file(f"exempt-{name}.out")
            res, rec = _step(slurm, log, [str(vendor / name), str(out)], user="nobody")
            assert res.returncode != 0
            assert f"{PREFIX}ERROR page-congruence: {vendor / name}" in res.stderr
            assert not out.exists()
            assert (rec["action"], rec["exempt"]) == ("reject", [])

        # Its last day still counts (UTC) ...
        slurm.set_plugin_line(slurm.plugin,
                              f"config={_exempt_config(slurm, vendor, _days(0))}",
                              f"audit={log}", f"cache_dir={_fresh_cache(slurm, 'exempt')}")
        out = slurm.side_file("exempt-today.out")
        res, rec = _step(slurm, log, [str(vendor / "tool"), str(out)], user="nobody")
        assert res.returncode == 0 and out.exists(), res.stderr
        # ... the day after, it is over.
        slurm.set_plugin_line(slurm.plugin,
                              f"config={_exempt_config(slurm, vendor, _days(-1))}",
                              f"audit={log}", f"cache_dir={_fresh_cache(slurm, 'exempt')}")
        out = slurm.side_file("exempt-expired.out")
        res, rec = _step(slurm, log, [str(vendor / "tool"), str(out)], user="nobody")
        assert res.returncode != 0 and not out.exists()
        assert f"{PREFIX}ERROR page-congruence: {vendor / 'tool'}" in res.stderr
        assert (rec["action"], rec["exempt"]) == ("reject", [])
        # config check says which exemptions are over.
        check = _cli(slurm, "config", "check", "--plugstack", "none",
                     str(slurm.configs["base"].parent / "exempt.toml"))
        assert check.returncode == 0, check.stderr
        assert (f"exemption rules.page-congruence.exempt[0]: page-congruence for paths "
                f"{vendor}/tool* until {_days(-1)} (EXPIRED: no effect): {REASON}"
                in check.stdout)
    finally:
        slurm.use("base")


def test_user_exemption_comes_from_slurm_not_the_environment(
        slurm: SlurmEnv, vendor: Path) -> None:
    log = _fresh_log(slurm, "exempt-user")
    slurm.set_plugin_line(slurm.plugin,
                          f"config={_exempt_config(slurm, vendor, _days(1), user='nobody')}",
                          f"audit={log}", f"cache_dir={_fresh_cache(slurm, 'exempt-user')}")
    try:
        out = slurm.side_file("exempt-user.out")
        res, rec = _step(slurm, log, [str(vendor / "other"), str(out)], user="nobody")
        assert res.returncode == 0 and out.exists(), res.stderr
        # A user exemption releases the rule for everything they run (here
        # also the info-level overlaps of the system libraries).
        released = rec["exempt"]
        assert {e["where"] for e in released} == {  # type: ignore[union-attr]
            "rules.page-congruence.exempt[1]", "rules.page-overlap.exempt[1]"}
        assert {"rule": "page-congruence", "path": str(vendor / "other"),
                "reason": "porting work", "until": _days(1),
                "where": "rules.page-congruence.exempt[1]"} in released
        # root, claiming to be nobody in every variable a user can set: refused.
        out = slurm.side_file("exempt-user-root.out")
        fake = {"USER": "nobody", "LOGNAME": "nobody", "SLURM_JOB_USER": "nobody",
                "SLURM_JOB_UID": "65534"}
        res, rec = _step(slurm, log, [str(vendor / "other"), str(out)], env=fake)
        assert res.returncode != 0 and not out.exists()
        assert (rec["uid"], rec["action"], rec["exempt"]) == (0, "reject", [])

        # A group exemption: the groups slurmstepd gave the step (nobody's
        # nogroup), not the submitting shell's.
        by_group = EXEMPT_CONFIG.replace('users = ["{user}"]', 'groups = ["nogroup"]')
        cfg = _config(slurm, "exempt-group", by_group.format(
            vendor=vendor, until=_days(1), reason=REASON, user=""))
        slurm.set_plugin_line(slurm.plugin, f"config={cfg}", f"audit={log}",
                              f"cache_dir={_fresh_cache(slurm, 'exempt-user')}")
        out = slurm.side_file("exempt-group.out")
        res, rec = _step(slurm, log, [str(vendor / "other"), str(out)], user="nobody")
        assert res.returncode == 0 and out.exists(), res.stderr
        assert "rules.page-congruence.exempt[1]" in {e["where"] for e in rec["exempt"]}  # type: ignore[union-attr]
        out = slurm.side_file("exempt-group-root.out")
        res, rec = _step(slurm, log, [str(vendor / "other"), str(out)])
        assert res.returncode != 0 and not out.exists()
        assert (rec["uid"], rec["exempt"]) == (0, [])
    finally:
        slurm.use("base")


# -- one audit setting, as config check tells it -------------------------------


def test_config_check_says_what_the_plugin_will_do(slurm: SlurmEnv) -> None:
    """The trap of issue 12: a config with ``[audit] path`` and a plugstack
    line without ``audit=``. config check now says nothing will be written,
    and the plugin indeed writes nothing; with ``audit=`` it writes there."""
    log = _fresh_log(slurm, "check")
    cfg = _config(slurm, "audit-in-toml", f'mode = "enforce"\n[audit]\npath = "{log}"\n')
    conf_env = {"SLURM_CONF": str(slurm.cluster.conf)}
    try:
        slurm.set_plugin_line(slurm.plugin, f"config={cfg}")
        check = _cli(slurm, "config", "check", str(cfg), extra_env=conf_env)
        assert check.returncode == 0, check.stderr
        assert (f"{cfg}:3: audit.path: ignored: the plugin writes the audit log named by "
                "audit= on its plugstack.conf line") in check.stdout
        assert f"plugstack {slurm.cluster.plugstack}:1 (from {slurm.cluster.conf}): required "\
            f"{slurm.plugin}" in check.stdout
        assert "  config: this file" in check.stdout
        assert "  audit log: none (no audit= on this line): no decision is written" \
            in check.stdout
        assert f"  check timeout: 10000 ms; verdict cache: {slurm.cache_dir}" in check.stdout
        res = slurm.cluster.srun(["true"], user="nobody")
        assert res.returncode == 0, res.stderr
        assert not log.exists()  # what config check said

        slurm.set_plugin_line(slurm.plugin, f"config={cfg}", f"audit={log}", "on_error=deny")
        check = _cli(slurm, "config", "check", str(cfg), extra_env=conf_env)
        assert f"  audit log: {log}: does not exist yet: the first step creates it (root, " \
               "0640)" in check.stdout
        assert "on_error=deny (step refused)" in check.stdout
        res = slurm.cluster.srun(["true"], user="nobody")
        assert res.returncode == 0, res.stderr
        [rec] = _records(log)
        assert rec["uid"] == 65534
        # report without files reads the log plugstack.conf names, and its
        # rotated copies (none of another name).
        log.with_name("audit.log.1").write_text("")
        log.with_name("other.log").write_text("{}\n")
        done = _cli(slurm, "report", "--json", extra_env=conf_env)
        assert done.returncode == 0, done.stderr
        data = json.loads(done.stdout)
        assert [f["path"] for f in data["files"]] == [str(log), str(log) + ".1"]
        assert data["steps"] == 1
        check = _cli(slurm, "config", "check", str(cfg), extra_env=conf_env)
        st = log.stat()
        assert st.st_uid == 0 and st.st_mode & 0o022 == 0
        assert f"  audit log: {log}: root-owned, mode {st.st_mode & 0o7777:04o}" in check.stdout

        # A line the plugin cannot use: exit 78, and the plugin indeed
        # follows on_error for the step (slurmd.log names the key).
        slurm.set_plugin_line(slurm.plugin, f"config={cfg}", f"audit={log}", "on_error=deny",
                              "audit_path=/x")
        check = _cli(slurm, "config", "check", str(cfg), extra_env=conf_env)
        assert check.returncode == 78, check.stdout + check.stderr
        assert "  broken: unknown plugstack argument 'audit_path=/x'" in check.stdout
        res = slurm.cluster.srun(["true"], user="nobody")
        assert res.returncode != 0
        assert "unknown plugstack argument 'audit_path=/x'" in slurm.cluster.slurmd_log_text()
    finally:
        slurm.use("base")


# -- report and metrics from real audit logs ------------------------------------


ROLLOUT_CONFIG = """\
mode = "enforce"
deadline_ms = 5000
[partitions.warnp]
mode = "warn"
[partitions.offp]
mode = "off"
[[rules.exe-arch-mismatch.exempt]]
paths = ["{vendor}/*"]
until = 2999-12-31
reason = "misjudged vendor tool (ticket 9)"
"""
HOSTILE = "evil\x1b[31m\nname"


def _nearest_rank(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[max(1, math.ceil(q * len(values))) - 1]


def _synthetic_rotated(path: Path, real_line: str) -> None:
    """An older rotated file holding everything a reader must survive."""
    with open(path, "wb") as f:
        f.write(b'{"msg": "logrotate ran", "level": "info"}\n')  # foreign
        f.write(b"Dec  1 08:00:00 node kernel: not json at all\n")  # torn
        bad = json.loads(real_line)
        bad["uid"] = "0"
        bad["elapsed_ms"] = "fast"
        f.write(json.dumps(bad).encode() + b"\n")  # invalid: wrong types
        f.write(b'\xff\xfe{"event": "decision"}\n')  # torn: not UTF-8
        f.write(b"x" * (2 << 20) + b"\n")  # oversized
        f.write(real_line[: len(real_line) // 2].encode())  # torn: no newline


def _metrics_samples(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def _scrape(node_exporter: Path, directory: Path) -> str:
    """node_exporter's textfile collector reading our file: the real consumer."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([str(node_exporter), "--collector.disable-defaults",
                             "--collector.textfile",
                             f"--collector.textfile.directory={directory}",
                             f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics",
                                            timeout=5) as r:
                    return r.read().decode()
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.1)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_report_and_metrics_from_real_audit_logs(slurm: SlurmEnv, tmp_path: Path,
                                                 node_exporter: Path) -> None:
    files = slurm.files
    vendor = files / "vendor-foreign"
    if vendor.exists():
        shutil.rmtree(vendor)
    vendor.mkdir()
    vendor.chmod(0o755)
    shutil.copy2(files / "foreign", vendor / "tool")
    hostile = slurm.cluster.shared / HOSTILE
    shutil.copy2(files / "foreign", hostile)
    hostile.chmod(0o755)
    cfg = _config(slurm, "rollout", ROLLOUT_CONFIG.format(vendor=vendor))
    tight = _config(slurm, "rollout-tight", "max_files = 1\n")
    log = _fresh_log(slurm, "report")
    cache = _fresh_cache(slurm, "report")

    def use(config: Path) -> None:
        slurm.set_plugin_line(slurm.plugin, f"config={config}", f"audit={log}",
                              f"cache_dir={cache}")

    try:
        use(cfg)
        out = slurm.side_file("report-native.out")
        # 1, 2: clean, the second from the verdict cache; 3: refused;
        # 4: warned (enforce would refuse); 5: partition off.
        _, r1 = _step(slurm, log, [str(files / "native"), str(out)], user="nobody")
        _, r2 = _step(slurm, log, [str(files / "native"), str(out)], user="nobody")
        assert "cache" not in r1 and r2["cache"] == "hit"
        _, r3 = _step(slurm, log, [str(files / "foreign")], user="nobody")
        _, r4 = _step(slurm, log, ["-p", "warnp", str(files / "foreign")])
        _, r5 = _step(slurm, log, ["-p", "offp", str(files / "foreign")])
        # Rotation as logrotate does it: rename, the plugin makes a new file
        # at the next step; then the real gzip.
        rotated = log.with_name("audit.log.1")
        log.rename(rotated)
        subprocess.run(["gzip", "-9", str(rotated)], check=True)
        gz = log.with_name("audit.log.1.gz")
        # 6: the exempted vendor tool in warnp; 7: a hostile program name;
        # 8: a check that hits its limit (error; on_error allow); 9: a batch
        # job whose script's interpreter is foreign.
        _, r6 = _step(slurm, log, ["-p", "warnp", str(vendor / "tool")], user="nobody")
        _, r7 = _step(slurm, log, ["-p", "warnp", str(hostile)], user="nobody")
        use(tight)
        _, r8 = _step(slurm, log, ["/bin/true"])
        use(cfg)
        before = len(_records(log))
        job = slurm.cluster.sbatch((files / "foreign-interp.sh").read_text(),
                                   ["-o", str(slurm.cluster.shared / "report-batch.out")])
        assert slurm.cluster.wait_job(job) == "FAILED"
        [r9] = _records(log)[before:]
    finally:
        slurm.use("base")
    real = [r1, r2, r3, r4, r5, r6, r7, r8, r9]
    assert [r["action"] for r in real] == ["allow", "allow", "reject", "warn", "allow",
                                          "allow", "warn", "allow", "reject"]
    assert [r["enforce_action"] for r in real] == ["allow", "allow", "reject", "reject", None,
                                                  "allow", "reject", "allow", "reject"]
    assert r8["error"] and r8["rules"] == ["check-limit"]
    assert r9["step_id"] == "batch" and str(r9["program"]).endswith("/slurm_script")
    assert r7["program"] == str(hostile)

    older = log.with_name("audit.log.2")
    _synthetic_rotated(older, json.dumps(r3, sort_keys=True))
    with gzip.open(gz, "rt") as f:
        assert [json.loads(line) for line in f] == real[:5]

    prom_dir = tmp_path / "textfile"
    prom_dir.mkdir()
    prom = prom_dir / "grace_policy.prom"
    res = _cli(slurm, "report", "--json", "--metrics", str(prom), str(log), str(gz), str(older))
    assert res.returncode == 0, res.stderr
    rep = json.loads(res.stdout)

    # -- field by field -------------------------------------------------------
    assert rep["lines"] == {"total": 15, "decisions": 9, "filtered_out": 0, "torn": 3,
                            "foreign": 1, "invalid": 1, "oversized": 1,
                            "judged_again_after_pull": 0}
    assert [(Path(f["path"]).name, f["lines"], f["decisions"], f["error"])
            for f in rep["files"]] == [("audit.log", 4, 4, None), ("audit.log.1.gz", 5, 5, None),
                                      ("audit.log.2", 6, 0, None)]
    assert rep["steps"] == 9
    assert rep["actions"] == {"allow": 5, "warn": 2, "reject": 2}
    assert rep["period"]["first"] == r1["time"] and rep["period"]["last"] == r9["time"]
    parts = rep["partitions"]
    assert set(parts) == {DEFAULT_PARTITION, "warnp", "offp"}
    assert parts[DEFAULT_PARTITION]["steps"] == 5
    assert parts[DEFAULT_PARTITION]["modes"] == {"enforce": 5}
    assert parts[DEFAULT_PARTITION]["actions"] == {"allow": 3, "warn": 0, "reject": 2}
    assert parts[DEFAULT_PARTITION]["errors"] == 1
    assert parts[DEFAULT_PARTITION]["would_refuse"] == 0
    assert parts["warnp"]["actions"] == {"allow": 1, "warn": 2, "reject": 0}
    assert parts["warnp"]["would_refuse"] == 2
    assert parts["offp"] == {"steps": 1, "modes": {"off": 1}, "errors": 0, "would_refuse": 0,
                             "actions": {"allow": 1, "warn": 0, "reject": 0}, "rules": {}}
    rule_steps: dict[str, int] = {}
    for r in real:
        for rule in dict.fromkeys(r["rules"]):  # type: ignore[arg-type]
            rule_steps[rule] = rule_steps.get(rule, 0) + 1
    assert rep["rules"] == dict(sorted(rule_steps.items(), key=lambda kv: (-kv[1], kv[0])))
    assert rep["rules"]["exe-arch-mismatch"] == 4  # 3, 4, 7, 9 (6 was exempted)
    assert rep["cache"] == {"hits": 1, "judged": 8, "hit_rate": round(1 / 8, 4)}
    assert rep["skipped"] == {"mode off": 1}
    assert rep["errors"] == {"steps": 1, "reasons": [{"reason": r8["error"], "steps": 1}]}
    assert rep["exempted"] == [{"rule": "exe-arch-mismatch", "path": str(vendor / "tool"),
                                "reason": "misjudged vendor tool (ticket 9)",
                                "until": "2999-12-31",
                                "where": "rules.exe-arch-mismatch.exempt[0]", "steps": 1}]
    assert rep["would_refuse"] == {
        "steps": 2, "partitions": {"warnp": 2}, "rules": {"exe-arch-mismatch": 2},
        "programs": sorted([{"program": str(files / "foreign"), "steps": 1},
                            {"program": str(hostile), "steps": 1}],
                           key=lambda p: str(p["program"])),
        "users": [{"uid": 0, "user": "root", "steps": 1},
                  {"uid": 65534, "user": "nobody", "steps": 1}],
        "unknown": 0}
    assert {p["program"]: p["steps"] for p in rep["programs"]} == {
        str(files / "foreign"): 2, str(hostile): 1, "/bin/true": 1, "(batch script)": 1}
    path_steps: dict[str, int] = {}
    for r in real:
        for p in dict.fromkeys(r["paths"]):  # type: ignore[arg-type]
            path_steps[p] = path_steps.get(p, 0) + 1
    assert {p["path"]: p["steps"] for p in rep["paths"]} == path_steps
    assert {u["user"]: (u["steps"], u["allow"], u["warn"], u["reject"])
            for u in rep["users"]} == {"nobody": (5, 3, 1, 1), "root": (4, 2, 1, 1)}
    times = [float(r["elapsed_ms"]) for r in real]  # type: ignore[arg-type]
    hits = [float(r2["elapsed_ms"])]  # type: ignore[arg-type]
    checked = [t for r, t in zip(real, times) if r is not r2]
    assert rep["time_ms"]["all"] == {"count": 9, "median": statistics.median(times),
                                     "p99": _nearest_rank(times, 0.99), "max": max(times),
                                     "sum": round(sum(times), 3)}
    assert rep["time_ms"]["cache_hit"]["median"] == hits[0]
    assert rep["time_ms"]["checked"]["median"] == statistics.median(checked)

    # -- filters ----------------------------------------------------------------
    def steps_with(*args: str) -> tuple[int, int]:
        done = _cli(slurm, "report", "--json", *args, str(log), str(gz), str(older))
        assert done.returncode == 0, done.stderr
        data = json.loads(done.stdout)
        return data["steps"], data["lines"]["filtered_out"]

    assert steps_with("--since", str(r6["time"])) == (4, 5)
    assert steps_with("--until", str(r6["time"])) == (5, 4)
    assert steps_with("--partition", "warnp") == (3, 6)
    assert steps_with("--partition", "warnp", "--partition", "offp") == (4, 5)
    assert steps_with("--user", "nobody") == (5, 4)
    assert steps_with("--user", "0", "--partition", "warnp") == (1, 8)
    assert steps_with("--since", "1d") == (9, 0)
    assert steps_with("--until", "2000-01-01") == (0, 9)

    # -- human output: at a glance, and nothing raw from a hostile name ----------
    human = _cli(slurm, "report", str(log), str(gz), str(older))
    assert human.returncode == 0, human.stderr
    text = human.stdout
    assert "\x1b" not in text and "evil\x1b" not in text
    assert "evil\\x1b[31m\\nname" in text
    assert text.startswith(f"grace-policy report: 9 steps from {r1['time']} to {r9['time']}, "
                           "3 files\n")
    assert "  skipped lines (not counted): 3 torn, 1 foreign, 1 invalid, 1 oversized" in text
    assert "steps: 9   allow 5 (56%)   warn 2 (22%)   reject 2 (22%)" in text
    assert "  checked 8, from the verdict cache 1 (12%); not judged: mode off 1" in text
    assert "enforce would have refused 2 steps in warn partitions:" in text
    row = [line.split() for line in text.splitlines() if line.startswith("  warnp ")]
    assert row == [["warnp", "warn", "3", "1", "2", "0", "0", "2"]]
    assert "misjudged vendor tool (ticket 9)" in text

    # -- the metrics file, and node_exporter reading it ---------------------------
    assert (prom.stat().st_mode & 0o777) == 0o644
    assert sorted(p.name for p in prom_dir.iterdir()) == ["grace_policy.prom"]
    ours = _metrics_samples(prom.read_text())
    expected = {
        f'grace_policy_steps{{partition="{DEFAULT_PARTITION}",mode="enforce",action="allow"}}': 3,
        f'grace_policy_steps{{partition="{DEFAULT_PARTITION}",mode="enforce",action="reject"}}':
            2,
        'grace_policy_steps{partition="warnp",mode="warn",action="allow"}': 1,
        'grace_policy_steps{partition="warnp",mode="warn",action="warn"}': 2,
        'grace_policy_steps{partition="offp",mode="off",action="allow"}': 1,
        'grace_policy_would_refuse_steps{partition="warnp"}': 2,
        f'grace_policy_error_steps{{partition="{DEFAULT_PARTITION}"}}': 1,
        "grace_policy_cache_hit_steps": 1,
        'grace_policy_exempted_steps{rule="exe-arch-mismatch",'
        'where="rules.exe-arch-mismatch.exempt[0]"}': 1,
        'grace_policy_check_seconds{quantile="0.5"}': statistics.median(times) / 1000,
        'grace_policy_check_seconds{quantile="0.99"}': _nearest_rank(times, 0.99) / 1000,
        "grace_policy_check_seconds_sum": round(sum(times), 3) / 1000,
        "grace_policy_check_seconds_count": 9,
        'grace_policy_audit_lines_skipped{reason="torn"}': 3,
        'grace_policy_audit_lines_skipped{reason="foreign"}': 1,
        'grace_policy_audit_lines_skipped{reason="invalid"}': 1,
        'grace_policy_audit_lines_skipped{reason="oversized"}': 1,
        "grace_policy_audit_files_unreadable": 0,
        "grace_policy_report_window_start_seconds": datetime.datetime.fromisoformat(
            str(r1["time"]).replace("Z", "+00:00")).timestamp(),
        "grace_policy_last_decision_seconds": datetime.datetime.fromisoformat(
            str(r9["time"]).replace("Z", "+00:00")).timestamp(),
    }
    for r in real:
        for rule in dict.fromkeys(r["rules"]):  # type: ignore[arg-type]
            key = f'grace_policy_rule_steps{{partition="{r["partition"]}",rule="{rule}"}}'
            expected[key] = expected.get(key, 0) + 1
    generated = ours.pop("grace_policy_report_generated_seconds")
    assert abs(generated - time.time()) < 600
    assert ours.keys() == expected.keys()
    for key, value in expected.items():
        assert ours[key] == pytest.approx(value, rel=1e-9, abs=1e-9), key

    scraped = _metrics_samples(_scrape(node_exporter, prom_dir))
    assert scraped['node_textfile_scrape_error'] == 0
    for key, value in expected.items():
        # node_exporter sorts labels by name; compare by the sorted form.
        name, _, labels = key.partition("{")
        pairs = sorted(labels.rstrip("}").split(",")) if labels else []
        canon = name + ("{" + ",".join(pairs) + "}" if pairs else "")
        assert scraped[canon] == pytest.approx(value, rel=1e-9, abs=1e-9), canon
