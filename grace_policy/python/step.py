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

from .._record import dataclass, replace
from ..budget import Budget
from ..context import StepContext
from ..findings import Issue
from ..fsprobe import HOST, Files
from ..launch import Hop
from ..layout import code_page_issues
from ..loader import Loading, Process
from .contents import Loadables, classify, record_files
from .dists import Dist
from .finder import Located
from .judge import Judge
from .names import LAUNCHERS, SHELLS
from .nodepath import listdir
from .sitepath import SysPath, is_system

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .interp import PyCommand

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


def _note_inputs(args: Sequence[str] | None, env: Mapping[str, str], files: Files,
                 decisive: int | None = None) -> None:
    # The verdict of a Python step depends on the interpreter's options and
    # its -c/-m/script operand (and "run" of uv), and on CPython's
    # variables, not only on argv[0]; the arguments after the operand are
    # the script's own (sys.argv[1:]) and change nothing it imports. So the
    # entry holds the step's argv up to the operand, as C sees it
    # ("argv:N"), and "argmin" (at least that many words): a sweep
    # `srun python train.py --seed N` is one entry. ``decisive``: how many
    # of ``args`` that is; None: all of them, and exactly as many (no
    # operand: `python3 -E` must not match `python3 -E x.py`). What #! lines
    # add to the interpreter's argv is recorded with the scripts'
    # identities. A shell step's environment does not depend on its
    # arguments (``args`` None): srun loops of 'bash -c ...' keep one entry.
    if args is not None:
        if decisive is None:
            files.note_input("argc", str(len(args) + 1))
            decisive = len(args)
        else:
            files.note_input("argmin", str(decisive + 1))
        for i, arg in enumerate(args[:decisive], 1):
            files.note_input(f"argv:{i}", arg)
    for name in PYTHON_VARS:
        files.note_env(name, env.get(name))


def decisive_args(args: Sequence[str], step_args: int, command: PyCommand) -> int | None:
    """How many of the step's own arguments (the last ``step_args`` of the
    interpreter's ``args``) decide what runs: those up to and including the
    script, ``-c``/``-m`` operand or ``-``. None when nothing ends the
    options (stdin, usage errors, ``-V``): then every word counts."""
    consumed = len(args) - len(command.args)
    operand = command.kind in ("code", "module", "script") or (
        command.kind == "stdin" and consumed > 0 and args[consumed - 1] == "-")
    if not operand:
        return None
    return max(0, consumed - (len(args) - step_args))


def python_issues(exe: str, process: Process, hops: Sequence[Hop], argv: Sequence[str],
                  ctx: StepContext, causes: Causes) -> list[Issue]:
    """Issues of what ``exe`` (already judged as a program, loaded by
    ``process``) will import when it is a CPython interpreter; ``[]`` for
    any other program."""
    env, cwd, node, budget, files = ctx.env, ctx.cwd, ctx.node, ctx.budget, ctx.files
    from .interp import identify, parse_python_argv

    interp = identify(exe, process.main.info, node, budget, files)
    if interp is None:
        name = os.path.basename(exe)
        if name in SHELLS:
            _note_inputs(None, env, files)
            return shell_env_issues(ctx, causes)
        if name in LAUNCHERS:
            # only "run" as the first word matters (uv's other commands and
            # arguments are not judged)
            _note_inputs(argv[1:], env, files, 1 if len(argv) > 1 else None)
            if argv[1:2] == ["run"]:
                venv = uv_project_env(env, cwd, budget, files)
                return shell_env_issues(ctx, causes,
                                        first=(f"{venv}/bin/python",) if venv else ())
        return []
    args = interpreter_args(hops, argv)
    flags, command = parse_python_argv(args, interp.version)
    _note_inputs(argv[1:], env, files, decisive_args(args, len(argv) - 1, command))
    if command.kind == "none":
        return []
    from .sitepath import sys_path

    paths = sys_path(interp, flags, command, ctx)
    if paths.startup_error:
        # CPython stops before it runs anything (a .pth that is not UTF-8,
        # a PYTHONHOME without a standard library).
        return [Issue("py-startup-error", exe, paths.startup_error, causes=causes(exe),
                      facts=(("detail", paths.startup_error),))]
    from .usage import command_imports

    used_names = command_imports(command.kind, command.value, cwd=cwd, node=node,
                                 budget=budget, files=files)
    environment = Environment(interp.version, paths, process, ctx, causes)
    if not flags.no_site:
        # .pth import lines and sitecustomize/usercustomize run at every
        # start: their imports are as certain as the command's own.
        used_names = (*used_names, *environment.pth_imports(),
                      *environment.startup_imports())
    return environment.issues(used_names)


def uv_project_env(env: Mapping[str, str], cwd: str, budget: Budget,
                   files: Files = HOST) -> str | None:
    """The environment ``uv run`` uses: ``UV_PROJECT_ENVIRONMENT``, else
    ``.venv`` of the project (the nearest directory up from the cwd with a
    ``pyproject.toml``), looked for in ``files``."""
    directory = cwd
    for _ in range(64):
        budget.tick()
        if files.isfile(f"{directory.rstrip('/')}/pyproject.toml"):
            chosen = env.get("UV_PROJECT_ENVIRONMENT")
            files.note_env("UV_PROJECT_ENVIRONMENT", chosen)
            if chosen:
                return chosen if chosen.startswith("/") else os.path.join(directory, chosen)
            return f"{directory.rstrip('/')}/.venv"
        parent = os.path.dirname(directory)
        if parent == directory:
            return None
        directory = parent
    return None


def shell_env_issues(ctx: StepContext, causes: Causes, *,
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

    env, cwd, node, budget, files = ctx.env, ctx.cwd, ctx.node, ctx.budget, ctx.files
    # Not known to import anything: no GPU judgement of its packages.
    ctx = replace(ctx, gpu=None)
    candidates = [*first]
    candidates += [f"{env[v].rstrip('/')}/bin/python" for v in ("VIRTUAL_ENV", "CONDA_PREFIX")
                   if env.get(v, "").startswith("/")]
    on_path = which("python3", env.get("PATH"), cwd, budget, files)
    if on_path is not None and not node_owns(node, on_path, files):
        candidates.append(on_path)
    for python in candidates:
        budget.tick()
        try:
            info = read_elf(python, budget=budget, files=files)
        except (ElfError, OSError):
            continue
        if not node.root_is_native and node_owns(node, python, files):
            # a venv of the distribution's python, seen from another
            # architecture: the node's own build will start it
            from .nodeinterp import node_process

            process = node_process(python, info, node, env,
                                   Loading(cwd=cwd, budget=budget, files=files))
        elif not node.runs(info):
            continue  # another machine's env: the env-leak rule speaks for it
        else:
            process = Process(python, info, node, env,
                              Loading(cwd=cwd, budget=budget, files=files))
        found = environment_of(python, process, ctx, causes, all_warnings=True)
        if found is not None:
            return found.issues(())
    return []


def environment_of(python: str, process: Process, ctx: StepContext, causes: Causes, *,
                   all_warnings: bool) -> Environment | None:
    """The environment of interpreter ``python`` started with no script (what
    a shell step's or a user's ``python`` would see), or None for no CPython."""
    from .interp import PyCommand, PyFlags, identify
    from .sitepath import sys_path

    interp = identify(python, process.main.info, ctx.node, ctx.budget, ctx.files)
    if interp is None:
        return None
    paths = sys_path(interp, PyFlags(), PyCommand("stdin", ""), ctx)
    return Environment(interp.version, paths, process, ctx, causes, all_warnings=all_warnings)


def _listdir(path: str, files: Files) -> list[str]:
    try:
        return sorted(listdir(path, files))
    except (OSError, ValueError):
        return []


#: sys.path entries that hold no distributions of their own.
_NO_DISTS = frozenset({"stdlib", "stdlib-zip", "lib-dynload", "script-dir", "cwd",
                       "editable-hook"})
#: sys.path entries that are no directory (setuptools' namespace path hook).
_NO_DIR = frozenset({"editable-hook"})
#: How much of one ``.pth`` import line, and of all of them, is parsed
#: (``Environment.pth_imports``); real lines are tens to hundreds of bytes.
PTH_LINE_BYTES = 4096
PTH_TOTAL_BYTES = 32 * 1024
#: The modules site.py imports after the .pth files (Lib/site.py main()).
_STARTUP = ("sitecustomize", "usercustomize")


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
                 ctx: StepContext, causes: Causes, *, all_warnings: bool = False) -> None:
        from .suffixes import extension_suffixes

        self.version = version
        self.paths = paths
        self.env = ctx.env
        self.cwd = ctx.cwd
        self.node = node = ctx.node
        self.budget = budget = ctx.budget
        self.files = ctx.files
        self.ctx = ctx
        self.causes = causes
        self.cuda_index = ctx.cuda_index
        gpu = ctx.gpu
        #: Nothing is known to be imported (a shell step's environment).
        self.all_warnings = all_warnings
        self.suffixes = tuple(extension_suffixes(version, node.machine))
        self.judge = Judge(process, node, budget, causes, extra=code_page_issues, gpu=gpu)
        #: directory listings, shared by every lookup (sys.path_importer_cache)
        self._listings: dict[str, object] = {}
        #: top-level names setuptools' editable finders answered
        self._editable_hits: set[str] = set()

    # -- finding modules -------------------------------------------------------

    def search_path(self, *, at_site: bool = False) -> list[str]:
        """The directories of sys.path in order; ``at_site``: as they are
        when site.py imports sitecustomize (sys.path[0] comes later)."""
        return [e.path for e in self.paths.entries if e.kind not in _NO_DIR
                and not (at_site and e.kind in ("script-dir", "cwd"))]

    def locate(self, name: str, search: Sequence[str]) -> Located:
        """Where ``import name`` (top level) is found: the path finder on
        ``search``, then setuptools' editable finders (``sys.meta_path``
        after the path finder)."""
        from .finder import Scope, find_top_level

        loc = find_top_level(name, search, self.suffixes, self.budget,
                             Scope(self.node, self.cwd, self._listings,  # type: ignore[arg-type]
                                   self.files))
        if loc.kind != "missing" or not self.paths.editables:
            return loc
        from .editable import locate

        hit = locate(name, self.paths.editables, self.suffixes, self.budget,
                     Scope(self.node, self.cwd, files=self.files))
        if hit is None:
            return loc
        if hit.kind == "missing":
            return Located(name=name, kind="missing", path="", entry="",
                           foreign=(*loc.foreign, *hit.foreign))
        self._editable_hits.add(name)
        return hit

    def startup_modules(self) -> list[tuple[str, Located]]:
        """``sitecustomize`` and (with the user site enabled) ``usercustomize``
        as site.py imports them: on sys.path without sys.path[0], after the
        .pth files (editable finders included). Only found ones are listed."""
        out = []
        search = self.search_path(at_site=True)
        for name in _STARTUP:
            if name == "usercustomize" and self.paths.user_site is None:
                continue
            loc = self.locate(name, search)
            if loc.kind != "missing":
                out.append((name, loc))
        return out

    def pth_imports(self) -> tuple[str, ...]:
        """The top-level modules the ``.pth`` import lines import.

        site.py ``exec``s every line that starts with ``import`` (a space
        or a tab after it) while it reads the site directories, before the
        step's own code: ``import _virtualenv``, setuptools' editable
        finders, distutils-precedence.pth's ``__import__('_distutils_hack')``.
        A line is Python source run at module level, so it is read as a
        ``-c`` text is (every statement after the first ``;`` counts, and an
        ``and``-guarded ``__import__`` counts as if its guard held). The
        names are found later on the whole ``sys.path``, not on the part
        that stood when the line ran; a line that fails (site.py then skips
        the rest of its file) is not modelled either.

        Parsing costs about 0.5 ms per KiB (far more on a loaded node) and a
        site directory is the user's: a line is read up to its last ``;``
        within :data:`PTH_LINE_BYTES` (the imports open such lines), and all
        lines together up to :data:`PTH_TOTAL_BYTES`; what lies beyond names
        nothing (unknown use, as for a script that does not parse)."""
        from .usage import source_imports

        names: dict[str, None] = {}
        left = PTH_TOTAL_BYTES
        for pth, line in self.paths.pth_imports:
            self.budget.tick()
            if len(line) > PTH_LINE_BYTES:
                line = line[:line.rfind(";", 0, PTH_LINE_BYTES) + 1]
            left -= len(line)
            if left < 0:
                break
            for found in source_imports(line, pth):
                names[found] = None
        return tuple(names)

    def startup_imports(self) -> tuple[str, ...]:
        """The top-level modules sitecustomize/usercustomize import when they
        run (their module-level imports, read as a script's are). A compiled
        or bytecode-only one names nothing."""
        from .usage import command_imports

        names: dict[str, None] = {}
        for _name, loc in self.startup_modules():
            source = loc.path if loc.kind == "source" else (
                f"{loc.path}/__init__.py" if loc.kind == "package" else None)
            if source is None:
                continue
            for found in command_imports("script", source, cwd=self.cwd, node=self.node,
                                         budget=self.budget, files=self.files):
                names[found] = None
        return tuple(names)

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
        search = self.search_path()
        out: list[Group] = []
        # The standard library's extension modules load for nearly every
        # step: judged with normal severities. Those of the node's own
        # distribution Python are its packages' files, built for this node:
        # judged there only when the step's LD_LIBRARY_PATH can make their
        # libraries resolve to something else (about half of a cold
        # `python3 -c pass` check was reading its ~45 of them otherwise).
        for e in entries:
            if e.kind != "lib-dynload":
                continue
            if e.system and not (self.node.root_is_native and self.env.get("LD_LIBRARY_PATH")):
                continue
            names = [f"{e.path}/{n}" for n in _listdir(self._host(e.path), self.files)
                     if ".so" in n]
            found = self._loadables(classify(names, e.path, self.suffixes))
            out.append(Group("the standard library", e.path, True, tuple(found)))
        # Distributions, per sys.path entry that holds metadata.
        by_dir: dict[str, tuple[Dist, ...]] = {}
        for e in entries:
            if e.system or e.kind in _NO_DISTS or e.path in by_dir:
                continue
            by_dir[e.path] = tuple(dists_in(e.path, self.node, self.version, self.budget,
                                            self.files))
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
            elif name in self._editable_hits:
                # an editable install's source directory (an extension built
                # in place on the login node lies there)
                if loc.kind in ("package", "extension") and not is_system(loc.path, self.node):
                    out.append(Group(f"{name} (editable install)", loc.path, True,
                                     tuple(self._module_issues(loc, name))))
            elif (loc.entry not in by_dir and loc.kind in ("package", "extension")
                  and not self._system_entry(loc.entry)):
                out.append(Group(name, loc.path, True, tuple(self._module_issues(loc, name))))
        out += self._editable_unused(search, located, used_names)
        return out

    def _module_issues(self, loc: Located, name: str) -> list[Issue]:
        return (self._tree(loc.path, name) if loc.kind == "package"
                else self.judge.file(loc.path, module=name))

    def _editable_unused(self, search: Sequence[str], located: Mapping[str, Located],
                         used_names: Sequence[str]) -> list[Group]:
        """What else the editable finders map, judged as an import would
        reach it (a name found on sys.path first is not the editable one):
        used when it lies under a used top-level name (``ns.sub`` of an
        editable namespace package ``ns``), else a warning."""
        out: list[Group] = []
        done = set(located)
        for finder in self.paths.editables:
            for name, _path in finder.mapping:
                if name in done:
                    continue
                done.add(name)
                self.budget.tick()
                used = "." in name and name.split(".", 1)[0] in used_names
                loc = self.locate(name, search)
                if loc.kind == "missing" and loc.foreign:
                    out.append(Group(f"{name} (editable install)", loc.foreign[0], used,
                                     (self._foreign_issue(name, loc.foreign),)))
                elif (name in self._editable_hits and loc.kind in ("package", "extension")
                      and not is_system(loc.path, self.node)):
                    found = self._module_issues(loc, name)
                    if found:
                        out.append(Group(f"{name} (editable install)", loc.path, used,
                                         tuple(found)))
        return out

    def _system_entry(self, path: str) -> bool:
        return any(e.system for e in self.paths.entries if e.path == path)

    def _node_builds(self, path: str) -> bool:
        """Whether the node has its own build where this host holds ``path``:
        the distribution's Python (its lib-dynload, its dist-packages) seen
        from a login node of another architecture."""
        from .sitepath import is_system

        return not self.node.root_is_native and is_system(path, self.node)

    def _owners(self, names: Sequence[str], search: Sequence[str],
                by_dir: Mapping[str, tuple[Dist, ...]]) -> tuple[set[str], dict[str, Located]]:
        """The distributions that provide the used top-level names, as the
        finder would find them (the first entry of sys.path wins)."""
        roots: set[str] = set()
        located: dict[str, Located] = {}
        for name in names:
            self.budget.tick()
            loc = self.locate(name, search)
            located[name] = loc
            for d in by_dir.get(loc.entry, ()):
                if name in d.top_level:
                    roots.add(d.name)
                    break
        return roots, located

    # -- one distribution -----------------------------------------------------

    def _dist(self, dist: Dist, site_dir: str) -> tuple[list[Issue], tuple[str, ...]]:
        files = record_files(self._host(dist.meta_dir), site_dir, self.budget, self.files)
        if files is None:
            # No RECORD (egg-info, a hand-made install): walk what it names.
            problems: list[Issue] = []
            for top in dist.top_level:
                path = f"{site_dir.rstrip('/')}/{top}"
                if self.files.isdir(path):
                    problems += self._tree(path, top)
            return problems, tuple(dist.top_level)
        # RECORD says where compiled files are; the directories themselves say
        # what is there now: one site dir filled from two machines keeps the
        # files of both, while RECORD lists only the last install's.
        shared: list[str] = []
        sources: set[str] = set()
        for directory in sorted({p.rsplit("/", 1)[0] for p in files.shared}):
            for name in _listdir(self._host(directory), self.files):
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
        from .finder import DATA_DIRS, Scope, package_extensions

        modules, foreign = package_extensions(pkg_dir, self.suffixes, self.budget,
                                              scope=Scope(self.node, files=self.files),
                                              skip_dirs=DATA_DIRS)
        libraries = tuple(p for _m, p in modules if is_library(os.path.basename(p)))
        return self._loadables(Loadables(
            tuple((m, p) for m, p in modules if p not in libraries), libraries,
            tuple((m, tuple(f)) for m, f in foreign)))

    def _unclaimed(self, site_dir: str, claimed: set[str], used: Sequence[str]
                   ) -> list[Group]:
        """Top-level entries of a site directory that no RECORD lists."""
        out: list[Group] = []
        base = site_dir.rstrip("/")
        for name in _listdir(self._host(site_dir), self.files):
            if name in claimed or name.endswith(_META_SUFFIXES) or name == "__pycache__":
                continue
            self.budget.tick()
            path = f"{base}/{name}"
            top = name.split(".", 1)[0]
            if ".so" in name:
                problems = self._loadables(classify([path], site_dir, self.suffixes))
            elif "." not in name and self.files.isdir(self._host(path)):
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

            out += torch_issues(f"{base}/torch", dist.meta_dir, self.ctx)
        elif name == _TORCHCODEC:
            from .torchcodec import torchcodec_issues

            out += torchcodec_issues(f"{base}/torchcodec", self.env, self.cwd, self.node,
                                     self.budget, self.files)
        if name in _JIT_USERS and not getattr(self, "_jit_done", False):
            self._jit_done = True
            from .jitcache import jit_cache_issues

            out += jit_cache_issues(self.env, self.node, self.budget, files=self.files)
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

