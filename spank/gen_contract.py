"""Write the C side of the plugin's contract from grace_policy/contract.py.

    python3 spank/gen_contract.py build/grace_contract.h

Run by ``make plugin`` (packaging/plugin.mk) before any C file is compiled;
spank/build_plugin.py imports :func:`cdef` for cffi, so the struct cffi
checks is the header's text itself. The build also stops here when the
table and ``slurm_bridge.StepInput`` disagree (:func:`check_python_side`):
a field added to one side only never reaches a compiler.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def contract() -> Any:
    sys.path.insert(0, str(REPO))
    try:
        from grace_policy import contract
    finally:
        sys.path.pop(0)
    return contract


def _comment(text: str) -> str:
    if "*/" in text or "\n" in text:
        raise SystemExit(f"gen_contract: not a one-line C comment: {text!r}")
    return f"/* {text} */"


def _c_string(text: str) -> str:
    if any(c in text for c in '"\\\n') or not text.isprintable():
        raise SystemExit(f"gen_contract: not a plain C string: {text!r}")
    return f'"{text}"'


def struct_text(c: Any = None) -> str:
    """``struct grace_step``: the header's and cffi's, character for character."""
    c = c or contract()
    lines = ["struct grace_step {"]
    for f in c.STEP:
        ctype = c.C_TYPES[f.kind]
        decl = ctype + f.name if ctype.endswith("*") else f"{ctype} {f.name}"
        lines.append(f"    {decl}; {_comment(f.doc)}")
        if f.kind in c.LISTS:
            lines.append(f"    int {f.count}; /* the number of {f.name} items */")
    lines.append("};")
    return "\n".join(lines) + "\n"


def int_defines(c: Any = None) -> str:
    """The integer constants cffi sees too (its cdef takes ``#define N 1``)."""
    c = c or contract()
    out = [f"#define GRACE_RC_{name.upper()} {code}" for name, code in c.RC]
    out += [f"#define GRACE_EMIT_{name.upper()} {code}" for name, code, _doc in c.EMIT]
    return "\n".join(out) + "\n"


def cdef(c: Any = None) -> str:
    return int_defines(c) + "\n" + struct_text(c)


def _x_step(c: Any) -> str:
    """``GRACE_STEP_FRAME(TEXT, UINT, FLAG, FD, LIST)``: the frame's fields
    in order, each handed to the macro of its kind (a list with its count)."""
    macro = {c.TEXT: "TEXT", c.UINT: "UINT", c.FLAG: "FLAG", c.FD: "FD", c.ARGV: "LIST",
             c.ENV: "LIST"}
    items = []
    for f in c.FRAME:
        args = f"{f.name}, {f.count}" if f.kind in c.LISTS else f.name
        items.append(f"\t{macro[f.kind]}({args})")
    return "#define GRACE_STEP_FRAME(TEXT, UINT, FLAG, FD, LIST) \\\n" + " \\\n".join(items) + "\n"


def header(c: Any = None) -> str:
    c = c or contract()
    body = [
        "/* The C <-> Python contract of grace-policy. Written by spank/gen_contract.py",
        " * from grace_policy/contract.py (read there what each item means and how",
        " * to add one); do not edit. */",
        "#ifndef GRACE_CONTRACT_H",
        "#define GRACE_CONTRACT_H",
        "",
        f"#define GRACE_CONTRACT_DIGEST {_c_string(digest(c))}",
        "",
        "/* grace_py_decide's return codes, grace_emit's kinds. */",
        int_defines(c),
        "/* The helper's records: kind byte, u32 length, bytes. */",
    ]
    body += [f"#define GRACE_REC_{name.upper()} '{letter}' {_comment(doc)}"
             for name, letter, doc in c.RECORDS]
    body += ["", "/* The kinds of failure (the audit line's \"failure\"). */"]
    body += [f"#define GRACE_FAIL_{macro} {_c_string(name)} {_comment(doc)}"
             for macro, name, doc in c.FAILURES]
    body += ["/* Those Python may name (GRACE_EMIT_FAIL). */",
             "#define GRACE_PYTHON_FAILURES(X) " + " ".join(
                 f"X(GRACE_FAIL_{m})" for m, name, _d in c.FAILURES
                 if name in c.PYTHON_FAILURES),
             "",
             f"#define GRACE_LOG_AUDIT '\\x{ord(c.AUDIT_MARK):02x}'",
             "", "/* The credentials frame: these ids (u32), then the groups. */",
             "#define GRACE_CREDS_IDS(X) " + " ".join(f"X({n})" for n in c.CREDS_IDS),
             "", f"#define GRACE_CHECKER_MODULE {_c_string(c.CHECKER_MODULE)}",
             f"#define GRACE_CHECKER_FUNCTION {_c_string(c.CHECKER_FUNCTION)}",
             f"#define GRACE_CODE_SEP {_c_string(c.CODE_SEP)}",
             f"#define GRACE_CODE_NO_PATH {_c_string(c.CODE_NO_PATH)}",
             "/* argv[0] names whose image is an argument (NULL-terminated). */",
             "#define GRACE_IMAGE_WRAPPERS { " + ", ".join(
                 _c_string(n) for n in c.IMAGE_WRAPPERS) + ", NULL }",
             "", struct_text(c), _x_step(c), "#endif", ""]
    return "\n".join(body)


def digest(c: Any = None) -> str:
    """Names the contract (a field, a code, a letter changed: another)."""
    c = c or contract()
    parts = [repr([(f.name, f.kind, f.count, f.null) for f in c.STEP]), repr(c.RC),
             repr([e[:2] for e in c.EMIT]), repr([r[:2] for r in c.RECORDS]),
             repr([f[:2] for f in c.FAILURES]), repr(c.CREDS_IDS), repr(c.REQUEST_TAIL),
             repr(c.AUDIT_MARK)]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def check_python_side(c: Any = None, step_input: Any = None) -> None:
    """Refuse a table whose fields slurm_bridge.StepInput does not have (or
    the reverse): the readers fill StepInput by the table's names."""
    c = c or contract()
    if step_input is None:
        sys.path.insert(0, str(REPO))
        try:
            from grace_policy.slurm_bridge import StepInput as step_input
        finally:
            sys.path.pop(0)
    table = {f.name for f in c.STEP if f.kind != c.OPAQUE}
    python = set(step_input.__annotations__)
    if table != python:
        raise SystemExit("gen_contract: grace_policy/contract.py STEP and "
                         "slurm_bridge.StepInput differ: only in the table "
                         f"{sorted(table - python)}, only in StepInput {sorted(python - table)}")


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: gen_contract.py OUT.h", file=sys.stderr)
        return 2
    c = contract()
    check_python_side(c)
    out = Path(argv[0])
    out.parent.mkdir(parents=True, exist_ok=True)
    text = header(c)
    if not out.exists() or out.read_text() != text:
        out.write_text(text)
    else:
        out.touch()  # newer than the table: make is done with it
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
