"""The interpreter a node of another architecture runs for a Python step.

Asked from a login node about a node of another architecture
(``node.root_is_native`` False), a program on a distribution path
(``/usr/bin/python3.11``, or a venv's ``bin/python`` linked to it) is not
the file this host holds: each node has its own build there, as it has its
own ``/usr/lib``, and that build is what imports the venv, the user site,
``PYTHONPATH`` and ``.pth`` directories on shared storage. So the check goes
on with a stand-in for the node's build (:func:`node_build`): the node's
machine and loader, the ``libpython`` it names kept (it tells the version,
as on the node), no file of its own judged (the node's system libraries
count as present by name). The X.Y comes from what names it here (the
name, ``pyvenv.cfg``, the ``lib/pythonX.Y`` landmark: the node runs the
same distribution); its extension suffixes are the node's
(:mod:`.suffixes`); the distribution's standard library and site-packages
are the node's own and are not judged from here (``sitepath.is_system``).

A user's own interpreter (a venv made with ``--copies``, conda, uv-managed,
a tarball build) is none of that: it is the very file the node will
execute, and it is judged as it is, its ELF machine first.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from .. import fsprobe
from .._record import dataclass, replace
from ..budget import Budget, BudgetExceeded
from ..elf import ET_DYN, ElfError, ElfInfo, machine_name, read_elf
from ..loader import CANONICAL_INTERP, Loading, Process
from ..node import NodeProfile, node_owns


def is_node_build(path: str, node: NodeProfile, files: fsprobe.Files = fsprobe.HOST) -> bool:
    """Whether the node runs its own build of ``path``, not this host's file."""
    return not node.root_is_native and node_owns(node, path, files)


def node_build(path: str, local: ElfInfo | None, node: NodeProfile) -> ElfInfo:
    """The node's own build of the program at ``path``, as far as the check
    needs it: the node's machine and loader; of this host's file only the
    ``libpython`` it links (a distribution links the same on every
    architecture), nothing whose layout or search path would be this host's."""
    needed = tuple(n for n in (local.needed if local else ()) if n.startswith("libpython"))
    interps = CANONICAL_INTERP.get(node.machine, ())
    if local is not None:
        base = local
    else:
        base = ElfInfo(path=path, elf_class=0, data=0, machine=0, e_type=ET_DYN, osabi=0,
                       phentsize=0, interp=None, load_segments=(), relro=None,
                       has_dynamic=True, needed=(), soname=None, rpath=None, runpath=None,
                       flags_1=0)
    return replace(base, path=path, elf_class=node.elf_class, data=node.data,
                   machine=node.machine_number, e_type=ET_DYN,
                   interp=interps[0] if interps else None, load_segments=(), relro=None,
                   has_dynamic=True, needed=needed, soname=None, rpath=None, runpath=None,
                   flags_1=0)


def node_process(path: str, local: ElfInfo | None, node: NodeProfile, env: Mapping[str, str],
                 how: Loading) -> Process:
    """The loader's view of the node's own build of ``path``: what its
    extension modules are ``dlopen``-ed from (``how``: the check's working
    directory, budget and files)."""
    return Process(path, node_build(path, local, node), node, env,
                   Loading(cwd=how.cwd, budget=how.budget, files=how.files))


@dataclass(frozen=True)
class Basis:
    """Which interpreter an answer assumed the node runs, and why."""

    #: "node-build": the node's own build at a distribution path;
    #: "file": the file itself (a user's own interpreter, or the node's own file)
    kind: str
    #: the program as given, and what the node executes (its real path)
    program: str
    real: str
    #: the machine the interpreter is built for ("" when unreadable)
    machine: str
    version: tuple[int, int] | None
    #: what told the version (interp.Interpreter.evidence), or ""
    evidence: str

    def text(self, node: NodeProfile) -> str:
        """One sentence for ``grace-policy env``: the answer's basis."""
        ver = f"CPython {self.version[0]}.{self.version[1]}" if self.version else "no CPython"
        told = f"; the version from its {self.evidence}" if self.evidence else ""
        if self.kind == "node-build":
            via = f"{self.program} links there; " if self.program != self.real else ""
            return (f"the node's own {node.machine} {ver} at {self.real} ({via}a distribution "
                    f"path: each node has its own build there{told}; its standard library "
                    f"is the node's and not judged from here)")
        built = f"built for {self.machine}" if self.machine else "not a readable ELF file"
        if node.root_is_native:
            why = "the node's architecture is this host's, or its image is given: " \
                  "judged as it is"
        else:
            why = "a user's own interpreter, not a distribution path: the node runs this " \
                  "very file"
        return f"{self.real} itself, {ver}, {built} ({why}{told})"

    def to_json(self) -> dict[str, object]:
        return {"kind": self.kind, "program": self.program, "real": self.real,
                "machine": self.machine,
                "version": f"{self.version[0]}.{self.version[1]}" if self.version else None,
                "evidence": self.evidence}


def basis(program: str, node: NodeProfile, budget: Budget,
          files: fsprobe.Files = fsprobe.HOST) -> Basis:
    """The interpreter the node runs for ``program`` (a path in ``files``),
    as the check assumes it. Never raises but BudgetExceeded."""
    from .interp import identify, node_realpath

    try:
        real = node_realpath(node, program, files=files)
    except (OSError, ValueError):
        real = program
    try:
        local: ElfInfo | None = read_elf(files.realpath(program), budget=budget, files=files)
    except (ElfError, OSError):
        local = None
    own = is_node_build(program, node, files)
    info = node_build(program, local, node) if own else local
    found = None
    if info is not None:
        try:
            found = identify(program, info, node, budget, files)
        except BudgetExceeded:
            raise
        except Exception:
            found = None
    if own:
        machine = node.machine
    else:
        machine = machine_name(local.machine) if local is not None else ""
    return Basis("node-build" if own else "file", program, real or os.path.abspath(program),
                 machine, found.version if found else None, found.evidence if found else "")
