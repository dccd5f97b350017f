"""PEP 508 environment markers, evaluated for the node without ``packaging``.

Why: ``Requires-Dist: nvidia-cublas-cu12 ; platform_machine == "x86_64"``
decides which distributions an import drags in *on the node*, and the checker
runs on the launch path, where ``packaging`` (and the ``re`` it needs) is too
heavy. The evaluator is three-valued: what it cannot decide (an unknown
variable, a version it cannot order, a syntax error) is ``None``, which callers
treat as "keep the requirement" (more is judged, never less). ``extra`` is
the empty string, as for a distribution installed without extras, so a
requirement under an extra is not required.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..node import NodeProfile, normalize_arch

#: platform.machine() on each (normalized) node machine.
_PLATFORM_MACHINE = {
    "x86_64": "x86_64", "aarch64": "aarch64", "i386": "i686", "ppc64": "ppc64le",
    "ppc64le": "ppc64le", "s390x": "s390x", "riscv64": "riscv64",
}

#: PEP 345 spellings that packaging still accepts.
_ALIASES = {
    "os.name": "os_name", "sys.platform": "sys_platform", "platform.version": "platform_version",
    "platform.machine": "platform_machine", "python_implementation":
    "platform_python_implementation", "platform.python_implementation":
    "platform_python_implementation",
}
_OPS = ("===", "==", "!=", "<=", ">=", "~=", "<", ">")
_MAX_MARKER = 4096


def node_environment(node: NodeProfile, version: tuple[int, int],
                     patch: int = 0) -> dict[str, str]:
    """The marker variables of a CPython ``version`` on ``node``. The patch
    level is not known from the files; :func:`evaluate` tries both ends."""
    major, minor = version[0], version[1]
    env = {
        "python_version": f"{major}.{minor}",
        "python_full_version": f"{major}.{minor}.{patch}",
        "implementation_version": f"{major}.{minor}.{patch}",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "os_name": "posix",
        "extra": "",
    }
    machine = _PLATFORM_MACHINE.get(normalize_arch(node.machine))
    if machine:
        env["platform_machine"] = machine
    return env


def _tokens(text: str) -> list[str] | None:
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c in " \t\r\n":
            i += 1
        elif c in "()":
            out.append(c)
            i += 1
        elif c in "'\"":
            j = text.find(c, i + 1)
            if j < 0:
                return None
            out.append(text[i:j + 1])
            i = j + 1
        elif c in "=!<>~":
            for op in _OPS:
                if text.startswith(op, i):
                    out.append(op)
                    i += len(op)
                    break
            else:
                return None
        elif c.isalnum() or c in "_.":
            j = i
            while j < n and (text[j].isalnum() or text[j] in "_."):
                j += 1
            out.append(text[i:j])
            i = j
        else:
            return None
    return out


def _release(text: str) -> tuple[int, ...] | None:
    parts = text.strip().split(".")
    try:
        return tuple(int(p) for p in parts)
    except ValueError:
        return None


def _pad(a: tuple[int, ...], n: int) -> tuple[int, ...]:
    return a + (0,) * (n - len(a))


def _compare_versions(left: str, op: str, right: str) -> bool | None:
    if op in ("==", "!=") and right.endswith(".*"):
        lv, rv = _release(left), _release(right[:-2])
        if lv is None or rv is None:
            return None
        eq = _pad(lv, len(rv))[:len(rv)] == rv
        return eq if op == "==" else not eq
    lv, rv = _release(left), _release(right)
    if lv is None or rv is None:
        return None
    n = max(len(lv), len(rv))
    a, b = _pad(lv, n), _pad(rv, n)
    if op == "==":
        return a == b
    if op == "!=":
        return a != b
    if op == "<":
        return a < b
    if op == "<=":
        return a <= b
    if op == ">":
        return a > b
    if op == ">=":
        return a >= b
    if op == "~=":
        if len(rv) < 2:
            return None
        return a >= b and _pad(lv, len(rv))[:len(rv) - 1] == rv[:-1]
    return None


def _kind(text: str) -> str:
    """"num" (dotted digits), "maybe" (could be a PEP 440 version this
    evaluator does not order: 3.13.0rc1, v3, 1!2), or "text"."""
    t = text.strip()
    if t and all(p.isdigit() for p in t.split(".")):
        return "num"
    if t[:1].isdigit() or (t[:1] in "vV" and t[1:2].isdigit()):
        return "maybe"
    return "text"


def _compare(left: str, op: str, right: str) -> bool | None:
    """packaging's rule: when ``op + right`` is a valid version specifier, the
    left side is compared as a version; otherwise as strings (``==``/``!=``
    only). Whatever this cannot decide exactly as packaging would is None."""
    if op == "in":
        return left in right
    if op == "not in":
        return left not in right
    if op == "===":
        return None
    rk = _kind(right[:-2]) if right.endswith(".*") else _kind(right)
    if right.endswith(".*") and op not in ("==", "!="):
        rk = "text" if rk != "maybe" else "maybe"     # not a specifier
    if rk == "maybe":
        return None
    if rk == "num" and not (op == "~=" and len(right.split(".")) < 2):
        lk = _kind(left)
        if lk != "num":
            return None        # packaging: an invalid or unordered version on the left
        return _compare_versions(left, op, right)
    if op == "==":
        return left == right
    if op == "!=":
        return left != right
    return None


class _Parser:
    def __init__(self, tokens: list[str], env: Mapping[str, str]) -> None:
        self.toks = tokens
        self.pos = 0
        self.env = env

    def peek(self) -> str | None:
        return self.toks[self.pos] if self.pos < len(self.toks) else None

    def take(self) -> str:
        tok = self.toks[self.pos]
        self.pos += 1
        return tok

    def expr(self, depth: int = 0) -> bool | None:
        if depth > 50:
            raise ValueError("too deep")
        value = self.conj(depth)
        while self.peek() == "or":
            self.take()
            rhs = self.conj(depth)
            value = True if (value is True or rhs is True) else (
                None if (value is None or rhs is None) else False)
        return value

    def conj(self, depth: int) -> bool | None:
        value = self.atom(depth)
        while self.peek() == "and":
            self.take()
            rhs = self.atom(depth)
            value = False if (value is False or rhs is False) else (
                None if (value is None or rhs is None) else True)
        return value

    def value(self) -> str | None:
        """A literal's text or a variable's value (None when unknown)."""
        tok = self.take()
        if tok[:1] in "'\"":
            return tok[1:-1]
        if tok in ("and", "or", "in", "not", "(", ")") or tok in _OPS:
            raise ValueError(tok)
        return self.env.get(_ALIASES.get(tok, tok))

    def atom(self, depth: int) -> bool | None:
        if self.peek() == "(":
            self.take()
            value = self.expr(depth + 1)
            if self.take() != ")":
                raise ValueError("unbalanced")
            return value
        left = self.value()
        op = self.take()
        if op == "not":
            if self.take() != "in":
                raise ValueError("not without in")
            op = "not in"
        elif op not in _OPS and op != "in":
            raise ValueError(op)
        right = self.value()
        if left is None or right is None:
            return None
        return _compare(left, op, right)


def evaluate(marker: str, env: Mapping[str, str]) -> bool | None:
    """True / False / None (cannot tell). Never raises."""
    if len(marker) > _MAX_MARKER:
        return None
    toks = _tokens(marker)
    if not toks:
        return None
    try:
        parser = _Parser(toks, env)
        value = parser.expr()
        if parser.pos != len(toks):
            return None
        return value
    except (IndexError, ValueError):
        return None


def evaluate_for_node(marker: str, node: NodeProfile, version: tuple[int, int]) -> bool | None:
    """:func:`evaluate` for the node; a marker on the patch level counts only
    when the lowest and a high patch level agree."""
    low = evaluate(marker, node_environment(node, version, 0))
    if "full_version" not in marker and "implementation_version" not in marker:
        return low
    high = evaluate(marker, node_environment(node, version, 99))
    return low if low == high else None


def required(marker: str | None, node: NodeProfile, version: tuple[int, int]) -> bool:
    """Is a requirement with this marker required on the node? Unknown -> yes."""
    if not marker or not marker.strip():
        return True
    return evaluate_for_node(marker, node, version) is not False
