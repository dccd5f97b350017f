"""``grace-policy``: ask from any node what the plugin would do.

One ``main_*.py`` module per subcommand, as in pypa/auditwheel; unlike there,
only the subcommand being run is imported (the others get a stub parser for
``--help``), so ``grace-policy check`` does not pay for pydantic or the
catalogue unless it needs them.

Exit codes: 0 allow, 1 warn, 2 reject (``check``; the others use 0 for
success and 2 for a file they cannot read), 64 usage error, 70 internal
error, 78 config error. No traceback reaches the user.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from importlib import import_module

from .. import __version__
from .common import EX_SOFTWARE, EX_USAGE, PROG, Parser, UsageError, err

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: typing stays off the command's path
    from typing import Any

#: name → (module, one-line help), in the order ``--help`` lists them.
COMMANDS: dict[str, tuple[str, str]] = {
    "check": ("main_check", "what the plugin would do for a job step (exit 0/1/2)"),
    "submit": ("main_submit", "the submit-host check of cli_filter.lua (exit 0/2)"),
    "inspect": ("main_inspect", "ELF facts and load tree of a file, as a node's loader sees it"),
    "env": ("main_env", "which packages of a Python environment would fail on a node"),
    "explain": ("main_explain", "what a rule checks and what users are told"),
    "config": ("main_config", "validate (and compile) the site's config"),
    "report": ("main_report", "what the plugin did, from its audit logs (--json, --metrics)"),
}


def _chosen(argv: Sequence[str]) -> str | None:
    """The subcommand: the first word that is not an option. Top-level options
    take no values, so no option argument can be mistaken for it."""
    for arg in argv:
        if arg == "--":
            return None
        if not arg.startswith("-"):
            return arg
    return None


def _parser(chosen: str | None) -> tuple[Parser, object | None]:
    parser = Parser(
        prog=PROG,
        description="Check whether what a Slurm job step runs will load on the node "
                    "(architecture, loader resolution, page size, leaked environments).",
        epilog="Exit codes: 0 allow, 1 warn, 2 reject, 64 usage error, 70 internal error, "
               "78 config error. 'grace-policy COMMAND --help' for each command.",
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = parser.add_subparsers(dest="command_name", metavar="COMMAND")
    module = None
    for name, (module_name, help_text) in COMMANDS.items():
        if name == chosen:
            module = import_module(f"{__package__}.{module_name}")
            module.configure_parser(sub, name, help_text)
        else:
            sub.add_parser(name, help=help_text, description=help_text)
    return parser, module


def _run(argv: list[str]) -> int:
    # Everything after the first "--" is handed to the subcommand untouched:
    # argparse's own "--" handling differs between Python versions, and a
    # command line to check must reach the checker byte for byte.
    rest: list[str] | None = None
    if "--" in argv:
        cut = argv.index("--")
        argv, rest = argv[:cut], argv[cut + 1:]
    chosen = _chosen(argv)
    parser, module = _parser(chosen)
    args = parser.parse_args(argv)
    if module is None or args.command_name is None:
        parser.print_help(sys.stderr)
        return EX_USAGE
    return int(module.execute(args, rest))


def _usage_error(exc: UsageError, argv: Sequence[str]) -> int:
    from ..messages import escape

    chosen = _chosen(argv)
    where = f"{PROG} {chosen}" if chosen in COMMANDS else PROG
    if exc.usage:
        sys.stderr.write(exc.usage)
    message = exc.message
    if chosen == "check" and message.startswith("unrecognized arguments"):
        message += " (put the step's command after '--': grace-policy check -- CMD ARGS...)"
    # argparse quotes the user's own argument: escape it like any user text.
    err(f"{escape(chosen) if chosen in COMMANDS else 'usage'}: error: {escape(message)}")
    err(f"see '{where} --help'")
    return EX_USAGE


class _ReaderMayLeave:
    """sys.stdout for one command: when the reader goes away (``check ... |
    head -c1``), the rest of the output is dropped instead of raising, so the
    command still ends with its own exit code (0/1/2) and Python prints no
    "Exception ignored ... BrokenPipeError" at exit."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.gone = False

    def write(self, text: str) -> int:
        if not self.gone:
            try:
                return int(self.stream.write(text))
            except BrokenPipeError:
                self._left()
        return len(text)

    def flush(self) -> None:
        if not self.gone:
            try:
                self.stream.flush()
            except BrokenPipeError:
                self._left()

    def _left(self) -> None:
        # What is still buffered goes to /dev/null when Python flushes it.
        self.gone = True
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self.stream.fileno())
            os.close(devnull)
        except (OSError, ValueError, AttributeError):
            pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``grace-policy`` with ``argv`` (default ``sys.argv[1:]``); return the
    exit code instead of exiting, so tests and the console script share it."""
    args = list(sys.argv[1:] if argv is None else argv)
    real = sys.stdout
    guarded = _ReaderMayLeave(real) if real is not None else None
    if guarded is not None:
        sys.stdout = guarded  # type: ignore[assignment]
    try:
        code = _run(args)
        sys.stdout.flush()
        return code
    except UsageError as exc:
        return _usage_error(exc, args)
    except SystemExit as exc:  # --help / --version
        code = exc.code
        if code is None:
            return 0
        if isinstance(code, int):
            return code
        err(str(code))
        return EX_USAGE
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `grace-policy inspect ... | head`: the reader left; say nothing more.
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError, AttributeError):
            pass
        return 141
    except Exception as exc:  # the promise: no traceback, ever
        from ..messages import escape

        err(f"internal error: {type(exc).__name__}: {escape(str(exc))}")
        if os.environ.get("GRACE_POLICY_DEBUG"):
            import traceback

            traceback.print_exc()
        else:
            err("(set GRACE_POLICY_DEBUG=1 to see where; please report it)")
        return EX_SOFTWARE
    finally:
        if guarded is not None and sys.stdout is guarded:
            sys.stdout = real


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
