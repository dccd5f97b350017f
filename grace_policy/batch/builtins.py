"""What the shell's own builtins do, read from their words: ``set``,
``shift``, ``command``, ``exec``, ``nohup``'s and ``time``'s words.

Each follows bash 5.2 (and dash 0.5, for ``#!/bin/sh`` and ``#!/bin/dash``
scripts) as checked against the real shells (tests/test_batch_shell.py):
where a builtin fails, bash goes on with the next line, while a POSIX shell
(dash, and bash as ``sh``) exits on a *special* builtin's error. ``sh`` may
be either: where the two would differ, the reader says it cannot know.
"""

from __future__ import annotations

from collections.abc import Sequence

from .._record import dataclass
from .words import ascii_digits

#: bash 5.2's builtins (``compgen -b``): they run inside the shell, none of
#: them is the program of the same name.
BUILTINS = frozenset("""
. : [ alias bg bind break builtin caller cd command compgen complete compopt continue
declare dirs disown echo enable eval exec exit export false fc fg getopts hash help
history jobs kill let local logout mapfile popd printf pushd pwd read readarray
readonly return set shift shopt source suspend test times trap true type typeset
ulimit umask unalias unset wait
""".split())
#: Where ``command -p`` looks: glibc's ``confstr(_CS_PATH)`` (``getconf PATH``).
STD_PATH = "/bin:/usr/bin"

#: ``set`` flag letters (``-o`` aside) and ``-o`` names each shell takes.
_LETTERS = {"bash": frozenset("abefhkmnprtuvxBCEHPT"), "dash": frozenset("abefimpsuvxCEIV")}
_NAMES = {
    "bash": frozenset("""allexport braceexpand emacs errexit errtrace functrace hashall
        histexpand history ignoreeof interactive-comments keyword monitor noclobber noexec
        noglob nolog notify nounset onecmd physical pipefail posix privileged verbose vi
        xtrace""".split()),
    "dash": frozenset("""errexit noglob ignoreeof interactive monitor noexec stdin xtrace
        verbose vi emacs noclobber allexport notify nounset privileged nolog debug""".split()),
}
_BLANK = " \t\n\r\f\v"


@dataclass(frozen=True)
class After:
    """The state a builtin leaves: ``allexport``, the positional arguments,
    and whether the script ends there (None: the shells ``sh`` may be
    disagree, so it cannot be known)."""

    allexport: bool
    args: tuple[str, ...]
    ends: bool | None = False


def _is_option(word: str) -> bool:
    return word[:1] in ("-", "+") and word not in ("-", "--")


def _letters_ok(words: Sequence[str], letters: frozenset[str]) -> bool:
    """bash checks every flag letter before ``set`` changes anything (its
    ``internal_getopt``): ``-o`` takes the rest of its word, or the next word
    unless that starts with ``-`` or ``+``."""
    i = 0
    while i < len(words) and _is_option(words[i]):
        word = words[i]
        for j, ch in enumerate(word[1:], 1):
            if ch == "o":
                if j == len(word) - 1 and i + 1 < len(words) and words[i + 1][:1] not in "-+":
                    i += 1
                break
            if ch not in letters:
                return False
        i += 1
    return True


def _set_in(shell: str, words: Sequence[str], allexport: bool,
            args: tuple[str, ...]) -> After:
    """``set WORDS`` in bash (``shell`` "bash", or "posix": bash as sh) or dash."""
    table = "dash" if shell == "dash" else "bash"
    fatal = shell != "bash"
    if not _letters_ok(words, _LETTERS[table]):
        return After(allexport, args, fatal)
    i = 0
    while i < len(words):
        word = words[i]
        if word in ("-", "--"):
            rest = tuple(words[i + 1:])
            if word == "--" or rest:
                args = rest
            return After(allexport, args)
        if not _is_option(word):
            return After(allexport, tuple(words[i:]))
        on = word[0] == "-"
        for ch in word[1:]:
            if ch == "a":
                allexport = on
            elif ch == "o":
                name = words[i + 1] if i + 1 < len(words) else ""
                if not name or (name[0] in "-+" and table == "bash"):
                    continue  # 'set -o' alone lists the options (dash: any next word)
                i += 1
                if name not in _NAMES[table]:
                    return After(allexport, args, fatal)
                if name == "allexport":
                    allexport = on
        i += 1
    return After(allexport, args)


def run_set(shell: str, words: Sequence[str], allexport: bool,
            args: tuple[str, ...]) -> After:
    """What ``set WORDS`` leaves in ``shell`` ("bash", "dash" or "sh")."""
    if shell != "sh":
        return _set_in(shell, words, allexport, args)
    return _either(_set_in("posix", words, allexport, args),
                   _set_in("dash", words, allexport, args))


def _either(posix: After, dash: After) -> After:
    return posix if posix == dash else After(posix.allexport, posix.args, None)


def _shift_by(shell: str, words: Sequence[str], count: int) -> int | str:
    """How many ``shift WORDS`` shifts, or its error: "number" (bash:
    numeric argument required) or "range" (negative, or more than $#)."""
    words = list(words)
    if words[:1] == ["--"] and shell != "dash":
        words = words[1:]
    if not words:
        by = 1
    else:
        text = words[0]
        if shell != "dash":  # strtoimax: blanks and a sign around ASCII digits
            text = text.lstrip(_BLANK).rstrip(" \t")
            sign = -1 if text[:1] == "-" else 1
            text = text[1:] if text[:1] in ("-", "+") else text
        else:
            sign = 1
        digits = text.lstrip("0") or "0"
        if not ascii_digits(text) or len(digits) > 18:
            return "number"
        by = sign * int(digits)
    if by < 0 or by > count:
        return "range"
    return by


def run_shift(shell: str, words: Sequence[str], allexport: bool,
              args: tuple[str, ...]) -> After:
    """What ``shift WORDS`` leaves in ``shell`` ("bash", "dash" or "sh")."""

    def after(name: str) -> After:
        by = _shift_by(name, words, len(args))
        if isinstance(by, int):
            return After(allexport, args[by:])
        fatal = name == "dash" or (name == "posix" and by == "number")
        return After(allexport, args, fatal)

    if shell != "sh":
        return after(shell)
    return _either(after("posix"), after("dash"))


def command_words(words: Sequence[str]) -> tuple[str, list[str]] | None:
    """``command [-pvV] [--] NAME ARGS``: ("describe"|"std"|"run", NAME ARGS);
    None for a usage error (nothing runs)."""
    how = "run"
    i = 0
    while i < len(words) and words[i].startswith("-") and words[i] != "-":
        word = words[i]
        i += 1
        if word == "--":
            break
        for ch in word[1:]:
            if ch in "vV":
                how = "describe"
            elif ch == "p":
                how = "std" if how == "run" else how
            else:
                return None
    return how, list(words[i:])


def exec_words(words: Sequence[str]) -> tuple[bool, list[str]] | None:
    """``exec [-cl] [-a NAME] [--] COMMAND ARGS``: (empty environment,
    COMMAND ARGS); None for a usage error (nothing runs, the script goes on)."""
    clear = False
    i = 0
    while i < len(words) and words[i].startswith("-") and words[i] != "-":
        word = words[i]
        i += 1
        if word == "--":
            break
        for j, ch in enumerate(word[1:], 1):
            if ch == "c":
                clear = True
            elif ch == "a":
                if j == len(word) - 1:  # the name is the next word
                    if i >= len(words):
                        return None
                    i += 1
                break
            elif ch != "l":
                return None
    return clear, list(words[i:])


def hash_words(words: Sequence[str]) -> tuple[bool, str | None, bool, list[str]] | None:
    """``hash [-lrt] [-p FILE] [-d] [NAME...]``: (empty the table first,
    FILE, delete NAMES, NAMES); None for a usage error."""
    flush = delete = False
    file: str | None = None
    i = 0
    while i < len(words) and words[i].startswith("-") and words[i] != "-":
        word = words[i]
        i += 1
        if word == "--":
            break
        for j, ch in enumerate(word[1:], 1):
            if ch == "p":
                if j < len(word) - 1:
                    file = word[j + 1:]
                elif i < len(words):
                    file = words[i]
                    i += 1
                else:
                    return None
                break
            if ch == "r":
                flush = True
            elif ch == "d":
                delete = True
            elif ch not in "lt":
                return None
    return flush, file, delete, list(words[i:])


def after_options(words: Sequence[str], flags: str) -> list[str] | None:
    """The words after the leading ``-FLAGS`` and ``--`` of ``time -p`` or
    ``nohup``; None for an option they do not take."""
    i = 0
    while i < len(words) and words[i].startswith("-") and words[i] != "-":
        if words[i] == "--":
            return list(words[i + 1:])
        if any(ch not in flags for ch in words[i][1:]):
            return None
        i += 1
    return list(words[i:])


def is_digits(text: str) -> bool:
    """A count the reader may hand to ``int`` (ASCII digits, a sane length)."""
    return ascii_digits(text) and len(text.lstrip("0")) <= 18
