"""``grace-policy env PYTHON``: which packages of an environment would fail on
a partition, and why.

A user on the x86_64 login node asks before submitting: every distribution of
the environment is judged as the partition's nodes would import it (the same
code the plugin runs for a Python step), with no script needed. Exit 0 when
everything would load, 1 when some package would fail, 2 when the
interpreter itself cannot run there. It says which interpreter it assumed
the node runs (:mod:`grace_policy.python.nodeinterp`): for a node of another
architecture, a distribution path's python is the node's own build, any
other interpreter the file itself.
"""

from __future__ import annotations

import argparse
import json
import os

from .common import (
    EX_REJECT,
    EX_WARN,
    UsageError,
    add_node_options,
    build_node,
    job_env,
    node_json,
    note_unknown_partition,
    report_config_error,
)


def configure_parser(sub: argparse._SubParsersAction, name: str, help_text: str) -> None:
    parser = sub.add_parser(
        name, help=help_text,
        usage="grace-policy env [--partition P | --arch A --page-size N --glibc V] "
              "[--root DIR] [--config F] [--env-file F] [--cwd D] [--import MOD]... "
              "[--gpu-arch SM] [--cuda-driver V] [--json] PYTHON",
        description="Judge every installed package of the environment of PYTHON (an "
                    "interpreter, or a venv/conda prefix) as a node of the partition would "
                    "import it: extension modules for another CPU or Python, libraries "
                    "that will not be found, layouts for smaller pages.",
        epilog="Exit codes: 0 all packages load, 1 some would fail, 2 the interpreter "
               "cannot run there, 64 usage error, 78 config error.",
    )
    add_node_options(parser)
    parser.add_argument("--cwd", metavar="D", help="the job's working directory")
    parser.add_argument("--import", dest="imports", action="append", default=[],
                        metavar="MOD", help="a module your program imports (marks it used)")
    from .main_check import add_gpu_node_options

    add_gpu_node_options(parser)
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("python", metavar="PYTHON", help="bin/python of the environment, "
                        "or its directory")


def _interpreter(path: str) -> str:
    from ..messages import escape

    if os.path.isdir(path):
        for name in ("bin/python3", "bin/python"):
            candidate = os.path.join(path, name)
            if os.path.lexists(candidate):
                return os.path.abspath(candidate)
        raise UsageError(f"{escape(path)!r} holds no bin/python3 or bin/python")
    if not os.path.lexists(path):
        raise UsageError(f"no such file: {escape(path)!r}")
    return os.path.abspath(path)


def execute(args: argparse.Namespace, rest: list[str] | None) -> int:
    from ..budget import Budget
    from ..check import environment_report
    from ..compiled import load_policy
    from ..context import StepContext
    from ..decide import finding_context
    from ..messages import PREFIX, escape
    from ..policy import ConfigError
    from ..rules import Catalogue

    if rest:
        raise UsageError("grace-policy env takes no command after '--'")
    python = _interpreter(args.python)
    cwd = os.path.abspath(args.cwd) if args.cwd else os.getcwd()
    env = job_env(args)
    try:
        policy = load_policy(args.config)
    except ConfigError as exc:
        return report_config_error(exc)
    from .main_check import apply_gpu_options

    node = apply_gpu_options(args, build_node(args, policy))
    note_unknown_partition(args, policy)
    part = policy.partition(args.partition)
    budget = Budget(60_000, 100_000, 1 << 34)  # a person asking can wait
    ctx = StepContext(node=node, env=env, cwd=cwd, budget=budget,
                      cuda_index=part.cuda_index if part else None)
    own, groups = environment_report(python, ctx, imports=args.imports)
    from ..python.nodeinterp import basis

    assumed = basis(python, node, budget)
    catalogue = Catalogue.for_policy(policy)
    context = finding_context(node, args.partition)
    own_findings = catalogue.findings(own, context)
    rows = []
    for g in groups or ():
        found = catalogue.findings(g.issues, context)
        rows.append((g, found))
    broken = [r for r in rows if any(f.severity in ("error", "warning") for f in r[1])]
    fatal = groups is None or any(f.severity == "error" for f in own_findings)
    code = EX_REJECT if fatal else (EX_WARN if broken else 0)
    if args.json:
        print(json.dumps({
            "python": python, "node": node_json(node),
            "interpreter": [f.to_json() for f in own_findings],
            "assumed_interpreter": {**assumed.to_json(), "text": assumed.text(node)},
            "packages": [{"name": g.label, "path": g.path, "imported": g.used,
                          "ok": not any(f.severity in ("error", "warning") for f in found),
                          "findings": [f.to_json() for f in found]} for g, found in rows],
        }, indent=2))
        return code
    where = f"partition {escape(args.partition)}, " if args.partition else ""
    print(f"{PREFIX}{escape(python)} on {where}{node.describe()}")
    print(f"{PREFIX}interpreter assumed there: {escape(assumed.text(node))}")
    for f in own_findings:
        print(f"{PREFIX}  interpreter: {f.severity.upper()} {f.rule}: {escape(f.path)}")
        print(f"{PREFIX}    {escape(f.predicted_error)}")
    if groups is None:
        print(f"{PREFIX}the interpreter cannot run there (or is no CPython): nothing imported")
        return code
    for g, found in rows:
        bad = [f for f in found if f.severity in ("error", "warning")]
        if not bad:
            continue
        print(f"{PREFIX}{escape(g.label)}: would fail to import ({len(bad)} problem(s))")
        for f in bad:
            print(f"{PREFIX}  {f.rule}: {escape(f.path)}")
            print(f"{PREFIX}    {escape(f.predicted_error)}")
        print(f"{PREFIX}  what to do: {bad[0].remediation}")  # escaped by the catalogue
    ok = len(rows) - len(broken)
    print(f"{PREFIX}{ok} of {len(rows)} package group(s) load there; {len(broken)} would fail")
    return code
