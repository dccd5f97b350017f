"""One step, checked: clean the environment, find what execve will run, follow
its ``#!`` chain, resolve its libraries like glibc, and judge every file's
architecture and page layout on the node.

The result is raw :class:`~grace_policy.findings.Issue` objects; the rule
catalogue and the partition's mode turn them into a verdict elsewhere.

A check that runs out of its :class:`~grace_policy.budget.Budget` does not
throw away what it already knows: the report keeps the issues found so far
and says why it stopped (``limit``), so a user cannot hide a foreign
executable behind a huge ``LD_LIBRARY_PATH`` that exhausts the budget.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from . import envleak
from ._record import dataclass, field, replace
from .budget import OUT_OF_MEMORY, Budget, BudgetExceeded
from .causes import path_causes
from .context import StepContext
from .elf import EM_386, ET_DYN, ET_EXEC, ElfError, ElfInfo, read_elf
from .findings import EnvChanges, Issue
from .fsprobe import HOST, Files
from .launch import Hop, build_path, c_string, follow
from .layout import code_page_issues, page_issues
from .loader import Loading, LoadTree, Process
from .node import NodeProfile, node_owns
from .policy import EnvPolicy
from .python.names import may_run_python

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .cuda.stepcheck import GpuCheck
    from .image import Image
    from .python.step import Group

#: Variables every check reads, besides the policy's env-leak names: every
#: cached verdict depends on them (slurm_bridge's cache entry records them).
#: HOME is read too, but a verdict depends on it only where a check notes it
#: (a Python step's user site, JIT caches), so a node's own program does not
#: depend on whose home it is.
READ_VARS = ("PATH", "LD_LIBRARY_PATH")

Causes = Callable[[str], tuple[str, ...]]

#: Issues of a program that stop it before it runs anything: a ``#!`` line's
#: env, or an interpreter before it imports anything.
_BLOCKING = frozenset({"exe-arch-mismatch", "elf-invalid", "interp-missing", "lib-not-found",
                       "exe-format", "page-congruence", "lib-version-missing"})


def _blocked(issues: Sequence[Issue]) -> bool:
    """Whether ``issues`` stop their program; a page finding on the node's own
    file (severity at most info) does not, nor a finding that may never
    happen (at most a warning: a lazily bound unversioned library)."""
    return any(i.rule in _BLOCKING and i.fact("max_severity") not in ("info", "warning")
               for i in issues)


@dataclass(frozen=True)
class StepReport:
    issues: tuple[Issue, ...]
    env: EnvChanges
    #: The path execve will be called with (None when not found).
    exe: str | None
    hops: tuple[Hop, ...] = ()
    tree: LoadTree | None = None
    #: Why the check stopped before the end (deadline or cap), else None.
    #: ``issues`` then holds what was found until then.
    limit: str | None = None


def _c_env(env: Mapping[str, str], names: Sequence[str]) -> dict[str, str]:
    """A copy of ``env`` whose values the check reads are C strings (see
    :func:`~grace_policy.launch.c_string`); other values are left alone."""
    out = dict(env)
    for name in (*READ_VARS, "HOME", *names):
        value = out.get(name)
        if value is not None:
            out[name] = c_string(value)
    return out


@dataclass(frozen=True)
class CheckInput:
    """One step to check and the site's rules for it: what
    :func:`grace_policy.decide.decide` hands the check."""

    argv: Sequence[str]
    env: Mapping[str, str]
    cwd: str
    node: NodeProfile
    #: None: a fresh default allowance (an image's: the one it was opened under).
    budget: Budget | None = None
    #: The step runs ``argv`` inside this image (``env`` and ``cwd`` are then
    #: the container's: see :meth:`grace_policy.image.Image.step_env`).
    image: Image | None = None
    #: The policy's ``[env]``: which leaked variables to judge, and when to strip.
    env_rules: EnvPolicy = field(default_factory=EnvPolicy)
    #: The package index of the partition, for torch-build remedies.
    cuda_index: str | None = None
    #: The host's files and the record of what the check asks (an image
    #: step reads ``files.inside(image.view)``); default: unrecorded.
    files: Files = field(default=HOST, compare=False)


def check_step(argv: Sequence[str], env: Mapping[str, str], cwd: str, node: NodeProfile, *,
               budget: Budget | None = None, image: Image | None = None) -> StepReport:
    """Check one step under the default ``[env]`` rules (see :func:`check`)."""
    return check(CheckInput(argv, env, cwd, node, budget=budget, image=image))


def check(step: CheckInput) -> StepReport:
    """Check one step. Raises nothing for bad input; a spent budget ends the
    check early with ``StepReport.limit`` set.

    ``step.image``: every file is read in the image, nothing on the host,
    and every issue names the image (``IMAGE:/inner/path``)."""
    image = step.image
    if image is None:
        return _check_step(replace(step, budget=step.budget or Budget()))
    from .image.step import image_issues

    # The view charges the budget it was opened under (the step's, from its
    # first byte: grace_policy/image/open.py); a check given none goes on
    # with that one rather than starting a second allowance.
    budget = step.budget or getattr(image.view, "budget", None) or Budget()
    report = _check_step(replace(step, budget=budget, files=step.files.inside(image.view)))
    return replace(report, issues=image_issues(report.issues, image))


def _check_step(step: CheckInput) -> StepReport:
    argv, node, image, cuda_index = step.argv, step.node, step.image, step.cuda_index
    budget, files = step.budget or Budget(), step.files
    env_vars, env_strip = step.env_rules.vars, step.env_rules.strip
    issues: list[Issue] = []
    state: dict[str, object] = {}
    changes = EnvChanges()
    try:
        env = _c_env(step.env, env_vars)
        cwd = c_string(step.cwd) or "/"
        if image is not None:
            from .image.step import arch_issue, image_node

            mismatch = arch_issue(image, argv, env, node, budget, files)
            if mismatch is not None:
                # Every file of the image is foreign: one finding says it all.
                return StepReport((mismatch,), changes, None)
            node = image_node(node, budget, files)
        leak = envleak.plan(env, node, names=env_vars, strip=env_strip, budget=budget,
                            files=files)
        changes = leak.changes
        issues.extend(leak.issues)
        step_env = leak.changes.apply(env)
        ctx = StepContext(node=node, env=step_env, cwd=cwd, budget=budget, files=files,
                          image=image, cuda_index=cuda_index,
                          gpu=gpu_check(node, step_env, budget, cuda_index, files))
        _check(argv, ctx, issues, state, leak.foreign_prefixes)
    except (BudgetExceeded, MemoryError) as exc:
        # What was held is freed as the stack unwinds: the report is small.
        limit = OUT_OF_MEMORY if isinstance(exc, MemoryError) else str(exc)
        return StepReport(tuple(issues), changes, _opt_str(state.get("exe")),
                          tuple(state.get("hops", ())),  # type: ignore[arg-type]
                          None, limit=limit)
    return StepReport(tuple(issues), changes, _opt_str(state.get("exe")),
                      tuple(state.get("hops", ())),  # type: ignore[arg-type]
                      state.get("tree"), limit=None)  # type: ignore[arg-type]


def gpu_check(node: NodeProfile, env: Mapping[str, str], budget: Budget,
              cuda_index: str | None, files: Files = HOST) -> GpuCheck | None:
    """The GPU judgement of a step that has GPUs (the one decision
    ``torch-cpu-only`` uses), else None: a step without GPUs imports
    nothing of :mod:`grace_policy.cuda` and reads no fat binary."""
    from .python.gpus import step_gpus

    if step_gpus(env, files) is None:
        return None
    from .cuda.stepcheck import for_step

    found = for_step(node, env, budget, cuda_index, files)
    return found if found.known else None


def _opt_str(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _check(argv: Sequence[str], ctx: StepContext, issues: list[Issue],
           state: dict[str, object], leaked: tuple[str, ...]) -> None:
    job_env, cwd, budget, files = ctx.env, ctx.cwd, ctx.budget, ctx.files

    def causes(path: str) -> tuple[str, ...]:
        return path_causes(path, job_env, leaked, files)

    name = c_string(argv[0]) if argv else ""
    if not name:
        issues.append(Issue("exe-not-found", "", "execve(): empty command: No such file "
                            "or directory", facts=(("name", ""),)))
        return

    if ctx.image is not None and ctx.image.kind == "oci":
        # runc, not slurmstepd, finds the program (image/runc.py).
        from .image.runc import look_path

        exe, runc_error = look_path(name, job_env, cwd, budget, files)
        if exe is None:
            state["exe"] = name
            rule = "exe-not-found" if runc_error and ("not found" in runc_error
                                                      or "no such" in runc_error) \
                else "exe-unreadable"
            issues.append(Issue(rule, name, runc_error or "", causes=causes(name),
                                facts=(("name", name), ("PATH", job_env.get("PATH", "")))))
            return
    else:
        exe = build_path(name, job_env, cwd, budget, files)
    if exe is None:  # only for an empty name, handled above; kept for safety
        return
    state["exe"] = exe
    hops = follow(exe, job_env, cwd, budget, files)
    state["hops"] = hops
    last = hops[-1]
    script = hops[0].path if len(hops) > 1 else None
    for hop in hops[:-1]:
        if hop.kind == "env":
            # The env a #! line names must load and run before its command.
            before = len(issues)
            check_elf(hop.path, ctx, issues, causes, Started(via_script=script))
            if _blocked(issues[before:]):
                return
    if last.kind == "elf":
        kept: dict[str, object] = {}
        before = len(issues)
        state["tree"] = check_elf(last.path, ctx, issues, causes, Started(via_script=script),
                                  kept)
        process = kept.get("process")
        if process is not None and may_run_python(last.path, files) and not _blocked(
                issues[before:]):
            from .python.step import python_issues

            issues.extend(python_issues(
                last.path, process, hops, argv, ctx, causes))  # type: ignore[arg-type]
    else:
        issues.append(_hop_issue(hops, name, causes, job_env))


def _hop_issue(hops: list[Hop], name: str, causes: Causes, env: Mapping[str, str]) -> Issue:
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
                     causes=causes(last.path),
                     facts=(("name", name), ("PATH", env.get("PATH", ""))))
    if last.kind == "not-regular":
        return Issue("exe-format", last.path,
                     f"slurmstepd: error: execve(): {last.path}: {last.detail}",
                     causes=causes(last.path), facts=(("detail", last.detail),))
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


@dataclass(frozen=True)
class Started:
    """How a file checked by :func:`check_elf` is started."""

    #: The script whose ``#!`` line names the file (errors name the script).
    via_script: str | None = None
    #: The file is started by execve (mapped by the kernel, its ``$ORIGIN``
    #: its real directory); False for a library looked at on its own
    #: (``grace-policy inspect``), which ld.so maps and checks.
    as_program: bool = True


_PROGRAM = Started()


def check_elf(path: str, ctx: StepContext, issues: list[Issue], causes: Causes,
              how: Started | None = None, keep: dict[str, object] | None = None
              ) -> LoadTree | None:
    """Judge one ELF file and everything it loads; issues go to ``issues``.

    ``keep``: receives the loader's ``process``, for what the program will
    dlopen later (a Python interpreter's extension modules).
    """
    node, env, cwd, budget, files = ctx.node, ctx.env, ctx.cwd, ctx.budget, ctx.files
    how = how or _PROGRAM
    via_script, as_program = how.via_script, how.as_program
    try:
        info = read_elf(path, budget=budget, files=files)
    except (ElfError, OSError) as exc:
        reason = exc.reason if isinstance(exc, ElfError) else (exc.strerror or str(exc))
        issues.append(Issue("elf-invalid", path,
                            f"slurmstepd: error: execve(): {path}: Exec format error ({reason})",
                            causes=causes(path), facts=(("detail", reason),)))
        return None
    if not node.root_is_native and node_owns(node, path, files):
        # Judging another architecture's node from here: the node has its own
        # build of system programs at the same path, as it has of system
        # libraries (which the loader model counts as present by name).
        # An interpreter there still imports the user's files on shared
        # storage: the Python step goes on with the node's own build.
        if keep is not None and may_run_python(path, files):
            from .python.nodeinterp import node_process

            keep["process"] = node_process(path, info, node, env,
                                           Loading(cwd=cwd, budget=budget, files=files))
        return None
    if node.machine == "x86_64" and info.machine == EM_386:
        # x86_64 kernels run i386 programs; they need the 32-bit loader and
        # libraries, which the i386 view of the same node looks for.
        i386 = replace(node, machine="i386")
        node = i386 if i386.runs(info) else node
    # The kernel reads e_machine in the node's byte order: a big-endian
    # aarch64 file is as foreign to a little-endian Grace node as x86_64.
    if not node.runs(info):
        shown = via_script or path
        error = (f"{via_script}: {path}: cannot execute binary file: Exec format error"
                 if via_script else
                 f"slurmstepd: error: execve(): {path}: Exec format error")
        arch = node.arch_of(info)
        issues.append(Issue(
            "exe-arch-mismatch", path, error, causes=causes(path),
            facts=(("file_arch", arch), ("bits", str(info.bits)), ("script", shown)),
        ))
        return None
    if info.e_type not in (ET_EXEC, ET_DYN):
        # load_elf_binary refuses relocatable objects and core files (ENOEXEC).
        issues.append(Issue(
            "exe-format", path, f"slurmstepd: error: execve(): {path}: Exec format error",
            causes=causes(path),
            facts=(("detail", f"ELF type {info.e_type} is not an executable"),),
        ))
        return None

    # The executable's own layout first: it is known before the (possibly
    # long) library search, and survives a budget that runs out there.
    loading = Loading(cwd=cwd, budget=budget, exec_origin=as_program, files=files)
    for issue in page_issues(path, info, node, mapped_by_kernel=as_program, how=loading):
        issues.append(_with_causes(issue, causes(path), node, files))
    for issue in code_page_issues(path, info, node, loading):
        issues.append(_with_causes(issue, causes(path), node, files))
    gpu = ctx.gpu
    if gpu is not None:
        issues.extend(_with_causes(i, causes(path), node, files) for i in gpu.file(path, info))

    process = Process(path, info, node, env, loading)
    tree = process.tree
    if keep is not None:
        keep["process"] = process
    for obj in tree.objects:
        if obj.by_name_only or obj.found_via == "exe":
            continue
        budget.tick()
        kernel = obj.found_via == "interp"
        for issue in page_issues(obj.path, obj.info, node, mapped_by_kernel=kernel,
                                 how=loading, name=obj.name):
            issues.append(_with_causes(issue, causes(obj.path), node, files))
        if not kernel:
            for issue in code_page_issues(obj.path, obj.info, node, loading):
                issues.append(_with_causes(issue, causes(obj.path), node, files))
            if gpu is not None:
                issues.extend(_with_causes(i, causes(obj.path), node, files) for i in gpu.file(
                    obj.path, obj.info, process.searcher.to_host(obj.path)))
    for miss in tree.missing:
        budget.tick()
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
        budget.tick()
        issues.append(Issue(
            "elf-invalid", fatal.path,
            f"error while loading shared libraries: {fatal.path}: {fatal.reason}",
            causes=causes(fatal.path),
            facts=(("name", fatal.name), ("needed_by", fatal.needed_by),
                   ("detail", fatal.reason)),
        ))
    for version in tree.versions:
        # rtld prints every missing version, argv[0] first, then exits; an
        # assertion is printed as it is.
        budget.tick()
        issues.append(Issue(
            "lib-version-missing", version.needed_by or path,
            version.message() if version.kind == "unversioned"
            else f"{path}: {version.message()}",
            causes=causes(version.needed_by), facts=version.facts,
        ))
    return tree


def _with_causes(issue: Issue, causes: tuple[str, ...], node: NodeProfile,
                 files: Files) -> Issue:
    facts = issue.facts
    if issue.rule.startswith("page-") and node_owns(node, issue.path, files):
        # The node's own system files are built for its page size; a page
        # finding on one means a simulated node or a broken image, neither of
        # which the user can fix: the admin sees it in the audit log. A venv's
        # bin/python is such a file when it links to the system python.
        facts = (*facts, ("max_severity", "info"))
    return Issue(issue.rule, issue.path, issue.predicted_error, causes, facts)


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


def environment_report(python: str, ctx: StepContext, *, imports: Sequence[str] = ()
                       ) -> tuple[list[Issue], list[Group] | None]:
    """Everything an environment's interpreter would meet on ``ctx.node``,
    for a user asking from the login node (``grace-policy env``): the
    interpreter's own issues, and every group of its environment (``None``
    when ``python`` is no CPython or cannot run there). ``imports``: the
    modules the user's program imports, marked as used; every group is
    judged either way."""
    from .python.step import environment_of

    node, env, budget, cuda_index = ctx.node, ctx.env, ctx.budget, ctx.cuda_index

    def causes(path: str) -> tuple[str, ...]:
        return path_causes(path, env, (), ctx.files)

    issues: list[Issue] = []
    kept: dict[str, object] = {}
    gpu = None
    if node.gpu_arch is not None:
        # No step here to have GPUs: the partition's (or --gpu-arch's) GPUs
        # are the ones its packages' kernels will meet.
        from .cuda.stepcheck import for_step

        gpu = for_step(node, env, budget, cuda_index, ctx.files)
    ctx = replace(ctx, gpu=gpu)
    check_elf(python, ctx, issues, causes, keep=kept)
    process = kept.get("process")
    if not isinstance(process, Process) or _blocked(issues):
        return issues, None
    found = environment_of(python, process, ctx, causes, all_warnings=False)
    if found is None:
        return issues, None
    return issues, found.groups((*imports, *found.startup_imports()))
