"""What the user of the two-architecture cluster has in the shared home, and
what they submit from the x86_64 login node (issue 17, item 2).

:func:`build_home` writes the home as the login node leaves it: a venv made
with the login node's python3, an x86_64 wheel installed with ``pip install
--user``, an x86_64 CLI in ``~/.local/bin``, and aarch64 programs someone
built for 4 KiB pages (one plain, one with a 4 KiB jemalloc inside). Each
:class:`Case` is one submission; :func:`submit` runs it with srun or sbatch
(or :func:`enqueue` then :func:`finish`, to queue many batch jobs at once)
and :func:`predict` asks ``grace-policy check --partition P --json`` on the
login node, with the same environment, what the node will do. Every srun
case has a batch twin (:func:`as_batch`) unless it says why not; a case's
partition is ``gb200`` (the 64 KiB aarch64 node) or ``x86`` (the x86_64 one).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from corpus import build_jemalloc
from fixtures.build import CompileCache, compile_c, src
from python import torch_layouts
from python.wheels import copy_site

from grace_policy.rules import Catalogue

from .ffmpeg import ffmpeg5_libs, link_into
from .twoarch import PARTITION, WARN_OF, X86_PARTITION, TwoArchCluster

SITE = ".local/lib/python3.11/site-packages"
#: Where the user unpacked an aarch64 FFmpeg 5 (in the home).
FFMPEG_DIR = "ffmpeg5/lib"


@dataclass(frozen=True)
class Case:
    name: str
    what: str
    #: srun: the step's argv; sbatch: the script's text.
    argv: tuple[str, ...] = ()
    script: str = ""
    #: srun's options besides the partition (e.g. --gpus=1).
    srun_opts: tuple[str, ...] = ()
    #: The login shell's additions (``~`` is the home).
    env: dict[str, str] = field(default_factory=dict)
    #: What the node must do in enforce mode: the action and the rule ids the
    #: user is shown (info findings, e.g. on the node's own libraries, aside).
    action: str = "allow"
    rules: tuple[str, ...] = ()
    #: For a refused case: what really fails when the step runs anyway (the
    #: warn-mode partition), as the node prints it; the prediction's
    #: "without this check" text must say the same.
    fails_with: str = ""
    #: Where it is submitted (the x86 partition: the same program on the
    #: x86_64 node).
    partition: str = PARTITION
    #: Why this srun case has no batch twin ("" = it has one: :func:`as_batch`).
    no_batch: str = ""

    @property
    def kind(self) -> str:
        return "sbatch" if self.script else "srun"

    @property
    def warn_partition(self) -> str:
        """The same node in warn mode, where a refused case runs anyway."""
        return WARN_OF[self.partition]


def as_batch(case: Case, fails_with: str | None = None) -> Case:
    """The srun case as a batch job: a script whose one line runs the step's
    argv, submitted with the same environment and options, so the node
    judges the script (and that line) before it runs. ``fails_with``: what
    the line's failure looks like in the job's output, when that differs
    from the step's (the script's shell reports a killed program itself)."""
    line = " ".join(shlex.quote(a) for a in case.argv)
    return Case(f"{case.name}-sbatch", f"{case.what}, as a batch job",
                script=f"#!/bin/sh\n#SBATCH -o ~/{case.name}-sbatch-%j.out\n{line}\n",
                srun_opts=case.srun_opts, env=case.env, action=case.action, rules=case.rules,
                fails_with=case.fails_with if fails_with is None else fails_with,
                partition=case.partition)


VENV = {"VIRTUAL_ENV": "~/venv-login", "PATH": "~/venv-login/bin:/usr/bin:/bin"}
SYSVENV = {"VIRTUAL_ENV": "~/venv-sys", "PATH": "~/venv-sys/bin:/usr/bin:/bin"}

SRUN_CASES: tuple[Case, ...] = (
    Case("venv-leak", "an x86_64 venv (--copies) activated on the login node, then a "
         "plain command", argv=("uname", "-m"), env=VENV, action="warn", rules=("env-leak",)),
    Case("system-venv", "a venv of the system python3 made on the login node, its python "
         "run on the node (issue 16)",
         argv=("python3", "-c", "import sys; print(sys.prefix)"), env=SYSVENV),
    Case("user-site-x86-wheel", "an x86_64 wheel from pip install --user, imported",
         argv=("python3", "-c", "import bcrypt; print(bcrypt.__version__)"),
         action="reject", rules=("py-ext-arch",), fails_with="ImportError"),
    Case("local-bin-x86-cli", "an x86_64 CLI in ~/.local/bin",
         argv=("tool",), env={"PATH": "~/.local/bin:/usr/bin:/bin"},
         action="reject", rules=("exe-arch-mismatch",), fails_with="Exec format error",
         no_batch="sbatch-x86-cli is its batch job (the script sets PATH itself)"),
    Case("native-64k", "an aarch64 program built for 64 KiB pages, named from the home",
         argv=("./bin/hello-64k",)),
    Case("aarch64-4k-build", "an aarch64 program linked for 4 KiB pages",
         argv=("~/bin/hello-4k",), action="reject", rules=("page-congruence", "page-overlap"),
         fails_with="Segmentation fault"),
    Case("jemalloc-4k", "an aarch64 program with a jemalloc built for 4 KiB pages",
         argv=("~/bin/alloc-4k",), action="reject", rules=("page-size-compiled",),
         fails_with="Unsupported system page size"),
    Case("torch-cpu-gpus", "a CPU-only torch (pip install --user) imported on a --gpus step",
         argv=("python3", "-c", "import torch; print('torch imported')"), srun_opts=("--gpus=1",),
         env={"PYTHONUSERBASE": "~/.local-torch"}, action="warn", rules=("torch-cpu-only",)),
    # Both torchcodec cases run tests/vm/src/torchcodec_ffmpeg.py: torchcodec's
    # own search for an FFmpeg, for real (its cores also need a CUDA torch,
    # which the home does not hold; see the script).
    Case("torchcodec-no-ffmpeg", "torchcodec (pip install --user) where the node has no FFmpeg",
         argv=("python3", "~/bin/torchcodec_ffmpeg.py"),
         env={"PYTHONUSERBASE": "~/.local-codec"}, action="reject",
         rules=("torchcodec-no-ffmpeg",),
         fails_with="libavutil.so.60: cannot open shared object file"),
    Case("torchcodec-ffmpeg5", "torchcodec with Debian 12's arm64 FFmpeg 5.1 on LD_LIBRARY_PATH",
         argv=("python3", "~/bin/torchcodec_ffmpeg.py"),
         env={"PYTHONUSERBASE": "~/.local-codec", "LD_LIBRARY_PATH": f"~/{FFMPEG_DIR}"}),
    # The same programs on the x86 partition (the x86_64 node): what Grace
    # refuses runs there, and the reverse.
    Case("x86-local-bin-cli", "the x86_64 CLI of ~/.local/bin on the x86 partition",
         argv=("tool",), env={"PATH": "~/.local/bin:/usr/bin:/bin"}, partition=X86_PARTITION),
    Case("x86-user-site-wheel", "the x86_64 wheel from pip install --user, imported on the "
         "x86 partition",
         argv=("python3", "-c", "import bcrypt; print(bcrypt.__version__)"),
         partition=X86_PARTITION),
    Case("x86-native-64k", "the aarch64 64 KiB program on the x86 partition",
         argv=("./bin/hello-64k",), partition=X86_PARTITION, action="reject",
         rules=("exe-arch-mismatch",), fails_with="Exec format error"),
)

#: The srun cases as batch jobs, then the batch-only ones.
BATCH_CASES: tuple[Case, ...] = (
    *(as_batch(c) for c in SRUN_CASES if not c.no_batch),
    Case("clean-sbatch", "the recommended sbatch lines in a clean job",
         script=f"#!/bin/sh\n#SBATCH -p {PARTITION}\n#SBATCH -o ~/clean-sbatch-%j.out\n"
                "unset CONDA_PREFIX CONDA_DEFAULT_ENV CONDA_EXE VIRTUAL_ENV\nuname -m\n"),
    Case("sbatch-x86-cli", "a batch script whose line runs the x86_64 CLI of ~/.local/bin",
         script=f"#!/bin/sh\n#SBATCH -p {PARTITION}\n#SBATCH -o ~/sbatch-x86-cli-%j.out\n"
                "export PATH=~/.local/bin:/usr/bin:/bin\ntool\n",
         action="reject", rules=("exe-arch-mismatch",),
         # The guest's /bin/sh is busybox, which runs an ELF file it cannot
         # execute as a shell script (grace_policy/batch/judge.py _worded).
         fails_with="syntax error"),
)

CASES: tuple[Case, ...] = (*SRUN_CASES, *BATCH_CASES)


def expand(text: str, home: Path) -> str:
    return text.replace("~", str(home))


def build_home(cluster: TwoArchCluster, cache: CompileCache | None) -> None:
    """The user's home as the x86_64 login node left it."""
    home = cluster.home
    # /usr/bin/python3: the login node's distribution python, not the tests'.
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", "--copies",
                    str(home / "venv-login")], check=True, capture_output=True)
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip",
                    str(home / "venv-sys")], check=True, capture_output=True)
    copy_site("bcrypt-4.1.2-abi3-x86_64", home / SITE)
    # Per-case user bases (PYTHONUSERBASE), so one case's packages are not
    # in another's user site.
    torch_layouts.copy_tree(torch_layouts.cpu_files(), home / ".local-torch" / SITE[7:])
    torch_layouts.copy_tree(torch_layouts.torchcodec_site(), home / ".local-codec" / SITE[7:])
    (home / "bin").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(Path(__file__).parent / "src" / "torchcodec_ffmpeg.py",
                    home / "bin" / "torchcodec_ffmpeg.py")
    # Linked from the cache, owned by root: a site's module directory is not
    # the user's either (and chown would change the cache's files).
    link_into(ffmpeg5_libs(), home / FFMPEG_DIR)
    kw = {"cache": cache}
    compile_c(src("hello.c"), home / ".local/bin/tool", arch="x86_64", **kw)
    compile_c(src("hello.c"), home / "bin/hello-4k", arch="aarch64", page_size=4096, **kw)
    compile_c(src("hello.c"), home / "bin/hello-64k", arch="aarch64", page_size=65536, **kw)
    lib = build_jemalloc(12) / "lib" / "libjemalloc.a"
    subprocess.run(["aarch64-linux-gnu-gcc", "-O1", "-o", str(home / "bin/alloc-4k"),
                    str(src("jemalloc_use.c")), str(lib), "-lpthread",
                    "-Wl,-z,max-page-size=65536"], check=True, capture_output=True)
    shared = home / FFMPEG_DIR
    for path in [home, *home.rglob("*")]:
        if path.parent != shared:
            os.lchown(path, 65534, 65534)


def case_env(cluster: TwoArchCluster, case: Case) -> dict[str, str]:
    return cluster.user_env({k: expand(v, cluster.home) for k, v in case.env.items()})


def _sbatch_path(cluster: TwoArchCluster, case: Case) -> Path:
    path = cluster.home / f"{case.name}.sh"
    if not path.exists():
        path.write_text(expand(case.script, cluster.home))
        path.chmod(0o755)
        os.chown(path, 65534, 65534)
    return path


@dataclass(frozen=True)
class Outcome:
    rc: int
    stdout: str
    stderr: str
    seconds: float
    job_state: str = ""
    job_id: int = 0


def submit(cluster: TwoArchCluster, case: Case, partition: str | None = None) -> Outcome:
    """Run the case to its end: srun's step, or sbatch's job waited for."""
    if case.kind == "sbatch":
        queued = enqueue(cluster, case, partition)
        return queued if isinstance(queued, Outcome) else finish(cluster, case, queued)
    partition = partition or case.partition
    argv = [expand(a, cluster.home) for a in case.argv]
    res = cluster.as_user(["srun", "-p", partition, "-N1", "-n1", *case.srun_opts, *argv],
                          case_env(cluster, case), timeout=180)
    return Outcome(res.rc, res.stdout, res.stderr, res.seconds)


def enqueue(cluster: TwoArchCluster, case: Case, partition: str | None = None
            ) -> int | Outcome:
    """sbatch the case's script: its job id, or the failed submission. The
    jobs of several cases queue on their node and run one after the other
    while the caller does something else (:func:`finish` waits)."""
    script = _sbatch_path(cluster, case)
    res = cluster.as_user(["sbatch", "--parsable", "-p", partition or case.partition,
                           *case.srun_opts, str(script)], case_env(cluster, case))
    if res.rc != 0:
        return Outcome(res.rc, res.stdout, res.stderr, res.seconds, "SUBMIT-FAILED")
    return int(res.stdout.strip().split(";")[0])


def finish(cluster: TwoArchCluster, case: Case, job: int) -> Outcome:
    """Wait for the job; its output file holds what the user sees."""
    t0 = time.monotonic()
    state = cluster.wait_job(job)
    out = cluster.home / f"{case.name}-{job}.out"
    text = out.read_text(errors="replace") if out.exists() else ""
    return Outcome(0 if state == "COMPLETED" else 1, text, "", time.monotonic() - t0, state,
                   job)


def predict(cluster: TwoArchCluster, case: Case, partition: str | None = None
            ) -> dict[str, object]:
    """``grace-policy check --partition P --json`` as the user on the login
    node, with the environment the submission had (``--env-file``, so the
    checker's own environment is not judged)."""
    env = case_env(cluster, case)
    with tempfile.NamedTemporaryFile("w", suffix=".env", delete=False,
                                     dir=cluster.root) as fh:
        fh.write("".join(f"{k}={v}\n" for k, v in env.items()))
    os.chmod(fh.name, 0o644)
    try:
        cmd = [str(cluster.login_tool), "check", "--config", str(cluster.login_config),
               "--partition", partition or case.partition, "--env-file", fh.name,
               "--cwd", str(cluster.home), "--json"]
        # The step's GPU options as the user gives them to srun: check takes
        # --gpus=N / --gres=gpu:N and sets what slurmstepd will.
        cmd += [opt for opt in case.srun_opts if opt.startswith(("--gpus=", "--gres="))]
        if case.kind == "srun":
            cmd += ["--", *(expand(a, cluster.home) for a in case.argv)]
        else:
            cmd += ["--batch", str(_sbatch_path(cluster, case))]
        tool_env = {"PATH": "/usr/bin:/bin", "HOME": env["HOME"], "LANG": "C.UTF-8"}
        res = cluster.as_user(cmd, tool_env, netns=False, timeout=120)
    finally:
        os.unlink(fh.name)
    try:
        verdict = json.loads(res.stdout)
    except ValueError:
        return {"action": f"(check failed rc={res.rc})", "rules": [], "stderr": res.stderr,
                "raw": res.stdout}
    verdict["rules"] = [f["rule"] for f in verdict.get("findings", [])]
    return verdict


def node_record(cluster: TwoArchCluster, before: int, partition: str = PARTITION,
                skip_jobs: frozenset[int] = frozenset()) -> list[dict[str, object]]:
    """The audit lines ``partition``'s node wrote since ``before`` lines,
    but those of the batch jobs ``skip_jobs`` (queued beside the step)."""
    records = [json.loads(line) for line in cluster.audit_lines(partition)[before:]]
    return [r for r in records if str(r.get("job_id")) not in {str(j) for j in skip_jobs}]


def job_record(cluster: TwoArchCluster, partition: str, job: int) -> list[dict[str, object]]:
    """The audit lines of batch job ``job`` (its batch step: one)."""
    return [r for r in (json.loads(line) for line in cluster.audit_lines(partition))
            if r.get("job_id") == str(job)]


#: The rule catalogue: which rules a user is shown.
CATALOGUE = Catalogue()


def visible(rules: object) -> list[str]:
    """The rule ids a user is shown (info findings go to the audit log only)."""
    return [r for r in rules if CATALOGUE.severity(r) != "info"]  # type: ignore[attr-defined]


def agrees(records: list[dict[str, object]], predicted: dict[str, object]) -> bool:
    """The node's one audit line and the login node's prediction: the same
    action and the same rules a user is shown."""
    return (len(records) == 1 and records[0]["action"] == predicted["action"]
            and visible(records[0]["rules"]) == visible(predicted["rules"]))
