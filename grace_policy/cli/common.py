"""What several subcommands share: exit codes, usage errors, the node options
and how they layer, the ``--env-file`` format.

Kept free of heavy imports: ``check`` and ``inspect`` import it on every run,
and the core modules it needs are imported inside the functions that use them.
"""

from __future__ import annotations

import argparse
import os
import re
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs a few ms; annotations are strings anyway
    from typing import NoReturn

    from ..node import NodeProfile
    from ..policy import ConfigError, Policy

#: Exit codes. 0/1/2 mirror the plugin's action so scripts can branch on what
#: the plugin would do; the others are the BSD sysexits(3) values users of
#: command-line tools already know.
EX_ALLOW = 0
EX_WARN = 1
EX_REJECT = 2
EX_USAGE = 64
EX_SOFTWARE = 70
EX_CONFIG = 78

EXIT_FOR_ACTION = {"allow": EX_ALLOW, "warn": EX_WARN, "reject": EX_REJECT}

PROG = "grace-policy"


class UsageError(Exception):
    """The command line (or a file it names as input) cannot be used: exit 64.

    ``usage`` is the subcommand's usage line when argparse knows it, so the
    user sees what the command expects next to what was wrong.
    """

    def __init__(self, message: str, usage: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.usage = usage


class Parser(argparse.ArgumentParser):
    """argparse exits with 2 on a usage error, which is our *reject* code. A
    script branching on "2 = the plugin would reject" must never see a typo as a
    rejection, so errors become :class:`UsageError` (exit 64) instead."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message, usage=self.format_usage())


def err(text: str) -> None:
    """One diagnostic line on stderr, prefixed like every message we print."""
    print(f"{PROG}: {text}", file=sys.stderr)


# --------------------------------------------------------------------------
# Node options


def add_node_options(parser: argparse.ArgumentParser) -> None:
    """The options that say which node a file or step is judged against.

    They layer, most specific last: the detected host, the config's ``[node]``,
    the partition's facts, then these options. So ``--partition gb200
    --glibc 2.34`` asks about gb200's nodes as they would be with an older glibc.
    """
    group = parser.add_argument_group(
        "node", "which node to judge against: the detected host, then the config's [node], "
        "then the partition's facts, then these options")
    group.add_argument("--config", metavar="FILE",
                       help="the site's grace-policy TOML (default: built-in policy)")
    group.add_argument("--partition", metavar="P",
                       help="judge as on partition P's nodes (its mode and facts from --config)")
    group.add_argument("--arch", metavar="A", help="node architecture, e.g. aarch64 or x86_64")
    group.add_argument("--page-size", metavar="N",
                       help="node page size in bytes (65536, 64K, 64KiB)")
    group.add_argument("--glibc", metavar="V", help="node glibc version, e.g. 2.34")
    group.add_argument("--root", metavar="DIR",
                       help="a node image mounted at DIR: its ld.so.cache and lib dirs")
    group.add_argument("--env-file", metavar="FILE",
                       help="the job's environment as KEY=VALUE lines "
                            "(default: this shell's environment)")


_SIZE = re.compile(r"(0x[0-9a-f]+|[0-9]+)\s*(k|kb|kib|m|mb|mib)?", re.IGNORECASE)


def parse_page_size(text: str) -> int:
    """``65536``, ``64K``, ``64KiB``, ``0x10000`` → bytes; the same bounds as
    the config (a power of two from 4 KiB to 1 MiB), so the command line
    cannot describe a node the config would refuse."""
    m = _SIZE.fullmatch(text.strip())
    if not m:
        raise UsageError(f"--page-size: not a size: {_shown(text)}")
    number = int(m.group(1), 0)
    unit = (m.group(2) or "").lower()
    number *= {"": 1, "k": 1024, "kb": 1024, "kib": 1024,
               "m": 1 << 20, "mb": 1 << 20, "mib": 1 << 20}[unit]
    from ..node import valid_page_size

    try:
        return valid_page_size(number)
    except ValueError as exc:
        raise UsageError(f"--page-size: {exc}") from None


def parse_arch(text: str) -> str:
    from ..node import valid_arch

    try:
        return valid_arch(text)
    except ValueError as exc:
        raise UsageError(f"--arch: {_shown(str(exc))}") from None


def parse_glibc_option(text: str) -> tuple[int, int]:
    from ..node import parse_glibc

    version = parse_glibc(text) if re.fullmatch(r"(glibc\s+)?\d+\.\d+(\.\d+)?", text.strip()) \
        else None
    if version is None:
        raise UsageError(f'--glibc: must look like "2.34", got {_shown(text)}')
    return version


def _shown(text: str) -> str:
    from ..messages import escape

    return repr(escape(text))


def report_config_error(exc: ConfigError) -> int:
    """Every problem, one line each, as ``FILE:LINE: key: message``."""
    from ..messages import escape

    for problem in exc.problems:
        for line in str(problem).split("\n"):
            err(escape(line))
    return EX_CONFIG


def build_node(args: argparse.Namespace, policy: Policy) -> NodeProfile:
    """Detected host → config ``[node]`` → partition facts → options."""
    from ..decide import node_for
    from ..node import detect

    machine = parse_arch(args.arch) if args.arch is not None else None
    page_size = parse_page_size(args.page_size) if args.page_size is not None else None
    glibc = parse_glibc_option(args.glibc) if args.glibc is not None else None
    root = None
    if args.root is not None:
        if not os.path.isdir(args.root):
            raise UsageError(f"--root: not a directory: {_shown(args.root)}")
        root = os.path.abspath(args.root)
    node = node_for(policy, args.partition, base=detect(), use_partition=True)
    if machine is None and page_size is None and glibc is None and root is None:
        return node
    return node.with_overrides(machine=machine, page_size=page_size, glibc=glibc, root=root)


def note_unknown_partition(args: argparse.Namespace, policy: Policy) -> None:
    """A misspelt partition silently falls back to the top-level mode and the
    host's facts; say so, because the answer would look plausible."""
    from ..messages import escape

    if args.partition and policy.partition(args.partition) is None:
        where = f"in {escape(policy.source)}" if policy.source else "(no --config given)"
        err(f"note: partition {escape(args.partition)!r} is not configured {where}; "
            f"judging with the top-level mode and the node facts shown")


def node_json(node: NodeProfile) -> dict[str, object]:
    out: dict[str, object] = {
        "machine": node.machine,
        "page_size": node.page_size,
        "glibc": f"{node.glibc[0]}.{node.glibc[1]}" if node.glibc else None,
        "root": node.root,
    }
    # Only when stated (config, --gpu-arch/--cuda-driver): NVML's answer is
    # read by a step with GPUs, not by describing the node.
    if node.gpu_arch is not None:
        out["gpu_arch"] = f"sm_{node.gpu_arch[0]}{node.gpu_arch[1]}"
    if node.cuda_driver is not None:
        out["cuda_driver"] = f"{node.cuda_driver[0]}.{node.cuda_driver[1]}"
    return out


# --------------------------------------------------------------------------
# The job's environment

_ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def read_env_file(path: str) -> dict[str, str]:
    """``KEY=VALUE`` lines, as ``env`` prints them; blank lines and lines
    starting with ``#`` are skipped. Values are taken literally (no quotes,
    no expansion): the plugin sees the environment as it is, not as a shell
    would rewrite it. A line that is not ``KEY=VALUE`` is an error naming it,
    because silently dropping, say, a PATH line would change the answer.
    """
    from ..messages import escape

    try:
        with open(path, "rb") as fh:
            raw = fh.read()
    except OSError as exc:
        raise UsageError(f"--env-file: cannot read {escape(path)}: "
                         f"{exc.strerror or exc}") from None
    env: dict[str, str] = {}
    text = raw.decode("utf-8", "surrogateescape")
    for number, line in enumerate(text.split("\n"), 1):
        if line.endswith("\r"):
            line = line[:-1]
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep or not _ENV_KEY.fullmatch(key):
            shown = line if len(line) <= 80 else line[:77] + "..."
            raise UsageError(f"--env-file {escape(path)}:{number}: not a KEY=VALUE line: "
                             f"{escape(shown)!r}")
        env[key] = value
    return env


def job_env(args: argparse.Namespace) -> dict[str, str]:
    if args.env_file is not None:
        return read_env_file(args.env_file)
    return dict(os.environ)
