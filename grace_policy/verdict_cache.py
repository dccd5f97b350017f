"""Clean verdicts the plugin may reuse without starting Python.

Most steps on a cluster run the same few programs again and again; their
check is clean every time. A cache entry says: *for these inputs, and while
the filesystem answers these questions the same way, the verdict is a clean
allow*. The plugin's C side (``spank/grace_cache.c``) reads entries from a
root-owned file it opened before privileges were dropped, asks every
recorded question again with the user's rights, and only on a full match
skips Python. Anything else (a changed file, a new file earlier in a search
path, another config, another plugin version) is a miss, and the full check
runs.

Only clean allows are cached: a step with findings or environment changes
must explain itself, which needs Python anyway.

Format (ASCII, one entry per block; keep in step with grace_cache.c)::

    GPC1
    I <name> <value>        one per input; value "-" absent, "=<enc>" present
    O mode <mode>           what the audit line reports on a hit
    P <op> <enc path> <enc answer>   op: s stat, l lstat, r realpath,
                                     D a directory listed (identity and times)
    .

``<enc>`` is :func:`grace_policy.fsprobe.encode` (percent-encoding of every
byte outside printable ASCII, and of ``%``), so a record is always one line.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

from . import fsprobe
from .findings import Verdict

MAGIC = "GPC1"
END = "."
#: Entries larger than this are not written (a huge tree is better checked).
#: A Python step in a large environment records a few hundred files and
#: directories (~50 KiB for a torch install).
MAX_ENTRY = 256 * 1024


def cacheable(verdict: Verdict) -> bool:
    # An exempted finding is never replayed as a clean allow: the entry would
    # outlive the exemption's last day (and the audit line must say why).
    return (verdict.action == "allow" and not verdict.findings and verdict.env.empty
            and verdict.error is None and verdict.skipped is None and not verdict.exempted)


def _value(value: str | None) -> str:
    return "-" if value is None else "=" + fsprobe.encode(value)


def inputs(*, argv0: str, cwd: str, partition: str | None, user_mode: str | None,
           env: Mapping[str, str], env_names: Iterable[str]) -> list[tuple[str, str]]:
    """The step's inputs a clean verdict depends on, besides the filesystem.
    ``env_names``: every variable the check reads (PATH, LD_LIBRARY_PATH and
    the policy's env-leak names)."""
    out = [("argv0", _value(argv0)), ("cwd", _value(cwd)), ("partition", _value(partition)),
           ("user_mode", _value(user_mode))]
    for name in dict.fromkeys(env_names):
        out.append(("env:" + name, _value(env.get(name))))
    return out


def config_probes(paths: Iterable[str]) -> list[tuple[str, str, str]]:
    """The config files' identity at decision time: a new config is a miss."""
    out = []
    for path in paths:
        try:
            st = os.stat(path)
        except OSError as exc:
            out.append(("s", path, fsprobe.signature(None, exc.errno or 0)))
        else:
            out.append(("s", path, fsprobe.signature(st)))
    return out


def entry(step_inputs: list[tuple[str, str]], mode: str,
          probes: list[tuple[str, str, str]]) -> str | None:
    """The entry text, or None when it cannot be trusted to replay (a
    relative path, whose meaning depends on a cwd) or is too large."""
    read = dict(step_inputs)
    for op, name, value in probes:
        if op == "v":  # a variable the check read on the way (env -S ${VAR})
            read.setdefault("env:" + name, _value(None if value == "-" else value[1:]))
        elif op == "i":  # another input it read (argc, argv:N of a Python step)
            read.setdefault(name, _value(None if value == "-" else value[1:]))
    lines = [MAGIC]
    lines += [f"I {fsprobe.encode(name)} {value}" for name, value in read.items()]
    lines.append(f"O mode {fsprobe.encode(mode)}")
    for op, path, answer in probes:
        if op in ("v", "i"):
            continue
        if not path.startswith("/"):
            return None
        lines.append(f"P {op} {fsprobe.encode(path)} {fsprobe.encode(answer)}")
    lines.append(END)
    # The leading newline ends a torn entry left by a writer that died
    # mid-write, so this one still starts on a line of its own.
    text = "\n" + "\n".join(lines) + "\n"
    return text if len(text) <= MAX_ENTRY else None


def decode(token: str) -> str:
    raw = bytearray()
    i = 0
    while i < len(token):
        if token[i] == "%" and i + 3 <= len(token):
            raw.append(int(token[i + 1:i + 3], 16))
            i += 3
        else:
            raw.append(ord(token[i]))
            i += 1
    return os.fsdecode(bytes(raw))


def parse(text: str) -> list[tuple[list[tuple[str, str]], str, list[tuple[str, str, str]]]]:
    """Entries of a cache file; torn or foreign blocks are skipped (Python's
    reading of what grace_cache.c reads, used by the tests and the CLI)."""
    out = []
    block: list[str] | None = None
    for line in text.split("\n"):
        if line == MAGIC:
            block = []
        elif line == END and block is not None:
            ins, mode, probes, ok = [], "", [], True
            for item in block:
                parts = item.split(" ")
                if parts[0] == "I" and len(parts) == 3:
                    ins.append((decode(parts[1]), parts[2]))
                elif parts[0] == "O" and len(parts) == 3 and parts[1] == "mode":
                    mode = decode(parts[2])
                elif parts[0] == "P" and len(parts) == 4:
                    probes.append((parts[1], decode(parts[2]), decode(parts[3])))
                else:
                    ok = False
            if ok and mode:
                out.append((ins, mode, probes))
            block = None
        elif block is not None:
            block.append(line)
    return out


def lookup(text: str, step_inputs: list[tuple[str, str]],
           env: Mapping[str, str] | None = None) -> str | None:
    """The mode of a matching, still-true entry, or None (Python's twin of
    the C lookup; the C side is what runs in slurmstepd). Like C, an
    ``env:NAME`` input the caller did not list is read from ``env``."""
    wanted = dict(step_inputs)

    def current(name: str) -> str | None:
        if name in wanted:
            return wanted[name]
        if env is not None and name.startswith("env:"):
            return _value(env.get(name[4:]))
        return None

    for ins, mode, probes in reversed(parse(text)):
        if any(current(name) != value for name, value in ins):
            continue
        if "container" in wanted and all(name != "container" for name, _ in ins):
            continue  # a host entry says nothing about an image (as grace_cache.c)
        if fsprobe.still_true(probes):
            return mode
    return None
