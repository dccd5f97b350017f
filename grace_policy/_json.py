"""``loads``/``dumps`` on CPython's ``_json`` accelerator, without ``import json``.

Why: ``json.decoder`` and ``json.encoder`` import ``re`` (and with it
``enum``, ``functools``, ``re._compiler`` ...), ~6-10 ms of every clean step,
which reads the compiled policy and writes one audit line. The C scanner and
encoder in ``_json`` need none of that. Output and accepted input are those
of :mod:`json` with the same arguments (the C encoder *is* what
``json.dumps`` runs for ``indent=None``); anything this module does not
cover (``indent``, ``ensure_ascii=False``, no ``_json``) goes to :mod:`json`.
Errors are ``ValueError`` as with :mod:`json` (the C scanner imports
``json.decoder`` for its ``JSONDecodeError`` only when it raises one).
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

try:
    import _json
except ImportError:  # another implementation: the stdlib module does it all
    _json = None

_WS = " \t\n\r"
_CONSTANTS = {"-Infinity": float("-inf"), "Infinity": float("inf"), "NaN": float("nan")}


class _Context:
    """What ``_json.make_scanner`` reads from a ``JSONDecoder``."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = _CONSTANTS.__getitem__


_scanner = _json.make_scanner(_Context()) if _json is not None else None


def loads(data: bytes | str) -> Any:
    """Like :func:`json.loads` for a UTF-8 document."""
    if _scanner is None:
        import json

        return json.loads(data)
    text = data.decode("utf-8") if isinstance(data, (bytes, bytearray)) else data
    start = len(text) - len(text.lstrip(_WS))
    try:
        obj, end = _scanner(text, start)
    except StopIteration:
        raise ValueError("Expecting value") from None
    if text[end:].strip(_WS):
        raise ValueError("Extra data")
    return obj


def dumps(obj: Any, *, sort_keys: bool = False, ensure_ascii: bool = True,
          default: Any = None, indent: Any = None) -> str:
    """Like :func:`json.dumps` with these arguments (default separators)."""
    if _json is None or indent is not None or not ensure_ascii:
        import json

        return json.dumps(obj, sort_keys=sort_keys, ensure_ascii=ensure_ascii,
                          default=default, indent=indent)

    def _default(o: Any) -> Any:
        if default is None:
            raise TypeError(f"Object of type {o.__class__.__name__} is not JSON serializable")
        return default(o)

    try:
        encode = _json.make_encoder({}, _default, _json.encode_basestring_ascii, None,
                                    ": ", ", ", sort_keys, False, True)
    except TypeError:  # the C signature changed in this Python: use the module
        import json

        return json.dumps(obj, sort_keys=sort_keys, ensure_ascii=True, default=default)
    return "".join(encode(obj, 0))
