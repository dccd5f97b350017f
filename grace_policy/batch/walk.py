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

from .. import fsprobe
from .._record import dataclass, field
from ..budget import Budget, BudgetExceeded
from ..launch import which
from . import envs
from .srunopts import apply_export, srun_command
from .words import ShellVars, fields, value

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

#: Statements walked, and nesting followed, before the rest is left unread.
MAX_STATEMENTS = 20000
MAX_DEPTH = 64
#: Characters of a command's source text kept for messages.
TEXT_CHARS = 160

#: Builtins and keywords that change nothing a later command depends on.
_INERT = frozenset("""
echo printf true false : test [ [[ shopt trap wait pwd return break continue ulimit
umask hash type jobs disown alias unalias history let caller times help kill bg fg
logout suspend enable complete compgen
""".split())
#: Commands whose effect on the environment a reader cannot know.
_UNKNOWABLE = frozenset({"module", "ml", "spack", "eval", "setenv", "use", "envmodule",
                         "lmod", "source_env", "direnv", "pyenv", "nvm", "conda.sh"})
#: Programs that run their arguments as a command (after their own options).
_WRAPPERS = {"time": 0, "nohup": 0, "command": 0, "builtin": 0}
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

    def copy(self) -> _State:
        return _State(self.shell.copy(), self.cwd, set(self.functions), self.sure, self.done)

    def same(self, other: _State) -> bool:
        return (self.shell.values == other.shell.values
                and self.shell.exported == other.shell.exported
                and self.cwd == other.cwd and self.functions == other.functions
                and self.shell.args == other.shell.args)


def _text(node: Any) -> str:
    return node.text.decode("utf-8", "surrogateescape")


def _short(node: Any) -> str:
    text = " ".join(_text(node).split())
    return text if len(text) <= TEXT_CHARS else text[:TEXT_CHARS - 3] + "..."


class Reader:
    def __init__(self, source: bytes, tree: Any, env: dict[str, str], cwd: str,
                 args: tuple[str, ...], script: str, budget: Budget,
                 login: bool = False) -> None:
        self.budget = budget
        self.source = source
        self.tree = tree
        shell = ShellVars(dict(env), set(env), args, script)
        shell.values.setdefault("PWD", cwd)
        self.state = _State(shell, cwd)
        self.out = Reading()
        self.first_command_seen = False
        if login:
            self._uncertain(1, "a login shell (#! ... -l) first reads the user's profile")
        if env.get("BASH_ENV"):
            self._uncertain(1, "BASH_ENV names a file bash reads before the script")

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
            self._nested(node.named_children, state, depth, line, f"this {kind.split('_')[0]}")
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
                              "herestring_redirect") or not child.is_named:
                continue
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
        self._run(words, env_extra, node, state, main, line)

    def _run(self, words: list[str], env_extra: dict[str, str | None], node: Any,
             state: _State, main: bool, line: int) -> None:
        cmd = words[0]
        if cmd in _INERT:
            return
        if cmd in _WRAPPERS:
            rest = words[1:]
            while rest and rest[0].startswith("-") and cmd in ("time", "command"):
                rest = rest[1:]
            if rest:
                self._run(rest, env_extra, node, state, main, line)
            return
        if cmd == "exit":
            if main and state is self.state:
                state.done = True
            return
        if cmd == "exec":
            if len(words) > 1:  # 'exec > log' only redirects: the script goes on
                self._run(words[1:], env_extra, node, state, main, line)
                if main and state is self.state:
                    state.done = True
            return
        if cmd in ("cd", "pushd"):
            self._cd(words[1:], state, line)
            return
        if cmd == "popd":
            self._uncertain_at(state, line, "'popd' returns to a directory the reader "
                               "does not track")
            return
        if cmd in ("source", "."):
            self._source(words[1:], node, state, line)
            return
        if cmd in ("export", "declare", "typeset", "readonly", "local", "unset"):
            self._uncertain_at(state, line, f"'{cmd}' with computed words")
            return
        if cmd == "set":
            if len(words) > 1 and words[1] == "--":
                state.shell.args = tuple(words[2:])
            elif any(w.startswith("-") and "a" in w[1:] for w in words[1:]):
                self._uncertain_at(state, line, "'set -a' exports what follows")
            return
        if cmd == "shift":
            count = int(words[1]) if len(words) > 1 and words[1].isdigit() else 1
            state.shell.args = state.shell.args[count:]
            return
        if cmd in ("read", "getopts", "mapfile", "readarray"):
            for word in words[1:]:
                if not word.startswith("-") and word.isidentifier():
                    state.shell.values[word] = None
            return
        if cmd == "printf" or cmd == "echo":
            return
        if cmd == "deactivate" and "deactivate" in state.functions:
            self._deactivate_venv(state)
            return
        if cmd in _CONDA and self._conda(words, state, line):
            return
        if cmd in state.functions:
            self._uncertain_at(state, line, f"the function '{cmd}' may change the "
                               "environment")
            return
        if cmd in _UNKNOWABLE:
            self._uncertain_at(state, line, f"'{_short(node)}' changes the environment "
                               "in ways a reader cannot know")
            return
        env = state.shell.environ()
        if env is None or state.cwd is None:
            self.out.unknown += 1
            return
        for key, val in env_extra.items():
            if val is None:
                self.out.unknown += 1
                return
            env[key] = val
        sure = main and state.sure
        text = _short(node)
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
        if not fsprobe.isdir(path):
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
        found = which(name, state.shell.get("PATH"), state.cwd or "/", self.budget)
        if found is not None:
            return found
        if state.cwd and fsprobe.isfile(os.path.join(state.cwd, name)):
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
            if fsprobe.isfile(os.path.join(parent, "conda")):
                # conda's own bin/activate: 'source activate [NAME]'
                state.shell.set("CONDA_EXE", os.path.join(parent, "conda"), export=True)
                self._conda(["conda", "activate", *(args[1:] or ["base"])], state, line)
                return
            venv = envs.venv_of_activate(path, self.budget)
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
                                             self.budget)
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
        prefix = envs.conda_prefix(name, values, state.cwd or "/", self.budget)
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
        shell.set("CONDA_SHLVL", str(int(level) + 1) if level.isdigit() else None,
                  export=True)
        if envs.has_activate_hooks(prefix):
            self._uncertain_at(state, line, f"{prefix}/etc/conda/activate.d runs scripts "
                               "on activation")
        return True


def _drop_path(path: str, entry: str) -> str:
    return ":".join(p for p in path.split(":") if p != entry)
