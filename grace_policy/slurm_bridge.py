"""The plugin's Python side: the only module that touches cffi.

slurmstepd -> spank/grace_stepd.c -> ``grace_py_decide(struct grace_step *)``
(implemented here with ``@ffi.def_extern``) -> :func:`run_step` -> the core
(``load_policy``, ``decide``, ``user_lines``, ``render_decision``) -> results
handed back one string at a time through the C function ``grace_emit``.

Contract with the C side (grace_policy/contract.py, from which spank/'s
header is generated; the struct, codes and kinds below are read from it):

* the return value is ``GRACE_RC_ALLOW``/``WARN``/``REJECT`` for a verdict,
  ``GRACE_RC_ERROR`` when the check could not be made (the reason was emitted
  as a log line, the kind of failure as a ``fail`` item: C never reads the
  kind from the reason's words); C then follows the plugstack's
  ``on_error``. 0 and -1 are never returned on purpose: 0 is what cffi
  returns when its own start-up failed, -1 what ``def_extern`` returns for
  an escaped exception;
* ``GRACE_EMIT_DONE`` is emitted last: C trusts no verdict without it;
* user lines already start with ``grace-policy: `` and are escaped; log lines
  go to slurmd's log only (never a traceback, never to the user);
* the decision's audit line is not written here but handed back as a log
  item that starts with :data:`AUDIT_MARK` (``GRACE_LOG_AUDIT``):
  C writes it once the verdict has been applied, or writes its own failure
  line instead (an env edit that failed, a verdict that came too late), so
  every judgement leaves exactly one audit line, always written by slurmstepd
  (a pyxis registry image's step is judged twice per node: ``phase``).

:func:`run_step` is plain Python on plain values, so it can be tested and
profiled without Slurm or cffi.
"""

from __future__ import annotations

import os
import sys
import time

from . import contract
from ._record import dataclass, field

TYPE_CHECKING = False
if TYPE_CHECKING:  # keep typing's import cost off the launch path
    from typing import Any

    from .findings import Verdict

#: Slurm's reserved step ids (slurm.h), shown by name in logs and the audit.
_STEP_NAMES = {0xFFFFFFFB: "batch", 0xFFFFFFFC: "extern", 0xFFFFFFFD: "interactive",
               0xFFFFFFFE: "pending"}

_PREFIX = "grace-policy: "
#: Starts the log item that carries the decision's audit line to C
#: (GRACE_LOG_AUDIT). No other log item can start with it: they are escaped
#: (messages.escape), which turns control characters into text.
AUDIT_MARK = contract.AUDIT_MARK


@dataclass(frozen=True)
class StepInput:
    """What slurmstepd tells us about the step, decoded."""

    config: str | None
    on_error: str
    partition: str | None
    cwd: str | None
    user_mode: str | None
    node: str
    argv: tuple[str, ...]
    env: dict[str, str]
    job_id: int
    step_id: int
    uid: int
    batch: bool
    #: Why this is a container step, as the C side established it from what
    #: Slurm says (never from the user's environment alone), else None.
    container: str | None = None
    #: ``audit=PATH`` of plugstack.conf and its descriptor, opened by root in
    #: slurm_spank_init (-1: not opened; C logged why).
    audit_path: str | None = None
    audit_fd: int = -1
    #: Which plugin install and module path run this check (C's words; an
    #: input of every verdict-cache entry, so another install never replays it).
    code: str | None = None
    #: The container runtime that runs argv, as C found it (spank/grace_container.c):
    #: "pyxis" or "oci", else None; its image (a local .sqsh, pyxis' image
    #: string or container name, or the bundle config.json slurmstepd wrote)
    #: and whether that is a file on this node.
    container_kind: str | None = None
    container_image: str | None = None
    container_local: bool = False
    #: The runtime's own options that change what argv finds, "key=value"
    #: lines (pyxis: mounts, workdir, mount_home), as C read them.
    container_args: str | None = None
    #: ``max_memory=`` of plugstack.conf in MiB (0: none): the helper that
    #: judges confines itself to it before reading the policy
    #: (checker/confine.py); the check's allocations past it end as check-limit.
    max_memory: int = 0

    @property
    def step_name(self) -> str:
        return _STEP_NAMES.get(self.step_id, str(self.step_id))


@dataclass
class Outcome:
    """What C applies: ``action`` is allow|warn|reject, or error (on_error decides)."""

    action: str
    user: list[str] = field(default_factory=list)
    unset: list[str] = field(default_factory=list)
    set: list[tuple[str, str]] = field(default_factory=list)
    log: list[str] = field(default_factory=list)
    #: A verdict-cache entry for C to append (clean allows only), or None.
    cache: str | None = None
    #: The decision's audit line (newline included) for C to write once it
    #: has applied the verdict, or None (no ``audit=``).
    audit: str | None = None
    #: With action error: the kind of failure (contract.PYTHON_FAILURES),
    #: handed to C as a code of its own, never left for C to read in the reason.
    failure: str = contract.FAIL_CHECK
    #: The verdict is on a registry image's manifest: pyxis pulls it after
    #: this check, and C has the root it makes judged in task_init. Without
    #: it a verdict was on the files themselves (a reused --container-name
    #: container): nothing to judge again.
    pull: bool = False

    @classmethod
    def failed(cls, reason: str, failure: str = contract.FAIL_CHECK) -> Outcome:
        return cls(action="error", log=[reason], failure=failure)


# What a cold check of a clean step imports (grace_policy/warm.py STEP, which
# tests/test_warm.py keeps complete); the pre-started helper imports them
# before the step arrives (grace_python.c grace_python_preload, in this
# order, until the step comes). Modules only: importing them reads no config
# and no user file.
PRELOAD = ("grace_policy.compiled", "grace_policy.policy", "grace_policy.decide",
           "grace_policy.check", "grace_policy.launch", "grace_policy.audit",
           "grace_policy.verdict_cache", "grace_policy.nodeowned", "grace_policy.python.step",
           "grace_policy.python.interp", "grace_policy.python.judge",
           "grace_policy.python.sitepath", "grace_policy.python.usage", "grace_policy.messages",
           "grace_policy.python.gpus",
           "encodings.ascii", "grace_policy.checker.confine", "ctypes", "resource")


def _one_line(text: str, limit: int = 900) -> str:
    """A reason fit for one slurmd log line: first line, escaped, bounded."""
    from .messages import escape

    first = (text.strip().splitlines() or [""])[0]
    if len(text.strip().splitlines()) > 1:
        first += " (+more)"
    return escape(first)[:limit]


def _shown(text: str, limit: int = 900) -> str:
    """A path or name in a slurmd log line: escaped whole (a newline in it
    must not start a forged log line), bounded."""
    from .messages import escape

    return escape(text)[:limit]


def run_step(step: StepInput) -> Outcome:
    """Judge one step. Never raises for a problem of the check itself: those
    come back as ``Outcome.failed`` (config) or as a verdict that already
    followed the policy's ``on_error`` (``decide`` never raises)."""
    started = time.monotonic()
    euid = os.geteuid()
    if euid != step.uid:
        # The check runs as the job's user, or not at all: if slurmstepd has
        # already taken root back, C gave up waiting long ago (timeout_ms).
        return Outcome.failed(f"not running as the job's user (euid {euid}, uid {step.uid}): "
                              "the plugin's timeout had passed; check abandoned")
    try:
        from .compiled import load_policy
        from .policy import ConfigError
    except Exception as exc:
        return Outcome.failed(f"cannot import grace_policy.compiled: {type(exc).__name__}: "
                              f"{_one_line(str(exc))}", contract.FAIL_PYTHON)
    if not step.config:
        return Outcome.failed("no config=FILE in plugstack.conf", contract.FAIL_ARGS)
    try:
        policy = load_policy(step.config)
    except ConfigError as exc:
        return Outcome.failed(f"config {_shown(step.config)}: {_one_line(str(exc))}",
                              contract.FAIL_CONFIG)
    except Exception as exc:
        return Outcome.failed(f"config {_shown(step.config)}: {type(exc).__name__}: "
                              f"{_one_line(str(exc))}", contract.FAIL_CONFIG)

    from .decide import StepRequest, decide

    who = None
    if policy.exemptions:
        from .exempt import Who

        # The uid is Slurm's (S_JOB_UID); the groups are the credentials
        # slurmstepd gave this thread from the job's, not the environment.
        who = Who.current(uid=step.uid)
    probes: list[tuple[str, str, str]] = []
    argv, env, cwd = list(step.argv), step.env, step.cwd or "/"
    container, image, program = step.container, None, step.argv[0] if step.argv else None
    inside: dict[str, Any] = {"image": image}
    pulled = False
    if step.container_kind:
        # Judged inside the container (C found it, on Slurm's and pyxis' word).
        # The step's budget starts now: reading the image is part of its check.
        from .container import ContainerStep
        from .container.plan import plan
        from .decide import step_budget
        from .fsprobe import Files

        # What the plan reads on the host (enroot, its configuration, the
        # user's mounts.d and environ.d) is part of the verdict: recorded, so
        # a cached allow is replayed only while every one of them is unchanged.
        budget = step_budget(policy)
        files = Files.recorded()
        try:
            todo = plan(ContainerStep(step.container_kind, step.container_image,
                                      step.container_local, step.container or step.container_kind,
                                      argv, env, cwd, args=step.container_args, batch=step.batch),
                        budget, files)
        finally:
            probes.extend(files.records())
        container, image = todo.skipped, todo.image
        argv, env, cwd = list(todo.argv), todo.env, todo.cwd
        program = argv[0] if argv else None  # the program in the image
        inside = {"image": image, "budget": budget, "limit": todo.limit}
        if todo.registry is not None:  # pulled by pyxis after the check: its manifest
            inside["registry"] = todo.registry
            pulled = True
    judge = decide
    if step.batch and not step.container_kind:
        # The job's script: its lines are read too (grace_policy/batch/). A
        # broken install of the reader leaves the script judged as before. A
        # script run inside a container is not read against the host's files.
        try:
            from .batch.judge import decide_batch

            judge, inside = decide_batch, {}
        except Exception:
            pass
    request = StepRequest(partition=step.partition, argv=argv, env=env, cwd=cwd, node=None,
                          user_lowered_mode=step.user_mode, container=container, who=who,
                          **inside)
    verdict = judge(policy, request, probes=probes)
    out = Outcome(action=verdict.action, pull=pulled)
    if verdict.action not in ("allow", "warn", "reject"):
        return Outcome.failed(f"core returned an unknown action {verdict.action!r}")
    if "grace_policy.config" in sys.modules:
        # load_policy had no trustworthy compiled form and ran pydantic: the
        # step works, but every step pays ~0.5 s until the admin compiles it.
        out.log.append(f"config {_shown(step.config)} has no current compiled form, so "
                       "every step validates it again (slow): run 'grace-policy config "
                       f"check --compile {_shown(step.config)}' as root after each edit")
    if verdict.findings or not verdict.env.empty or verdict.action != "allow":
        # Only a step with something to say pays for messages (re, enum).
        out.user = _user_lines(policy, verdict)
    out.unset = list(verdict.env.unset)
    out.set = list(verdict.env.set)
    if verdict.error:
        out.log.append(f"check error ({verdict.action} per on_error={policy.on_error}): "
                       f"{_one_line(verdict.error)}")
    elapsed_ms = (time.monotonic() - started) * 1000.0
    if os.geteuid() != euid:
        # C stopped waiting (timeout_ms), followed on_error and logged it;
        # slurmstepd has since taken root back. A late line would contradict
        # what was done, and nothing from here is applied any more.
        return Outcome.failed("the check finished after the plugin's timeout; discarded")
    out.audit, problem = _audit(step, verdict, elapsed_ms, program, pulled)
    if problem:
        out.log.append(_one_line(problem))
    try:
        out.cache = _cache_entry(step, policy, verdict, probes)
    except Exception as exc:  # the cache is an optimisation: never a verdict's problem
        out.log.append(f"verdict cache: entry not written: {type(exc).__name__}: "
                       f"{_one_line(str(exc))}")
    return out


def _user_lines(policy: Any, verdict: Verdict) -> list[str]:
    from .messages import user_lines

    catalogue = None
    if verdict.findings:
        try:
            from .rules import Catalogue

            catalogue = Catalogue.for_policy(policy)
        except Exception:  # titles are a nicety; the findings carry the text
            catalogue = None
    return [line if line.startswith(_PREFIX) else _PREFIX + line
            for line in user_lines(verdict, catalogue=catalogue, contact=policy.contact)]


def credentials() -> str:
    """The rights this check runs with (contract.format_credentials, as
    grace_cache.c computes them for a lookup)."""
    return contract.format_credentials(os.getegid(), os.getgroups())


def code_files() -> list[str]:
    """The grace_policy modules this process runs: a reinstall (new files,
    new inodes) makes every entry written by the old code a miss."""
    import sys

    out = []
    for name, module in list(sys.modules.items()):
        if name == "grace_policy" or name.startswith("grace_policy."):
            path = getattr(module, "__file__", None)
            if path and path.startswith("/"):
                out.append(path)
    return sorted(out)


def _cache_entry(step: StepInput, policy: Any, verdict: Verdict,
                 probes: list[tuple[str, str, str]]) -> str | None:
    """The verdict-cache entry of a clean allow, for C to store (the format
    is grace_policy/verdict_cache.py's; C replays it in grace_cache.c)."""
    from . import verdict_cache

    if not verdict_cache.cacheable(verdict) or not step.argv or not step.config \
            or step.code is None or step.batch or not step.cwd:
        # A batch step's stored script is new for every job; without a cwd
        # (C's getcwd failed) relative names were resolved against a guess.
        return None
    if step.container and not (step.container_kind and step.container_local):
        return None  # skipped on the admin's word: nothing was judged
    if contract.wraps_an_image(step.argv[0]):
        return None  # the image is an argument the entry would not key on (grace_cache.c)
    if not verdict_cache.replayable(probes):
        return None  # judged on facts C cannot check (NVML's, unpublished): it would never hit
    from .check import READ_VARS  # imported already: the verdict came from a check
    from .compiled import compiled_path_for

    ins = verdict_cache.inputs(
        argv0=step.argv[0], cwd=step.cwd, partition=step.partition, user_mode=step.user_mode,
        env=step.env, env_names=(*READ_VARS, *policy.env.vars))
    if step.container_kind and step.container_image:
        # Judged in this image: the record holds the image file's identity
        # (fsprobe.Files.inside), never paths inside it; C replays it for the same
        # KIND:IMAGE only, and only with the same runtime options ("cargs":
        # pyxis' mounts, workdir and home mount, exactly as C read them),
        # which C requires of every container entry (grace_cache.c).
        ins.append(("container", "=" + verdict_cache.fsprobe.encode(
            f"{step.container_kind}:{step.container_image}")))
        ins.append(("cargs", verdict_cache.value(step.container_args or None)))
    ins.append(("config", "=" + verdict_cache.fsprobe.encode(step.config)))
    ins.append(("code", "=" + verdict_cache.fsprobe.encode(step.code)))
    ins.append(("creds", "=" + verdict_cache.fsprobe.encode(credentials())))
    # The node's own name: an entry is never replayed on another node, even
    # if an admin put cache_dir on shared storage; and what the node is now
    # (page size, kernel, glibc, machine): not across a reboot into another.
    ins.append(("node", "=" + verdict_cache.fsprobe.encode(step.node)))
    ins.append(("host", "=" + verdict_cache.fsprobe.encode(verdict_cache.host_profile())))
    extra = verdict_cache.config_probes(
        [step.config, compiled_path_for(step.config), *code_files()])
    everything = probes + extra
    shared = verdict_cache.node_wide(ins, everything, step.cwd)
    if shared is not None:
        return verdict_cache.entry(shared, verdict.mode, everything,
                                   scope=verdict_cache.SCOPE_NODE)
    return verdict_cache.entry(ins, verdict.mode, everything)


def _audit(step: StepInput, verdict: Verdict, elapsed_ms: float,
           program: str | None = None, pulled: bool = False
           ) -> tuple[str | None, str | None]:
    """(line, problem): the decision line for C to write to the descriptor
    root opened, or None and why not.

    The check runs as the job's user: opening a path here would need a file
    every user can write (and forge lines in). plugstack.conf's
    ``audit=PATH``, opened by root in slurm_spank_init before privileges
    drop, is therefore the one audit setting; the config's old ``[audit]
    path`` is not read (``grace-policy config check`` says so). The line is
    rendered here but written by C after the env edits (module docstring).
    """
    from .audit import render_decision

    if step.audit_path is None or step.audit_fd < 0:
        return None, None  # not configured, or C logged why it could not open it
    try:
        return render_decision(
            verdict, job_id=step.job_id, step_id=step.step_name, uid=step.uid,
            node=step.node or None, elapsed_ms=elapsed_ms, program=program,
            phase=_phase(step, pulled)), None
    except Exception as exc:  # a bug in building the record must not fail the step
        return None, f"audit log {step.audit_path}: {type(exc).__name__}: {exc}"


def _phase(step: StepInput, pulled: bool) -> str | None:
    """Which of a registry image's two judgements this is (audit.PHASES):
    a pyxis step whose image pyxis will pull is judged in user_init by its
    manifest (``pulled``: the outcome's ``pull``) and, once pyxis has made
    the container, again from task_init (``after_pull`` in its args,
    spank/grace_afterpull.c). A reused --container-name container is judged
    once, in its root: no phase."""
    if step.container_kind != "pyxis" or step.container_local:
        return None
    from .container.plan import option_lines

    if option_lines(step.container_args).get("after_pull"):
        return "after_pull"
    return "before_pull" if pulled else None


# --------------------------------------------------------------------------
# cffi side


def env_dict(entries: Any) -> dict[str, str]:
    """``NAME=VALUE`` entries as a dict, like getenv(): the first definition wins."""
    env: dict[str, str] = {}
    for entry in entries:
        if entry is None:
            continue
        key, sep, value = entry.partition("=")
        if sep and key not in env:
            env[key] = value
    return env


def _signed(value: int) -> int:
    return value - (1 << 32) if value >= 1 << 31 else value


def step_input(raw: dict[str, Any]) -> StepInput:
    """The step from its fields as C holds them, by contract.STEP's names
    (bytes or None for a text, ints, lists of bytes or None): the one
    conversion behind both readers, the cffi struct's (:func:`read_step`)
    and the frame's (checker/wire.py). Bytes are decoded with the file
    system encoding, UTF-8 with surrogateescape, so odd bytes survive."""
    fsdecode = os.fsdecode
    values: dict[str, Any] = {}
    for f in contract.FRAME:
        value = raw[f.name]
        kind = f.kind
        if kind == contract.TEXT:
            values[f.name] = f.null if value is None else fsdecode(value)
        elif kind == contract.FLAG:
            values[f.name] = bool(value)
        elif kind == contract.FD:
            values[f.name] = _signed(int(value))
        elif kind == contract.ARGV:
            values[f.name] = tuple("" if v is None else fsdecode(v) for v in value)
        elif kind == contract.ENV:
            values[f.name] = env_dict(None if v is None else fsdecode(v) for v in value)
        else:
            values[f.name] = int(value)
    return StepInput(**values)


def read_step(ffi: Any, c_step: Any) -> StepInput:
    """Copy the C struct into Python values, field by field as the contract
    lists them."""
    null = ffi.NULL
    string = ffi.string
    raw: dict[str, Any] = {}
    for f in contract.FRAME:
        value = getattr(c_step, f.name)
        if f.kind == contract.TEXT:
            raw[f.name] = None if value == null else string(value)
        elif f.kind in contract.LISTS:
            n = max(0, getattr(c_step, f.count))
            raw[f.name] = [None if value[i] == null else string(value[i]) for i in range(n)]
        else:
            raw[f.name] = int(value)
    return step_input(raw)


def _c_bytes(text: str) -> bytes:
    """Back to the bytes C expects; a NUL would cut the string short in C."""
    return os.fsencode(text).replace(b"\0", b"\\0")


#: GRACE_RC_* by action (contract.RC): what grace_py_decide returns and the
#: node checker (grace_policy/checker/), which has no cffi, sends as 'R'.
RC_CODES = contract.RC_CODES


def outcome_for(step: StepInput) -> Outcome:
    """:func:`run_step`, with an escaped exception turned into a failure:
    the one entry both the embedded check and the node checker call."""
    try:
        return run_step(step)
    except Exception as exc:
        return Outcome.failed(f"bridge: {type(exc).__name__}: {_one_line(str(exc))}")


def confine(step: StepInput) -> tuple[Outcome | None, str | None]:
    """Confine the process that is about to judge (checker/confine.py: the
    data limit, no new privileges, the system call filter), before the
    policy or any file of the user's is read. Only for a process that
    judges and then ends: the node checker's child, slurmstepd's helper
    (grace_py_decide runs nowhere else); never the CLI, never a test's own
    process. Returns the failure to answer with if it did not take, and a
    line for slurmd's log if it took without the filter."""
    from .checker import confine as _confine

    try:
        missing = _confine.enter(step.max_memory)
    except _confine.Refused as exc:
        return Outcome.failed(f"the check was not confined, so not run: "
                              f"{_one_line(str(exc))}"), None
    if missing:
        return None, f"the check ran without its system call filter: {_one_line(missing)}"
    return None, None


def confined_outcome(step: StepInput) -> Outcome:
    """:func:`outcome_for` in a process :func:`confine` confined first: the
    helper slurmstepd forks (``checker=step``). It is in slurmstepd's mount
    namespace, which on 22.05 to 25.x is slurmd's at user_init, not the
    job's (job_container/tmpfs): a job with its own /tmp is then a check
    failure that on_error decides, never a verdict on the host's files."""
    from .jobns import elsewhere

    why = elsewhere(step.job_id)
    if why is not None:
        return Outcome.failed(f"cannot judge the step in its job's own view of files: {why}; "
                              "not judged in the host's view (checker=node enters it)")
    refused, note = confine(step)
    out = refused or outcome_for(step)
    if note:
        out.log.append(note)
    return out


def emissions(out: Outcome) -> list[tuple[str, bytes]]:
    """What C is handed, in order, by kind (contract.EMIT's names: ``user``,
    ``unset``, ``set``, ``log``, ``cache``, ``fail`` for an error, ``done``
    last), as the bytes C expects."""
    items: list[tuple[str, bytes]] = [("user", _c_bytes(line)) for line in out.user]
    items += [("unset", _c_bytes(name)) for name in out.unset]
    items += [("set", _c_bytes(f"{key}={value}")) for key, value in out.set]
    items += [("log", _c_bytes(line)) for line in out.log]
    if out.audit:  # C writes it once the verdict is applied (GRACE_LOG_AUDIT)
        items.append(("log", _c_bytes(AUDIT_MARK + out.audit)))
    if out.cache:
        items.append(("cache", _c_bytes(out.cache)))
    if out.action == "error":
        items.append(("fail", out.failure.encode()))
    if out.pull:
        items.append(("pull", b""))
    items.append(("done", b""))
    return items


def _built_from_this_contract(ffi: Any, lib: Any) -> None:
    """Raise unless the plugin's glue was generated from the table this
    package has (a plugin and a Python tree of two installs): the init code
    then reports it as failure python, and no field is read as another."""
    built = [name for name, _type in ffi.typeof("struct grace_step").fields]
    table = [n for f in contract.STEP for n in ((f.name, f.count) if f.count else (f.name,))]
    codes = [(f"GRACE_RC_{n.upper()}", c) for n, c in contract.RC]
    codes += [(f"GRACE_EMIT_{n.upper()}", c) for n, c, _d in contract.EMIT]
    if built != table or any(getattr(lib, name, None) != c for name, c in codes):
        raise RuntimeError("the plugin was built from another grace_policy/contract.py than "
                           "this package's: reinstall both from one build")


def register(ffi: Any, lib: Any) -> None:
    """Called once by the plugin's cffi init code: install ``grace_py_decide``."""
    _built_from_this_contract(ffi, lib)
    # The numbers cffi was built with are the table's (checked just now);
    # the table's own are used, so a name can only be one of its.
    codes, kinds = contract.RC_CODES, contract.EMIT_CODES

    def _escaped(exc_type: Any, exc_value: Any, traceback: Any) -> None:
        # Only a BaseException (SystemExit, KeyboardInterrupt) gets here; the
        # return value then is def_extern's error=-1 and C follows on_error.
        # Returning None also stops cffi from printing a traceback.
        return None

    @ffi.def_extern(name="grace_py_decide", error=-1, onerror=_escaped)
    def grace_py_decide(c_step: Any) -> int:
        result = c_step.result
        try:
            out = confined_outcome(read_step(ffi, c_step))
        except Exception as exc:
            out = Outcome.failed(f"bridge: {type(exc).__name__}: {_one_line(str(exc))}")
        for kind, text in emissions(out):
            lib.grace_emit(result, kinds[kind], text)
        return int(codes[out.action])
