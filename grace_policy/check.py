"""One step, checked: clean the environment, find what execve will run, follow
its ``#!`` chain, resolve its libraries like glibc, and judge every file's
architecture and page layout on the node.

The result is raw :class:`~grace_policy.findings.Issue` objects; the rule
catalogue and the partition's mode turn them into a verdict elsewhere.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from . import envleak
from .budget import Budget
from .causes import path_causes
from .elf import ElfError, ElfInfo, read_elf
from .findings import EnvChanges, Issue
from .launch import Hop, build_path, follow
from .layout import page_issues
from .loader import LoadTree, resolve
from .node import NodeProfile


@dataclass(frozen=True)
class StepReport:
    issues: tuple[Issue, ...]
    env: EnvChanges
    #: The path execve will be called with (None when not found).
    exe: str | None
    hops: tuple[Hop, ...] = ()
    tree: LoadTree | None = None


def check_step(
    argv: Sequence[str],
    env: Mapping[str, str],
    cwd: str,
    node: NodeProfile,
    *,
    env_vars: Sequence[str] = envleak.DEFAULT_VARS,
    env_strip: str = "foreign",
    budget: Budget | None = None,
) -> StepReport:
    budget = budget or Budget()
    leak = envleak.plan(env, node, names=env_vars, strip=env_strip)
    job_env = leak.changes.apply(dict(env))
    issues: list[Issue] = list(leak.issues)
    leaked = leak.foreign_prefixes

    def causes(path: str) -> tuple[str, ...]:
        return path_causes(path, job_env, leaked)

    if not argv or not argv[0]:
        issues.append(Issue("exe-not-found", "", "execve(): empty command: No such file "
                            "or directory", facts=(("name", ""),)))
        return StepReport(tuple(issues), leak.changes, None)

    name = argv[0]
    exe = build_path(name, job_env, cwd)
    if exe is None:
        issues.append(Issue(
            "exe-not-found", name,
            f"slurmstepd: error: execve(): {name}: No such file or directory",
            causes=causes(name), facts=(("name", name), ("PATH", job_env.get("PATH", ""))),
        ))
        return StepReport(tuple(issues), leak.changes, None)

    budget.take_file()
    hops = follow(exe, job_env, cwd)
    last = hops[-1]
    script = hops[0].path if len(hops) > 1 else None
    tree: LoadTree | None = None
    if last.kind == "elf":
        tree = _check_elf(last.path, job_env, cwd, node, budget, issues, causes,
                          via_script=script)
    else:
        issues.append(_hop_issue(hops, name, causes))
    return StepReport(tuple(issues), leak.changes, exe, tuple(hops), tree)


def _hop_issue(hops: list[Hop], name: str, causes) -> Issue:
    last = hops[-1]
    first = hops[0].path
    if len(hops) > 1 and last.kind == "missing":
        return Issue(
            "interp-missing", first,
            f"{first}: bad interpreter: {last.path}: No such file or directory",
            causes=causes(first), facts=(("interp", last.path), ("name", name)),
        )
    if last.kind == "missing":
        return Issue("exe-not-found", last.path,
                     f"slurmstepd: error: execve(): {name}: No such file or directory",
                     causes=causes(last.path), facts=(("name", name),))
    if last.kind in ("unreadable", "not-executable"):
        return Issue("exe-unreadable", last.path,
                     f"slurmstepd: error: execve(): {last.path}: {last.detail}",
                     causes=causes(last.path), facts=(("detail", last.detail),))
    if last.kind == "loop":
        return Issue("exe-format", first,
                     f"execve(): {first}: Too many levels of symbolic links ({last.detail})",
                     causes=causes(first), facts=(("detail", last.detail),))
    return Issue("exe-format", last.path,
                 f"slurmstepd: error: execve(): {last.path}: Exec format error",
                 causes=causes(last.path), facts=(("detail", last.detail),))


def _check_elf(path: str, env: Mapping[str, str], cwd: str, node: NodeProfile, budget: Budget,
               issues: list[Issue], causes, *, via_script: str | None) -> LoadTree | None:
    try:
        info = read_elf(path)
    except (ElfError, OSError) as exc:
        reason = exc.reason if isinstance(exc, ElfError) else (exc.strerror or str(exc))
        issues.append(Issue("elf-invalid", path,
                            f"slurmstepd: error: execve(): {path}: Exec format error ({reason})",
                            causes=causes(path), facts=(("detail", reason),)))
        return None
    if info.machine != node.machine_number or info.elf_class != node.elf_class:
        shown = via_script or path
        error = (f"{via_script}: {path}: cannot execute binary file: Exec format error"
                 if via_script else
                 f"slurmstepd: error: execve(): {path}: Exec format error")
        issues.append(Issue(
            "exe-arch-mismatch", path, error, causes=causes(path),
            facts=(("file_arch", f"{info.machine_name}"), ("bits", str(info.bits)),
                   ("script", shown)),
        ))
        return None

    tree = resolve(path, info, node, env, cwd=cwd, budget=budget)
    for obj in tree.objects:
        if obj.by_name_only:
            continue
        kernel = obj.found_via in ("exe", "interp")
        for issue in page_issues(obj.path, obj.info, node, mapped_by_kernel=kernel):
            issues.append(_with_causes(issue, causes(obj.path)))
    for miss in tree.missing:
        if miss.name == info.interp:
            issues.append(Issue(
                "interp-missing", path,
                f"slurmstepd: error: execve(): {path}: No such file or directory "
                f"(its program interpreter {miss.name} is missing)",
                causes=causes(path), facts=(("interp", miss.name),),
            ))
            continue
        foreign = miss.foreign
        if foreign:
            error = (f"error while loading shared libraries: {miss.name}: cannot open shared "
                     "object file: No such file or directory (only files for another "
                     "architecture were found)")
            where = foreign[0].path
        else:
            error = (f"error while loading shared libraries: {miss.name}: cannot open shared "
                     "object file: No such file or directory")
            where = miss.needed_by
        issues.append(Issue(
            "lib-not-found", miss.needed_by, error, causes=causes(where),
            facts=(("name", miss.name), ("needed_by", miss.needed_by),
                   ("candidates", ", ".join(f"{c.path} ({c.machine})" for c in foreign))),
        ))
    for fatal in tree.fatal:
        issues.append(Issue(
            "elf-invalid", fatal.path,
            f"error while loading shared libraries: {fatal.name}: {fatal.reason}",
            causes=causes(fatal.path),
            facts=(("name", fatal.name), ("needed_by", fatal.needed_by),
                   ("detail", fatal.reason)),
        ))
    return tree


def _with_causes(issue: Issue, causes: tuple[str, ...]) -> Issue:
    return Issue(issue.rule, issue.path, issue.predicted_error, causes, issue.facts)


def elf_summary(info: ElfInfo) -> dict[str, object]:
    """The ELF facts ``grace-policy inspect --json`` shows."""
    return {
        "machine": info.machine_name,
        "class": info.bits,
        "interp": info.interp,
        "min_load_align": info.min_load_align,
        "load_segments": [
            {"offset": s.offset, "vaddr": s.vaddr, "filesz": s.filesz, "memsz": s.memsz,
             "flags": s.perms, "align": s.align}
            for s in info.load_segments
        ],
        "needed": list(info.needed),
        "soname": info.soname,
        "rpath": info.rpath,
        "runpath": info.runpath,
    }
