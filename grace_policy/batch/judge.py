"""A batch step's verdict: the script itself (as before) and every command
its lines will run, each judged as the step it will be.

Severity follows certainty: a command on the main path keeps its rules'
severities (in enforce mode the job then fails before its first line
runs); any other command's findings are warnings. Messages name the line:
``grace-policy: ERROR exe-arch-mismatch: line 4: python train.py -> PATH``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from .._record import replace
from ..budget import Budget, BudgetExceeded
from ..findings import SEVERITY_RANK, Finding, Issue, Verdict
from ..policy import EnvPolicy, Policy

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ..check import StepReport
    from ..decide import StepRequest
    from ..node import NodeProfile
    from .walk import Command, Reading

#: Interpreters whose scripts are read (tree-sitter's bash grammar reads sh too).
SHELLS = frozenset({"sh", "bash", "dash"})
#: Distinct commands judged per script; the rest counts as a check limit.
MAX_COMMANDS = 200
#: Line findings that say nothing a batch line needs: a name not found may be
#: a function or alias defined where the reader cannot see; leaked
#: variables are the batch step's own finding.
_NOT_FOR_LINES = frozenset({"exe-not-found", "env-leak"})
_LAUNCHERS = frozenset({"torchrun", "accelerate", "deepspeed"})


def shebang_shell(script: str, budget: Budget) -> tuple[str, bool] | None:
    """(shell name, login) when ``script`` is a sh/bash script, else None."""
    from ..launch import parse_shebang
    from ..python.nodepath import read_small

    head = read_small(script, 256, budget)
    if head is None:
        return None
    parsed = parse_shebang(head)
    if parsed is None:
        return None
    interp, arg = parsed
    name = os.path.basename(interp)
    words = (arg or "").split()
    if name == "env":
        words = [w for w in words if not w.startswith("-")]
        if not words:
            return None
        name, words = os.path.basename(words[0]), words[1:]
    if name not in SHELLS:
        return None
    login = any(w in ("-l", "--login") or (w.startswith("-") and not w.startswith("--")
                                           and "l" in w) for w in words)
    return name, login


def read_script(script: str, args: Sequence[str], env: Mapping[str, str], cwd: str,
                budget: Budget, *, shell: tuple[str, bool] = ("bash", False)) -> Reading:
    """Parse and follow ``script`` as ``shell`` (its #! line's: name, login)
    runs it: a :class:`~.walk.Reading` (its ``limit`` set when the budget or
    a cap ended it)."""
    from ..python.nodepath import read_small
    from . import shparse
    from .walk import Reader, Reading, Start

    try:
        size = os.stat(script).st_size
    except OSError as exc:
        return Reading(limit=f"the batch script cannot be read: {exc.strerror}")
    if size > shparse.MAX_SCRIPT_BYTES:
        return Reading(limit=f"the batch script is larger than {shparse.MAX_SCRIPT_BYTES} "
                             "bytes; its commands were not read")
    try:
        source = read_small(script, shparse.MAX_SCRIPT_BYTES, budget)
        if source is None:
            return Reading(limit="the batch script is not a readable regular file")
        tree = shparse.parse(source, budget)
        start = Start(dict(env), cwd, tuple(args), script, shell[0], shell[1])
        return Reader(source, tree, start, budget).read()
    except BudgetExceeded as exc:
        return Reading(limit=str(exc))
    except shparse.ParserUnavailable as exc:
        # An install without the parser: the script is judged as before.
        return Reading(skipped=f"no shell parser ({exc})")


def decide_batch(policy: Policy, step: StepRequest, *,
                 probes: list[tuple[str, str, str]] | None = None) -> Verdict:
    """The verdict of a batch step whose program is ``argv[0]``, the job's
    script. Never raises: a failure of the reading keeps the script's own
    verdict and notes why (a crash here must not change what the plugin did
    before this reader existed)."""
    from ..decide import decide

    own = decide(policy, step, probes=probes)
    argv, partition = step.argv, step.partition
    if own.skipped or own.error or not argv:
        return own
    if any(f.rule == "exe-unreadable" and f.path == argv[0] for f in own.findings) \
            and os.access(argv[0], os.R_OK):
        # A script submitted without its x bit (check --batch, submit):
        # slurmd runs its own copy, mode 0700. Never so for the plugin.
        own = replace(own, findings=tuple(f for f in own.findings
                                          if not (f.rule == "exe-unreadable"
                                                  and f.path == argv[0])))
    try:
        return _with_lines(policy, own, step)
    except (BudgetExceeded, MemoryError) as exc:
        from ..budget import OUT_OF_MEMORY
        from ..decide import _limit_verdict

        limit = OUT_OF_MEMORY if isinstance(exc, MemoryError) else str(exc)
        return _limit_verdict(policy, own.mode, partition, limit, own)
    except Exception as exc:  # the reader is new: never worse than without it
        return replace(own, error=f"batch script not read: internal error: "
                                  f"{type(exc).__name__}: {exc}")


def _with_lines(policy: Policy, own: Verdict, step: StepRequest) -> Verdict:
    from ..decide import _limit_verdict, action_for, node_for

    partition, argv, env, cwd = step.partition, step.argv, step.env, step.cwd
    who, today = step.who, step.today

    if any(f.rule == "exe-arch-mismatch" or f.rule == "interp-missing"
           for f in own.findings if f.severity == "error"):
        return own  # the script itself cannot start: its lines never run
    limits = policy.limits
    budget = Budget(limits.deadline_ms, limits.max_files, limits.max_bytes)
    shell = shebang_shell(argv[0], budget)
    if shell is None:
        return own  # not a sh/bash script: judged as any program
    node = step.node or node_for(policy, partition)
    start_env = own.env.apply(dict(env))
    reading = read_script(argv[0], argv[1:], start_env, cwd, budget, shell=shell)
    if reading.skipped:
        return own
    kept_own = own.findings
    env_changes = own.env
    leak = [f for f in own.findings if f.rule == "env-leak"]
    if leak and reading.unset_first and _leak_vars(env, policy) <= reading.unset_first:
        # The script unsets the leaked variables before it runs anything:
        # they cannot mislead it, and nothing needs stripping (PATH is then
        # judged line by line as the script leaves it).
        kept_own = tuple(f for f in own.findings if f.rule != "env-leak")
        from ..findings import EnvChanges

        env_changes = EnvChanges()
        reading = read_script(argv[0], argv[1:], dict(env), cwd, budget, shell=shell)
    found, limit = _judge(policy, reading, node, partition, budget,
                          start_env if env_changes is own.env else dict(env))
    if who is not None and policy.exemptions and found:
        from .. import exempt

        kept, released = exempt.apply(policy, [f for f, _c in found], who, today)
        ids = {id(f) for f in kept}
        found = [(f, c) for f, c in found if id(f) in ids]
        exempted = (*own.exempted, *released)
    else:
        exempted = own.exempted
    words = script_shell(shell[0], argv[0], node, budget)
    lines = tuple(_worded(f, c, words) for f, c in found)
    if reading.uncertain is not None:
        lines += _uncertain(policy, reading.uncertain, node, partition)
    findings = tuple(sorted((*kept_own, *lines), key=lambda f: SEVERITY_RANK[f.severity]))
    action = action_for(own.mode, findings)
    limit = limit or reading.limit
    found = Verdict(action=action, mode=own.mode, partition=partition, findings=findings,
                    env=env_changes, exempted=exempted)
    if limit is not None:
        return _limit_verdict(policy, own.mode, partition, limit, found)
    return found


def _uncertain(policy: Policy, where: tuple[int, str], node: NodeProfile,
               partition: str | None) -> tuple[Finding, ...]:
    """Why the rest of the script only warns: an info finding (``check``
    by hand and the audit log show it; job output does not)."""
    from ..decide import finding_context
    from ..rules import Catalogue

    line, why = where
    finding = Catalogue.for_policy(policy).finding(
        Issue("batch-uncertain", f"line {line}", "", facts=(("detail", why),)),
        finding_context(node, partition))
    return (finding,) if finding is not None else ()


def _leak_vars(env: Mapping[str, str], policy: Policy) -> set[str]:
    return {name for name in policy.env.vars if name in env}


def script_shell(name: str, script: str, node: NodeProfile, budget: Budget) -> str:
    """Which shell will word the script's errors: the #! line's program as
    the node resolves it (``/bin/sh`` is bash on some systems, dash on
    Debian's, busybox in small images) when the node's files are at hand (on
    the node, or from an image); otherwise the name the line gives."""
    if not node.root_is_native:
        return name
    from ..launch import parse_shebang
    from ..python.nodepath import read_small

    try:
        parsed = parse_shebang(read_small(script, 256, budget) or b"")
        if parsed is None:
            return name
        interp = parsed[0]
        if os.path.basename(interp) == "env":
            return name  # found on PATH: the name is what we know
        found = os.path.basename(os.path.realpath(node.in_root(interp)))
    except (OSError, ValueError):
        return name
    return found if found in SHELLS or found == "busybox" else name


def _worded(finding: Finding, command: Command, shell: str = "bash") -> Finding:
    severity = finding.severity
    if not command.certain and SEVERITY_RANK[severity] < SEVERITY_RANK["warning"]:
        severity = "warning"
    shown = f"line {command.line}: {command.text}"
    if finding.path:
        shown += f" -> {finding.path}"
    error = finding.predicted_error
    execve = "slurmstepd: error: execve(): "
    if not command.srun and error.startswith(execve):
        # The script's shell, not slurmstepd, starts the line's program and
        # says so, each in its own way: bash "SCRIPT: line 3: /x/tool: cannot
        # execute binary file: Exec format error"; dash "SCRIPT: 3: tool: Exec
        # format error"; busybox 1.35 sh (the 64 KiB guest's /bin/sh) runs
        # the file as a shell script: "/x/tool: line 3: syntax error: EOF in
        # backquote substitution" (the line and the complaint depend on the
        # bytes). A shell this check cannot see is given all three.
        what = error[len(execve):]
        line = command.line
        error = f"line {line}: {what}"
        if what.endswith(": Exec format error"):
            path, word = what[:-len(": Exec format error")], command.argv[0]
            if shell == "bash":
                error = f"line {line}: {path}: cannot execute binary file: Exec format error"
            elif shell == "dash":
                error = f"{line}: {word}: Exec format error"
            elif shell == "busybox":
                error = f"{path}: line N: syntax error (busybox sh runs a file it cannot " \
                        "execute as a shell script)"
            else:
                error = (f"line {line}: {word}: Exec format error (dash; bash: {path}: cannot "
                         f"execute binary file; busybox sh runs it as a script: {path}: line N: "
                         "syntax error)")
    return replace(finding, severity=severity, path=shown, predicted_error=error)


def _judge(policy: Policy, reading: Reading, node: NodeProfile, partition: str | None,
           budget: Budget, start_env: Mapping[str, str]
           ) -> tuple[list[tuple[Finding, Command]], str | None]:
    """Every distinct command, judged once (a loop of ``srun hostname`` is one)."""
    from ..check import CheckInput, check
    from ..decide import finding_context
    from ..rules import Catalogue

    part = policy.partition(partition)
    cuda = part.cuda_index if part is not None else None
    catalogue = Catalogue.for_policy(policy)
    context = finding_context(node, partition)
    seen: dict[tuple[object, ...], tuple[Issue, ...]] = {}
    out: list[tuple[Finding, Command]] = []
    shown: set[tuple[str, str, bool]] = set()
    limit: str | None = None
    for command in reading.commands:
        runs = [(command.argv, command)]
        for argv, cmd in runs:
            key = (argv, cmd.cwd, cmd.srun, tuple(sorted(cmd.env.items())))
            issues = seen.get(key)
            if issues is None:
                if len(seen) >= MAX_COMMANDS:
                    return out, f"the batch script runs more than {MAX_COMMANDS} commands"
                report = check(CheckInput(list(argv), cmd.env, cmd.cwd, node, budget=budget,
                                          env_rules=_env_rules(policy, cmd),
                                          cuda_index=cuda))
                if not report.issues and report.limit is None:
                    report = _in_image(argv, cmd, node, policy, budget, cuda) or report
                issues = tuple(_own_causes(i, cmd.env, start_env) for i in report.issues
                               if i.rule not in _NOT_FOR_LINES)
                seen[key] = issues
                if report.limit is not None:
                    limit = limit or report.limit
                extra = _launched_script(argv, report)
                if extra is not None and limit is None:
                    runs.append((extra, cmd))
            for finding in catalogue.findings(issues, context):
                mark = (finding.rule, finding.path, cmd.certain)
                if (mark[0], mark[1], True) in shown or mark in shown:
                    continue  # one block per problem file, at its first line
                shown.add(mark)
                out.append((finding, cmd))
        if limit is not None:
            break
    # A file the launched script imports also shows as a broken distribution
    # of the launcher's environment: one block per file and line is enough.
    strong = {(f.path, c.line) for f, c in out if f.rule != "py-dist-broken"}
    out = [(f, c) for f, c in out if f.rule != "py-dist-broken" or (f.path, c.line) not in strong]
    return out, limit


def _in_image(argv: Sequence[str], cmd: Command, node: NodeProfile, policy: Policy,
              budget: Budget, cuda: str | None) -> StepReport | None:
    """``apptainer exec IMG CMD`` on a line: the host's apptainer was clean,
    so CMD is judged in IMG as the plugin judges such an srun step
    (decide.py); None when the line is no exec of a local image this
    parser is sure of, or the image cannot be read (the host verdict stands)."""
    from ..container.apptainer import is_apptainer, plan_apptainer

    if not argv or not is_apptainer(argv[0]):
        return None
    todo = plan_apptainer(argv, cmd.env, cmd.cwd)
    if todo is None or todo.image is None:
        return None
    from ..check import CheckInput, check

    return check(CheckInput(list(todo.argv), todo.env, todo.cwd, node, budget=budget,
                            image=todo.image, env_rules=_env_rules(policy, cmd),
                            cuda_index=cuda))


def _env_rules(policy: Policy, cmd: Command) -> EnvPolicy:
    """An srun line's leaked variables are stripped as the plugin would
    strip them; a line the script runs itself keeps its environment."""
    return policy.env if cmd.srun else replace(policy.env, strip="never")


def _own_causes(issue: Issue, env: Mapping[str, str], start: Mapping[str, str]) -> Issue:
    """An environment the script activated itself did not leak from the
    login node: its files are told what a venv's or conda env's are."""
    if "leaked-env" not in issue.causes:
        return issue
    if all(env.get(v) == start.get(v) for v in ("VIRTUAL_ENV", "CONDA_PREFIX")):
        return issue
    return replace(issue, causes=tuple(c for c in issue.causes if c != "leaked-env"))


def _launched_script(argv: Sequence[str], report: object) -> tuple[str, ...] | None:
    """``torchrun [opts] X.py ...`` / ``accelerate launch X.py``: the script
    runs in the launcher's python; judged as ``PYTHON X.py ...``."""
    name = os.path.basename(argv[0]) if argv else ""
    if name not in _LAUNCHERS:
        return None
    hops = getattr(report, "hops", ())
    if not hops or hops[-1].kind != "elf":
        return None
    for i, word in enumerate(argv[1:], 1):
        if word.endswith(".py") and not word.startswith("-"):
            return (hops[-1].path, *argv[i:])
    return None
