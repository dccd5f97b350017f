"""A model of glibc's dynamic loader: which file each DT_NEEDED name becomes.

It follows ``elf/dl-load.c`` (glibc 2.33-2.40) step by step so that the answer
equals what ``ld.so --list`` prints, which the oracle tests check on every
library of this machine and, through qemu, on aarch64:

* names with a ``/`` are opened as given (after ``$ORIGIN``-style expansion);
* otherwise: DT_RPATH of the loading object and its loaders up to the
  executable (only if the loading object has no DT_RUNPATH), the executable's
  DT_RPATH, ``LD_LIBRARY_PATH``, the loading object's DT_RUNPATH, the
  ld.so.cache, the system directories (the last two not under DF_1_NODEFLIB);
* each directory is tried with its supported ``glibc-hwcaps`` subdirectories
  first;
* a candidate of the wrong ELF class or machine is skipped silently and the
  search goes on; a non-ELF file, a wrong byte order or an unloadable type is
  fatal, as in glibc;
* names already loaded (as requested, by DT_SONAME, or the same file) are
  reused; objects are loaded breadth first.

We model ``ld.so --list`` rather than a real start: all missing libraries are
reported, not only the first.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

from . import ldcache
from .budget import Budget
from .elf import ELFCLASS32, ET_DYN, ET_EXEC, ElfError, ElfInfo, machine_name, read_elf
from .node import NodeProfile

#: PT_INTERP paths of each target's loader, for judging a foreign node from a
#: host that does not carry that loader.
CANONICAL_INTERP = {
    "x86_64": ("/lib64/ld-linux-x86-64.so.2", "/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"),
    "aarch64": ("/lib/ld-linux-aarch64.so.1", "/lib/aarch64-linux-gnu/ld-linux-aarch64.so.1"),
    "i386": ("/lib/ld-linux.so.2",),
    "ppc64": ("/lib64/ld64.so.2",),
    "s390x": ("/lib/ld64.so.1",),
    "riscv64": ("/lib/ld-linux-riscv64-lp64d.so.1",),
}

_X86_64_HWCAPS = (
    ("x86-64-v4", ("avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl")),
    ("x86-64-v3", ("avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave")),
    ("x86-64-v2", ("cx16", "lahf_lm", "popcnt", "sse4_1", "sse4_2", "ssse3")),
)


@dataclass(frozen=True)
class Candidate:
    """A file the search looked at and passed over, with glibc's reason."""

    path: str
    reason: str
    machine: str = ""


@dataclass(frozen=True)
class LoadedObject:
    name: str
    path: str
    info: ElfInfo
    found_via: str
    needed_by: str | None
    skipped: tuple[Candidate, ...] = ()
    #: True when the file was not judged because it stands for a node system
    #: library that this host only has in its own architecture.
    by_name_only: bool = False


@dataclass(frozen=True)
class Missing:
    name: str
    needed_by: str
    skipped: tuple[Candidate, ...]
    searched: tuple[str, ...]

    @property
    def foreign(self) -> tuple[Candidate, ...]:
        return tuple(c for c in self.skipped if c.machine)


@dataclass(frozen=True)
class Fatal:
    """glibc would stop with ``reason`` on ``path``."""

    name: str
    path: str
    needed_by: str
    reason: str


@dataclass(frozen=True)
class LoadTree:
    objects: tuple[LoadedObject, ...]
    missing: tuple[Missing, ...] = ()
    fatal: tuple[Fatal, ...] = ()
    #: Objects to judge for page layout (everything actually read).
    edges: tuple[tuple[str, str], ...] = field(default=())

    def resolved(self) -> dict[str, str | None]:
        """``{needed name: path or None}``, like ``ld.so --list``."""
        out: dict[str, str | None] = {}
        for obj in self.objects[1:]:
            if obj.found_via != "interp":
                out.setdefault(obj.name, obj.path)
        for miss in self.missing:
            out.setdefault(miss.name, None)
        return out


class _Map:
    """The loader's link_map: one loaded object and the names it answers to."""

    __slots__ = ("file_id", "info", "loader", "name", "names", "origin", "path")

    def __init__(self, name: str, path: str, info: ElfInfo, loader: _Map | None,
                 origin: str | None, file_id: tuple[int, int] | None) -> None:
        self.name = name
        self.path = path
        self.info = info
        self.loader = loader
        self.origin = origin
        self.file_id = file_id
        self.names = {name}
        if info.soname:
            self.names.add(info.soname)


class _Searcher:
    def __init__(self, node: NodeProfile, env: Mapping[str, str], cwd: str,
                 budget: Budget | None, cache: ldcache.LdCache | None) -> None:
        self.node = node
        self.env = env
        self.cwd = cwd
        self.budget = budget
        self._cache = cache
        self._hwcaps: tuple[str, ...] | None = None
        self._dir_has_hwcaps: dict[str, bool] = {}
        self._system_dirs = system_dirs(node)

    # -- the pieces of the search -------------------------------------------------

    @property
    def cache(self) -> ldcache.LdCache:
        if self._cache is None:
            self._cache = ldcache.load(self.node.in_root("/etc/ld.so.cache"))
        return self._cache

    def hwcaps(self) -> tuple[str, ...]:
        if self._hwcaps is None:
            self._hwcaps = supported_hwcaps(self.node)
        return self._hwcaps

    def expand(self, text: str, origin: str | None) -> str | None:
        """Dynamic string tokens; None drops the element, as glibc does when
        ``$ORIGIN`` cannot be known."""
        if "$" not in text:
            return text
        out: list[str] = []
        i = 0
        while i < len(text):
            ch = text[i]
            if ch != "$":
                out.append(ch)
                i += 1
                continue
            for token, value in (("ORIGIN", origin), ("PLATFORM", self.node.platform),
                                 ("LIB", lib_token(self.node))):
                length = _dst_len(text, i + 1, token)
                if length:
                    if value is None:
                        return None
                    out.append(value)
                    i += 1 + length
                    break
            else:
                out.append(ch)
                i += 1
        return "".join(out)

    def path_list(self, text: str, origin: str | None, seps: str = ":") -> list[str]:
        dirs: list[str] = []
        elems = [text]
        for sep in seps:
            elems = [part for elem in elems for part in elem.split(sep)]
        for elem in elems:
            expanded = self.expand(elem, origin)
            if expanded is None:
                continue
            while len(expanded) > 1 and expanded.endswith("/"):
                expanded = expanded[:-1]
            dirs.append(expanded)
        return dirs

    def subdirs(self, directory: str) -> list[str]:
        """glibc-hwcaps subdirectories (best first), then the directory."""
        prefix = directory + "/" if directory and directory != "/" else directory
        if self.node.machine != "x86_64":
            return [prefix]
        has = self._dir_has_hwcaps.get(directory)
        if has is None:
            has = os.path.isdir(self.to_host(prefix + "glibc-hwcaps"))
            self._dir_has_hwcaps[directory] = has
        if not has:
            return [prefix]
        return [f"{prefix}glibc-hwcaps/{sub}/" for sub in self.hwcaps()] + [prefix]

    def to_host(self, path: str) -> str:
        """A node path as a path on this host.

        Relative paths are relative to the job's cwd. With a node image, a
        path is looked up in the image first and on this host after (shared
        storage such as /home is the same on both), as ``qemu -L`` does.
        """
        if not path.startswith("/"):
            return os.path.join(self.cwd, path)
        if self.node.root in ("", "/"):
            return path
        inside = self.node.in_root(path)
        return inside if os.path.lexists(inside) else path

    # -- verifying one candidate (open_verify) -----------------------------------

    def verify(self, path: str) -> tuple[str, ElfInfo | None, str]:
        """``("ok", info, "")``, ``("skip", info, reason)``, ``("absent", None,
        reason)`` or ``("fatal", None|info, reason)``."""
        if self.budget is not None:
            self.budget.take_file()
        host_path = self.to_host(path)
        try:
            info = read_elf(host_path)
        except FileNotFoundError:
            return "absent", None, "no such file"
        except NotADirectoryError:
            return "absent", None, "not a directory"
        except PermissionError:
            return "absent", None, "permission denied"
        except IsADirectoryError:
            return "fatal", None, "cannot read file data: Is a directory"
        except OSError as exc:
            return "absent", None, exc.strerror or "cannot open"
        except ElfError as exc:
            if exc.reason == "not a regular file":
                if os.path.isdir(host_path):
                    return "fatal", None, "cannot read file data: Is a directory"
                return "fatal", None, "not a regular file"
            if exc.reason in ("file too short", "not an ELF file"):
                return "fatal", None, exc.reason if exc.reason == "file too short" else (
                    "invalid ELF header")
            return "fatal", None, f"invalid ELF file: {exc.reason}"
        node = self.node
        if info.elf_class != node.elf_class:
            return "skip", info, f"wrong ELF class: ELFCLASS{info.bits}"
        if info.data != node.data:
            return "fatal", info, "ELF file data encoding does not match the node"
        if info.osabi not in (0, 3):
            return "fatal", info, "ELF file OS ABI invalid"
        if info.machine != node.machine_number:
            return "skip", info, f"wrong machine: {info.machine_name}"
        if info.e_type not in (ET_DYN, ET_EXEC):
            return "fatal", info, "only ET_DYN and ET_EXEC can be loaded"
        expected = 32 if info.elf_class == ELFCLASS32 else 56
        if info.phentsize != expected:
            return "fatal", info, "ELF file's phentsize not the expected size"
        return "ok", info, ""

    # -- one name (_dl_map_object) ---------------------------------------------

    def search(self, name: str, loader: _Map) -> tuple[str, str | None, ElfInfo | None,
                                                        list[Candidate], list[str], str]:
        """Returns (outcome, path, info, skipped, searched, via) where outcome is
        ``found``, ``missing`` or ``fatal`` (then ``via`` holds the reason)."""
        skipped: list[Candidate] = []
        searched: list[str] = []

        def try_dirs(dirs: list[str], via: str):
            for directory in dirs:
                for prefix in self.subdirs(directory):
                    path = prefix + name
                    searched.append(path)
                    status, info, reason = self.verify(path)
                    if status == "ok":
                        return "found", path, info, via
                    if status == "skip":
                        assert info is not None
                        skipped.append(Candidate(path, reason, info.machine_name))
                    elif status == "fatal":
                        return "fatal", path, info, reason
            return None

        if "/" in name:
            path = self.expand(name, loader.origin)
            if path is None:
                return "missing", None, None, skipped, searched, "path"
            status, info, reason = self.verify(path)
            searched.append(path)
            if status == "ok":
                return "found", path, info, skipped, searched, "path"
            if status == "fatal":
                return "fatal", path, info, skipped, searched, reason
            if status == "skip":
                assert info is not None
                skipped.append(Candidate(path, reason, info.machine_name))
            return "missing", None, None, skipped, searched, "path"

        info_runpath = loader.info.runpath
        if info_runpath is None:
            seen_main = False
            chain: _Map | None = loader
            while chain is not None:
                if chain.info.rpath is not None:
                    hit = try_dirs(self.path_list(chain.info.rpath, chain.origin), "rpath")
                    if hit:
                        return hit[0], hit[1], hit[2], skipped, searched, hit[3]
                    seen_main |= chain.loader is None
                if chain.loader is None:
                    break
                chain = chain.loader

        llp = self.env.get("LD_LIBRARY_PATH")
        if llp:
            main = loader
            while main.loader is not None:
                main = main.loader
            hit = try_dirs(self.path_list(llp, main.origin, ":;"), "LD_LIBRARY_PATH")
            if hit:
                return hit[0], hit[1], hit[2], skipped, searched, hit[3]

        if info_runpath is not None:
            hit = try_dirs(self.path_list(info_runpath, loader.origin), "runpath")
            if hit:
                return hit[0], hit[1], hit[2], skipped, searched, hit[3]

        nodeflib = loader.info.nodeflib
        if self.node.root_is_native:
            cached = self.cache.lookup(name, self.node.cache_flags, self.hwcaps())
        else:
            cached = self.cache.lookup(name, None)
        if cached is not None and nodeflib:
            if any(cached.startswith(d + "/") for d in self._system_dirs):
                cached = None
        if cached is not None:
            searched.append(cached)
            if not self.node.root_is_native:
                return "found", cached, None, skipped, searched, "ld.so.cache (by name)"
            status, info, reason = self.verify(cached)
            if status == "ok":
                return "found", cached, info, skipped, searched, "ld.so.cache"
            if status == "fatal":
                return "fatal", cached, info, skipped, searched, reason
            if status == "skip":
                assert info is not None
                skipped.append(Candidate(cached, reason, info.machine_name))

        if not nodeflib:
            if not self.node.root_is_native:
                for directory in self._system_dirs:
                    path = f"{directory}/{name}"
                    searched.append(path)
                    if os.path.exists(path):
                        return "found", path, None, skipped, searched, "system dir (by name)"
            else:
                hit = try_dirs(list(self._system_dirs), "system dir")
                if hit:
                    return hit[0], hit[1], hit[2], skipped, searched, hit[3]
        return "missing", None, None, skipped, searched, ""


def _dst_len(text: str, start: int, token: str) -> int:
    """Length of ``token`` or ``{token}`` at ``start`` when it is a whole word."""
    if text.startswith("{" + token + "}", start):
        return len(token) + 2
    if text.startswith(token, start):
        end = start + len(token)
        if end == len(text) or not (text[end].isalnum() or text[end] == "_"):
            return len(token)
    return 0


def lib_token(node: NodeProfile) -> str:
    """``$LIB``: Debian-style glibc expands it to ``lib/<triplet>``."""
    if os.path.isdir(node.in_root(f"/lib/{node.multiarch}")) or os.path.isdir(
        node.in_root(f"/usr/lib/{node.multiarch}")
    ):
        return f"lib/{node.multiarch}"
    return node.lib


def system_dirs(node: NodeProfile) -> tuple[str, ...]:
    """glibc's built-in search path for the node's layout, as node paths.

    Debian-style (multiarch) glibc searches ``/lib/<triplet>``,
    ``/usr/lib/<triplet>``, ``/lib``, ``/usr/lib``; Red Hat-style 64-bit glibc
    ``/lib64``, ``/usr/lib64``. When judging a foreign node from this host we
    use the host's layout, where its libraries stand by name.
    """
    if not node.root_is_native:
        host = NodeProfile(machine=_host_machine(), page_size=node.page_size, glibc=None)
        return system_dirs(host)
    triplet = node.multiarch
    if os.path.isdir(node.in_root(f"/lib/{triplet}")) or os.path.isdir(
        node.in_root(f"/usr/lib/{triplet}")
    ):
        return (f"/lib/{triplet}", f"/usr/lib/{triplet}", "/lib", "/usr/lib")
    if node.lib == "lib64" and (os.path.isdir(node.in_root("/lib64"))
                                or os.path.isdir(node.in_root("/usr/lib64"))):
        return ("/lib64", "/usr/lib64")
    return (f"/lib/{triplet}", f"/usr/lib/{triplet}", "/lib", "/usr/lib")


def _host_machine() -> str:
    from .node import host_machine

    return host_machine()


def supported_hwcaps(node: NodeProfile) -> tuple[str, ...]:
    """glibc-hwcaps subdirectories the node's loader searches, best first.

    Only x86_64 defines levels that apply here (aarch64 defines none). On this
    host we read the CPU flags; for a simulated node we assume all levels.
    """
    if node.machine != "x86_64":
        return ()
    if not node.root_is_native or node.root not in ("", "/"):
        return tuple(name for name, _ in _X86_64_HWCAPS)
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    break
            else:
                flags = set()
    except OSError:
        flags = set()
    out = []
    for name, needs in reversed(_X86_64_HWCAPS):
        if not all(f in flags for f in needs):
            break
        out.append(name)
    return tuple(reversed(out))


def _file_id(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def resolve(
    exe_path: str,
    exe_info: ElfInfo,
    node: NodeProfile,
    env: Mapping[str, str],
    *,
    cwd: str = "/",
    budget: Budget | None = None,
    cache: ldcache.LdCache | None = None,
    exec_origin: bool = True,
) -> LoadTree:
    """Every object the loader would load for ``exe_path``.

    ``exec_origin``: the executable's ``$ORIGIN`` is the directory of its real
    path, as the kernel reports it to a program started by execve; set False
    to model ``ld.so --list FILE``, where it is the directory as given.
    """
    searcher = _Searcher(node, env, cwd, budget, cache)
    host_exe = searcher.to_host(exe_path)
    if exec_origin:
        origin = os.path.dirname(os.path.realpath(host_exe))
        if node.root not in ("", "/") and origin.startswith(node.root.rstrip("/") + "/"):
            origin = origin[len(node.root.rstrip("/")):]
    else:
        absolute = exe_path if exe_path.startswith("/") else os.path.join(cwd, exe_path)
        origin = os.path.dirname(absolute) or "/"
    main = _Map(exe_path, exe_path, exe_info, None, origin, _file_id(host_exe))
    maps: list[_Map] = [main]
    objects: list[LoadedObject] = [
        LoadedObject(exe_path, exe_path, exe_info, "exe", None)
    ]
    missing: list[Missing] = []
    fatal: list[Fatal] = []
    edges: list[tuple[str, str]] = []

    interp = exe_info.interp
    if not interp and exe_info.needed:
        # Whatever runs this object has the node's loader mapped already (a
        # library listed on its own, or dlopened): its soname is taken.
        interp = next((p for p in CANONICAL_INTERP.get(node.machine, ())
                       if os.path.exists(searcher.to_host(p))), None)
    if interp:
        status, info, reason = searcher.verify(interp)
        if status == "ok" and info is not None:
            rtld = _Map(interp, interp, info, None, os.path.dirname(interp),
                        _file_id(searcher.to_host(interp)))
            maps.append(rtld)
        elif not node.root_is_native and interp in CANONICAL_INTERP.get(node.machine, ()):
            pass  # the node's own loader; this host cannot hold it
        elif status == "fatal" or status == "skip":
            fatal.append(Fatal(interp, interp, exe_path, reason or "cannot run the interpreter"))
        else:
            missing.append(Missing(interp, exe_path, (), (interp,)))

    queue: deque[_Map] = deque([main])
    while queue:
        loader = queue.popleft()
        if budget is not None:
            budget.tick()
        for name in loader.info.needed:
            known = _find_loaded(maps, name)
            if known is not None:
                edges.append((loader.path, known.path))
                continue
            outcome, path, info, skipped, searched, via = searcher.search(name, loader)
            if outcome == "missing" or path is None:
                if not any(m.name == name for m in missing):
                    missing.append(Missing(name, loader.path, tuple(skipped), tuple(searched)))
                continue
            if outcome == "fatal":
                fatal.append(Fatal(name, path, loader.path, via))
                continue
            if info is None:
                # A node system library judged by name from a foreign host.
                maps.append(_Map(name, path, _placeholder(name), loader, None, None))
                objects.append(LoadedObject(name, path, _placeholder(name), via, loader.path,
                                            tuple(skipped), by_name_only=True))
                edges.append((loader.path, path))
                continue
            host_path = searcher.to_host(path)
            fid = _file_id(host_path)
            same = next((m for m in maps if fid is not None and m.file_id == fid), None)
            if same is not None:
                same.names.add(name)
                edges.append((loader.path, same.path))
                continue
            origin = os.path.dirname(path if path.startswith("/") else os.path.join(cwd, path))
            new = _Map(name, path, info, loader, origin, fid)
            maps.append(new)
            objects.append(LoadedObject(name, path, info, via, loader.path, tuple(skipped)))
            edges.append((loader.path, path))
            queue.append(new)
    for m in maps:
        if m is not main and m.name == (interp or "") and m.loader is None:
            objects.insert(1, LoadedObject(m.name, m.path, m.info, "interp", exe_path))
            break
    return LoadTree(tuple(objects), tuple(missing), tuple(fatal), tuple(edges))


def _find_loaded(maps: list[_Map], name: str) -> _Map | None:
    for m in maps:
        if name in m.names:
            return m
    return None


def _placeholder(name: str) -> ElfInfo:
    return ElfInfo(path=name, elf_class=0, data=0, machine=0, e_type=0, osabi=0, phentsize=0,
                   interp=None, load_segments=(), relro=None, has_dynamic=False, needed=(),
                   soname=name, rpath=None, runpath=None, flags_1=0)


def describe_candidate(c: Candidate) -> str:
    return f"{c.path} ({c.reason})"


__all__ = [
    "CANONICAL_INTERP",
    "Candidate",
    "Fatal",
    "LoadTree",
    "LoadedObject",
    "Missing",
    "describe_candidate",
    "machine_name",
    "resolve",
    "supported_hwcaps",
    "system_dirs",
]
