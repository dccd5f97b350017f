"""JIT and extension caches holding another architecture's compiled code.

The caches and how their owners find them (read in their sources):

- torch.utils.cpp_extension (``load()``; DeepSpeed's JIT ops go through it):
  ``TORCH_EXTENSIONS_DIR``, else ``$XDG_CACHE_HOME/torch_extensions``, else
  ``~/.cache/torch_extensions``; builds under ``py311_cu124/<name>/<name>.so``
  — keyed by Python and CUDA version, not by CPU architecture.
- Triton: ``TRITON_CACHE_DIR``, else ``$TRITON_HOME/.triton/cache`` (HOME
  when TRITON_HOME is unset); ``<hash>/__triton_launcher.so`` and
  ``cuda_utils.so`` are host code. DeepSpeed's Triton autotune tables
  (``~/.triton/autotune``) are pickles, not machine code: not scanned.
- TorchInductor: ``TORCHINDUCTOR_CACHE_DIR``, else
  ``$TMPDIR/torchinductor_$USER`` (tempfile's TMPDIR/TEMP/TMP, else /tmp;
  getpass's LOGNAME/USER/LNAME/USERNAME).
- FlashInfer (``flashinfer/jit/env.py``): ``$FLASHINFER_WORKSPACE_BASE`` (else
  HOME) ``/.cache/flashinfer/<GPU archs>/cached_ops/...`` — keyed by the GPU's
  architecture, not the CPU's.

HOME and the rest come from the step's environment. Only names that look like
shared objects (``*.so``, ``*.so.N``) are opened, and only their first bytes
(class and machine); directories are told from the listing's entry types — so
a cache of thousands of files costs a listing per directory and a small read
per shared object, bounded by ``max_entries`` per cache. Those reads are
charged to the budget's bytes and deadline but not to its file count: a big
cache must not turn a step into check-limit for a warning.
"""

from __future__ import annotations

import stat as _stat

from .. import fsprobe
from ..elf import ElfError, read_head
from ..findings import Issue
from ..node import Ident
from .nodepath import host_path, scandir

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

    from ..budget import Budget
    from ..node import NodeProfile

#: How deep below a cache root shared objects are looked for (inductor's
#: triton/0/<hash>/x.so is the deepest seen).
MAX_DEPTH = 6
#: Files named in a finding.
SHOWN = 3

#: Per-architecture places to suggest, by the variable that sets the cache.
PER_ARCH = {
    "TORCH_EXTENSIONS_DIR": "$HOME/.cache/torch_extensions-$(uname -m)",
    "TRITON_CACHE_DIR": "$HOME/.triton/cache-$(uname -m)",
    "TORCHINDUCTOR_CACHE_DIR": "/tmp/torchinductor_$USER-$(uname -m)",
    "FLASHINFER_WORKSPACE_BASE": "$HOME/flashinfer-$(uname -m)",
}


def _env(env: Mapping[str, str], name: str, files: fsprobe.Files) -> str:
    """The variable as the tools would use it, noted in ``files``' record
    for the verdict cache; trailing slashes dropped so joined paths are
    normal."""
    value = env.get(name)
    files.note_env(name, value)
    value = (value or "").strip()
    return value.rstrip("/") or value[:1]


def cache_dirs(env: Mapping[str, str],
               files: fsprobe.Files = fsprobe.HOST) -> list[tuple[str, str]]:
    """``[(variable that sets it, cache dir)]`` for the step, defaults filled in
    from its HOME/XDG_CACHE_HOME/TRITON_HOME/TMPDIR/USER; relative or empty
    results are dropped (the tools would resolve them against a cwd they
    choose themselves)."""
    home = _env(env, "HOME", files)
    out: list[tuple[str, str]] = []

    def add(var: str, path: str) -> None:
        if path.startswith("/"):
            path = "/" + path.lstrip("/")  # HOME=/ gives //.cache: one slash
        path = path.rstrip("/") or path
        if path.startswith("/") and all(p != path for _, p in out):
            out.append((var, path))

    ext = _env(env, "TORCH_EXTENSIONS_DIR", files)
    if not ext:
        xdg = _env(env, "XDG_CACHE_HOME", files)
        base = xdg or (f"{home}/.cache" if home else "")
        ext = f"{base}/torch_extensions" if base else ""
    add("TORCH_EXTENSIONS_DIR", ext)

    triton = _env(env, "TRITON_CACHE_DIR", files)
    if not triton:
        triton_home = _env(env, "TRITON_HOME", files) or home
        triton = f"{triton_home}/.triton/cache" if triton_home else ""
    add("TRITON_CACHE_DIR", triton)

    inductor = _env(env, "TORCHINDUCTOR_CACHE_DIR", files)
    if not inductor:
        tmp = (_env(env, "TMPDIR", files) or _env(env, "TEMP", files)
               or _env(env, "TMP", files) or "/tmp")
        user = ""
        for var in ("LOGNAME", "USER", "LNAME", "USERNAME"):
            user = _env(env, var, files)
            if user:
                break
        if user and "/" not in user:
            inductor = f"{tmp}/torchinductor_{user}"
    add("TORCHINDUCTOR_CACHE_DIR", inductor)

    flashinfer = _env(env, "FLASHINFER_WORKSPACE_BASE", files) or home
    add("FLASHINFER_WORKSPACE_BASE", f"{flashinfer}/.cache/flashinfer" if flashinfer else "")
    return out


def _looks_shared(name: str) -> bool:
    return name.endswith(".so") or ".so." in name


def _foreign_machine(host: str, node: NodeProfile, budget: Budget,
                     files: fsprobe.Files) -> str | None:
    """The machine of an ELF shared object or executable at ``host`` when it is
    not the node's, else None (the node's own, not ELF, unreadable, an object
    file)."""
    budget.spend_bytes(20)
    try:
        head = read_head(host, 20, files)
    except (OSError, ElfError, ValueError):
        return None
    if len(head) < 20 or head[:4] != b"\x7fELF" or head[5] not in (1, 2):
        return None
    order = "little" if head[5] == 1 else "big"
    e_type = int.from_bytes(head[16:18], order)
    if e_type not in (2, 3):  # ET_EXEC, ET_DYN: what a loader maps
        return None
    machine = int.from_bytes(head[18:20], order)
    ident = Ident(machine, head[4], head[5])
    if node.runs(ident):
        return None
    name = node.arch_of(ident)
    return name if head[4] == node.elf_class else f"{name} ({32 * head[4]}-bit)"


def scan_cache(root: str, node: NodeProfile, budget: Budget, *,
               max_entries: int = 2000, files: fsprobe.Files = fsprobe.HOST
               ) -> tuple[list[tuple[str, str]], bool]:
    """(foreign files as (node path, machine), whether the scan stopped at
    ``max_entries`` before the end). Directory loops are followed once."""
    found: list[tuple[str, str]] = []
    seen: set[tuple[int, int]] = set()
    entries = 0
    stack: list[tuple[str, int]] = [(root, 0)]
    while stack:
        directory, depth = stack.pop()
        budget.tick()
        host = host_path(directory, node, "/", files)
        try:
            st = files.stat(host)
        except (OSError, ValueError):
            continue
        if not _stat.S_ISDIR(st.st_mode) or (st.st_dev, st.st_ino) in seen:
            continue
        seen.add((st.st_dev, st.st_ino))
        try:
            listed = sorted(scandir(host, files), key=lambda e: e.name)
        except (OSError, ValueError):
            continue
        subdirs = []
        for entry in listed:
            entries += 1
            if entries > max_entries:
                return found, True
            budget.tick()
            name = entry.name
            if name.startswith("."):
                continue
            path = f"{directory}/{name}"
            if _looks_shared(name):
                machine = _foreign_machine(host_path(path, node, "/", files), node, budget,
                                           files)
                if machine is not None:
                    found.append((path, machine))
                continue
            try:
                is_dir = entry.is_dir()  # free from the listing, except for links
            except OSError:
                is_dir = False  # a link loop or an unreadable target
            if is_dir and depth < MAX_DEPTH:
                subdirs.append((path, depth + 1))
        stack.extend(reversed(subdirs))
    return found, False


def jit_cache_issues(env: Mapping[str, str], node: NodeProfile, budget: Budget, *,
                     max_entries: int = 2000, files: fsprobe.Files = fsprobe.HOST) -> list[Issue]:
    """One jit-cache-foreign warning per cache directory of the step that holds
    compiled code of another machine."""
    issues: list[Issue] = []
    for var, root in cache_dirs(env, files):
        found, stopped = scan_cache(root, node, budget, max_entries=max_entries, files=files)
        if not found:
            continue
        machines = sorted({m for _, m in found})
        shown = ", ".join(p[len(root) + 1:] if p.startswith(root + "/") else p
                          for p, _ in found[:SHOWN])
        if len(found) > SHOWN:
            shown += ", ..."
        count = str(len(found)) if not stopped else f"at least {len(found)}"
        issues.append(Issue(
            "jit-cache-foreign", root, "", causes=("jit-cache",),
            facts=(("name", var), ("per_arch", PER_ARCH[var]), ("count", count), ("files", shown),
                   ("file_arch", ", ".join(machines)),
                   ("detail", f"the scan stopped after {max_entries} entries" if stopped
                    else "")),
        ))
    return issues
