"""``grace-policy config check FILE [--compile]``: validate the site's config
the way the plugin will, before the plugin meets it at a step launch.

An admin editing the config wants every mistake at once, each with its line,
so all problems are printed (exit 78, EX_CONFIG). ``--compile`` also writes
the compiled form the plugin loads in microseconds; without it nothing is
written, so checking a draft has no side effects.
"""

from __future__ import annotations

import argparse

from .common import EX_ALLOW, UsageError, err, report_config_error

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ..policy import Policy


def configure_parser(sub: argparse._SubParsersAction, name: str, help_text: str) -> None:
    parser = sub.add_parser(name, help=help_text, description=help_text)
    actions = parser.add_subparsers(dest="config_action", metavar="ACTION")
    check = actions.add_parser(
        "check", help="validate FILE (exit 0 OK, 78 with every problem listed)",
        description="Validate FILE with the same rules as the plugin and list every problem "
                    "as FILE:LINE: key: message.",
        epilog="Exit codes: 0 valid, 64 usage error, 78 config error.",
    )
    check.add_argument("--compile", action="store_true",
                       help="also write the compiled form the plugin loads "
                            "(default: FILE.compiled.json next to FILE)")
    check.add_argument("-o", "--output", metavar="OUT",
                       help="where --compile writes (default: next to FILE)")
    check.add_argument("file", nargs="?", metavar="FILE", help="the TOML config")


def execute(args: argparse.Namespace, rest: list[str] | None) -> int:
    from ..messages import escape
    from ..policy import ConfigError

    if args.config_action != "check":
        raise UsageError("which action? grace-policy config check FILE [--compile]")
    names = ([args.file] if args.file is not None else []) + list(rest or [])
    if len(names) != 1:
        raise UsageError("give exactly one FILE" if names else "no FILE given")
    path = names[0]
    if args.output is not None and not args.compile:
        raise UsageError("--output only makes sense with --compile")
    try:
        if args.compile:
            from ..policy import compile_config, compiled_path_for

            policy = compile_config(path, args.output)
            written = args.output or compiled_path_for(path)
        else:
            from ..config import load_config  # pydantic: only this command pays for it

            policy = load_config(path)
            written = None
    except ConfigError as exc:
        code = report_config_error(exc)
        count = len(exc.problems)
        err(f"config: {escape(path)}: {count} problem{'s' if count != 1 else ''}")
        return code
    print(f"{escape(path)}: OK")
    for line in _summary(policy):
        print(f"  {line}")
    if written is not None:
        print(f"compiled form written to {escape(written)}")
    return EX_ALLOW


def _summary(policy: Policy) -> list[str]:
    """What the config amounts to, so a typo that is still valid TOML (a
    partition name the cluster does not have) is visible at a glance."""
    from ..messages import escape

    lines = [f"mode {policy.mode} for partitions not listed; on_error {policy.on_error}"]
    node = policy.node
    if not node.empty:
        lines.append("[node] " + _facts(node.arch, node.page_size, node.glibc, node.root))
    for part in policy.partitions:
        facts = _facts(part.node.arch, part.node.page_size, part.node.glibc, None)
        mode = part.mode or f"{policy.mode} (inherited)"
        lower = ", users may lower it" if part.allow_user_lower else ""
        lines.append(f"partition {escape(part.name)}: mode {mode}{lower}"
                     + (f"; {facts}" if facts else ""))
    for rule in policy.rules:
        what = []
        if rule.severity:
            what.append(f"severity {rule.severity}")
        if rule.text:
            what.append("site text")
        lines.append(f"rule {escape(rule.rule)}: " + ", ".join(what or ["no change"]))
    lines.append(f"leaked env: strip {policy.env.strip}: {', '.join(policy.env.vars)}")
    if policy.audit_path:
        lines.append(f"audit log {escape(policy.audit_path)}")
    return lines


def _facts(arch: str | None, page_size: int | None, glibc: tuple[int, int] | None,
           root: str | None) -> str:
    from ..messages import escape

    parts = []
    if arch:
        parts.append(arch)
    if page_size:
        parts.append(f"{page_size // 1024} KiB pages")
    if glibc:
        parts.append(f"glibc {glibc[0]}.{glibc[1]}")
    if root:
        parts.append(f"image {escape(root)}")
    return ", ".join(parts)
