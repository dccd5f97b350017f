"""Follow a batch script's statements with the state it builds.

The reader keeps what bash would have at each line: variables (the step's
environment, exported, plus what lines assign), the working directory, the
functions defined. It hands back every command it can know, each with the
environment and directory it would run with and whether it is on the
*main path*: top level, not inside ``if``/``case``/loops/functions/
subshells, not right of ``&&``/``||``, and not after a line whose effect a
reader cannot know (``module load``, ``source`` of an unknown file, a
function call, a block that changed the state). Nothing is ever run.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from .. import fsprobe
from .._record import dataclass, field, replace
from ..budget import Budget, BudgetExceeded
from ..launch import which
from . import builtins, envs
from .srunopts import apply_export, srun_command
from .words import ShellVars, fields, is_name, value

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

#: Statements walked, and nesting followed, before the rest is left unread.
MAX_STATEMENTS = 20000
MAX_DEPTH = 64
#: Characters of a command's source text kept for messages.
TEXT_CHARS = 160

#: Commands whose effect on the environment a reader cannot know: shell
#: functions a profile defines (``module``, ``ml``, ...) and ``eval``.
_UNKNOWABLE = frozenset({"module", "ml", "spack", "eval", "setenv", "use", "envmodule",
                         "lmod", "source_env", "direnv", "pyenv", "nvm", "conda.sh"})
#: How a command's first word is looked up: as bash does by default
#: (functions, builtins, then PATH); after ``command`` (no functions); after
#: ``exec`` or ``nohup`` (a program only); after ``builtin`` (builtins only).
_ANY, _NO_FUNCTIONS, _PROGRAM, _BUILTIN = "any", "command", "program", "builtin"
_CONDA = frozenset({"conda", "mamba", "micromamba"})
#: ``eval "$(conda shell.bash hook)"`` and its spellings (compiled when met).
_HOOK = r"""^eval\s+["']?\$\(\s*(\S+)\s+shell(\.bash|\s+hook)"""


@dataclass(frozen=True)
class Command:
    """One command the script will run, as the step it will be."""

    line: int
    text: str
    argv: tuple[str, ...]
    env: dict[str, str]
    cwd: str
    #: On the main path (rule severities apply) or not (warnings only).
    certain: bool
    #: Started as an ``srun`` step (the plugin will also judge it there).
    srun: bool = False


@dataclass(frozen=True)
class Start:
    """How slurmd starts the script: its environment and directory, its
    arguments and path, the shell its #! line names ("bash", "dash" or
    "sh", which may be either) and whether that is a login shell."""

    env: Mapping[str, str]
    cwd: str
    args: tuple[str, ...] = ()
    script: str = ""
    shell: str = "bash"
    login: bool = False
    #: The files the script's paths are looked up in (this host's).
    files: fsprobe.Files = field(default=fsprobe.HOST, compare=False)


@dataclass
class Reading:
    commands: list[Command] = field(default_factory=list)
    #: The first line after which nothing is certain, and why.
    uncertain: tuple[int, str] | None = None
    #: Variables unset on the main path before its first command.
    unset_first: set[str] = field(default_factory=set)
    #: Commands not judged because a word of them cannot be known.
    unknown: int = 0
    statements: int = 0
    #: Where the reading stopped early (the budget), else None.
    limit: str | None = None
    #: Why the script was not read at all (no parser), else None.
    skipped: str | None = None


@dataclass
class _State:
    shell: ShellVars
    cwd: str | None
    functions: set[str] = field(default_factory=set)
    #: Main path still certain (no unknowable line so far).
    sure: bool = True
    done: bool = False
    #: ``hash -p FILE NAME``: NAME -> (FILE, ShellVars.path_epoch then:
    #: assigning PATH empties bash's table).
    hashed: dict[str, tuple[str, int]] = field(default_factory=dict)

    def copy(self) -> _State:
        return _State(self.shell.copy(), self.cwd, set(self.functions), self.sure, self.done,
                      dict(self.hashed))

    def same(self, other: _State) -> bool:
        return (self.shell.values == other.shell.values
                and self.shell.exported == other.shell.exported
                and self.cwd == other.cwd and self.functions == other.functions
                and self.hashed == other.hashed
                and self.shell.args == other.shell.args
                and self.shell.allexport == other.shell.allexport)


@dataclass(frozen=True)
class _At:
    """One simple command being read: its node, the state it runs in, on
    the main path or not, its line, the assignments before its name, and
    whether ``exec -c`` empties its environment."""

    node: Any
    state: _State
    main: bool
    line: int
    extra: Mapping[str, str | None]
    clear: bool = False


def _text(node: Any) -> str:
    return node.text.decode("utf-8", "surrogateescape")


def _short(node: Any) -> str:
    text = " ".join(_text(node).split())
    return text if len(text) <= TEXT_CHARS else text[:TEXT_CHARS - 3] + "..."


def _same_dir(a: str, b: str, files: fsprobe.Files) -> bool:
    try:
        one, two = files.stat(a), files.stat(b)
    except (OSError, ValueError):
        return False
    return (one.st_dev, one.st_ino) == (two.st_dev, two.st_ino)


def _start_dirs(shell: ShellVars, cwd: str, files: fsprobe.Files) -> str:
    """PWD and OLDPWD as the shell sets them at start-up (bash's
    ``set_pwd``, dash's ``getpwd``): the inherited PWD when it is absolute
    and names the directory the shell starts in (kept as written), else that
    directory's physical path (``getcwd``); exported either way. OLDPWD is
    dropped unless it names a directory, and is exported once ``cd`` sets
    it. Returns the shell's own idea of its directory (what ``cd ..``
    starts from). Slurm starts the script in the job's directory
    (``--chdir`` or the submit directory) with the submitting shell's PWD."""
    inherited = shell.get("PWD")
    if inherited and inherited.startswith("/") and _same_dir(inherited, cwd, files):
        here = os.path.normpath(inherited)
    else:
        try:
            here = files.realpath(cwd)
        except (OSError, ValueError):
            here = cwd
        shell.values["PWD"] = here
    shell.exported.add("PWD")
    old = shell.get("OLDPWD")
    if old is None or not files.isdir(os.path.join(here, old)):
        shell.values.pop("OLDPWD", None)
    shell.exported.add("OLDPWD")
    return here


class Reader:
    def __init__(self, source: bytes, tree: Any, start: Start, budget: Budget) -> None:
        self.budget = budget
        self.files = start.files
        self.source = source
        self.tree = tree
        self.dialect = start.shell
        env = start.env
        shell = ShellVars(dict(env), set(env), tuple(start.args), start.script)
        cwd = _start_dirs(shell, start.cwd, start.files)
        self.state = _State(shell, cwd)
        self.out = Reading()
        self.first_command_seen = False
        if start.login:
            self._uncertain(1, "a login shell (#! ... -l) first reads the user's profile")
        if env.get("BASH_ENV") and start.shell == "bash":
            self._uncertain(1, "BASH_ENV names a file bash reads before the script")
        if "allexport" in (env.get("SHELLOPTS") or "").split(":"):
            # bash turns on what SHELLOPTS lists; dash does not read it.
            if start.shell == "bash":
                shell.allexport = True
            elif start.shell == "sh":
                self._uncertain(1, "SHELLOPTS turns allexport on if /bin/sh is bash")

    # -- bookkeeping ------------------------------------------------------
    def _uncertain(self, line: int, why: str) -> None:
        if self.out.uncertain is None:
            self.out.uncertain = (line, why)
        self.state.sure = False

    def read(self) -> Reading:
        try:
            self._block(self.tree.root_node.children, self.state, True, 0)
        except BudgetExceeded as exc:
            self.out.limit = str(exc)
        return self.out

    def _tick(self) -> None:
        self.out.statements += 1
        if self.out.statements > MAX_STATEMENTS:
            raise BudgetExceeded(f"the batch script has more than {MAX_STATEMENTS} statements")
        self.budget.tick()

    # -- statements -------------------------------------------------------
    def _block(self, nodes: Any, state: _State, main: bool, depth: int) -> None:
        for node in nodes:
            if state.done:
                return
            if not node.is_named or node.type == "comment":
                continue
            self._statement(node, state, main, depth)

    def _nested(self, nodes: Any, state: _State, depth: int, line: int, what: str,
                keep: bool = False) -> None:
        """Statements that may or may not run (branches, loops, function
        bodies, subshells, right of && / ||): judged as warnings, on a copy
        of the state. A change they make leaves the rest uncertain, unless
        ``keep`` (a subshell: its changes die with it)."""
        inner = state.copy()
        inner.sure = False
        self._block(nodes, inner, False, depth + 1)
        if not keep and not inner.same(state):
            if state is self.state:
                self._uncertain(line, f"{what} changes the environment or directory")
            else:
                state.sure = False

    def _statement(self, node: Any, state: _State, main: bool, depth: int) -> None:
        self._tick()
        line = node.start_point[0] + 1
        if depth > MAX_DEPTH:
            self._uncertain_at(state, line, "nesting deeper than the reader follows")
            return
        if node.has_error or node.is_missing:
            self._uncertain_at(state, line, "bash cannot parse this line")
            return
        kind = node.type
        if kind == "command":
            self._command(node, state, main, line)
        elif kind in ("variable_assignment", "variable_assignments"):
            self._assignments(node, state, export=False)
        elif kind == "declaration_command":
            self._declaration(node, state, line)
        elif kind == "unset_command":
            self._unset(node, state)
        elif kind == "redirected_statement":
            body = node.child_by_field_name("body")
            if body is not None:
                self._statement(body, state, main, depth + 1)
        elif kind == "negated_command":
            self._block(node.named_children, state, main, depth + 1)
        elif kind == "pipeline":
            members = [c for c in node.named_children if c.type != "comment"]
            for member in members:
                # Every member runs, in a subshell of its own: what it sets is lost.
                inner = state.copy()
                self._statement(member, inner, main, depth + 1)
        elif kind == "list":
            kids = [c for c in node.children if c.is_named and c.type != "comment"]
            if kids:
                self._statement(kids[0], state, main, depth + 1)
                if len(kids) > 1:
                    self._nested(kids[1:], state, depth, line, "the right side of && or ||")
        elif kind == "compound_statement":
            if node.children and node.children[0].type == "((":
                self._arith(node, state)
            else:
                self._block(node.named_children, state, main, depth + 1)
        elif kind == "subshell":
            self._nested(node.named_children, state, depth, line, "a subshell", keep=True)
        elif kind in ("if_statement", "case_statement", "for_statement", "while_statement",
                      "c_style_for_statement", "until_statement", "select_statement"):
            what = "for" if kind == "c_style_for_statement" else kind.split("_")[0]
            self._nested(node.named_children, state, depth, line, f"this {what}")
        elif kind in ("elif_clause", "else_clause", "case_item", "do_group"):
            self._block(node.named_children, state, main, depth + 1)
        elif kind == "function_definition":
            name = node.child_by_field_name("name")
            body = node.child_by_field_name("body")
            if name is not None:
                state.functions.add(_text(name))
            if body is not None:
                inner = state.copy()
                inner.sure = False
                self._block([body], inner, False, depth + 1)
        elif kind in ("test_command", "heredoc_body", "word", "string", "concatenation",
                      "number", "raw_string", "simple_expansion", "expansion",
                      "file_redirect", "heredoc_redirect", "herestring_redirect",
                      "variable_name", "command_substitution"):
            return  # conditions and leftovers of compound statements
        else:
            self._uncertain_at(state, line, f"the reader does not follow '{kind}'")

    def _uncertain_at(self, state: _State, line: int, why: str) -> None:
        if state is self.state:
            self._uncertain(line, why)
        else:
            state.sure = False

    def _arith(self, node: Any, state: _State) -> None:
        stack = [node]
        while stack:
            current = stack.pop()
            self.budget.tick()
            if current.type == "variable_name":
                name = _text(current)
                if name in state.shell.values:
                    state.shell.values[name] = None
            stack.extend(current.children)

    # -- assignments ------------------------------------------------------
    def _assign(self, node: Any, state: _State, export: bool) -> None:
        name_node = node.child_by_field_name("name")
        if name_node is None or name_node.type != "variable_name":
            return  # arr[i]=..., unusual: arrays are never exported
        name = _text(name_node)
        val_node = node.child_by_field_name("value")
        if val_node is not None and val_node.type == "array":
            state.shell.set(name, None)
            return
        text = value(val_node, state.shell)
        if any(c.type == "+=" for c in node.children):
            old = state.shell.get(name)
            text = None if old is None or text is None else old + text
        state.shell.set(name, text, export=export or name in state.shell.exported)

    def _assignments(self, node: Any, state: _State, export: bool) -> None:
        targets = [node] if node.type == "variable_assignment" else [
            c for c in node.named_children if c.type == "variable_assignment"]
        for target in targets:
            self._assign(target, state, export)

    def _declaration(self, node: Any, state: _State, line: int) -> None:
        keyword = node.children[0].type if node.children else ""
        flags = "".join(_text(c)[1:] for c in node.named_children
                        if c.type == "word" and _text(c).startswith("-"))
        export = keyword == "export" or "x" in flags
        if keyword == "export" and "n" in flags:
            for child in node.named_children:
                if child.type == "variable_name":
                    state.shell.exported.discard(_text(child))
            return
        if "f" in flags or "a" in flags or "A" in flags:
            return
        for child in node.named_children:
            if child.type == "variable_assignment":
                self._assign(child, state, export)
            elif child.type == "variable_name":
                name = _text(child)
                if export:
                    state.shell.exported.add(name)
                elif keyword == "local" or keyword in ("declare", "typeset"):
                    state.shell.values.setdefault(name, "")
            elif child.type != "word":
                self._uncertain_at(state, line, f"'{keyword}' with a computed name")

    def _unset(self, node: Any, state: _State) -> None:
        funcs = False
        for child in node.named_children:
            text = _text(child)
            if child.type == "word" and text.startswith("-"):
                funcs = "f" in text
                continue
            if funcs:
                state.functions.discard(text)
                continue
            state.shell.unset(text)
            if state is self.state and not self.first_command_seen:
                self.out.unset_first.add(text)

    # -- commands ---------------------------------------------------------
    def _command(self, node: Any, state: _State, main: bool, line: int) -> None:
        prefix = [c for c in node.children if c.type == "variable_assignment"]
        name = node.child_by_field_name("name")
        if name is None:
            for assignment in prefix:
                self._assign(assignment, state, export=False)
            return
        words: list[str] | None = []
        for child in node.children:
            if child.type in ("variable_assignment", "file_redirect", "heredoc_redirect",
                              "herestring_redirect") or not (child.is_named or
                                                             child.type == "$"):
                continue  # (a lone '$' is a word: itself)
            if child.type == "command_name":
                child = child.named_children[0] if child.named_children else child
            got = fields(child, state.shell)
            if got is None:
                words = None
                break
            words.extend(got)
        if main:
            self.first_command_seen = True
        head = _text(name)
        if words is None or not words:
            if words is None and (head in ("source", ".", "cd", "pushd", "popd", "export",
                                           "read", "set", "shift", "deactivate")
                                  or head in _UNKNOWABLE or head in _CONDA
                                  or head in state.functions):
                if head == "eval" and self._conda_hook(node, state):
                    return
                self._uncertain_at(state, line, f"'{_short(node)}' cannot be read")
            elif words is None:
                self.out.unknown += 1
            return
        env_extra: dict[str, str | None] = {}
        for assignment in prefix:
            n = assignment.child_by_field_name("name")
            if n is not None:
                env_extra[_text(n)] = value(assignment.child_by_field_name("value"),
                                            state.shell)
        self._run(words, _At(node, state, main, line, env_extra))

    def _run(self, words: list[str], at: _At, lookup: str = _ANY,
             path: str | None = None) -> None:
        """One command's words, looked up as bash looks up its first word
        (``lookup``, ``path``: see _ANY); a program it starts is kept."""
        cmd = words[0]
        state = at.state
        if lookup == _ANY:
            if cmd in state.functions:
                if cmd == "deactivate":
                    self._deactivate_venv(state)
                    return
                self._uncertain_at(state, at.line, f"the function '{cmd}' may change the "
                                   "environment")
                return
            if cmd == "time":  # a keyword: times the command after it
                rest = builtins.after_options(words[1:], "p")
                if rest:
                    self._run(rest, at)
                return
        if lookup != _PROGRAM and cmd in builtins.BUILTINS:
            self._builtin(words, at, path)
            return
        if lookup == _BUILTIN:
            return  # 'builtin X' of no builtin: an error, nothing runs
        if cmd == "nohup":
            rest = builtins.after_options(words[1:], "")
            if rest:
                self._run(rest, at, _PROGRAM)
            return
        if lookup == _ANY:
            if cmd in _CONDA and self._conda(words, state, at.line):
                return
            if cmd in _UNKNOWABLE:
                self._uncertain_at(state, at.line, f"'{_short(at.node)}' changes the "
                                   "environment in ways a reader cannot know")
                return
        self._program(words, at, path)

    def _builtin(self, words: list[str], at: _At, path: str | None) -> None:
        """A builtin: what it changes in the state, or the command it runs."""
        cmd = words[0]
        state, line = at.state, at.line
        if cmd == "command":
            parsed = builtins.command_words(words[1:])
            if parsed is not None and parsed[0] != "describe" and parsed[1]:
                self._run(parsed[1], at, _NO_FUNCTIONS,
                          builtins.STD_PATH if parsed[0] == "std" else path)
        elif cmd == "builtin":
            rest = builtins.after_options(words[1:], "")
            if rest:
                self._run(rest, at, _BUILTIN, path)
        elif cmd == "exec":
            self._exec(words[1:], at)
        elif cmd == "exit":
            if at.main and state is self.state:
                state.done = True
        elif cmd in ("cd", "pushd"):
            self._cd(words[1:], state, line)
        elif cmd == "popd":
            self._uncertain_at(state, line, "'popd' returns to a directory the reader "
                               "does not track")
        elif cmd in ("source", "."):
            self._source(words[1:], at.node, state, line)
        elif cmd in ("export", "declare", "typeset", "readonly", "local", "unset", "eval"):
            self._uncertain_at(state, line, f"'{_short(at.node)}' cannot be read")
        elif cmd in ("set", "shift"):
            self._positional(words, at)
        elif cmd in ("read", "getopts", "mapfile", "readarray", "let"):
            for word in words[1:]:
                for name in _names_in(word) if cmd == "let" else [word]:
                    if is_name(name) and (cmd != "let" or name in state.shell.values):
                        state.shell.set(name, None)
        elif cmd == "printf":
            if len(words) > 2 and words[1] == "-v" and is_name(words[2]):
                state.shell.set(words[2], None)
        elif cmd == "hash":
            self._hash(words[1:], at)
        # Any other builtin changes nothing a later command depends on.

    def _positional(self, words: list[str], at: _At) -> None:
        """``set`` and ``shift``: allexport and the arguments, and where a
        POSIX shell ends the script on their error."""
        shell = at.state.shell
        run = builtins.run_set if words[0] == "set" else builtins.run_shift
        after = run(self.dialect, words[1:], shell.allexport, shell.args)
        shell.allexport, shell.args = after.allexport, after.args
        if after.ends is None:
            self._uncertain_at(at.state, at.line, f"'{_short(at.node)}' fails: dash "
                               "and bash as sh go on differently")
        elif after.ends and at.main and at.state is self.state:
            at.state.done = True

    def _hash(self, words: list[str], at: _At) -> None:
        """``hash -p FILE NAME``: NAME then runs FILE (bash; dash has no -p)."""
        parsed = builtins.hash_words(words)
        if parsed is None:
            return
        flush, file, delete, names = parsed
        table = at.state.hashed
        if flush:
            table.clear()
        if file is not None and self.dialect != "dash":
            if self.dialect == "sh":
                self._uncertain_at(at.state, at.line, "'hash -p' works only if /bin/sh "
                                   "is bash")
            for name in names:
                table[name] = (file, at.state.shell.path_epoch)
        elif delete:
            for name in names:
                table.pop(name, None)

    def _exec(self, words: list[str], at: _At) -> None:
        parsed = builtins.exec_words(words)
        if parsed is None or not parsed[1]:
            return  # a usage error, or 'exec > log' (only redirects): the script goes on
        clear, rest = parsed
        self._run(rest, replace(at, clear=clear or at.clear), _PROGRAM)
        if at.main and at.state is self.state:
            at.state.done = True  # replaced, or (not found) bash exits

    def _program(self, words: list[str], at: _At, path: str | None) -> None:
        """A program the shell starts, found as bash finds it: with ``path``
        (``command -p``), else the shell's own PATH variable (exported or
        not, or the one assigned before the name)."""
        state = at.state
        env = state.shell.environ()
        if env is None or state.cwd is None:
            self.out.unknown += 1
            return
        for key, val in at.extra.items():
            if val is None:
                self.out.unknown += 1
                return
            env[key] = val
        if at.clear:
            env = {}
        cmd = words[0]
        if path is None:
            path = at.extra["PATH"] if "PATH" in at.extra else state.shell.get("PATH")
            hashed = state.hashed.get(cmd) if "/" not in cmd else None
            if hashed is not None and hashed[1] == state.shell.path_epoch:
                words = [hashed[0], *words[1:]]
                cmd = hashed[0]
        if "/" not in cmd and path != env.get("PATH"):
            # The child's PATH is not the one bash searched: judge the file found.
            found = (which(cmd, path, state.cwd, self.budget, self.files) if path is not None
                     else None)
            if found is None:
                if path is None:
                    self.out.unknown += 1
                return  # bash: command not found; nothing runs
            words = [found, *words[1:]]
            cmd = found
        sure = at.main and state.sure
        text = _short(at.node)
        line = at.line
        if os.path.basename(cmd) == "srun":
            parsed = srun_command(words)
            if parsed is None:
                self.out.unknown += 1
                return
            command, opts = parsed
            step_env = apply_export(opts.get("export"), env)
            cwd = opts.get("chdir", state.cwd)
            if step_env is None:
                self.out.unknown += 1
                return
            if not cwd.startswith("/"):
                cwd = os.path.normpath(os.path.join(state.cwd, cwd))
            if os.path.basename(command[0]) == "srun":
                return
            self.out.commands.append(Command(line, text, tuple(command), step_env, cwd,
                                             sure, srun=True))
            return
        if cmd == "env":
            inner = self._env_command(words, env)
            if inner is None:
                self.out.unknown += 1
                return
            argv, env = inner
            self.out.commands.append(Command(line, text, tuple(argv), env, state.cwd, sure))
            return
        self.out.commands.append(Command(line, text, tuple(words), env, state.cwd, sure))

    @staticmethod
    def _env_command(words: list[str], env: dict[str, str]
                     ) -> tuple[list[str], dict[str, str]] | None:
        out = dict(env)
        i = 1
        while i < len(words):
            word = words[i]
            if word in ("-i", "--ignore-environment", "-"):
                out = {}
            elif word in ("-u", "--unset") and i + 1 < len(words):
                out.pop(words[i + 1], None)
                i += 1
            elif word.startswith("-"):
                return None  # -S, -C, ...: not followed
            elif "=" in word:
                key, _eq, val = word.partition("=")
                out[key] = val
            else:
                return words[i:], out
            i += 1
        return None

    # -- state changes ----------------------------------------------------
    def _cd(self, args: list[str], state: _State, line: int) -> None:
        args = [a for a in args if a not in ("-P", "-L", "-e", "--")]
        if not args:
            target = state.shell.get("HOME")
        elif args[0] == "-":
            target = state.shell.get("OLDPWD")
        else:
            target = args[0]
        if target is None or state.cwd is None:
            state.cwd = None
            self._uncertain_at(state, line, "'cd' to a directory the reader cannot know")
            return
        path = target if target.startswith("/") else os.path.join(state.cwd, target)
        path = os.path.normpath(path)
        if not self.files.isdir(path):
            self._uncertain_at(state, line, f"'cd {target}': no such directory here")
            return
        state.shell.set("OLDPWD", state.cwd)
        state.shell.set("PWD", path)
        state.cwd = path

    def _find_sourced(self, name: str, state: _State) -> str | None:
        if "/" in name:
            base = state.cwd
            if base is None and not name.startswith("/"):
                return None
            return name if name.startswith("/") else os.path.join(base or "/", name)
        # bash looks a name without '/' up in PATH, then in the cwd.
        found = which(name, state.shell.get("PATH"), state.cwd or "/", self.budget, self.files)
        if found is not None:
            return found
        if state.cwd and self.files.isfile(os.path.join(state.cwd, name)):
            return os.path.join(state.cwd, name)
        return None

    def _source(self, args: list[str], node: Any, state: _State, line: int) -> None:
        if not args:
            return
        path = self._find_sourced(args[0], state)
        if path is None:
            self._uncertain_at(state, line, f"'{_short(node)}': file not found")
            return
        base = os.path.basename(path)
        parent = os.path.dirname(path)
        if base == "conda.sh" and parent.endswith("/etc/profile.d"):
            root = os.path.dirname(os.path.dirname(parent))
            state.shell.set("CONDA_EXE", f"{root}/bin/conda", export=True)
            state.shell.set("CONDA_PYTHON_EXE", f"{root}/bin/python", export=True)
            state.shell.set("_CE_CONDA", "", export=True)
            state.functions.discard("conda")
            return
        if base == "activate":
            if self.files.isfile(os.path.join(parent, "conda")):
                # conda's own bin/activate: 'source activate [NAME]'
                state.shell.set("CONDA_EXE", os.path.join(parent, "conda"), export=True)
                self._conda(["conda", "activate", *(args[1:] or ["base"])], state, line)
                return
            venv = envs.venv_of_activate(path, self.budget, self.files)
            if venv is not None:
                self._activate_venv(venv, state)
                return
        self._uncertain_at(state, line, f"'{_short(node)}' runs a file the reader does "
                           "not follow")

    def _activate_venv(self, venv: str, state: _State) -> None:
        shell = state.shell
        old = shell.get("VIRTUAL_ENV")
        path = shell.get("PATH") or ""
        if old:
            path = _drop_path(path, f"{old}/bin")
        shell.set("VIRTUAL_ENV", venv, export=True)
        shell.set("PATH", f"{venv}/bin:{path}" if path else f"{venv}/bin", export=True)
        shell.unset("PYTHONHOME")
        state.functions.add("deactivate")

    def _deactivate_venv(self, state: _State) -> None:
        shell = state.shell
        old = shell.get("VIRTUAL_ENV")
        if old:
            shell.set("PATH", _drop_path(shell.get("PATH") or "", f"{old}/bin"), export=True)
        shell.unset("VIRTUAL_ENV")
        state.functions.discard("deactivate")

    def _conda_hook(self, node: Any, state: _State) -> bool:
        """``eval "$(conda shell.bash hook)"``: defines the conda function;
        its effect is the ``CONDA_EXE`` of the conda that printed it."""
        import re

        match = re.match(_HOOK, _text(node).strip())
        if not match:
            return False
        exe = match.group(1)
        found = exe if "/" in exe else which(exe, state.shell.get("PATH"), state.cwd or "/",
                                             self.budget, self.files)
        if found is None or os.path.basename(found) not in _CONDA:
            return False
        if os.path.basename(found) == "micromamba":
            return False  # its hook sets MAMBA_ROOT_PREFIX from its own config
        state.shell.set("CONDA_EXE", found, export=True)
        return True

    def _conda(self, words: list[str], state: _State, line: int) -> bool:
        """``conda activate NAME|PREFIX`` / ``conda deactivate``; False for
        other subcommands (judged as commands)."""
        if len(words) < 2 or words[1] not in ("activate", "deactivate"):
            return False
        shell = state.shell
        if words[1] == "deactivate":
            old = shell.get("CONDA_PREFIX")
            if old:
                shell.set("PATH", _drop_path(shell.get("PATH") or "", f"{old}/bin"),
                          export=True)
            if (shell.get("CONDA_SHLVL") or "1") not in ("0", "1"):
                self._uncertain_at(state, line, "'conda deactivate' returns to an "
                                   "environment the reader does not track")
            for name in ("CONDA_PREFIX", "CONDA_DEFAULT_ENV", "CONDA_PROMPT_MODIFIER"):
                shell.unset(name)
            return True
        rest = [w for w in words[2:] if not w.startswith("-")]
        stack = "--stack" in words
        name = rest[0] if rest else "base"
        values = dict(shell.values)
        if words[0] == "micromamba" and not values.get("MAMBA_ROOT_PREFIX"):
            values["MAMBA_ROOT_PREFIX"] = None
        prefix = envs.conda_prefix(name, values, state.cwd or "/", self.budget, self.files)
        if prefix is None:
            self._uncertain_at(state, line, f"'conda activate {name}': no such environment "
                               "found (conda would fail)")
            return True
        old = shell.get("CONDA_PREFIX")
        path = shell.get("PATH") or ""
        if old and not stack:
            path = _drop_path(path, f"{old}/bin")
        shell.set("PATH", f"{prefix}/bin:{path}" if path else f"{prefix}/bin", export=True)
        shell.set("CONDA_PREFIX", prefix, export=True)
        shell.set("CONDA_DEFAULT_ENV", name, export=True)
        level = shell.get("CONDA_SHLVL") or "0"
        shell.set("CONDA_SHLVL", str(int(level) + 1) if builtins.is_digits(level) else None,
                  export=True)
        if envs.has_activate_hooks(prefix, self.files):
            self._uncertain_at(state, line, f"{prefix}/etc/conda/activate.d runs scripts "
                               "on activation")
        return True


def _names_in(text: str) -> list[str]:
    """The variable names an arithmetic word (``let``) may assign."""
    out: list[str] = []
    word = ""
    for ch in text + " ":
        if ch.isascii() and (ch.isalnum() or ch == "_"):
            word += ch
            continue
        if word:
            out.append(word)
        word = ""
    return out


def _drop_path(path: str, entry: str) -> str:
    return ":".join(p for p in path.split(":") if p != entry)
