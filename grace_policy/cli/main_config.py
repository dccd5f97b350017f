"""``grace-policy config check FILE [--compile]``: validate the site's config
the way the plugin will, before the plugin meets it at a step launch.

An admin editing the config wants every mistake at once, each with its line,
so all problems are printed (exit 78, EX_CONFIG). ``--compile`` also writes
the compiled form the plugin loads in microseconds; without it nothing is
written, so checking a draft has no side effects.
"""

from __future__ import annotations

import argparse

from .common import EX_ALLOW, EX_CONFIG, UsageError, err, report_config_error

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from .. import plugstack
    from ..policy import NodeOverrides, Policy


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
    check.add_argument("--plugstack", metavar="PLUGSTACK",
                       help="the plugstack.conf to read the plugin's line from (default: "
                            "PlugStackConfig= of $SLURM_CONF or /etc/slurm/slurm.conf, else "
                            "plugstack.conf next to it); 'none' to skip")
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
            from ..compiled import compile_config, compiled_path_for

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
    lines, broken = _plugstack(path, policy, args.plugstack)
    for line in lines:
        print(line)
    if broken:
        err(f"config: {escape(path)}: the plugin's line in plugstack.conf is broken: every "
            "step follows its on_error")
        return EX_CONFIG
    return EX_ALLOW


def _audit_key_line(path: str) -> int | None:
    from ..config import key_lines

    try:
        with open(path, encoding="utf-8") as f:
            return key_lines(f.read()).get(("audit", "path"))
    except (OSError, UnicodeDecodeError):
        return None


def _plugstack(path: str, policy: Policy, chosen: str | None) -> tuple[list[str], bool]:
    """What only plugstack.conf decides, and whether its plugin line is so
    broken that every step follows on_error."""
    import os

    from .. import plugstack
    from ..messages import escape

    out: list[str] = []
    if policy.audit_path:
        line = _audit_key_line(path)
        where = f"{escape(path)}:{line}" if line else escape(path)
        out.append(f"{where}: audit.path: ignored: the plugin writes the audit log named by "
                   "audit= on its plugstack.conf line (opened as root before the step drops "
                   "privileges); remove this key")
    if chosen == "none":
        return out, False
    if chosen is None:
        conf = plugstack.slurm_conf_path()
        main = plugstack.locate(conf)
        how = f"from {escape(conf)}"
    else:
        main, how = chosen, "given"
    stack = plugstack.read(main)
    for name, reason in stack.unreadable:
        out.append(f"plugstack {escape(name)}: cannot read: {escape(reason)}")
    if not stack.lines:
        if not stack.unreadable:
            out.append(f"plugstack {escape(main)} ({how}): no {plugstack.PLUGIN_NAME} line: "
                       "the plugin is not loaded, nothing is checked or written")
        out.append("  what only plugstack.conf decides (audit log, on_error when the check "
                   "cannot run, timeout, verdict cache): unknown without it (--plugstack FILE)")
        return out, False
    broken = False
    same = os.path.realpath(path)
    for entry in stack.lines:
        out.append(f"plugstack {escape(entry.file)}:{entry.line} ({how}): {entry.kind} "
                   f"{escape(entry.path)}")
        if entry.kind == "optional":
            out.append("  optional: Slurm ignores the plugin's errors: it can never refuse a "
                       "step (use required)")
        if entry.error:
            broken = True
            out.append(f"  broken: {escape(entry.error)}: every step follows on_error="
                       f"{entry.on_error} unchecked")
        if entry.config and os.path.realpath(entry.config) != same:
            out.append(f"  config: {escape(entry.config)}, not this file: steps use that one")
        elif entry.config:
            out.append("  config: this file")
        if entry.audit:
            usable, state = plugstack.audit_file_state(entry.audit)
            out.append(f"  audit log: {escape(entry.audit)}: {escape(state)}"
                       + ("" if usable else " (slurmd.log says so at every step)"))
        else:
            out.append("  audit log: none (no audit= on this line): no decision is written "
                       "anywhere; add audit=/var/log/slurm/grace-policy.jsonl")
        then = "step allowed unchecked" if entry.on_error == "allow" else "step refused"
        out.append(f"  when the check cannot run (config, import, timeout): on_error="
                   f"{entry.on_error} ({then})")
        out.append(f"  check timeout: {entry.timeout_ms} ms; verdict cache: "
                   + (escape(entry.cache_dir) if entry.cache_dir else "off"))
        out.append(_checker_line(entry, escape))
        out.append("  check memory: " + (
            f"{entry.max_memory} MiB beyond what its process starts with (max_memory=); "
            "more ends as check-limit" if entry.max_memory else
            "unlimited (max_memory=0): a check fed a hostile file can take the node's memory")
            + "; the process that judges cannot regain root, run programs or trace others "
            "(docs/SECURITY.md)")
        out.append("  container steps: "
                   + (f"skipped when the step env has {escape(entry.container_env)}"
                      if entry.container_env else "never skipped (no container_env=); "
                      "pyxis, Slurm OCI and apptainer exec steps are judged in their image"))
        for note in plugstack.pyxis_order(stack, entry):
            out.append(f"  {escape(note)}")
        if entry.python_path:
            out.append(f"  python_path: {escape(entry.python_path)} (searched first)")
    return out, broken


def _checker_line(entry: plugstack.PluginLine, escape: Callable[[str], str]) -> str:
    """Who checks a cache miss: the default node checker exists only once
    slurmd has been (re)started with this line, which nothing else shows."""
    if entry.checker == "step":
        return "  cold steps: checked by a helper of slurmstepd (checker=step)"
    return (f"  cold steps: checked by the node checker slurmd starts (checker=node, socket "
            f"{escape(entry.checker_socket)}); restart slurmd after changing this line or "
            "the install, until then steps use checker=step")


def _summary(policy: Policy) -> list[str]:
    """What the config amounts to, so a typo that is still valid TOML (a
    partition name the cluster does not have) is visible at a glance."""
    from ..messages import escape

    lines = [f"mode {policy.mode} for partitions not listed; on_error {policy.on_error}"]
    node = policy.node
    if not node.empty:
        lines.append("[node] " + ", ".join(f for f in (
            _facts(node.arch, node.page_size, node.glibc, node.root), _gpu_facts(node)) if f))
    for part in policy.partitions:
        facts = ", ".join(f for f in (
            _facts(part.node.arch, part.node.page_size, part.node.glibc, None),
            _gpu_facts(part.node)) if f)
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
        if not what and any(ex.rule == rule.rule for ex in policy.exemptions):
            continue  # only exemptions: listed below
        lines.append(f"rule {escape(rule.rule)}: " + ", ".join(what or ["no change"]))
    lines.append(f"leaked env: strip {policy.env.strip}: {', '.join(policy.env.vars)}")
    from ..exempt import today_utc

    today = today_utc()
    for ex in policy.exemptions:
        who = [f"paths {', '.join(escape(p) for p in ex.paths)}" if ex.paths else "",
               f"users {', '.join(escape(u) for u in ex.users)}" if ex.users else "",
               f"groups {', '.join(escape(g) for g in ex.groups)}" if ex.groups else ""]
        state = "active" if today <= ex.until else "EXPIRED: no effect"
        lines.append(f"exemption {ex.where}: {ex.rule} for {' and '.join(w for w in who if w)}"
                     f" until {ex.until} ({state}): {escape(ex.reason)}")
    return lines


def _gpu_facts(node: NodeOverrides) -> str:
    """``GPU sm_100, CUDA driver 13.0`` for what the config states."""
    parts = []
    if node.gpu_arch is not None:
        parts.append(f"GPU sm_{node.gpu_arch[0]}{node.gpu_arch[1]}")
    if node.cuda_driver is not None:
        parts.append(f"CUDA driver {node.cuda_driver[0]}.{node.cuda_driver[1]}")
    return ", ".join(parts)


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
