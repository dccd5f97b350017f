"""Import what a check may need, and check nothing: for a pre-started checker.

A per-node checker that forks a child per step pays every import once, in
the parent, if the parent imports them before the first step; each child
then starts with them. :func:`preload` does that. It reads no config, no
user file and no node file (ld.so.cache, the interpreter, its libraries:
those are the step's inputs and must be read by the step's own check, as
the step's user), so calling it changes no verdict. It also builds
CPython's syntax-tree types (the first parse of a process pays for them)
and freezes what is alive for the garbage collector (``gc.freeze``: the
use the CPython docs give it, before a fork).

:data:`STEP` is what a clean step's check imports (``/bin/true``,
``python3 -c pass`` with and without a venv, an executable with 100
libraries: tests/test_warm.py checks that nothing is left over);
:data:`LATER` is what rarer paths import (a finding and its wording, an
exemption, a login-node or 64 KiB check, torch, editable installs), on
request only (see :func:`preload`).
"""

from __future__ import annotations

from .slurm_bridge import PRELOAD

_PYCF_ONLY_AST = 0x400

#: Imported by a clean step's check, in the order the check needs them: the
#: list the C prestart of grace_python.c walks one module at a time.
STEP = PRELOAD

#: Imported by rarer checks: findings and their wording, exemptions, the
#: rules of particular packages, another architecture's or page size's.
LATER = ("grace_policy.rules", "grace_policy.exempt", "grace_policy.pagecode",
         "grace_policy.python.editable", "grace_policy.python.torch_build",
         "grace_policy.python.torchcodec", "grace_policy.python.jitcache",
         "grace_policy.python.gpus", "grace_policy.python.nodeinterp")


#: Imported by a container step's check (pyxis: a local image, a named
#: container, a registry image's manifest, and the root pyxis made from it
#: after the pull): the node checker holds them, so that each of those
#: checks - on a pyxis cluster, most steps, two for a registry image - does
#: not pay ~15-20 ms of imports in its child. They add 19 files to every
#: verdict-cache entry the node checker writes (measured: +0.04 ms of
#: stat on a miss, as much on a hit).
CONTAINERS = ("grace_policy.plugstack", "grace_policy.image", "grace_policy.image.view",
              "grace_policy.image.open", "grace_policy.image.step",
              "grace_policy.image.squashfs", "grace_policy.container",
              "grace_policy.container.enroot", "grace_policy.container.plan",
              "grace_policy.container.pyxis", "grace_policy.container.named",
              "grace_policy.container.registry", "grace_policy.registry",
              "grace_policy.registry.reference", "grace_policy.registry.settings",
              "grace_policy.registry.http", "grace_policy.registry.auth",
              "grace_policy.registry.manifest", "grace_policy.registry.step")


def preload(*, later: bool = False, containers: bool = False) -> list[str]:
    """Import :data:`STEP` (:data:`LATER` with ``later``, :data:`CONTAINERS`
    with ``containers``). Returns the
    names that failed to import (a broken install: the check reports it
    itself when it needs the module); never raises for them.

    ``later`` is off by default: every verdict-cache entry records the
    package's modules loaded in the process that wrote it
    (``slurm_bridge.code_files``, so a reinstall is a miss), and each one
    held without need is one more file to stat on every miss and every hit
    (measured: +0.6 ms on a forked ``/bin/true`` miss with all of LATER)."""
    import importlib

    failed = []
    for name in STEP + (LATER if later else ()) + (CONTAINERS if containers else ()):
        try:
            importlib.import_module(name)
        except Exception:
            failed.append(name)
    # The first syntax tree of a process builds CPython's AST node types
    # (~1 ms); every Python step parses its -c text or script
    # (python/usage.py), so do it once here, on a text of our own.
    compile("import _\n", "<grace-policy preload>", "exec", _PYCF_ONLY_AST)
    # What is alive now (modules, their functions and constants) lives as
    # long as the process: out of the collector's reach, a forked child's
    # collections no longer walk it, and so no longer write to (and copy)
    # every page of the parent's heap (measured: 1-2 ms of a forked
    # `python3 -c pass` check).
    import gc

    gc.freeze()
    return failed


def prefault() -> int:
    """Touch every object reachable from the loaded modules, in a child
    forked from a preloaded parent, before its step arrives; returns how
    many. Why: after ``fork`` the child shares the parent's pages until it
    writes to them, and in CPython reading an object writes to it (its
    reference count), so the first check of a child takes one page copy per
    page it touches (measured here: ~900 copies, ~5 us each, half of a
    forked ``python3 -c pass`` check's CPU time). A checker that forks its
    next child ahead of time can have the child take those copies while it
    waits. Reads no file; pointless in a process that will not fork."""
    import gc
    import sys

    seen: set[int] = set()
    stack: list[object] = list(sys.modules.values())
    referents = gc.get_referents
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        stack.extend(referents(obj))
    return len(seen)
