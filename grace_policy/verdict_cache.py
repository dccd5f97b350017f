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
    O scope node            only in the node-wide file (below)
    P <op> <enc path> <enc answer>   op: s stat, l lstat, r realpath,
                                     D a directory listed (identity and times)
    .

Inputs C knows: ``argv0``, ``cwd``, ``partition``, ``user_mode``, ``config``,
``code``, ``creds``, ``node``, ``host`` (:func:`host_profile`: the machine,
page size, kernel release and glibc C sees now), ``gpus`` (the node's GPU
facts as the node checker published them: the text of
``<cache_dir>/gpus.v<version>``, which C reads as root beside the cache
files; :mod:`grace_policy.cuda.nodegpus`; no such file: never a match),
``container`` (``KIND:IMAGE``) and ``cargs`` (the runtime's options, C's
``key=value`` lines; both required of an entry a container step replays),
``env:NAME``, ``argv:N``
(the step's argument N), ``argc`` (exactly that many) and ``argmin`` (at
least that many: a Python step records the arguments up to its script,
``-c`` or ``-m`` operand, and ``argmin`` one more than the last, so the
script's own arguments are not part of the key).

Two files per node and version: ``<uid>.v<version>``, the user's, and
``node.v<version>``, entries every user may replay. An entry goes to the
node-wide file only when :mod:`grace_policy.nodeowned` finds that no user
can change any of its answers; it then has no ``creds`` input (every user
gets the same answers) and no ``cwd`` when nothing was resolved against it.

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
#: The mark of an entry for the node-wide file (C refuses it elsewhere, and
#: refuses entries without it there).
SCOPE_NODE = "node"
#: Entries larger than this are not written (a huge tree is better checked).
#: A Python step in a large environment records a few hundred files and
#: directories (~50 KiB for a torch install).
MAX_ENTRY = 256 * 1024


#: Inputs a check may note that the C lookup cannot compute (so they never
#: match): an entry with one is not worth its bytes, and is not written.
#: ``nvml``: the node's GPUs as NVML answered a process that did not publish
#: them (grace_policy/cuda/stepcheck.py; published facts are ``gpus``).
NEVER_MATCHED = frozenset({"nvml"})


def replayable(probes: Iterable[tuple[str, str, str]]) -> bool:
    """Whether an entry with these recorded answers could ever be replayed."""
    return not any(op == "i" and name in NEVER_MATCHED for op, name, _v in probes)


def cacheable(verdict: Verdict) -> bool:
    # An exempted finding is never replayed as a clean allow: the entry would
    # outlive the exemption's last day (and the audit line must say why).
    return (verdict.action == "allow" and not verdict.findings and verdict.env.empty
            and verdict.error is None and verdict.skipped is None and not verdict.exempted)


def value(value: str | None) -> str:
    """An input's value as an entry spells it: ``-`` absent, ``=<enc>``."""
    return "-" if value is None else "=" + fsprobe.encode(value)


_value = value


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


def host_profile() -> str:
    """What C computes for the ``host`` input (grace_cache.c): machine, page
    size, kernel release and glibc of this node now. A node rebooted into a
    64 KiB kernel, or with another glibc, replays nothing made before. The
    config's ``[node]``/partition overrides are part of the key through the
    config file's identity and the ``partition`` input."""
    uts = os.uname()
    try:
        libc = os.confstr("CS_GNU_LIBC_VERSION") or "-"
    except (ValueError, OSError):
        libc = "-"
    return f"{uts.machine} {os.sysconf('SC_PAGE_SIZE')} {uts.release} {libc}"


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


def read_inputs(step_inputs: list[tuple[str, str]],
                probes: list[tuple[str, str, str]]) -> dict[str, str]:
    """The step's inputs plus those the check noted on the way."""
    read = dict(step_inputs)
    for op, name, value in probes:
        if op == "v":  # a variable the check read on the way (env -S ${VAR})
            read.setdefault("env:" + name, _value(None if value == "-" else value[1:]))
        elif op == "i":  # another input it read (argv:N, argmin of a Python step)
            read.setdefault(name, _value(None if value == "-" else value[1:]))
    return read


def node_wide(step_inputs: list[tuple[str, str]], probes: list[tuple[str, str, str]],
              cwd: str | None) -> list[tuple[str, str]] | None:
    """The inputs of a node-wide entry, or None when the entry must stay the
    user's: some recorded answer is one a user could change (a user's file,
    a directory users may write, an answer that depends on who asks).
    Without ``creds``: every user gets the same answers. Without ``cwd``
    when no recorded path lies in it and no Python variable was read (a
    Python step's sys.path holds the cwd, normalised)."""
    from .nodeowned import NodeOwned

    files = [p for p in probes if p[0] not in ("v", "i")]
    if not files or not NodeOwned().all_owned(files):
        return None
    out = [(name, value) for name, value in step_inputs if name != "creds"]
    used_cwd = cwd is None or cwd in ("", "/") or any(
        op == "v" and name.startswith("PYTHON") for op, name, _v in probes)
    if not used_cwd:
        below = cwd.rstrip("/") + "/"
        used_cwd = any(path == cwd or path.startswith(below) for _op, path, _a in files)
    if not used_cwd:
        out = [(name, value) for name, value in out if name != "cwd"]
    return out


def entry(step_inputs: list[tuple[str, str]], mode: str,
          probes: list[tuple[str, str, str]], *, scope: str | None = None) -> str | None:
    """The entry text, or None when it cannot be trusted to replay (a
    relative path, whose meaning depends on a cwd) or is too large.
    ``scope``: :data:`SCOPE_NODE` for the node-wide file."""
    read = read_inputs(step_inputs, probes)
    lines = [MAGIC]
    lines += [f"I {fsprobe.encode(name)} {value}" for name, value in read.items()]
    lines.append(f"O mode {fsprobe.encode(mode)}")
    if scope is not None:
        lines.append(f"O scope {fsprobe.encode(scope)}")
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


Block = tuple[list[tuple[str, str]], str, list[tuple[str, str, str]], str | None]


def parse_blocks(text: str) -> list[Block]:
    """Entries of a cache file as (inputs, mode, probes, scope); torn or
    foreign blocks are skipped (Python's reading of what grace_cache.c
    reads, used by the tests and the CLI)."""
    out: list[Block] = []
    block: list[str] | None = None
    for line in text.split("\n"):
        if line == MAGIC:
            block = []
        elif line == END and block is not None:
            ins, mode, probes, ok = [], "", [], True
            scope: str | None = None
            for item in block:
                parts = item.split(" ")
                if parts[0] == "I" and len(parts) == 3:
                    ins.append((decode(parts[1]), parts[2]))
                elif parts[0] == "O" and len(parts) == 3 and parts[1] == "mode":
                    mode = decode(parts[2])
                elif parts[0] == "O" and len(parts) == 3 and parts[1] == "scope":
                    scope = decode(parts[2])
                elif parts[0] == "P" and len(parts) == 4:
                    probes.append((parts[1], decode(parts[2]), decode(parts[3])))
                else:
                    ok = False
            if ok and mode:
                out.append((ins, mode, probes, scope))
            block = None
        elif block is not None:
            block.append(line)
    return out


def parse(text: str) -> list[tuple[list[tuple[str, str]], str, list[tuple[str, str, str]]]]:
    """Entries of a cache file as (inputs, mode, probes)."""
    return [(ins, mode, probes) for ins, mode, probes, _scope in parse_blocks(text)]


#: Inputs every entry has (grace_cache.c's required set): a block without
#: them is not the bridge's and never matches. A node-wide entry has no
#: ``creds`` and may lack ``cwd``.
REQUIRED = ("argv0", "cwd", "partition", "user_mode", "config", "code", "creds", "node",
            "host", "env:PATH")
REQUIRED_NODE = tuple(n for n in REQUIRED if n not in ("cwd", "creds"))


def _arg_matches(name: str, value: str, argv: list[str] | tuple[str, ...]) -> bool:
    if name == "argc":
        return value == _value(str(len(argv)))
    if name == "argmin":
        return value[:1] == "=" and value[1:].isdigit() and len(argv) >= int(value[1:])
    index = name[5:]
    if not index.isdigit():
        return False
    i = int(index)
    return value == _value(argv[i] if i < len(argv) else None)


def lookup(text: str, step_inputs: list[tuple[str, str]],
           env: Mapping[str, str] | None = None, *,
           argv: list[str] | tuple[str, ...] | None = None,
           scope: str | None = None) -> str | None:
    """The mode of a matching, still-true entry, or None (Python's twin of
    the C lookup; the C side is what runs in slurmstepd). Like C, an
    ``env:NAME`` input the caller did not list is read from ``env``, and
    ``argc``/``argmin``/``argv:N`` from ``argv`` when given. ``scope``: the
    file being read (:data:`SCOPE_NODE`: the node-wide one, whose entries
    must carry the mark; the user's file takes none that do)."""
    wanted = dict(step_inputs)

    def current(name: str) -> str | None:
        if name in wanted:
            return wanted[name]
        if name.startswith("env:"):
            # C reads the step's environment: a caller that passes none
            # describes a step with no other variables (every step's entry
            # records the GPU variables, SLURM_GPUS_ON_NODE absent or not).
            return _value((env or {}).get(name[4:]))
        return None

    def matches(name: str, value: str) -> bool:
        if argv is not None and (name in ("argc", "argmin") or name.startswith("argv:")):
            return _arg_matches(name, value, argv)
        return current(name) == value

    required = REQUIRED_NODE if scope == SCOPE_NODE else None
    for ins, mode, probes, block_scope in reversed(parse_blocks(text)):
        if block_scope != scope:
            continue
        if required is not None and not set(required) <= {name for name, _v in ins}:
            continue
        if any(not matches(name, value) for name, value in ins):
            continue
        if "container" in wanted and not {"container", "cargs"} <= {name for name, _ in ins}:
            continue  # a host entry says nothing about an image (as grace_cache.c)
        if fsprobe.still_true(probes):
            return mode
    return None
