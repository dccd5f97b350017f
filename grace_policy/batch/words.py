"""Shell words expanded the way bash would, when a reader can know them.

A word is expanded from what the script's state holds: the step's
environment, what earlier lines assigned, the script's own arguments. Any
part a reader cannot know (``$(...)``, arithmetic, a variable nobody set, a
glob, ``$RANDOM``) makes the whole word unknown (``None``): the command is
then not judged, never guessed.
"""

from __future__ import annotations

from .._record import dataclass, field

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

#: Characters that make an unquoted word a glob pattern.
_GLOB = frozenset("*?[")
_IFS = " \t\n"
_NAME_START = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz_")
_NAME_CHARS = _NAME_START | frozenset("0123456789")
#: Positional parameters beyond this index are never set (a bound on int()).
_MAX_INDEX_DIGITS = 9


@dataclass
class ShellVars:
    """The shell's variables: ``values`` (None: set to something unknown),
    which are exported, and the script's positional arguments."""

    values: dict[str, str | None] = field(default_factory=dict)
    exported: set[str] = field(default_factory=set)
    args: tuple[str, ...] = ()
    script: str = ""
    #: ``set -a`` / ``set -o allexport``: every assignment also exports.
    allexport: bool = False
    #: Bumped on every assignment or unset of PATH (bash then forgets what
    #: ``hash -p`` said).
    path_epoch: int = 0
    #: How many ``${...}`` are being expanded inside one another right now.
    depth: int = 0

    def copy(self) -> ShellVars:
        return ShellVars(dict(self.values), set(self.exported), self.args, self.script,
                         self.allexport, self.path_epoch)

    def get(self, name: str) -> str | None:
        """The value, or None when unset or unknown (both unknowable to us)."""
        return self.values.get(name)

    def is_set(self, name: str) -> bool | None:
        """True/False, or None when it is set to an unknown value."""
        if name not in self.values:
            return False
        return True if self.values[name] is not None else None

    def environ(self) -> dict[str, str] | None:
        """The environment a command started here gets; None if an exported
        variable has an unknown value (then nothing started here is judged)."""
        out: dict[str, str] = {}
        for name in self.exported:
            if name not in self.values:
                continue
            value = self.values[name]
            if value is None:
                return None
            out[name] = value
        return out

    def set(self, name: str, value: str | None, *, export: bool = False) -> None:
        """Assign as bash's ``bind_variable`` does (under allexport it exports)."""
        self.values[name] = value
        if export or self.allexport:
            self.exported.add(name)
        if name == "PATH":
            self.path_epoch += 1

    def unset(self, name: str) -> None:
        self.values.pop(name, None)
        self.exported.discard(name)
        if name == "PATH":
            self.path_epoch += 1


def is_name(text: str) -> bool:
    """A bash variable name: ASCII letters, digits and ``_``, not starting
    with a digit (``str.isidentifier`` also takes ``é`` or ``x²``)."""
    return bool(text) and text[0] in _NAME_START and all(c in _NAME_CHARS for c in text)


def ascii_digits(text: str) -> bool:
    """Only ``0``-``9`` (``str.isdigit`` also takes ``²``, ``٣``, ``３``, which
    bash never reads as numbers and ``int`` turns into errors or values)."""
    return text.isascii() and text.isdigit()


class Unknown(Exception):
    """Raised inside the expansion when a part cannot be known."""


def _text(node: Any) -> str:
    return node.text.decode("utf-8", "surrogateescape")


def _unescape(text: str, escapable: str | None) -> str:
    """Backslash removal as bash does it: before any character outside quotes
    (``escapable`` None), before ``$ ` " \\`` and newline inside double quotes;
    a backslash-newline joins lines."""
    out: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text) and (escapable is None or text[i + 1] in escapable):
            if text[i + 1] != "\n":
                out.append(text[i + 1])
            i += 2
            continue
        out.append(ch)
        i += 1
    return "".join(out)


def _unescape_unquoted(text: str) -> str:
    return _unescape(text, None)


def _unescape_dquoted(text: str) -> str:
    return _unescape(text, '$`"\\\n')


def _special(name: str, shell: ShellVars, quoted: bool) -> list[str] | str:
    if name == "@":
        return list(shell.args)
    if name == "*":
        return " ".join(shell.args)
    if name == "#":
        return str(len(shell.args))
    if name == "0":
        return shell.script
    raise Unknown(name)  # $? $$ $! $- : runtime values


def _variable(name: str, shell: ShellVars) -> str:
    if ascii_digits(name):
        digits = name.lstrip("0") or "0"  # ${01} is $1
        if len(digits) > _MAX_INDEX_DIGITS:
            raise Unknown(name)
        index = int(digits)
        if index == 0:
            return shell.script
        if index <= len(shell.args):
            return shell.args[index - 1]
        raise Unknown(name)
    if name in ("RANDOM", "SECONDS", "LINENO", "BASHPID", "PPID", "EPOCHSECONDS",
                "EPOCHREALTIME", "SRANDOM"):
        raise Unknown(name)
    value = shell.get(name)
    if value is None:
        raise Unknown(name)
    return value


#: ``${X:-${Y:-...}}`` deeper than this is unknown: real scripts nest two or
#: three; a bound keeps a hostile word from exhausting the stack (under a
#: tracer, Python's recursion limit is not reached before C's stack is).
MAX_NESTING = 16


def _expansion(node: Any, shell: ShellVars) -> str:
    """``${NAME}``, ``${NAME:-W}``, ``${NAME-W}``, ``${NAME:+W}``, ``${NAME+W}``;
    anything else (``${#X}``, ``${X%...}``, arrays) is unknown. ``:=`` assigns."""
    if shell.depth >= MAX_NESTING:
        raise Unknown("nesting")
    shell.depth += 1
    try:
        return _expand_one(node, shell)
    finally:
        shell.depth -= 1


def _expand_one(node: Any, shell: ShellVars) -> str:
    parts = [c for c in node.children if c.type not in ("${", "}")]
    if not parts or parts[0].type not in ("variable_name", "special_variable_name"):
        raise Unknown("expansion")
    name = _text(parts[0])
    if len(parts) == 1:
        if parts[0].type == "special_variable_name":
            value = _special(name, shell, True)
            if isinstance(value, list):
                raise Unknown("${@}")
            return value
        return _variable(name, shell)
    op = parts[1]
    if op.type not in (":-", "-", ":=", "=", ":+", "+") or parts[0].type != "variable_name":
        raise Unknown("expansion")
    rest = parts[2:]
    state = shell.is_set(name)
    if state is None:
        raise Unknown(name)
    value = shell.values.get(name) if state else None
    colon = op.type.startswith(":")
    present = state and (not colon or value != "")
    if op.type in (":+", "+"):
        return _join_value(rest, shell) if present else ""
    if present:
        assert value is not None
        return value
    default = _join_value(rest, shell)
    if op.type in (":=", "="):
        shell.set(name, default)
    return default


def _join_value(nodes: list[Any], shell: ShellVars) -> str:
    """The operand of ``${X:-...}``: expanded, no splitting, no globbing."""
    out: list[str] = []
    for node in nodes:
        for text, _split, _glob in _pieces(node, shell, quoted=True):
            out.append(text)
    return "".join(out)


def _pieces(node: Any, shell: ShellVars, quoted: bool) -> list[tuple[str, bool, bool]]:
    """``node`` as (text, splittable, may-glob) pieces; raises Unknown."""
    kind = node.type
    if kind in ("word", "number", "variable_name"):
        text = _text(node)
        if quoted:
            return [(_unescape_dquoted(text) if kind == "word" else text, False, False)]
        glob = kind == "word" and _has_glob(text)
        return [(_unescape_unquoted(text), False, glob)]
    if kind == "string_content":
        return [(_unescape_dquoted(_text(node)), False, False)]
    if kind == "raw_string":
        return [(_text(node)[1:-1], False, False)]
    if kind == "ansi_c_string":
        inner = _text(node)[2:-1]
        if "\\" in inner:
            raise Unknown("$'...'")
        return [(inner, False, False)]
    if kind == "string":
        out: list[tuple[str, bool, bool]] = []
        kids = [c for c in node.children if c.type != '"']
        if len(kids) == 1 and kids[0].type == "simple_expansion" and \
                _text(kids[0]) == "$@":
            return [("\0@", False, False)]  # "$@": one field per argument, marked
        last = None
        for child in node.children:
            if child.type == '"':
                continue
            # tree-sitter drops whitespace-only content between expansions:
            # recover it from the byte offsets.
            if last is not None and child.start_byte > last:
                gap = node.text[last - node.start_byte:child.start_byte - node.start_byte]
                out.append((_unescape_dquoted(gap.decode("utf-8", "surrogateescape")),
                            False, False))
            out.extend(_pieces(child, shell, quoted=True))
            last = child.end_byte
        if last is not None:
            tail_end = node.end_byte - 1
            if tail_end > last:
                gap = node.text[last - node.start_byte:tail_end - node.start_byte]
                out.append((_unescape_dquoted(gap.decode("utf-8", "surrogateescape")),
                            False, False))
        return out or [("", False, False)]
    if kind == "$":
        return [("$", False, False)]  # a '$' no name follows is itself (bash)
    if kind == "simple_expansion":
        target = node.children[-1]
        name = _text(target)
        if target.type == "variable_name" and not is_name(name):
            if ascii_digits(name[:1]):
                # $10 is ${1} then "0": one digit is a positional parameter.
                return [(_variable(name[0], shell), not quoted, False),
                        (name[1:], False, False)]
            return [("$" + name, False, False)]  # "$ b": no expansion at all
        if target.type == "special_variable_name":
            value = _special(name, shell, quoted)
            if isinstance(value, list):
                if quoted:
                    raise Unknown("$@ inside a string")
                return [(" ".join(value), True, False)]
            return [(value, not quoted, False)]
        return [(_variable(name, shell), not quoted, False)]
    if kind == "expansion":
        return [(_expansion(node, shell), not quoted, False)]
    if kind == "concatenation":
        out = []
        for child in node.children:
            out.extend(_pieces(child, shell, quoted))
        return out
    raise Unknown(kind)  # command/process substitution, arithmetic, brace groups...


def _has_glob(text: str) -> bool:
    escaped = False
    for ch in text:
        if escaped:
            escaped = False
            continue
        if ch == "\\":
            escaped = True
        elif ch in _GLOB:
            return True
    return False


def _tilde(text: str, shell: ShellVars) -> str:
    if not text.startswith("~"):
        return text
    head, sep, tail = text.partition("/")
    if head != "~":
        raise Unknown("~user")
    home = shell.get("HOME")
    if home is None:
        raise Unknown("HOME")
    return home + sep + tail


def fields(node: Any, shell: ShellVars) -> list[str] | None:
    """The words one argument node becomes (splitting unquoted expansions on
    blanks, ``"$@"`` one per argument); None when any part is unknown."""
    try:
        pieces = _pieces(node, shell, quoted=False)
    except (Unknown, RecursionError):
        return None
    if pieces and node.type in ("word", "concatenation") and not pieces[0][1]:
        first = pieces[0]
        try:
            pieces[0] = (_tilde(first[0], shell), first[1], first[2])
        except Unknown:
            return None
    if any(glob for _t, _s, glob in pieces):
        return None  # what a glob matches is not read; never guessed
    if len(pieces) == 1 and pieces[0][0] == "\0@":
        return list(shell.args)
    out: list[str] = []
    current: str | None = None
    for text, split, _glob in pieces:
        if text == "\0@":
            return None  # "$@" inside a longer word
        if not split:
            current = (current or "") + text
            continue
        words = text.split()
        if not words:
            continue
        if text[:1] in _IFS and current is not None:
            out.append(current)
            current = None
        for i, word in enumerate(words):
            if i == 0:
                current = (current or "") + word
            else:
                if current is not None:
                    out.append(current)
                current = word
        if text[-1:] in _IFS and current is not None:
            out.append(current)
            current = None
    if current is not None:
        out.append(current)
    return out


def value(node: Any | None, shell: ShellVars) -> str | None:
    """An assignment's value (no splitting, no globbing; a leading ``~`` is
    expanded); None when unknown."""
    if node is None:
        return ""
    try:
        pieces = _pieces(node, shell, quoted=False)
        text = "".join(t for t, _s, _g in pieces)
        if "\0@" in text:
            return None
        if node.type in ("word", "concatenation"):
            text = _tilde(text, shell)
        return text
    except (Unknown, RecursionError):
        return None
