"""``grace-policy submit``: the check ``cli_filter.lua`` runs on the submit
host, as the user, before Slurm queues a job.

It is a courtesy, not a control (a user can submit with a ``SLURM_CONF`` of
their own): the launch check on the node stays the enforcement point. It
judges what the node would judge: the batch script (or ``--wrap`` text) and
every command its lines will run, or the command of an ``srun``/``salloc``,
with the environment ``--export`` gives the job from the submitting shell,
on the partition's node facts. Prints nothing for a clean job. Exit codes:
0 queue the job, 2 refuse it (the partition's ``submit = "enforce"`` and a
job the node would reject); anything else is an error of this check, which
``cli_filter.lua`` never turns into a refusal.
"""

from __future__ import annotations

import argparse
import os
import sys

from .common import EX_REJECT, UsageError, add_node_options, build_node, report_config_error

#: The script sbatch --wrap writes (src/sbatch/opt.c), with the command.
_WRAP = "#!/bin/sh\n# This script was created by sbatch --wrap.\n\n{}\n"


def configure_parser(sub: argparse._SubParsersAction, name: str, help_text: str) -> None:
    parser = sub.add_parser(
        name, help=help_text,
        usage="grace-policy submit --type sbatch|srun|salloc [--partition P] [--config F] "
              "[--script F | --wrap CMD] [--export RULE] [--chdir D] [-- ARGS...]",
        description=help_text + ". Run by cli_filter.lua; prints findings only.",
        epilog="Exit codes: 0 submit, 2 refuse (submit = \"enforce\"), others: check error.",
    )
    add_node_options(parser)
    parser.add_argument("--type", choices=("sbatch", "srun", "salloc"), required=True)
    parser.add_argument("--script", metavar="F", help="the batch script (sbatch)")
    parser.add_argument("--wrap", metavar="CMD", help="sbatch --wrap's command")
    parser.add_argument("--export", metavar="RULE", help="the job's --export rule")
    parser.add_argument("--chdir", metavar="D", help="the job's --chdir")


def execute(args: argparse.Namespace, rest: list[str] | None) -> int:
    from ..batch.srunopts import apply_export
    from ..compiled import load_policy
    from ..policy import ConfigError

    words = list(rest or [])
    cwd = os.path.abspath(args.chdir) if args.chdir else os.getcwd()
    env = apply_export(args.export, dict(os.environ))
    if env is None:
        return 0  # --export=NONE: the node builds the job's environment; not known here
    env.setdefault("SLURM_SUBMIT_DIR", os.getcwd())
    try:
        policy = load_policy(args.config)
    except ConfigError as exc:
        return report_config_error(exc)
    node = build_node(args, policy)
    if args.type == "sbatch":
        verdict = _batch(policy, args, words, env, cwd, node)
        if verdict is None:
            return 0
    else:
        if not words:
            return 0  # salloc without a command starts the user's shell
        from ..decide import StepRequest, decide

        verdict = decide(policy,
                         StepRequest(partition=args.partition, argv=words, env=env, cwd=cwd,
                                     node=node))
    if verdict.skipped or not verdict.findings:
        return 0
    if verdict.error and verdict.error.startswith("internal error"):
        return 70
    refuse = verdict.action == "reject" and policy.submit_for(args.partition) == "enforce"
    for line in _lines(verdict, policy, args, refuse):
        print(line)
    sys.stdout.flush()
    return EX_REJECT if refuse else 0


def _batch(policy, args, words, env, cwd, node):  # type: ignore[no-untyped-def]
    from ..batch.judge import decide_batch
    from ..decide import StepRequest

    if args.wrap is not None:
        import tempfile

        with tempfile.NamedTemporaryFile("w", prefix="grace-wrap-", suffix=".sh",
                                         delete=False) as handle:
            handle.write(_WRAP.format(args.wrap))
        os.chmod(handle.name, 0o700)
        try:
            return decide_batch(policy, StepRequest(partition=args.partition, argv=[handle.name],
                                                    env=env, cwd=cwd, node=node))
        finally:
            os.unlink(handle.name)
    if not args.script:
        return None  # a script on stdin: sbatch reads it, we cannot
    if not os.path.isfile(args.script):
        raise UsageError("--script: not a file")
    script = os.path.abspath(args.script)
    return decide_batch(policy, StepRequest(partition=args.partition, argv=[script, *words],
                                            env=env, cwd=cwd, node=node))


def _lines(verdict, policy, args, refuse: bool) -> list[str]:  # type: ignore[no-untyped-def]
    from .._record import replace
    from ..messages import _block, escape, user_lines
    from ..rules import Catalogue

    # The findings' blocks without the launch-time trailer ("step not started"):
    # here nothing has started yet.
    lines = user_lines(replace(verdict, action="allow"),
                       catalogue=Catalogue.for_policy(policy), contact=policy.contact)
    where = f"partition {escape(args.partition)}" if args.partition else "the default partition"
    if refuse:
        text = (f"{args.type}: job not submitted: on {where} it would be stopped before it "
                f"starts (mode {verdict.mode}). Fix the lines above and submit again.")
    elif verdict.action == "reject":
        text = (f"{args.type}: submitted anyway, but on {where} it will be stopped before it "
                f"starts (mode {verdict.mode}): fix the lines above.")
    elif any(f.severity in ("error", "warning") for f in verdict.findings):
        text = f"{args.type}: submitted; on {where} it may fail as described above."
    else:
        return lines
    return lines + _block("", text, indent="")
