"""Leaked conda and virtualenv variables: which ones to strip, and why.

sbatch and srun export the login shell's whole environment by default, so an
activated environment from an x86_64 login node arrives on an aarch64 node
pointing at interpreters that cannot run there (uv: "Failed to inspect Python
interpreter ... Exec format error"). A native venv activated on the node stays.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from . import fsprobe
from ._record import dataclass
from .elf import ElfError, read_elf
from .findings import EnvChanges, Issue
from .launch import follow
from .node import NodeProfile, node_owns
from .policy import DEFAULT_ENV_VARS

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .budget import Budget

#: The variables an activated conda or venv leaves behind (one list, the
#: config's default).
DEFAULT_VARS = DEFAULT_ENV_VARS

#: Variables that name an environment prefix directly, or a file two levels
#: below it (``<prefix>/bin/conda``).
_PREFIX_VARS = {"CONDA_PREFIX": 0, "VIRTUAL_ENV": 0, "CONDA_EXE": 2, "CONDA_PYTHON_EXE": 2}


@dataclass(frozen=True)
class EnvPlan:
    changes: EnvChanges
    issues: tuple[Issue, ...]
    #: Prefixes judged foreign or missing (for remediation causes).
    foreign_prefixes: tuple[str, ...]


def _prefixes(env: Mapping[str, str], names: Sequence[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for var, up in _PREFIX_VARS.items():
        value = env.get(var)
        if var not in names or not value or not value.startswith("/"):
            continue
        prefix = value
        for _ in range(up):
            prefix = os.path.dirname(prefix)
        out[var] = prefix.rstrip("/") or "/"
    return out


def judge_prefix(prefix: str, node: NodeProfile, env: Mapping[str, str],
                 budget: Budget | None = None,
                 files: fsprobe.Files = fsprobe.HOST) -> str | None:
    """Why the environment at ``prefix`` cannot run here, or None if it can.

    Judged by its interpreter, followed like execve would (symlinks, ``#!``):
    that is what uv, pip and ``python`` from PATH would start.
    """
    if not files.isdir(prefix):
        return f"{prefix} does not exist on this node"
    for name in ("bin/python", "bin/python3"):
        candidate = os.path.join(prefix, name)
        if not files.lexists(candidate):
            continue
        hops = follow(candidate, env, "/", budget, files)
        last = hops[-1]
        if last.kind == "missing":
            return f"its interpreter {candidate} points at {last.path}, which is missing here"
        if last.kind != "elf":
            return None
        if not node.root_is_native and node_owns(node, last.path, files):
            return None  # judged from another architecture: the node has its own
        try:
            info = read_elf(last.path, budget=budget, files=files)
        except (ElfError, OSError):
            return None
        if not node.runs(info):
            return f"its interpreter {last.path} is built for {node.arch_of(info)}"
        return None
    return None


def _strip_paths(value: str, prefixes: Sequence[str]) -> str:
    kept = [
        part for part in value.split(":")
        if not any(part == p or part.startswith(p + "/") for p in prefixes)
    ]
    return ":".join(kept)


def plan(env: Mapping[str, str], node: NodeProfile, *, names: Sequence[str] = DEFAULT_VARS,
         strip: str = "foreign", budget: Budget | None = None,
         files: fsprobe.Files = fsprobe.HOST) -> EnvPlan:
    """What to remove from the step environment. ``strip`` is ``foreign``
    (only environments that cannot run here), ``always`` or ``never``."""
    present = [n for n in names if n in env]
    if not present:
        return EnvPlan(EnvChanges(), (), ())
    prefixes = _prefixes(env, names)
    foreign: dict[str, str] = {}
    for prefix in dict.fromkeys(prefixes.values()):
        reason = judge_prefix(prefix, node, env, budget, files)
        if reason is not None:
            foreign[prefix] = reason

    groups = {
        "venv": [n for n in present if n.startswith("VIRTUAL_ENV")],
        "conda": [n for n in present if not n.startswith("VIRTUAL_ENV")],
    }
    unset: list[str] = []
    strip_prefixes: list[str] = []
    issues: list[Issue] = []
    for group, members in groups.items():
        if not members:
            continue
        group_prefixes = [prefixes[n] for n in members if n in prefixes]
        bad = [p for p in group_prefixes if p in foreign]
        if strip == "never":
            do_strip = False
        elif strip == "always":
            do_strip = True
        else:
            do_strip = bool(bad)
        if bad or do_strip:
            target = (bad or group_prefixes or [env.get(members[0], "")])[0]
            reason = foreign.get(target, "the site strips these variables from every step")
            issues.append(Issue(
                "env-leak", target,
                f"programs that follow {', '.join(members)} (uv, pip, python, conda) would run "
                f"what is at {target}: {reason}",
                causes=("leaked-env",),
                facts=(("vars", " ".join(members)), ("prefix", target),
                       ("cleaned", "yes" if do_strip else "no"),
                       ("reason", reason), ("group", group)),
            ))
        if do_strip:
            unset.extend(members)
            strip_prefixes.extend(group_prefixes)

    sets: list[tuple[str, str]] = []
    if strip_prefixes:
        for var in ("PATH", "LD_LIBRARY_PATH"):
            value = env.get(var)
            if value is None:
                continue
            cleaned = _strip_paths(value, strip_prefixes)
            if cleaned != value:
                if cleaned or var == "PATH":
                    sets.append((var, cleaned))
                else:
                    unset.append(var)
    return EnvPlan(EnvChanges(tuple(unset), tuple(sets)), tuple(issues), tuple(foreign))
