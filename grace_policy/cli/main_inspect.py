"""``grace-policy inspect FILE``: the ELF facts of a file and its load tree as
the node's glibc would build it, with why each library was found where it was
and which candidates were passed over.

lddtree answers "what does this need"; this answers "what would the node's
loader do", using the same loader model as the plugin (RPATH chain unless
RUNPATH, LD_LIBRARY_PATH, RUNPATH, ld.so.cache, system dirs, wrong-arch files
skipped), and judges every file's PT_LOADs against the node's page size.
It reports; ``check`` judges. Exit 0 unless FILE cannot be read as ELF (2).
"""

from __future__ import annotations

import argparse
import json
import os

from .common import (
    EX_ALLOW,
    EX_REJECT,
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
    from collections.abc import Mapping
    from typing import Any

    from ..elf import ElfInfo
    from ..findings import Finding
    from ..loader import Candidate
    from ..node import NodeProfile
    from ..policy import Policy

#: DF_1_PIE: a static PIE has no PT_INTERP but is still started by execve.
_DF_1_PIE = 0x08000000


def configure_parser(sub: argparse._SubParsersAction, name: str, help_text: str) -> None:
    parser = sub.add_parser(
        name, help=help_text,
        usage="grace-policy inspect [node options] [--json] FILE",
        description="Show FILE's ELF facts and every object the node's loader would load "
                    "for it: where each library was found (rpath, LD_LIBRARY_PATH, runpath, "
                    "ld.so.cache, system dir), which candidates were skipped and why, and "
                    "the page-size problems of each file on the node.",
        epilog="Exit codes: 0 inspected (problems or not), 2 FILE is not a readable ELF file, "
               "64 usage error, 78 config error. 'grace-policy check' gives the verdict.",
    )
    add_node_options(parser)
    parser.add_argument("--json", action="store_true", help="print the facts as JSON")
    parser.add_argument("file", nargs="?", metavar="FILE", help="the ELF file to inspect")


def _file(args: argparse.Namespace, rest: list[str] | None) -> str:
    names = ([args.file] if args.file is not None else []) + list(rest or [])
    if len(names) != 1:
        raise UsageError("give exactly one FILE" if names else "no FILE given")
    return names[0]


def execute(args: argparse.Namespace, rest: list[str] | None) -> int:
    from ..compiled import load_policy
    from ..elf import ElfError, read_elf
    from ..messages import escape
    from ..policy import ConfigError

    path = _file(args, rest)
    env = job_env(args)
    try:
        policy = load_policy(args.config)
    except ConfigError as exc:
        return report_config_error(exc)
    node = build_node(args, policy)
    note_unknown_partition(args, policy)

    try:
        # Any size: a person asked about this file, no step launch is waiting.
        info = read_elf(path, max_bytes=1 << 40)
    except ElfError as exc:
        what = ("not an ELF file" if exc.not_elf or exc.reason == "not an ELF file"
                else f"not a readable ELF file ({escape(exc.reason)})")
        if exc.reason == "not a regular file":
            what = "not a regular file"
        err(f"inspect: {escape(path)}: {what}{_script_hint(path)}")
        return EX_REJECT
    except OSError as exc:
        err(f"inspect: {escape(path)}: cannot read: {escape(exc.strerror or str(exc))}")
        return EX_REJECT

    report = _inspect(path, info, node, env, policy, args.partition)
    if args.json:
        report["node"] = node_json(node)
        print(json.dumps(report, indent=2))
    else:
        for line in _human(path, info, node, report):
            print(line)
    return EX_ALLOW


def _script_hint(path: str) -> str:
    try:
        with open(path, "rb") as fh:
            head = fh.read(256)
    except OSError:
        return ""
    if not head.startswith(b"#!"):
        return ""
    from ..messages import escape

    line = head[2:].split(b"\n", 1)[0].strip().decode("utf-8", "surrogateescape")
    return f" (a script for '{escape(line)}': inspect that interpreter, or use 'check')"


def _kernel_mapped(info: ElfInfo) -> bool:
    """The executable (and static PIE) is mapped by execve, which ignores
    p_align; everything else by ld.so, which checks it on old glibc."""
    from ..elf import ET_EXEC

    return bool(info.interp) or info.e_type == ET_EXEC or bool(info.flags_1 & _DF_1_PIE)


def _candidate(c: Candidate) -> dict[str, str]:
    return {"path": c.path, "reason": c.reason, "machine": c.machine}


def _finding_json(f: Finding) -> dict[str, str]:
    return f.to_json()


def _inspect(path: str, info: ElfInfo, node: NodeProfile, env: Mapping[str, str],
             policy: Policy, partition: str | None) -> dict[str, Any]:
    """Everything both output forms show, as plain data.

    The issues come from the same ``check_elf`` the plugin runs, so inspect
    and check cannot disagree about a file; inspect only adds the tree.
    """
    from ..budget import Budget
    from ..causes import path_causes
    from ..check import Started, check_elf, elf_summary
    from ..context import StepContext
    from ..decide import finding_context
    from ..findings import Issue
    from ..rules import Catalogue

    out: dict[str, Any] = {"file": path, **elf_summary(info)}
    issues: list[Issue] = []
    libraries: list[dict[str, Any]] = []
    fatal: list[dict[str, str]] = []
    limits = policy.limits
    budget = Budget(max(limits.deadline_ms, 10_000), max(limits.max_files, 100_000),
                    max(limits.max_bytes, 1 << 30))
    ctx = StepContext(node=node, env=env, cwd=os.getcwd(), budget=budget)
    tree = check_elf(path, ctx, issues, lambda p: path_causes(p, env),
                     Started(as_program=_kernel_mapped(info)))
    out["runs_on_node"] = not any(i.rule == "exe-arch-mismatch" for i in issues)
    by_path: dict[str, list[str]] = {}
    for issue in issues:
        by_path.setdefault(issue.path, []).append(issue.rule)
    if tree is not None:
        for obj in tree.objects:
            if obj.found_via == "exe":
                continue
            judged = not obj.by_name_only
            libraries.append({
                "name": obj.name,
                "path": obj.path,
                "found_via": obj.found_via,
                "needed_by": obj.needed_by,
                "machine": obj.info.machine_name if judged else None,
                "min_load_align": obj.info.min_load_align if judged else None,
                "judged": judged,
                "skipped": [_candidate(c) for c in obj.skipped],
                "issues": by_path.get(obj.path, []),
            })
        for miss in tree.missing:
            libraries.append({
                "name": miss.name,
                "path": None,
                "found_via": None,
                "needed_by": miss.needed_by,
                "skipped": [_candidate(c) for c in miss.skipped],
                "searched": list(miss.searched),
                "issues": ["interp-missing" if miss.name == info.interp else "lib-not-found"],
            })
        fatal = [{"name": bad.name, "path": bad.path, "needed_by": bad.needed_by,
                  "reason": bad.reason} for bad in tree.fatal]
    out["libraries"] = libraries
    out["fatal"] = fatal
    catalogue = Catalogue.for_policy(policy)
    out["issues"] = [_finding_json(f)
                     for f in catalogue.findings(issues, finding_context(node, partition))]
    return out


# --------------------------------------------------------------------------
# Human output


def _hex(value: object) -> str:
    return f"0x{value:x}" if isinstance(value, int) else "-"


def _human(path: str, info: ElfInfo, node: NodeProfile, report: dict[str, Any]
           ) -> list[str]:
    from ..messages import escape

    lines = [f"{escape(path)}: ELF {info.bits}-bit {info.machine_name}"
             + (f", interpreter {escape(info.interp)}" if info.interp else "")
             + (f", soname {escape(info.soname)}" if info.soname else "")]
    align = info.min_load_align
    lines.append(f"  smallest PT_LOAD alignment: {_hex(align)}"
                 + (f" ({align // 1024} KiB)" if isinstance(align, int) and align >= 1024
                    else ""))
    for seg in info.load_segments:
        lines.append(f"  PT_LOAD {seg.perms} offset {_hex(seg.offset)} vaddr {_hex(seg.vaddr)} "
                     f"filesz {_hex(seg.filesz)} memsz {_hex(seg.memsz)} align {_hex(seg.align)}")
    if info.needed:
        lines.append("  NEEDED " + ", ".join(escape(n) for n in info.needed))
    if info.rpath is not None:
        lines.append(f"  RPATH {escape(info.rpath)}")
    if info.runpath is not None:
        lines.append(f"  RUNPATH {escape(info.runpath)}")
    if info.nodeflib:
        lines.append("  DF_1_NODEFLIB (no ld.so.cache, no system dirs)")
    where = f", image {escape(node.root)}" if node.root not in ("", "/") else ""
    lines.append(f"node: {node.describe()}{where}")

    libraries = report["libraries"]
    if not report["runs_on_node"]:
        lines.append(f"load tree: none: the node's loader would refuse {escape(path)} itself "
                     f"({info.machine_name} file, {node.machine} node); "
                     f"add --arch {info.machine_name} to see its tree on such a node")
    elif not libraries:
        lines.append("load tree: nothing to load (static, or no DT_NEEDED)")
    else:
        lines.append("load tree:")
        lines.extend(_tree(path, libraries))
    fatal = report["fatal"]
    for bad in fatal:
        lines.append(f"  {escape(bad['name'])} => {escape(bad['path'])}: the loader stops "
                     f"here: {escape(bad['reason'])}")

    findings = report["issues"]
    if findings:
        lines.append("on this node:")
        for f in findings:
            lines.append(f"  {f['severity'].upper()} {f['rule']}: {escape(f['path'])}")
            lines.append(f"    {escape(f['predicted_error'])}")
    else:
        lines.append("on this node: no problems found")
    return lines


def _tree(root: str, libraries: list[dict[str, Any]]) -> list[str]:
    """Libraries under the object that first needed them (as the loader's
    breadth-first order attributes them), each with how it was found."""
    from ..messages import escape

    children: dict[str | None, list[dict[str, Any]]] = {}
    for lib in libraries:
        children.setdefault(lib["needed_by"], []).append(lib)
    lines: list[str] = []
    seen: set[str] = set()

    def walk(parent: str, depth: int) -> None:
        if parent in seen:
            return
        seen.add(parent)
        for lib in children.get(parent, []):
            pad = "  " * depth
            name = escape(str(lib["name"]))
            if lib["path"] is None:
                lines.append(f"{pad}{name} => not found")
                searched = lib.get("searched") or []
                if searched:
                    lines.append(f"{pad}    searched: "
                                 + ", ".join(escape(str(s)) for s in searched))
            else:
                via = str(lib["found_via"])
                extra = ""
                if not lib.get("judged", True):
                    via = via.replace(" (by name)", "")
                    extra = ", by name: this host's copy stands for the node's, not judged"
                problems = lib.get("issues") or []
                if problems:
                    extra += "; " + ", ".join(str(p) for p in problems)
                if via == "interp":
                    lines.append(f"{pad}{escape(str(lib['path']))} (program interpreter{extra})")
                else:
                    lines.append(f"{pad}{name} => {escape(str(lib['path']))} "
                                 f"(via {via}{extra})")
            for cand in lib.get("skipped") or []:
                lines.append(f"{pad}    skipped {escape(cand['path'])}: {escape(cand['reason'])}")
            if lib["path"] is not None and lib.get("found_via") != "interp":
                walk(str(lib["path"]), depth + 1)

    walk(root, 1)
    return lines
