"""A Python step, judged before launch: what the node's CPython will import.

Most steps on a GPU partition are ``python train.py``, ``torchrun ...`` or a
console script whose ``#!`` names an environment's python. Such a step
fails at ``import`` time, not at execve, and wastes the allocation all the
same. Given the interpreter the launch check found, this module models its
``sys.path`` (:mod:`.sitepath`), finds what the command is known to import
(:mod:`.usage`) and which distributions that pulls in (:mod:`.dists`), and
judges every extension module and bundled library of the environment as
``dlopen`` would load it (:mod:`.judge`).

Severity follows use: problems in what the step imports (and the standard
library) keep the rules' severities; a broken distribution nobody is known
to import becomes one ``py-dist-broken`` warning naming its files, so it
never rejects a step.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence

from .. import fsprobe
from .._record import dataclass
from ..budget import Budget
from ..elf import ElfInfo
from ..findings import Issue
from ..launch import Hop
from ..loader import Process
from ..node import NodeProfile
from .contents import Loadables, classify, record_files
from .dists import Dist
from .finder import Located
from .judge import Judge
from .names import LAUNCHERS, SHELLS
from .nodepath import listdir
from .sitepath import SysPath

Causes = Callable[[str], tuple[str, ...]]

#: Variables CPython's start-up reads that change what it imports; a cached
#: verdict depends on them.
PYTHON_VARS = ("PYTHONPATH", "PYTHONHOME", "PYTHONUSERBASE", "PYTHONNOUSERSITE",
               "PYTHONSAFEPATH", "PYTHONPLATLIBDIR", "VIRTUAL_ENV", "CONDA_PREFIX")

#: Site-directory entries that are metadata, not importable code.
_META_SUFFIXES = (".dist-info", ".egg-info", ".pth", ".egg-link", ".data")

#: Distributions whose use brings their own rules.
_TORCH, _TORCHCODEC = "torch", "torchcodec"
_JIT_USERS = frozenset({"torch", "triton", "deepspeed", "pytorch-triton"})


def interpreter_args(hops: Sequence[Hop], argv: Sequence[str]) -> list[str]:
    """The interpreter's own ``argv[1:]``: for a script started through its
    ``#!`` line, the kernel passes the line's argument and the script path
    before the step's arguments (``env -S`` splits its argument first)."""
    args = list(argv[1:])
    for hop in hops[:-1]:
        if hop.kind != "script":
            continue
        words: list[str] = []
        if hop.interp and os.path.basename(hop.interp) == "env":
            words = _env_words(hop.interp_arg)
        elif hop.interp_arg:
            words = [hop.interp_arg]
        args = [*words, hop.path, *args]
    return args


def _env_words(arg: str | None) -> list[str]:
    """What ``env`` passes to the command after its name: only ``env -S``
    splits its single argument into words."""
    if not arg:
        return []
    if not arg.startswith("-S"):
        return []
    words = arg[2:].split()
    while words and ("=" in words[0] or words[0].startswith("-")):
        words.pop(0)
    return words[1:]


def _note_inputs(args: Sequence[str] | None, env: Mapping[str, str]) -> None:
    # The verdict of a Python step depends on the step's own arguments (-c,
    # -m, the script; "run" of uv) and on CPython's variables, not only on
    # argv[0]. The step's argv, as C sees it: what #! lines add to the
    # interpreter's argv is recorded with the scripts' identities. A shell
    # step's environment does not depend on its arguments (None): srun loops
    # of 'bash -c ...' keep one cache entry.
    if args is not None:
        fsprobe.note_input("argc", str(len(args) + 1))
        for i, arg in enumerate(args, 1):
            fsprobe.note_input(f"argv:{i}", arg)
    for name in PYTHON_VARS:
        fsprobe.note_env(name, env.get(name))


def python_issues(exe: str, info: ElfInfo, process: Process, hops: Sequence[Hop],
                  argv: Sequence[str], env: Mapping[str, str], cwd: str, node: NodeProfile,
                  budget: Budget, causes: Causes, *, cuda_index: str | None = None
                  ) -> list[Issue]:
    """Issues of what ``exe`` (already judged as a program) will import
    when it is a CPython interpreter; ``[]`` for any other program."""
    from .interp import identify, parse_python_argv

    interp = identify(exe, info, node, budget)
    if interp is None:
        name = os.path.basename(exe)
        if name in SHELLS:
            _note_inputs(None, env)
            return shell_env_issues(env, cwd, node, budget, causes, cuda_index=cuda_index)
        if name in LAUNCHERS:
            _note_inputs(argv[1:], env)
            if argv[1:2] == ["run"]:
                venv = uv_project_env(env, cwd, budget)
                return shell_env_issues(env, cwd, node, budget, causes, cuda_index=cuda_index,
                                        first=(f"{venv}/bin/python",) if venv else ())
        return []
    _note_inputs(argv[1:], env)
    args = interpreter_args(hops, argv)
    flags, command = parse_python_argv(args, interp.version)
    if command.kind == "none":
        return []
    from .sitepath import sys_path

    paths = sys_path(interp, flags, command, env, cwd, node, budget)
    if paths.startup_error:
        # CPython stops before it runs anything (a .pth that is not UTF-8,
        # a PYTHONHOME without a standard library).
        return [Issue("py-startup-error", exe, paths.startup_error, causes=causes(exe),
                      facts=(("detail", paths.startup_error),))]
    from .usage import command_imports

    used_names = command_imports(command.kind, command.value, cwd=cwd, node=node,
                                 budget=budget)
    return Environment(interp.version, paths, process, env, cwd, node, budget, causes,
                       cuda_index=cuda_index).issues(used_names)


def uv_project_env(env: Mapping[str, str], cwd: str, budget: Budget) -> str | None:
    """The environment ``uv run`` uses: ``UV_PROJECT_ENVIRONMENT``, else
    ``.venv`` of the project (the nearest directory up from the cwd with a
    ``pyproject.toml``)."""
    directory = cwd
    for _ in range(64):
        budget.tick()
        if fsprobe.isfile(f"{directory.rstrip('/')}/pyproject.toml"):
            chosen = env.get("UV_PROJECT_ENVIRONMENT")
            fsprobe.note_env("UV_PROJECT_ENVIRONMENT", chosen)
            if chosen:
                return chosen if chosen.startswith("/") else os.path.join(directory, chosen)
            return f"{directory.rstrip('/')}/.venv"
        parent = os.path.dirname(directory)
        if parent == directory:
            return None
        directory = parent
    return None


def shell_env_issues(env: Mapping[str, str], cwd: str, node: NodeProfile, budget: Budget,
                     causes: Causes, *, cuda_index: str | None = None,
                     first: Sequence[str] = ()) -> list[Issue]:
    """A shell step (``bash job.sh``) that keeps a user environment active (a
    native ``VIRTUAL_ENV``/``CONDA_PREFIX``, or the first ``python3`` of its
    PATH in a user environment) will most likely run that Python: its
    environment is judged, and everything found is a warning, since which
    modules the script's python imports is not known. ``first``: the
    interpreter a launcher names (``uv run``: the project's ``.venv``); uv
    syncs the environment from its lock before it runs, so what is found
    there is a warning too."""
    from ..elf import ElfError, read_elf
    from ..launch import which
    from ..node import node_owns

    candidates = [*first]
    candidates += [f"{env[v].rstrip('/')}/bin/python" for v in ("VIRTUAL_ENV", "CONDA_PREFIX")
                   if env.get(v, "").startswith("/")]
    on_path = which("python3", env.get("PATH"), cwd, budget)
    if on_path is not None and not node_owns(on_path):
        candidates.append(on_path)
    for python in candidates:
        budget.tick()
        try:
            info = read_elf(python, budget=budget)
        except (ElfError, OSError):
            continue
        if not node.root_is_native and node_owns(python):
            # a venv of the distribution's python, seen from another
            # architecture: the node's own build will start it
            from .nodeinterp import node_process

            process = node_process(python, info, node, env, cwd, budget)
        elif info.machine != node.machine_number or info.elf_class != node.elf_class:
            continue  # another machine's env: the env-leak rule speaks for it
        else:
            process = Process(python, info, node, env, cwd=cwd, budget=budget)
        found = _environment(python, process, env, cwd, node, budget, causes,
                             cuda_index=cuda_index, all_warnings=True)
        if found is not None:
            return found.issues(())
    return []


def _environment(python: str, process: Process, env: Mapping[str, str], cwd: str,
                 node: NodeProfile, budget: Budget, causes: Causes, *,
                 cuda_index: str | None, all_warnings: bool) -> Environment | None:
    """The environment of interpreter ``python`` started with no script (what
    a shell step's or a user's ``python`` would see), or None for no CPython."""
    from .interp import PyCommand, PyFlags, identify
    from .sitepath import sys_path

    interp = identify(python, process.main.info, node, budget)
    if interp is None:
        return None
    paths = sys_path(interp, PyFlags(), PyCommand("stdin", ""), env, cwd, node, budget)
    return Environment(interp.version, paths, process, env, cwd, node, budget, causes,
                       cuda_index=cuda_index, all_warnings=all_warnings)


def _listdir(path: str) -> list[str]:
    try:
        return sorted(listdir(path))
    except (OSError, ValueError):
        return []


def _compiled_page_rule() -> Callable[..., list[Issue]]:
    """The page-size-in-code rule (jemalloc), as programs get it."""
    from ..check import code_page_issues

    return code_page_issues


#: sys.path entries that hold no distributions of their own.
_NO_DISTS = frozenset({"stdlib", "stdlib-zip", "lib-dynload", "script-dir", "cwd"})


@dataclass(frozen=True)
class Group:
    """The problems of one distribution (or the standard library, or a
    package without metadata), and whether the step is known to use it."""

    label: str
    path: str
    used: bool
    issues: tuple[Issue, ...]


class Environment:
    """One interpreter's import world: its ``sys.path`` and what lies there."""

    def __init__(self, version: tuple[int, int], paths: SysPath, process: Process,
                 env: Mapping[str, str], cwd: str, node: NodeProfile, budget: Budget,
                 causes: Causes, *, cuda_index: str | None = None,
                 all_warnings: bool = False) -> None:
        from .suffixes import extension_suffixes

        self.version = version
        self.paths = paths
        self.env = env
        self.cwd = cwd
        self.node = node
        self.budget = budget
        self.causes = causes
        self.cuda_index = cuda_index
        #: Nothing is known to be imported (a shell step's environment).
        self.all_warnings = all_warnings
        self.suffixes = tuple(extension_suffixes(version, node.machine))
        self.judge = Judge(process, node, budget, causes, extra=_compiled_page_rule())

    # -- the whole environment ------------------------------------------------

    def issues(self, used_names: Iterable[str]) -> list[Issue]:
        """What the step's users see: the problems of what it imports with
        their rules' severities, one ``py-dist-broken`` warning per other
        broken distribution."""
        out: list[Issue] = []
        seen: set[tuple[str, str]] = set()
        for group in self.groups(used_names):
            if group.used and not self.all_warnings:
                # A file reached two ways (a RECORD-less site entry that is
                # also the imported name) is one finding.
                for issue in group.issues:
                    if (issue.rule, issue.path) not in seen:
                        seen.add((issue.rule, issue.path))
                        out.append(issue)
            elif group.issues:
                out.append(self._dist_warning(group.label, group.path, group.issues))
        return out

    def groups(self, used_names: Iterable[str]) -> list[Group]:
        """Every problem of the environment, by the distribution (or the
        standard library, or a package without metadata) it belongs to."""
        from .dists import closure, dists_in

        entries = self.paths.entries
        search = [e.path for e in entries]
        out: list[Group] = []
        # The standard library's extension modules load for nearly every
        # step: judged with normal severities.
        for e in entries:
            if e.kind == "lib-dynload" and (self.node.root_is_native or not e.system):
                names = [f"{e.path}/{n}" for n in _listdir(self._host(e.path)) if ".so" in n]
                found = self._loadables(classify(names, e.path, self.suffixes))
                out.append(Group("the standard library", e.path, True, tuple(found)))
        # Distributions, per sys.path entry that holds metadata.
        by_dir: dict[str, tuple[Dist, ...]] = {}
        for e in entries:
            if e.system or e.kind in _NO_DISTS or e.path in by_dir:
                continue
            by_dir[e.path] = tuple(dists_in(e.path, self.node, self.version, self.budget))
        every = [d for ds in by_dir.values() for d in ds]
        used_names = tuple(dict.fromkeys(used_names))
        roots, located = self._owners(used_names, search, by_dir)
        used = closure(roots, every) if roots else set()
        # sys.path order: the first copy of a distribution shadows the others.
        effective: set[tuple[str, str]] = set()
        seen_names: set[str] = set()
        for site_dir in search:
            for d in by_dir.get(site_dir, ()):
                if d.name not in seen_names:
                    seen_names.add(d.name)
                    effective.add((site_dir, d.name))
        for site_dir, dists in by_dir.items():
            claimed: set[str] = set()
            for d in dists:
                problems, entries_of = self._dist(d, site_dir)
                claimed.update(entries_of)
                label = f"{d.name} {d.version}".strip()
                # Remedies can name what is installed: "upgrade numpy 1.19.0".
                problems = [Issue(i.rule, i.path, i.predicted_error, i.causes,
                                  (*i.facts, ("dist", label))) for i in problems]
                in_use = d.name in used and (site_dir, d.name) in effective
                if in_use:
                    problems += self._special(d, site_dir)
                out.append(Group(label, d.meta_dir, in_use, tuple(problems)))
            out += self._unclaimed(site_dir, claimed, used_names)
        # Modules the command imports from where no distribution lives
        # (a PYTHONPATH directory of plain packages, the script's directory).
        for name, loc in located.items():
            if loc.kind == "missing" and loc.foreign:
                if self._node_builds(loc.foreign[0]):
                    continue
                out.append(Group(name, loc.foreign[0], True,
                                 (self._foreign_issue(name, loc.foreign),)))
            elif (loc.entry not in by_dir and loc.kind in ("package", "extension")
                  and not self._system_entry(loc.entry)):
                found = (self._tree(loc.path, name) if loc.kind == "package"
                         else self.judge.file(loc.path, module=name))
                out.append(Group(name, loc.path, True, tuple(found)))
        return out

    def _system_entry(self, path: str) -> bool:
        return any(e.system for e in self.paths.entries if e.path == path)

    def _node_builds(self, path: str) -> bool:
        """Whether the node has its own build where this host holds ``path``:
        the distribution's Python (its lib-dynload, its dist-packages) seen
        from a login node of another architecture."""
        from .sitepath import is_system

        return not self.node.root_is_native and is_system(path)

    def _owners(self, names: Sequence[str], search: Sequence[str],
                by_dir: Mapping[str, tuple[Dist, ...]]) -> tuple[set[str], dict[str, Located]]:
        """The distributions that provide the used top-level names, as the
        finder would find them (the first entry of sys.path wins)."""
        from .finder import find_top_level

        roots: set[str] = set()
        located: dict[str, Located] = {}
        listings: dict[str, object] = {}
        for name in names:
            self.budget.tick()
            loc = find_top_level(name, search, self.suffixes, self.budget, node=self.node,
                                 cwd=self.cwd, listings=listings)  # type: ignore[arg-type]
            located[name] = loc
            for d in by_dir.get(loc.entry, ()):
                if name in d.top_level:
                    roots.add(d.name)
                    break
        return roots, located

    # -- one distribution -----------------------------------------------------

    def _dist(self, dist: Dist, site_dir: str) -> tuple[list[Issue], tuple[str, ...]]:
        files = record_files(self._host(dist.meta_dir), site_dir, self.budget)
        if files is None:
            # No RECORD (egg-info, a hand-made install): walk what it names.
            problems: list[Issue] = []
            for top in dist.top_level:
                path = f"{site_dir.rstrip('/')}/{top}"
                if fsprobe.isdir(path):
                    problems += self._tree(path, top)
            return problems, tuple(dist.top_level)
        # RECORD says where compiled files are; the directories themselves say
        # what is there now: one site dir filled from two machines keeps the
        # files of both, while RECORD lists only the last install's.
        shared: list[str] = []
        sources: set[str] = set()
        for directory in sorted({p.rsplit("/", 1)[0] for p in files.shared}):
            for name in _listdir(self._host(directory)):
                if ".so" in name:
                    shared.append(f"{directory}/{name}")
                elif name.endswith(".py"):
                    sources.add(f"{directory}/{name[:-3]}")
        found = classify(shared, site_dir, self.suffixes, sources)
        return self._loadables(found), files.entries

    def _host(self, path: str) -> str:
        return self.judge.process.searcher.to_host(path)

    def _loadables(self, found: Loadables) -> list[Issue]:
        out: list[Issue] = []
        for module, path in found.modules:
            out += self.judge.file(path, module=module)
        for path in found.libraries:
            out += self.judge.file(path, required=False, deps=False)
        for module, files in found.foreign:
            # A submodule without a build for this node is a failure only if
            # the package has no pure-Python fallback, which the files cannot
            # tell (PyYAML, MarkupSafe and msgpack fall back; numpy does not):
            # a warning. A top-level module is imported by name: certain.
            out.append(self._foreign_issue(module, files, optional="." in module))
        return out

    def _tree(self, pkg_dir: str, top: str) -> list[Issue]:
        """A package directory no RECORD describes, walked."""
        from .contents import is_library
        from .finder import DATA_DIRS, package_extensions

        modules, foreign = package_extensions(pkg_dir, self.suffixes, self.budget,
                                              node=self.node, skip_dirs=DATA_DIRS)
        libraries = tuple(p for _m, p in modules if is_library(os.path.basename(p)))
        return self._loadables(Loadables(
            tuple((m, p) for m, p in modules if p not in libraries), libraries,
            tuple((m, tuple(f)) for m, f in foreign)))

    def _unclaimed(self, site_dir: str, claimed: set[str], used: Sequence[str]
                   ) -> list[Group]:
        """Top-level entries of a site directory that no RECORD lists."""
        out: list[Group] = []
        base = site_dir.rstrip("/")
        for name in _listdir(self._host(site_dir)):
            if name in claimed or name.endswith(_META_SUFFIXES) or name == "__pycache__":
                continue
            self.budget.tick()
            path = f"{base}/{name}"
            top = name.split(".", 1)[0]
            if ".so" in name:
                problems = self._loadables(classify([path], site_dir, self.suffixes))
            elif "." not in name and fsprobe.isdir(self._host(path)):
                problems = self._tree(path, name)
            else:
                continue
            if problems:  # a directory of data or scripts is nothing to report
                out.append(Group(f"{top} (no package metadata)", path, top in used,
                                 tuple(problems)))
        return out

    def _special(self, dist: Dist, site_dir: str) -> list[Issue]:
        """Rules of particular distributions the step uses."""
        name = dist.name
        out: list[Issue] = []
        base = site_dir.rstrip("/")
        if name == _TORCH:
            from .torch_build import torch_issues

            out += torch_issues(f"{base}/torch", dist.meta_dir,
                                self.env, self.node, cuda_index=self.cuda_index,
                                budget=self.budget)
        elif name == _TORCHCODEC:
            from .torchcodec import torchcodec_issues

            out += torchcodec_issues(f"{base}/torchcodec", self.env, self.cwd, self.node,
                                     self.budget)
        if name in _JIT_USERS and not getattr(self, "_jit_done", False):
            self._jit_done = True
            from .jitcache import jit_cache_issues

            out += jit_cache_issues(self.env, self.node, self.budget)
        return out

    # -- issue shapes ----------------------------------------------------------

    def _foreign_issue(self, module: str, files: Sequence[str], *,
                       optional: bool = False) -> Issue:
        from .suffixes import describe_suffix, split_extension

        builds = []
        for f in files[:3]:
            split = split_extension(os.path.basename(f))
            builds.append(describe_suffix(split[1]) if split else os.path.basename(f))
        wanted = describe_suffix(self.suffixes[0]) if self.suffixes else ""
        facts = (("name", module), ("file_arch", ", ".join(dict.fromkeys(builds))),
                 ("candidates", ", ".join(files[:5])))
        if optional:
            facts = (*facts, ("max_severity", "warning"))
        return Issue(
            "py-ext-foreign", files[0],
            f"ModuleNotFoundError: No module named '{module}' (this node's Python looks "
            f"for {wanted} builds; only {', '.join(dict.fromkeys(builds))} is there)",
            causes=self.causes(files[0]), facts=facts,
        )

    def _dist_warning(self, label: str, path: str, problems: Sequence[Issue]) -> Issue:
        shown = []
        for p in problems[:5]:
            shown.append(f"{p.path} ({p.rule})")
        more = len(problems) - len(shown)
        detail = "; ".join(shown) + (f"; and {more} more" if more > 0 else "")
        return Issue(
            "py-dist-broken", path,
            f"importing {label} would fail: {problems[0].predicted_error}",
            causes=problems[0].causes or self.causes(path),
            facts=(("name", label), ("detail", detail), ("rules", ", ".join(
                dict.fromkeys(p.rule for p in problems)))),
        )


def environment_report(python: str, env: Mapping[str, str], cwd: str, node: NodeProfile,
                       budget: Budget, *, imports: Sequence[str] = (),
                       cuda_index: str | None = None
                       ) -> tuple[list[Issue], list[Group] | None]:
    """Everything an environment's interpreter would meet on ``node``, for a
    user asking from the login node: the interpreter's own issues, and every
    group of its environment (``None`` when ``python`` is no CPython or cannot
    run there). ``imports``: the modules the user's program imports, marked
    as used; every group is judged either way."""
    from ..causes import path_causes
    from ..check import check_elf

    def causes(path: str) -> tuple[str, ...]:
        return path_causes(path, env)

    issues: list[Issue] = []
    kept: dict[str, object] = {}
    check_elf(python, env, cwd, node, budget, issues, causes, via_script=None, keep=kept)
    process = kept.get("process")
    if not isinstance(process, Process) or any(
            i.rule in ("exe-arch-mismatch", "elf-invalid", "interp-missing") for i in issues):
        return issues, None
    found = _environment(python, process, env, cwd, node, budget, causes,
                         cuda_index=cuda_index, all_warnings=False)
    return issues, (found.groups(imports) if found is not None else None)
