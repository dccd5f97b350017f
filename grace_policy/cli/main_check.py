"""``grace-policy check -- CMD [ARGS...]``: what the plugin would do for a step.

It calls the same :func:`grace_policy.decide.decide` as the plugin, so the
answer on a login node is the plugin's answer on the compute node, given the
same node facts and environment. The exit code is the action (0 allow,
1 warn, 2 reject), so a job script or CI job can branch on it.
"""

from __future__ import annotations

import argparse
import json
import os

from .common import (
    EX_SOFTWARE,
    EXIT_FOR_ACTION,
    UsageError,
    add_node_options,
    build_node,
    err,
    job_env,
    node_json,
    note_unknown_partition,
    report_config_error,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ..findings import Verdict
    from ..node import NodeProfile
    from ..policy import Policy
    from ..python.nodeinterp import Basis


def configure_parser(sub: argparse._SubParsersAction, name: str, help_text: str) -> None:
    parser = sub.add_parser(
        name, help=help_text,
        usage="grace-policy check [--partition P | --arch A --page-size N --glibc V] "
              "[--root DIR] [--config F] [--env-file F] [--cwd D] [--json] "
              "(-- CMD [ARGS...] | --batch SCRIPT [-- ARGS...])",
        description="Say what the plugin would do if a job step ran CMD: find the program "
                    "the way slurmstepd does, follow #! lines, resolve its libraries like "
                    "the node's glibc, judge architecture and page layout, and clean leaked "
                    "conda/venv variables. Mode enforce unless the config says otherwise.",
        epilog="Exit codes: 0 allow, 1 warn, 2 reject, 64 usage error, 78 config error.",
    )
    add_node_options(parser)
    parser.add_argument("--cwd", metavar="D",
                        help="the job's working directory (default: the current one)")
    parser.add_argument("--json", action="store_true", help="print the verdict as JSON")
    parser.add_argument("--batch", metavar="SCRIPT",
                        help="judge SCRIPT as an sbatch job's batch step: the script and "
                             "every command its lines will run (read, never run); "
                             "words after '--' are the script's arguments")
    parser.add_argument("command", nargs="*", metavar="CMD",
                        help="the step's command line; put it after '--'")


def _command(args: argparse.Namespace, rest: list[str] | None) -> list[str]:
    if args.batch is not None:
        if args.command:
            raise UsageError("--batch SCRIPT: put the script's arguments after '--'")
        if not os.path.isfile(args.batch):
            from ..messages import escape

            raise UsageError(f"--batch: not a file: {escape(args.batch)!r}")
        return [os.path.abspath(args.batch), *(rest or [])]
    if rest is not None and args.command:
        raise UsageError("put the whole command after '--' (found "
                         f"{len(args.command)} word(s) before it)")
    command = rest if rest is not None else list(args.command)
    if not command:
        raise UsageError("no command given: grace-policy check [options] -- CMD [ARGS...]")
    return command


def _cwd(args: argparse.Namespace) -> str:
    if args.cwd is None:
        return os.getcwd()
    if not os.path.isdir(args.cwd):
        from ..messages import escape

        raise UsageError(f"--cwd: not a directory: {escape(args.cwd)!r}")
    return os.path.abspath(args.cwd)


def execute(args: argparse.Namespace, rest: list[str] | None) -> int:
    from ..decide import decide
    from ..policy import ConfigError, load_policy

    command = _command(args, rest)
    cwd = _cwd(args)
    env = job_env(args)
    try:
        policy = load_policy(args.config)
    except ConfigError as exc:
        return report_config_error(exc)
    node = build_node(args, policy)
    note_unknown_partition(args, policy)
    who = None
    if policy.exemptions:
        from ..exempt import Who

        who = Who.current()  # the asking user, as the plugin would see them in their job
    if args.batch is not None:
        from ..batch.judge import decide_batch

        env.setdefault("SLURM_SUBMIT_DIR", cwd)
        verdict = decide_batch(policy, partition=args.partition, argv=command, env=env,
                               cwd=cwd, node=node, who=who)
    else:
        verdict = decide(policy, partition=args.partition, argv=command, env=env, cwd=cwd,
                         node=node, who=who)
    crashed = bool(verdict.error and verdict.error.startswith("internal error"))
    assumed = _node_interpreter(command, env, cwd, node)
    if args.json:
        out = verdict.to_json()
        out["node"] = node_json(node)
        out["command"] = command
        if assumed is not None:
            out["assumed_interpreter"] = {**assumed.to_json(), "text": assumed.text(node)}
        print(json.dumps(out, indent=2))
    elif not crashed:
        for line in _human(verdict, policy, node, command):
            print(line)
        if assumed is not None:
            from ..messages import PREFIX, escape

            print(f"{PREFIX}note: judged as {escape(assumed.text(node))}")
    if crashed:
        # decide() turned a crash into the site's on_error action, which is right
        # for slurmstepd; a person asking wants to know the check did not run.
        from ..messages import escape

        err(escape(str(verdict.error)))
        err(f"(the plugin would {verdict.action} this step: on_error={policy.on_error})")
        return EX_SOFTWARE
    return EXIT_FOR_ACTION.get(verdict.action, EX_SOFTWARE)


def _node_interpreter(command: list[str], env: dict[str, str], cwd: str,
                      node: NodeProfile) -> Basis | None:
    """The node's own interpreter the answer assumed, when the program is a
    distribution path's python judged for another architecture (the user
    should know the answer is not about this host's file); else None."""
    if node.root_is_native:
        return None
    from ..budget import Budget, BudgetExceeded
    from ..launch import build_path, follow
    from ..python.names import may_run_python
    from ..python.nodeinterp import basis, is_node_build

    budget = Budget(10_000, 10_000, 1 << 30)
    try:
        exe = build_path(command[0], env, cwd, budget)
        if exe is None:
            return None
        last = follow(exe, env, cwd, budget)[-1]
        if last.kind != "elf" or not may_run_python(last.path) or not is_node_build(
                last.path, node):
            return None
        found = basis(last.path, node, budget)
    except BudgetExceeded:
        return None
    return found if found.version is not None else None


def _human(verdict: Verdict, policy: Policy, node: NodeProfile, command: list[str]) -> list[str]:
    """The blocks the job would print, then one line with the outcome.

    Info findings are shown too (the plugin keeps them out of job output):
    someone running ``check`` by hand asked for the whole story.
    """
    from ..messages import PREFIX, escape, user_lines
    from ..rules import Catalogue

    lines = user_lines(verdict, catalogue=Catalogue.for_policy(policy),
                       contact=policy.contact, min_severity="info")
    where = f"partition {escape(verdict.partition)}, " if verdict.partition else ""
    facts = f"{where}{node.describe()}, mode {verdict.mode}"
    if node.root not in ("", "/"):
        facts += f", image {escape(node.root)}"
    program = escape(command[0])
    if verdict.skipped:
        lines.append(f"{PREFIX}not checked: {escape(verdict.skipped)} ({facts})")
    elif verdict.action == "allow":
        lines.append(f"{PREFIX}allow: {program} would start ({facts})")
    elif verdict.action == "warn":
        lines.append(f"{PREFIX}warn: {program} would start, with the warnings above ({facts})")
    else:
        lines.append(f"{PREFIX}reject: the step would not start ({facts})")
    for ex in verdict.exempted:
        lines.append(f"{PREFIX}exempted: {escape(ex.rule)} for {escape(ex.path)} until "
                     f"{ex.until} ({ex.where}: {escape(ex.reason)})")
    if verdict.error:
        lines.append(f"{PREFIX}note: {escape(verdict.error)}")
    return lines
