"""The two-architecture cluster of issue 17: submitted on x86_64, judged on a
64 KiB aarch64 node, predicted on the x86_64 login node.

One cluster per module (:mod:`vm.twoarch`): slurmctld, munge, srun and sbatch
on this machine inside a network namespace the test makes, slurmd with the
aarch64 plugin in the 64 KiB guest, the home shared over 9p, the user
``nobody`` on both sides. Every case of :data:`vm.twoarch_cases.CASES` is
submitted as that user from the x86_64 side; the node's audit line must give
the case's action and rules, and ``grace-policy check --partition gb200
--json`` on the login node must give the same (prediction == decision).
Refused cases run again on the warn-mode partition, where they start and
fail for real the way the plugin's message said they would. Every srun case
also runs as a batch job (judged, by the node, as its step is), and the
same programs go to the x86 partition (a second slurmd, x86_64, on this
machine), where what gb200 refuses runs and the reverse.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path

import pytest
from corpus import CorpusUnavailable, _give_up
from fixtures.build import CompileCache
from vm import twoarch, twoarch_cases
from vm.twoarch_cases import CASES, CATALOGUE, Case, Outcome, visible

from grace_policy.node import host_machine

pytestmark = [
    pytest.mark.vm, pytest.mark.slurm, pytest.mark.network, pytest.mark.cross,
    pytest.mark.skipif(host_machine() != "x86_64",
                       reason="the login node and controller are this x86_64 machine"),
]
PREFIX = "grace-policy: "

#: The refused cases, rerun on the warn-mode partition: each must start there
#: and fail the way the prediction said it would.
WARN_CASES = tuple(c for c in CASES if c.fails_with)



class Run:
    """Everything the module's cluster did, for the tests to read."""

    def __init__(self) -> None:
        self.enforce: dict[str, Outcome] = {}
        self.warn: dict[str, Outcome] = {}
        self.audit: dict[str, list[dict[str, object]]] = {}
        self.warn_audit: dict[str, list[dict[str, object]]] = {}
        self.predicted: dict[str, dict[str, object]] = {}
        self.warn_predicted: dict[str, dict[str, object]] = {}
        self.netns_links: str = ""
        self.host_links_before: str = ""
        self.host_links_during: str = ""
        self.boot_seconds = 0.0
        self.home = Path()
        #: Wall time of each part of the run (srun steps, batch jobs...).
        self.phases: dict[str, float] = {}


def _srun_case(cluster: twoarch.TwoArchCluster, out: Run, case: Case,
               skip_jobs: frozenset[int] = frozenset()) -> None:
    """One srun step (and its warn-mode rerun): judged alone on its node's
    log, but for the queued batch jobs ``skip_jobs``."""
    for mode, partition in (("enforce", case.partition), ("warn", case.warn_partition)):
        if mode == "warn" and not case.fails_with:
            break
        before = len(cluster.audit_lines(partition))
        outcome = twoarch_cases.submit(cluster, case, partition)
        record = twoarch_cases.node_record(cluster, before, partition, skip_jobs)
        predicted = twoarch_cases.predict(cluster, case, partition)
        if mode == "enforce":
            out.enforce[case.name], out.audit[case.name] = outcome, record
            out.predicted[case.name] = predicted
        else:
            out.warn[case.name], out.warn_audit[case.name] = outcome, record
            out.warn_predicted[case.name] = predicted


def _run_cases(cluster: twoarch.TwoArchCluster, out: Run) -> None:
    """The Grace node's srun steps one at a time; then every batch job at
    once (they queue on their node, which runs them back to back), and
    while the guest works through them, the x86_64 node's steps and the
    batch jobs' predictions on this machine."""
    t0 = time.monotonic()
    srun = [c for c in CASES if c.kind == "srun"]
    for case in srun:
        if case.partition == twoarch.PARTITION:
            _srun_case(cluster, out, case)
    t1 = time.monotonic()
    queued: dict[tuple[str, str], int | Outcome] = {}
    batch = [c for c in CASES if c.kind == "sbatch"]
    for case in batch:
        queued[case.name, "enforce"] = twoarch_cases.enqueue(cluster, case)
        if case.fails_with:
            queued[case.name, "warn"] = twoarch_cases.enqueue(cluster, case,
                                                              case.warn_partition)
    jobs = frozenset(j for j in queued.values() if isinstance(j, int))
    for case in srun:
        if case.partition != twoarch.PARTITION:
            _srun_case(cluster, out, case, jobs)
    t2 = time.monotonic()
    for case in batch:
        out.predicted[case.name] = twoarch_cases.predict(cluster, case)
        if case.fails_with:
            out.warn_predicted[case.name] = twoarch_cases.predict(cluster, case,
                                                                  case.warn_partition)
    for (name, mode), job in queued.items():
        case = next(c for c in batch if c.name == name)
        partition = case.partition if mode == "enforce" else case.warn_partition
        outcome = job if isinstance(job, Outcome) else twoarch_cases.finish(cluster, case, job)
        record = ([] if isinstance(job, Outcome)
                  else twoarch_cases.job_record(cluster, partition, job))
        if mode == "enforce":
            out.enforce[name], out.audit[name] = outcome, record
        else:
            out.warn[name], out.warn_audit[name] = outcome, record
    t3 = time.monotonic()
    out.phases = {"Grace srun steps": t1 - t0, "x86 srun steps": t2 - t1,
                  "batch jobs after that": t3 - t2}


@pytest.fixture(scope="module")
def run(compile_cache: CompileCache) -> Run:
    why = twoarch.unavailable()
    if why:
        _give_up(why)
    out = Run()
    out.host_links_before = twoarch._run(["ip", "-o", "link"]).stdout
    # Not pytest's tmp_path: its /tmp/pytest-of-root is 0700, and the user
    # must reach the home and munge's socket.
    root = Path(tempfile.mkdtemp(prefix="gp-twoarch-"))
    cluster = twoarch.TwoArchCluster(root)
    try:
        try:
            cluster.start()
            twoarch_cases.build_home(cluster, compile_cache)
        except CorpusUnavailable as exc:
            _give_up(f"two-architecture cluster setup: {exc}")
        except twoarch.ClusterError as exc:
            pytest.fail(f"the two-architecture cluster did not come up: {exc}")
        out.boot_seconds, out.home = cluster.boot_seconds, cluster.home
        assert cluster.netns is not None
        out.netns_links = twoarch._run(["ip", "-n", cluster.netns.name, "-o", "addr"]).stdout
        out.host_links_during = twoarch._run(["ip", "-o", "link"]).stdout
        _run_cases(cluster, out)
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
    print(f"\ntwo-arch cluster: nodes idle {out.boot_seconds:.0f} s after start; "
          + ", ".join(f"{k} {v:.0f} s" for k, v in out.phases.items()) + "; srun steps: "
          + ", ".join(f"{k} {v.seconds:.0f} s" for k, v in out.enforce.items()
                      if v.job_id == 0))
    print("scenario | node action+rules | prediction action+rules")
    for case in CASES:
        rec = out.audit[case.name]
        p = out.predicted[case.name]
        print(f"{case.name} | {[(r['action'], r['rules']) for r in rec]} | "
              f"{p['action']} {p['rules']}")
    return out


def said(text: str) -> str:
    lines = [line[len(PREFIX):] for line in text.splitlines() if line.startswith(PREFIX)]
    return " ".join(" ".join(lines).split())


def one_record(run: Run, case: Case) -> dict[str, object]:
    records = run.audit[case.name]
    assert len(records) == 1, records
    return records[0]


def test_the_network_is_only_inside_the_namespace(run: Run) -> None:
    """tap0 and the addresses live in the test's namespace; the machine's
    own interfaces are the same before and during the run."""
    assert f"inet {twoarch.HOST_IP}/{twoarch.PREFIX_LEN}" in run.netns_links
    assert "tap0" in run.netns_links
    def names(text: str) -> list[str]:
        return sorted(line.split(":")[1].strip() for line in text.splitlines())

    assert names(run.host_links_during) == names(run.host_links_before)
    assert "tap0" not in run.host_links_during


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_node_decides_as_the_case_says(run: Run, case: Case) -> None:
    step = run.enforce[case.name]
    record = one_record(run, case)
    assert record["node"] == twoarch.NODE_OF[case.partition]
    assert record["partition"] == case.partition
    assert (record["action"], tuple(visible(record["rules"]))) == (case.action, case.rules), \
        step.stderr
    if case.action == "reject":
        # The program did not run (a batch job's output also holds our
        # message, which names the file).
        assert step.rc != 0 and "hello" not in step.stdout.splitlines()
        if case.kind == "srun":
            assert f"{PREFIX}ERROR {case.rules[0]}: " in step.stderr, step.stderr
        else:
            assert step.job_state == "FAILED"
    else:
        assert step.rc == 0, step.stderr + step.job_state
        # It ran on the node: each such case prints (uname -m, sys.prefix, ...).
        assert step.stdout.strip(), (step.stdout, step.stderr)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_login_node_prediction_equals_the_node_decision(run: Run, case: Case) -> None:
    """The same action and the same rules. The node may add info findings
    on its own files (Debian 12 arm64's libnsl.so.2, which the standard
    library loads: relro-tail), which the login node does not have to judge
    and no user sees; any other difference fails."""
    record = one_record(run, case)
    predicted = run.predicted[case.name]
    assert predicted["action"] == record["action"], predicted
    assert visible(predicted["rules"]) == visible(record["rules"]), (predicted, record)
    extra = list(record["rules"])  # type: ignore[call-overload]
    for rule in predicted["rules"]:  # type: ignore[attr-defined]
        extra.remove(rule)
    assert all(CATALOGUE.severity(r) == "info" for r in extra), (extra, record)
    pred_paths = {f["path"] for f in predicted["findings"]}  # type: ignore[attr-defined]
    node_only = [p for p in record["paths"] if p not in pred_paths]  # type: ignore[attr-defined]
    assert not [p for p in node_only if p.startswith(str(run.home))], (node_only, predicted)
    assert bool(extra) == bool(node_only), (extra, node_only)
    machine, page = (("x86_64", 4096) if case.partition == twoarch.X86_PARTITION
                     else ("aarch64", 65536))
    assert predicted["node"]["machine"] == machine  # type: ignore[index]
    assert predicted["node"]["page_size"] == page  # type: ignore[index]


def test_page_size_came_from_the_node(run: Run) -> None:
    """Neither the node's config nor this 4 KiB host says 64 KiB: the
    message's figure is what the plugin detected on the guest."""
    assert "page_size" not in twoarch.NODE_CONFIG
    step = run.enforce["aarch64-4k-build"]
    assert "pages smaller than this node's 64 KiB" in said(step.stderr)


def test_venv_leak_is_stripped_and_the_step_runs(run: Run) -> None:
    step = run.enforce["venv-leak"]
    assert step.rc == 0 and step.stdout == "aarch64\n", step.stderr
    assert "removed from the step's environment: VIRTUAL_ENV" in said(step.stderr)
    record = one_record(run, next(c for c in CASES if c.name == "venv-leak"))
    assert "VIRTUAL_ENV" in record["env_unset"]  # type: ignore[operator]
    assert "VIRTUAL_ENV" in run.predicted["venv-leak"]["env"]["unset"]  # type: ignore[index]


def test_torchcodec_finds_ffmpeg5_on_the_node(run: Run) -> None:
    """With FFmpeg 5.1 on LD_LIBRARY_PATH the step ran torchcodec's own
    search on the node: the cores for FFmpeg 8, 7 and 6 found nothing, the
    one for 5 loaded all seven libraries."""
    step = run.enforce["torchcodec-ffmpeg5"]
    assert step.stdout.startswith("FFmpeg 5 loaded for libtorchcodec_core5.so: "
                                  "libavutil.so.57 "), (step.stdout, step.stderr)
    for major, soname in ((8, "libavutil.so.60"), (7, "libavutil.so.59"),
                          (6, "libavutil.so.58")):
        assert f"FFmpeg {major}: {soname}: cannot open shared object file" in step.stderr


def test_clean_sbatch_is_silent(run: Run) -> None:
    step = run.enforce["clean-sbatch"]
    assert step.job_state == "COMPLETED" and step.stdout == "aarch64\n"
    assert PREFIX not in step.stdout


@pytest.mark.parametrize("case", WARN_CASES, ids=[c.name for c in WARN_CASES])
def test_warn_mode_runs_and_fails_as_predicted(run: Run, case: Case) -> None:
    """On the warn-mode partition (gb200warn, x86warn) the refused step or
    batch job starts, fails for real, and the failure is the one the login
    node's prediction (and the node's warning) named."""
    step = run.warn[case.name]
    assert step.rc != 0, step.stdout + step.stderr
    text = step.stdout + "\n" + step.stderr  # a batch job's output file holds both
    assert f"{PREFIX}WARNING" in text or f"{PREFIX}ERROR" in text, text
    real = "\n".join(line for line in text.splitlines() if not line.startswith(PREFIX))
    assert case.fails_with in real, real
    assert case.fails_with.split()[0] in said(text), said(text)
    (record,) = run.warn_audit[case.name]
    assert record["action"] == "warn"
    assert visible(record["rules"]) == list(case.rules), record
    predicted = run.warn_predicted[case.name]
    assert predicted["action"] == "warn", predicted
    assert visible(predicted["rules"]) == list(case.rules), predicted
    first = next(f for f in predicted["findings"]  # type: ignore[attr-defined]
                 if f["rule"] == case.rules[0])
    assert case.fails_with in first["predicted_error"], first


def test_cpu_torch_warning_names_the_partitions_cuda_index(run: Run) -> None:
    """The --gpus step with a CPU-only torch runs (a warning), and both the
    node's message and the login node's prediction point at the PyTorch
    index of the partition's CUDA (cuda_index = "cu130" on gb200)."""
    step = run.enforce["torch-cpu-gpus"]
    assert step.rc == 0 and "torch imported" in step.stdout, step.stderr
    assert "WARNING torch-cpu-only" in said(step.stderr)
    assert "cu130" in said(step.stderr), said(step.stderr)
    [finding] = [f for f in run.predicted["torch-cpu-gpus"]["findings"]  # type: ignore[attr-defined]
                 if f["rule"] == "torch-cpu-only"]
    assert "cu130" in json.dumps(finding), finding


#: (srun case, its batch twin): every srun case has one unless it says why.
TWINS = tuple((c, next(b for b in CASES if b.name == f"{c.name}-sbatch"))
              for c in CASES if c.kind == "srun" and not c.no_batch)


def test_every_srun_case_runs_as_a_batch_job_or_says_why() -> None:
    names = {c.name for c in CASES}
    for case in CASES:
        if case.kind == "srun":
            assert case.no_batch or f"{case.name}-sbatch" in names, case.name


@pytest.mark.parametrize(("step", "batch"), TWINS, ids=[c.name for c, _b in TWINS])
def test_batch_job_is_judged_and_runs_as_its_step(run: Run, step: Case, batch: Case) -> None:
    """The node's decision on the script (judged before its first line) is
    the step's: the same action and the same rules shown; an allowed job's
    line printed what the step printed."""
    step_rec, batch_rec = one_record(run, step), one_record(run, batch)
    assert batch_rec["action"] == step_rec["action"], (batch_rec, step_rec)
    assert visible(batch_rec["rules"]) == visible(step_rec["rules"]), (batch_rec, step_rec)
    job = run.enforce[batch.name]
    if step.action == "reject":
        assert job.job_state == "FAILED", job
        assert f"{PREFIX}ERROR {step.rules[0]}: line 3: " in job.stdout, job.stdout
    else:
        assert job.job_state == "COMPLETED", job
        printed = run.enforce[step.name].stdout.strip()
        assert printed and printed in job.stdout, (printed, job.stdout)


#: (x86 partition case, Grace case): the same program, opposite verdicts.
ACROSS = (("x86-local-bin-cli", "local-bin-x86-cli"),
          ("x86-user-site-wheel", "user-site-x86-wheel"),
          ("x86-local-bin-cli-sbatch", "sbatch-x86-cli"),
          ("native-64k", "x86-native-64k"))


@pytest.mark.parametrize(("allowed", "refused"), ACROSS, ids=[a for a, _r in ACROSS])
def test_same_program_runs_on_one_architecture_refused_on_the_other(
        run: Run, allowed: str, refused: str) -> None:
    """An x86_64 program runs on the x86 partition and is refused on gb200;
    the aarch64 64 KiB one the reverse. Both nodes judge it themselves (the
    x86_64 node's config says nothing about the node either)."""
    ok, no = run.enforce[allowed], run.enforce[refused]
    ok_rec, no_rec = one_record(run, _case(allowed)), one_record(run, _case(refused))
    assert {ok_rec["node"], no_rec["node"]} == {twoarch.NODE, twoarch.X86_NODE}
    assert ok_rec["action"] == "allow" and no_rec["action"] == "reject", (ok_rec, no_rec)
    assert (ok.rc, ok.job_state) in ((0, ""), (0, "COMPLETED")), ok
    assert ("hello" in ok.stdout) or ok.stdout.strip()[:1].isdigit(), ok.stdout
    assert no.rc != 0 and "hello" not in no.stdout.splitlines(), no
    import tomllib  # the tests' Python (3.11); the package supports 3.9

    config = tomllib.loads(twoarch.X86_NODE_CONFIG)
    assert "node" not in config
    assert not [p for p in config["partitions"].values() if {"arch", "page_size"} & set(p)]


def _case(name: str) -> Case:
    return next(c for c in CASES if c.name == name)
