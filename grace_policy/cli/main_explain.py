"""``grace-policy explain RULE``: what a rule checks, how severe it is here,
and what users are told for each cause.

Users get rule ids in rejection messages and quote them to admins; this is
where either side looks one up. With ``--config`` the site's overrides
(severity, replaced texts) are shown, because that is what users actually see.
"""

from __future__ import annotations

import argparse

from .common import EX_ALLOW, EX_USAGE, UsageError, err, report_config_error


def configure_parser(sub: argparse._SubParsersAction, name: str, help_text: str) -> None:
    parser = sub.add_parser(
        name, help=help_text, description=help_text,
        epilog="Exit codes: 0 shown, 64 unknown rule (the known ids are listed), "
               "78 config error.",
    )
    parser.add_argument("--config", metavar="FILE",
                        help="show the rule as the site's config changes it")
    parser.add_argument("rule", nargs="?", metavar="RULE", help="a rule id, e.g. page-align")


def execute(args: argparse.Namespace, rest: list[str] | None) -> int:
    from ..compiled import load_policy
    from ..messages import escape
    from ..policy import ConfigError
    from ..rules import Catalogue

    names = ([args.rule] if args.rule is not None else []) + list(rest or [])
    if len(names) != 1:
        raise UsageError("give exactly one RULE" if names else "no RULE given")
    rule_id = names[0]
    try:
        policy = load_policy(args.config)
    except ConfigError as exc:
        return report_config_error(exc)
    catalogue = Catalogue.for_policy(policy)
    if catalogue.rule(rule_id) is None:
        err(f"explain: unknown rule {escape(rule_id)!r}")
        err("known rules: " + ", ".join(catalogue.ids()))
        return EX_USAGE
    # The texts can come from the site's config: keep them to printable lines.
    for line in catalogue.explain(rule_id).split("\n"):
        print(escape(line))
    return EX_ALLOW
