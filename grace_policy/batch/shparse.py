"""The shell parser: tree-sitter with the bash grammar, loaded lazily.

Why tree-sitter-bash and not bashlex (docs/DESIGN.md "Batch scripts"):
bashlex refuses common bash (``[[ ... ]]``, ``case``, arithmetic) with an
exception and costs ~90 ms to import; tree-sitter parses everything, marks
what it cannot parse as ERROR nodes (we then stop trusting the rest), is C
(a 4 MB script in ~1 s, a typical one in < 1 ms) and can be cancelled
through its progress callback when the check's budget runs out.

The two extension modules are loaded directly (``tree_sitter._binding``,
``tree_sitter_bash._binding``): their packages' ``__init__`` import
``typing`` and ``importlib.resources`` (~20 ms) for things we never use.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from ..budget import Budget

#: Scripts larger than this are not parsed (Slurm's own default
#: ``max_script_size`` is 4 MB; real job scripts are a few KB).
MAX_SCRIPT_BYTES = 1024 * 1024

_PARSER: Any = None


class ParserUnavailable(Exception):
    """tree-sitter or its bash grammar is not installed (or cannot load)."""


def _load_ext(name: str, package: str) -> Any:
    """Load ``package._binding`` without running ``package/__init__.py``."""
    import importlib.machinery
    import importlib.util

    full = f"{package}._binding"
    if full in sys.modules:
        return sys.modules[full]
    for entry in sys.path:
        directory = os.path.join(entry or ".", package)
        try:
            names = os.listdir(directory)
        except OSError:
            continue
        for file in sorted(names):
            if file.startswith("_binding.") and file.endswith(".so"):
                path = os.path.join(directory, file)
                loader = importlib.machinery.ExtensionFileLoader(full, path)
                spec = importlib.util.spec_from_file_location(full, path, loader=loader)
                if spec is None:
                    continue
                module = importlib.util.module_from_spec(spec)
                loader.exec_module(module)
                sys.modules[full] = module
                return module
    raise ParserUnavailable(f"{package} is not installed")


def parser() -> Any:
    """The one bash parser of this process."""
    global _PARSER
    if _PARSER is None:
        try:
            core = _load_ext("tree_sitter", "tree_sitter")
            bash = _load_ext("tree_sitter_bash", "tree_sitter_bash")
            _PARSER = core.Parser(core.Language(bash.language()))
        except ParserUnavailable:
            raise
        except Exception as exc:  # a broken install: no parser, not a crash
            raise ParserUnavailable(f"{type(exc).__name__}: {exc}") from None
    return _PARSER


def parse(source: bytes, budget: Budget) -> Any:
    """The syntax tree of ``source``; raises BudgetExceeded (from the
    progress callback's deadline) rather than parse past the budget."""
    from ..budget import BudgetExceeded

    chunk = 65536
    stopped: list[BudgetExceeded] = []

    def read(offset: int, _point: object) -> bytes:
        return source[offset:offset + chunk]

    def progress(*_args: object) -> bool:
        try:
            budget.tick()
        except BudgetExceeded as exc:
            stopped.append(exc)
            return True
        return False

    try:
        return parser().parse(read, progress_callback=progress)
    except ValueError:
        if stopped:
            raise stopped[0] from None
        raise BudgetExceeded("the batch script could not be parsed in time") from None
