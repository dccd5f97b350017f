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

import functools
import os
import struct
from collections import deque
from collections.abc import Mapping

from . import fsprobe, ldcache
from ._record import dataclass, field
from .budget import Budget
from .elf import (
    DF_1_NOW,
    ELFCLASS32,
    ET_DYN,
    ET_EXEC,
    ElfError,
    ElfInfo,
    machine_name,
    read_elf,
    read_head,
)
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
    #: ``"library"`` (a DT_NEEDED name) or ``"interp"`` (the PT_INTERP path,
    #: which the kernel, not ld.so, fails on: ``ld.so --list`` does not show it).
    kind: str = "library"

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


#: glibc before 2.41 asserts in dl-lookup.c ``check_match`` when a versioned
#: reference binds to a symbol of the very object its DT_VERNEED names and
#: that object has no DT_VERDEF (removed by glibc commit bdaf500353, 2.41).
#: The line of that assert in each release's ``elf/dl-lookup.c``.
_CHECK_MATCH_ASSERT_LINE = {(2, 28): 111, (2, 29): 111, (2, 30): 111, (2, 31): 111,
                            (2, 32): 111, (2, 33): 111, (2, 34): 105, (2, 35): 106,
                            (2, 36): 107, (2, 37): 107, (2, 38): 107, (2, 39): 106,
                            (2, 40): 106}
_CHECK_MATCH_ASSERT = ("Inconsistency detected by ld.so: dl-lookup.c: {line}: check_match: "
                       "Assertion `version->filename == NULL || ! _dl_name_match_p "
                       "(version->filename, map)' failed!")


@dataclass(frozen=True)
class VersionMissing:
    """A symbol version ``needed_by`` requires of ``path`` (loaded for the
    DT_NEEDED name ``name``) that ``path`` does not define: glibc refuses
    to start the program (or fails the dlopen). ``kind`` is ``"missing"``
    (the version check fails) or ``"unversioned"`` (``path`` defines no
    versions at all, and a glibc before 2.41 aborts on the first symbol
    bound there: ``assert_line`` is that glibc's line, 0 when unknown)."""

    version: str
    name: str
    path: str
    needed_by: str
    #: The newest version of the same family ``path`` does define
    #: (``GLIBC_2.36`` when ``GLIBC_2.38`` is wanted), or "".
    newest: str = ""
    kind: str = "missing"
    assert_line: int = 0
    #: ``needed_by`` binds every symbol at start (DF_1_NOW, ld -z now): the
    #: assertion of an ``"unversioned"`` pair is then certain; with lazy
    #: binding it comes only if a symbol there is ever called, so the
    #: finding is a warning, never a refusal.
    bind_now: bool = True

    def message(self) -> str:
        """glibc's text: the version check's (dl-version.c ``match_symbol``,
        with the object name in front as rtld and dlerror print it), or the
        assertion ld.so dies with."""
        if self.kind == "unversioned":
            return _CHECK_MATCH_ASSERT.format(line=self.assert_line or "NNN")
        return (f"{self.path}: version `{self.version}' not found "
                f"(required by {self.needed_by})")

    @property
    def facts(self) -> tuple[tuple[str, str], ...]:
        if self.kind == "unversioned":
            have = f"{self.path} was built without symbol versions"
        elif self.newest:
            have = f"{self.path} defines {self.newest} at most"
        else:
            have = f"{self.path} does not define it"
        facts = (("name", self.name), ("version", self.version),
                 ("needed_by", self.needed_by), ("detail", have))
        if self.kind == "unversioned" and not self.bind_now:
            facts = (*facts, ("max_severity", "warning"))
        return facts


@dataclass(frozen=True)
class LoadTree:
    objects: tuple[LoadedObject, ...]
    missing: tuple[Missing, ...] = ()
    fatal: tuple[Fatal, ...] = ()
    #: Objects to judge for page layout (everything actually read).
    edges: tuple[tuple[str, str], ...] = field(default=())
    #: Non-weak version needs the loaded objects do not define.
    versions: tuple[VersionMissing, ...] = ()

    def resolved(self) -> dict[str, str | None]:
        """``{needed name: path or None}``, like ``ld.so --list``."""
        out: dict[str, str | None] = {}
        for obj in self.objects[1:]:
            if obj.found_via != "interp":
                out.setdefault(obj.name, obj.path)
        for miss in self.missing:
            if miss.kind == "library":
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


def host_path(node: NodeProfile, path: str, cwd: str = "/",
              files: fsprobe.Files = fsprobe.HOST) -> str:
    """A node path as a path on this host.

    Relative paths are relative to the job's cwd. With a node image, a
    path is looked up in the image first and on this host after (shared
    storage such as /home is the same on both), as ``qemu -L`` does.
    Module-level so the Python-step model (grace_policy/python/) reads
    node paths by the same rule as the loader. ``files``: the check's.
    """
    if not path.startswith("/"):
        return os.path.join(cwd, path)
    if node.root in ("", "/"):
        return path
    inside = node.in_root(path)
    return inside if files.lexists(inside) else path


class _Searcher:
    def __init__(self, node: NodeProfile, env: Mapping[str, str], how: Loading) -> None:
        self.node = node
        self.env = env
        self.cwd = how.cwd
        self.budget = how.budget
        self.files = how.files
        self._cache = how.cache
        self._hwcaps: tuple[str, ...] | None = None
        self._subdirs: dict[str, list[str]] = {}
        self._lib: str | None = None
        self._path_lists: dict[tuple[str, str | None, str], list[str]] = {}
        self._system_dirs = system_dirs(node, how.files)
        self.platform = loader_platform(node)
        self._legacy = legacy_hwcap_subdirs(node)
        self._legacy_first = tuple(dict.fromkeys(c.split("/", 1)[0] for c in self._legacy))
        self._legacy_cache = legacy_cache_bits(node) if self._legacy else None

    # -- the pieces of the search -------------------------------------------------

    @property
    def cache(self) -> ldcache.LdCache:
        if self._cache is None:
            # Like every other path: the image's file first, then the host's
            # (what qemu -L does); entries of another architecture are
            # dropped by their flags.
            self._cache = ldcache.load(self.to_host("/etc/ld.so.cache"), self.files)
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
            for token, value in (("ORIGIN", origin), ("PLATFORM", self.platform),
                                 ("LIB", self.lib)):
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

    @property
    def lib(self) -> str:
        if self._lib is None:
            self._lib = lib_token(self.node, self.files)
        return self._lib

    def path_list(self, text: str, origin: str | None, seps: str = ":") -> list[str]:
        """Directories of an RPATH/RUNPATH/LD_LIBRARY_PATH, as glibc decomposes
        them once per object (memoized: an executable's RUNPATH is asked once
        per DT_NEEDED name)."""
        key = (text, origin, seps)
        known = self._path_lists.get(key)
        if known is None:
            known = self._path_lists[key] = self._path_list(text, origin, seps)
        return known

    def _path_list(self, text: str, origin: str | None, seps: str) -> list[str]:
        if not text:
            # decompose_rpath ignores an empty DT_RPATH/DT_RUNPATH (an empty
            # RUNPATH still switches RPATH off); an empty *element* is the cwd.
            return []
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
        """The prefixes glibc tries in ``directory``, best first: supported
        ``glibc-hwcaps/<level>/``, then (glibc < 2.37) the legacy hwcap
        combinations such as ``tls/haswell/x86_64/``, then the directory.

        glibc opens every prefix blindly; we only offer those whose first
        component exists (one stat each, cached per directory), which gives
        the same answer with a few stats instead of ~20 failed opens.
        """
        prefix = directory + "/" if directory and directory != "/" else directory
        known = self._subdirs.get(prefix)
        if known is not None:
            return known
        out: list[str] = []
        levels = self.hwcaps()
        if levels and self.files.isdir(self.to_host(prefix + "glibc-hwcaps")):
            out += [f"{prefix}glibc-hwcaps/{sub}/" for sub in levels]
        if self._legacy:
            present = {first for first in self._legacy_first
                       if self.files.isdir(self.to_host(prefix + first))}
            if present:
                out += [f"{prefix}{combo}/" for combo in self._legacy
                        if combo.split("/", 1)[0] in present]
        out.append(prefix)
        self._subdirs[prefix] = out
        return out

    def to_host(self, path: str) -> str:
        return host_path(self.node, path, self.cwd, self.files)

    # -- verifying one candidate (open_verify) -----------------------------------

    def verify(self, path: str) -> tuple[str, ElfInfo | None, str, str]:
        """glibc's ``open_verify`` on one candidate.

        Returns ``(status, info, reason, machine)``: ``ok``; ``skip`` (wrong
        class or machine: glibc passes over it silently, ``machine`` names
        what it is); ``absent`` (open failed: the search goes on); ``fatal``
        (glibc stops loading with ``reason``, worded as glibc prints it).
        """
        # Only files that exist count against max_files: a Spack-style tree
        # probes hundreds of absent paths for a handful of real libraries.
        if self.budget is not None:
            self.budget.tick()
        host_path = self.to_host(path)
        try:
            info = read_elf(host_path, budget=self.budget, files=self.files)
            if self.budget is not None:
                self.budget.take_file()
        except FileNotFoundError:
            return "absent", None, "no such file", ""
        except NotADirectoryError:
            return "absent", None, "not a directory", ""
        except PermissionError:
            return "absent", None, "permission denied", ""
        except IsADirectoryError:
            return "fatal", None, _EISDIR, ""
        except OSError as exc:
            return "absent", None, exc.strerror or "cannot open", ""
        except ElfError as exc:
            if self.budget is not None:
                self.budget.take_file()
            if exc.reason == "not a regular file":
                if self.files.isdir(host_path):
                    # open(2) succeeds on a directory, read(2) fails: fatal.
                    return "fatal", None, _EISDIR, ""
                return "fatal", None, "not a regular file", ""
            if exc.reason == "file too short":
                return "fatal", None, "file too short", ""
            if exc.reason == "not an ELF file":
                return "fatal", None, "invalid ELF header", ""
            # glibc decides from the first 64 bytes; a file of another
            # class or machine is skipped even if the rest is unreadable.
            return self._verify_ident(host_path, f"invalid ELF file: {exc.reason}")
        node = self.node
        if info.elf_class != node.elf_class:
            return "skip", info, f"wrong ELF class: ELFCLASS{info.bits}", info.machine_name
        if info.data != node.data:
            return "fatal", info, _encoding_error(node), info.machine_name
        if info.osabi not in (0, 3):
            return "fatal", info, "ELF file OS ABI invalid", info.machine_name
        if info.machine != node.machine_number:
            return "skip", info, f"wrong machine: {info.machine_name}", info.machine_name
        if info.e_type not in (ET_DYN, ET_EXEC):
            return "fatal", info, "only ET_DYN and ET_EXEC can be loaded", info.machine_name
        expected = 32 if info.elf_class == ELFCLASS32 else 56
        if info.phentsize != expected:
            return ("fatal", info, "ELF file's phentsize not the expected size",
                    info.machine_name)
        return "ok", info, "", info.machine_name

    def _verify_ident(self, host_path: str,
                      otherwise: str) -> tuple[str, ElfInfo | None, str, str]:
        """open_verify's header tests alone, for a file our reader rejected."""
        try:
            # open_regular: never block on a FIFO swapped in since the first read
            ident = read_head(host_path, 20, self.files)
        except (OSError, ElfError):
            return "fatal", None, otherwise, ""
        node = self.node
        if len(ident) < 20:
            return "fatal", None, otherwise, ""
        elf_class, data = ident[4], ident[5]
        if elf_class != node.elf_class:
            return "skip", None, f"wrong ELF class: {elf_class}", f"class-{elf_class}"
        if data != node.data:
            return "fatal", None, _encoding_error(node), ""
        (machine,) = struct.unpack_from("<H" if data == 1 else ">H", ident, 18)
        if machine != node.machine_number:
            name = machine_name(machine)
            return "skip", None, f"wrong machine: {name}", name
        return "fatal", None, otherwise, machine_name(machine)

    # -- one name (_dl_map_object) ---------------------------------------------

    def search(self, name: str, loader: _Map) -> tuple[str, str | None, ElfInfo | None,
                                                        list[Candidate], list[str], str]:
        """Where ``name`` (already DST-expanded) comes from, for ``loader``.

        Returns (outcome, path, info, skipped, searched, via) where outcome is
        ``found``, ``missing`` or ``fatal`` (then ``via`` holds the reason).
        """
        skipped: list[Candidate] = []
        searched: list[str] = []

        def attempt(path: str) -> tuple[str, ElfInfo | None, str] | None:
            searched.append(path)
            status, info, reason, machine = self.verify(path)
            if status == "ok":
                return "found", info, ""
            if status == "fatal":
                return "fatal", info, reason
            if status == "skip":
                skipped.append(Candidate(path, reason, machine))
            return None

        def try_dirs(dirs: list[str], via: str):
            for directory in dirs:
                for prefix in self.subdirs(directory):
                    path = prefix + name
                    hit = attempt(path)
                    if hit is not None:
                        outcome, info, reason = hit
                        return outcome, path, info, skipped, searched, reason or via
            return None

        if "/" in name:
            hit = attempt(name)
            if hit is not None:
                outcome, info, reason = hit
                return outcome, name, info, skipped, searched, reason or "path"
            return "missing", None, None, skipped, searched, "path"

        runpath = loader.info.runpath
        if runpath is None:
            # DT_RPATH of the loading object, then of its loaders up to the
            # executable. An object that has DT_RUNPATH too has its DT_RPATH
            # ignored by glibc (get-dynamic-info.h), also as a link in the chain.
            chain: _Map | None = loader
            while chain is not None:
                if chain.info.rpath is not None and chain.info.runpath is None:
                    found = try_dirs(self.path_list(chain.info.rpath, chain.origin), "rpath")
                    if found:
                        return found
                chain = chain.loader

        llp = self.env.get("LD_LIBRARY_PATH")
        if llp:
            main = loader
            while main.loader is not None:
                main = main.loader
            found = try_dirs(self.path_list(llp, main.origin, ":;"), "LD_LIBRARY_PATH")
            if found:
                return found

        if runpath is not None:
            found = try_dirs(self.path_list(runpath, loader.origin), "runpath")
            if found:
                return found

        nodeflib = loader.info.nodeflib
        if self.node.root_is_native:
            cached = self.cache.lookup(name, self.node.cache_flags, self.hwcaps(),
                                       self._legacy_cache)
        else:
            cached = self.cache.lookup(name, None)
        if cached is not None and nodeflib:
            # glibc compares the entry with each system dir *with* its
            # trailing slash, so /usr/lib/ also drops /usr/lib/foo/libx.so.
            if any(cached.startswith(d.rstrip("/") + "/") for d in self._system_dirs):
                cached = None
        if cached is not None:
            if not self.node.root_is_native:
                searched.append(cached)
                return "found", cached, None, skipped, searched, "ld.so.cache (by name)"
            hit = attempt(cached)
            if hit is not None:
                outcome, info, reason = hit
                return outcome, cached, info, skipped, searched, reason or "ld.so.cache"

        if not nodeflib:
            if not self.node.root_is_native:
                for directory in self._system_dirs:
                    path = f"{directory}/{name}"
                    searched.append(path)
                    if self.files.exists(path):
                        return "found", path, None, skipped, searched, "system dir (by name)"
            else:
                found = try_dirs(list(self._system_dirs), "system dir")
                if found:
                    return found
        return "missing", None, None, skipped, searched, ""


def _dst_len(text: str, start: int, token: str) -> int:
    """Length of ``token`` or ``{token}`` at ``start`` when it is a whole word."""
    if text.startswith("{" + token + "}", start):
        return len(token) + 2
    if text.startswith(token, start):
        end = start + len(token)
        if end == len(text) or text[end] not in _IDENT_CHARS:
            return len(token)
    return 0


#: glibc's ``is_dst`` ends a token at anything but ASCII ``[A-Za-z0-9_]``.
_IDENT_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")

#: What glibc prints when a candidate is a directory: open(2) works, read(2)
#: fails with EISDIR, and ld.so has no strerror table, hence "Error 21".
_EISDIR = "cannot read file data: Error 21"


def _encoding_error(node: NodeProfile) -> str:
    """glibc's wording, which names the loader's own byte order."""
    order = "little-endian" if node.data == 1 else "big-endian"
    return f"ELF file data encoding not {order}"


def lib_token(node: NodeProfile, files: fsprobe.Files = fsprobe.HOST) -> str:
    """``$LIB``: compiled into ld.so from the same ``slibdir`` as its system
    directories, so it follows them: ``lib/<triplet>`` for Debian-style glibc
    (also the cross glibc in /usr/aarch64-linux-gnu, whose files sit in a
    plain ``lib/``: qemu shows ``lib/aarch64-linux-gnu``), ``lib64`` for Red
    Hat-style."""
    first = system_dirs(node, files)[0]
    return first.lstrip("/") if first.startswith("/lib/") else node.lib


def system_dirs(node: NodeProfile, files: fsprobe.Files = fsprobe.HOST) -> tuple[str, ...]:
    """glibc's built-in search path for the node's layout, as node paths.

    Debian-style (multiarch) glibc searches ``/lib/<triplet>``,
    ``/usr/lib/<triplet>``, ``/lib``, ``/usr/lib``; Red Hat-style 64-bit glibc
    ``/lib64``, ``/usr/lib64``. When judging a foreign node from this host we
    use the host's layout, where its libraries stand by name.
    """
    if not node.root_is_native:
        host = NodeProfile(machine=_host_machine(), page_size=node.page_size, glibc=None)
        return system_dirs(host, files)
    triplet = node.multiarch
    if files.isdir(node.in_root(f"/lib/{triplet}")) or files.isdir(
        node.in_root(f"/usr/lib/{triplet}")
    ):
        return (f"/lib/{triplet}", f"/usr/lib/{triplet}", "/lib", "/usr/lib")
    if node.lib == "lib64" and (files.isdir(node.in_root("/lib64"))
                                or files.isdir(node.in_root("/usr/lib64"))):
        return ("/lib64", "/usr/lib64")
    return (f"/lib/{triplet}", f"/usr/lib/{triplet}", "/lib", "/usr/lib")


def _host_machine() -> str:
    from .node import host_machine

    return host_machine()


@functools.lru_cache(maxsize=1)
def _host_cpu() -> tuple[str, frozenset[str]]:
    """(vendor, feature flags) of this host's first CPU, from /proc/cpuinfo
    (``flags`` on x86, ``Features`` on Arm); read once per process. A fact of
    the node, not of the files judged: read from the host also when the check
    reads an image (:mod:`grace_policy.fsprobe` views), so not through it."""
    vendor, flags = "", frozenset()
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "vendor_id" and not vendor:
                    vendor = value.strip()
                elif key in ("flags", "Features"):
                    flags = frozenset(value.split())
                    break
    except OSError:
        pass
    return vendor, flags


def _cpu_of(node: NodeProfile) -> tuple[str, frozenset[str]] | None:
    """The node's CPU when it is this host's; None for a simulated node or an
    image (then the callers assume a current CPU of the node's architecture)."""
    if node.root not in ("", "/") or node.machine != _host_machine():
        return None
    return _host_cpu()


def loader_platform(node: NodeProfile) -> str:
    """What ``$PLATFORM`` expands to (glibc's ``dl_platform``).

    The kernel's AT_PLATFORM, except that glibc on Intel x86_64 replaces it
    with ``haswell`` (AVX2, FMA, BMI1/2, LZCNT, MOVBE, POPCNT) or ``xeon_phi``
    (AVX512ER/PF) in ``init_cpu_features``: seen here, where ld.so --help
    lists ``haswell (AT_PLATFORM)``.
    """
    cpu = _cpu_of(node)
    if node.machine != "x86_64" or cpu is None or cpu[0] != "GenuineIntel":
        return node.platform
    flags = cpu[1]
    if {"avx512cd", "avx512er", "avx512pf"} <= flags:
        return "xeon_phi"
    if {"avx2", "fma", "bmi1", "bmi2", "abm", "movbe", "popcnt"} <= flags:
        return "haswell"
    return node.platform


def legacy_hwcap_subdirs(node: NodeProfile) -> tuple[str, ...]:
    """Legacy hwcap subdirectories (glibc < 2.37) in the order glibc tries them.

    glibc 2.36 still tries, in *every* search directory, all combinations of
    ``tls``, the platform and the hwcap names it deems important, most
    specific first (``tls/haswell/avx512_1/x86_64`` ... ``x86_64``); glibc
    2.37 removed them. Checked against ``LD_DEBUG=libs`` on x86_64 and under
    qemu-aarch64 (``tls``, ``aarch64``, ``atomics``). The empty combination
    (the directory itself) is not included.
    """
    if node.glibc is None or node.glibc >= (2, 37):
        return ()
    cpu = _cpu_of(node)
    names = ["tls", loader_platform(node)]
    if node.machine == "x86_64":
        # HWCAP_X86_AVX512_1 (bit 2) before HWCAP_X86_64 (bit 1): highest first.
        if cpu is not None and cpu[0] == "GenuineIntel" and (
                {"avx512cd", "avx512bw", "avx512dq", "avx512vl"} <= cpu[1]
                and "avx512er" not in cpu[1]):
            names.append("avx512_1")
        names.append("x86_64")
    elif node.machine == "aarch64" and (cpu is None or "atomics" in cpu[1]):
        names.append("atomics")
    count = len(names)
    out = []
    for mask in range((1 << count) - 1, 0, -1):
        out.append("/".join(names[i] for i in range(count) if mask >> (count - 1 - i) & 1))
    return tuple(out)


#: Legacy hwcap word bits as ldconfig writes them (``dl-procinfo.h``).
_LEGACY_BITS = {"x86_64": 1 << 1, "avx512_1": 1 << 2, "atomics": 1 << 8}
_X86_PLATFORM_BITS = {"i586": 1 << 48, "i686": 1 << 49, "haswell": 1 << 50,
                      "xeon_phi": 1 << 51}


def legacy_cache_bits(node: NodeProfile) -> tuple[int, int]:
    """``(allowed, platform)`` for :meth:`ldcache.LdCache.lookup`: the node's
    important hwcap bits, any platform bit and TLS are allowed; a platform bit
    must be the node's own (none when glibc knows no number for it)."""
    names = {part for combo in legacy_hwcap_subdirs(node) for part in combo.split("/")}
    allowed = ldcache.LEGACY_TLS_BIT
    for name in names:
        allowed |= _LEGACY_BITS.get(name, 0)
    platform = 0
    if node.machine == "x86_64":
        allowed |= sum(_X86_PLATFORM_BITS.values())
        platform = _X86_PLATFORM_BITS.get(loader_platform(node), 0)
    return allowed, platform


def supported_hwcaps(node: NodeProfile) -> tuple[str, ...]:
    """glibc-hwcaps subdirectories the node's loader searches, best first.

    Only x86_64 defines levels that apply here (aarch64 defines none). On this
    host we read the CPU flags; for a simulated node we assume all levels.
    """
    if node.machine != "x86_64":
        return ()
    cpu = _cpu_of(node)
    if cpu is None:
        return tuple(name for name, _ in _X86_64_HWCAPS)
    flags = cpu[1]
    out = []
    for name, needs in reversed(_X86_64_HWCAPS):
        if not all(f in flags for f in needs):
            break
        out.append(name)
    return tuple(reversed(out))


def _file_id(path: str, files: fsprobe.Files) -> tuple[int, int] | None:
    try:
        st = files.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


@dataclass(frozen=True)
class Loading:
    """How a program is started, besides its file, node and environment."""

    #: The working directory (relative ``LD_LIBRARY_PATH`` entries, paths).
    cwd: str = "/"
    #: The check's allowance (None: unbounded, for tools and tests).
    budget: Budget | None = None
    #: The executable's ``$ORIGIN`` is the directory of its real path, as
    #: the kernel reports it to a program started by execve; False models
    #: ``ld.so --list FILE`` (and a library looked at on its own), where it
    #: is the directory as given.
    exec_origin: bool = True
    #: The ld.so.cache to use instead of the node's.
    cache: ldcache.LdCache | None = None
    #: The files the program is read from (the check's: host or image).
    files: fsprobe.Files = field(default=fsprobe.HOST, compare=False)


_EXEC = Loading()


class Process:
    """What one process has mapped: a program started by execve, its
    libraries, and the objects it ``dlopen``s later.

    A Python interpreter imports extension modules with dlopen after start;
    each finds its libraries through its own RPATH/RUNPATH, the RPATH chain
    of the caller up to the executable (conda's python carries
    ``$ORIGIN/../lib``), ``LD_LIBRARY_PATH`` and the system, and reuses
    every soname the process has already loaded (any scope: RTLD_LOCAL does
    not hide a soname from later lookups).
    """

    def __init__(self, exe_path: str, exe_info: ElfInfo, node: NodeProfile,
                 env: Mapping[str, str], how: Loading | None = None) -> None:
        how = how or _EXEC
        cwd, budget, exec_origin = how.cwd, how.budget, how.exec_origin
        self.node = node
        self.cwd = cwd
        self.budget = budget
        self.maps: list[_Map] = []
        self.by_name: dict[str, _Map] = {}
        self.by_file: dict[tuple[int, int], _Map] = {}
        #: Keys added since the dlopen in progress began (undone if it fails).
        self._added: list[tuple[str, object]] | None = None
        self.files = files = how.files
        self.searcher = _Searcher(node, env, how)
        host_exe = self.searcher.to_host(exe_path)
        if exec_origin:
            origin = os.path.dirname(files.realpath(host_exe))
            if node.root not in ("", "/") and origin.startswith(node.root.rstrip("/") + "/"):
                origin = origin[len(node.root.rstrip("/")):]
        else:
            absolute = exe_path if exe_path.startswith("/") else os.path.join(cwd, exe_path)
            origin = os.path.dirname(absolute) or "/"
        main = _Map(exe_path, exe_path, exe_info, None, origin, _file_id(host_exe, files))

        self.add(main)
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
                           if files.exists(self.searcher.to_host(p))), None)
        rtld_loaded = False
        if interp:
            status, info, reason, _machine = self.searcher.verify(interp)
            if status == "ok" and info is not None:
                rtld = _Map(interp, interp, info, None, os.path.dirname(interp),
                            _file_id(self.searcher.to_host(interp), files))
                self.add(rtld)
                rtld_loaded = True
            elif not node.root_is_native and interp in CANONICAL_INTERP.get(node.machine, ()):
                pass  # the node's own loader; this host cannot hold it
            elif status == "fatal" or status == "skip":
                fatal.append(Fatal(interp, interp, exe_path,
                                   reason or "cannot run the interpreter"))
            else:
                missing.append(Missing(interp, exe_path, (), (interp,), kind="interp"))
        if not rtld_loaded and exe_info.needed:
            # Whatever loader ends up running the object (``ld.so FILE``, or the
            # one a fixed PT_INTERP would name) answers to its soname, so
            # libc's DT_NEEDED on it is never searched.
            for path in CANONICAL_INTERP.get(node.machine, ()):
                status, info, _reason, _machine = self.searcher.verify(path)
                if status == "ok" and info is not None:
                    rtld = _Map(path, path, info, None, os.path.dirname(path),
                                _file_id(self.searcher.to_host(path), files))
                    rtld.names.discard(path)
                    self.add(rtld)
                    rtld_loaded = True
                    break
        if not rtld_loaded and not node.root_is_native:
            # Judging another architecture's node from here: its loader is not on
            # this host, but on the node it is mapped and answers to its soname
            # (libc, libjemalloc and gconv modules name it in DT_NEEDED).
            paths = CANONICAL_INTERP.get(node.machine, ())
            if paths:
                rtld = _Map(paths[0], paths[0], _placeholder(os.path.basename(paths[0])), None,
                            os.path.dirname(paths[0]), None)
                rtld.names.update(paths)
                rtld.names.update(os.path.basename(p) for p in paths)
                self.add(rtld)

        self.main = main
        self.exe_path = exe_path
        self._walk(deque([main]), objects, missing, fatal, edges)
        for m in self.maps:
            if m is not main and m.name == (interp or "") and m.loader is None:
                objects.insert(1, LoadedObject(m.name, m.path, m.info, "interp", exe_path))
                break
        #: The executable's own load tree, as :func:`resolve` returns it.
        self.tree = LoadTree(tuple(objects), tuple(missing), tuple(fatal), tuple(edges),
                             self._check_versions(self.maps))
        #: The object that calls dlopen: libpython when the program links it.
        self.caller = next((m for m in self.maps if m.loader is main
                            and any(n.startswith("libpython") for n in m.names)), main)

    def add(self, m: _Map) -> None:
        # Indexed, not scanned: glibc's first-loaded-wins lookup in O(1), so a
        # hostile tree of thousands of objects stays linear.
        self.maps.append(m)
        for known in m.names:
            self._name(known, m)
        if m.file_id is not None and m.file_id not in self.by_file:
            self.by_file[m.file_id] = m
            if self._added is not None:
                self._added.append(("file", m.file_id))

    def _name(self, name: str, m: _Map) -> None:
        if name not in self.by_name:
            self.by_name[name] = m
            if self._added is not None:
                self._added.append(("name", name))

    def dlopen(self, path: str, info: ElfInfo) -> LoadTree:
        """``dlopen(path)`` by the program: the objects it newly maps (first
        the file itself, unless already mapped), what is missing and what is
        fatal. A dlopen that fails maps nothing, so a later one cannot reuse
        a library of a failed one."""
        objects: list[LoadedObject] = []
        missing: list[Missing] = []
        fatal: list[Fatal] = []
        edges: list[tuple[str, str]] = []
        host = self.searcher.to_host(path)
        fid = _file_id(host, self.files)
        if fid is not None and fid in self.by_file:
            return LoadTree((), (), (), ())
        origin = os.path.dirname(path if path.startswith("/") else os.path.join(self.cwd, path))
        new = _Map(path, path, info, self.caller, origin, fid)
        self._added = []
        maps_before = len(self.maps)
        try:
            self.add(new)
            objects.append(LoadedObject(path, path, info, "dlopen", self.caller.path))
            self._walk(deque([new]), objects, missing, fatal, edges)
            versions = self._check_versions(self.maps[maps_before:])
        finally:
            added, self._added = self._added, None
        if missing or fatal or versions:
            # dl-open.c checks the versions of the new objects after mapping
            # them; a failure unmaps them all, as a missing library does.
            for kind, key in added:
                if kind == "name":
                    self.by_name.pop(key, None)  # type: ignore[arg-type]
                else:
                    self.by_file.pop(key, None)  # type: ignore[arg-type]
            del self.maps[maps_before:]
        return LoadTree(tuple(objects), tuple(missing), tuple(fatal), tuple(edges), versions)

    def _check_versions(self, maps: list[_Map]) -> tuple[VersionMissing, ...]:
        """glibc's ``_dl_check_map_versions`` (elf/dl-version.c) on each of
        ``maps``: every DT_VERNEED file name is looked up among the loaded
        objects by name (``find_needed``); a weak need is never fatal, and a
        version matches when a DT_VERDEF record has its hash and name
        (``match_symbol``). A target without DT_VERDEF passes that check;
        before glibc 2.41 binding a symbol there aborts (see
        ``_CHECK_MATCH_ASSERT_LINE``), which we count once per pair."""
        glibc = self.node.glibc
        old_lookup = glibc is not None and tuple(glibc) < (2, 41)
        out: list[VersionMissing] = []
        for m in maps:
            for file, wants in m.info.verneed:
                target = self.by_name.get(file)
                if target is None or not target.info.elf_class:
                    # Not loaded (reported as missing already; glibc asserts)
                    # or a node library judged by name only.
                    continue
                defined = target.info.verdef
                if defined is None:
                    strong = next((v for v, _h, weak in wants if not weak), None)
                    if old_lookup and strong is not None:
                        line = _CHECK_MATCH_ASSERT_LINE.get(tuple(glibc), 0)  # type: ignore[arg-type]
                        out.append(VersionMissing(strong, file, target.path, m.path,
                                                  kind="unversioned", assert_line=line,
                                                  bind_now=bool(m.info.flags_1 & DF_1_NOW)))
                    continue
                for version, vhash, weak in wants:
                    if weak or (vhash, version) in defined:
                        continue
                    out.append(VersionMissing(version, file, target.path, m.path,
                                              _newest(version, defined)))
        return tuple(out)

    def _walk(self, queue: deque[_Map], objects: list[LoadedObject], missing: list[Missing],
              fatal: list[Fatal], edges: list[tuple[str, str]]) -> None:
        while queue:
            loader = queue.popleft()
            if self.budget is not None:
                self.budget.tick()
            for needed in loader.info.needed:
                # dl-deps.c expands $ORIGIN/$LIB/$PLATFORM in DT_NEEDED first; the
                # expanded text is what is matched, searched and printed.
                name = self.searcher.expand(needed, loader.origin) if "$" in needed else needed
                if not name:
                    fatal.append(Fatal(needed, needed, loader.path,
                                       "empty dynamic string token substitution"))
                    continue
                known = self.by_name.get(name)
                if known is not None:
                    edges.append((loader.path, known.path))
                    continue
                outcome, path, info, skipped, searched, via = self.searcher.search(name, loader)
                if outcome == "missing" or path is None:
                    if not any(m.name == name for m in missing):
                        missing.append(Missing(name, loader.path, tuple(skipped),
                                               tuple(searched)))
                    continue
                if outcome == "fatal":
                    fatal.append(Fatal(name, path, loader.path, via))
                    continue
                if info is None:
                    # A node system library judged by name from a foreign host.
                    self.add(_Map(name, path, _placeholder(name), loader, None, None))
                    objects.append(LoadedObject(name, path, _placeholder(name), via, loader.path,
                                                tuple(skipped), by_name_only=True))
                    edges.append((loader.path, path))
                    continue
                host_path = self.searcher.to_host(path)
                fid = _file_id(host_path, self.files)
                same = self.by_file.get(fid) if fid is not None else None
                if same is not None:
                    same.names.add(name)
                    self._name(name, same)
                    edges.append((loader.path, same.path))
                    continue
                absolute = path if path.startswith("/") else os.path.join(self.cwd, path)
                origin = os.path.dirname(absolute)
                new = _Map(name, path, info, loader, origin, fid)
                self.add(new)
                objects.append(LoadedObject(name, path, info, via, loader.path, tuple(skipped)))
                edges.append((loader.path, path))
                queue.append(new)


def resolve(exe_path: str, exe_info: ElfInfo, node: NodeProfile, env: Mapping[str, str],
            how: Loading | None = None) -> LoadTree:
    """Every object the loader would load for ``exe_path`` (``how``: see
    :class:`Loading`)."""
    return Process(exe_path, exe_info, node, env, how).tree


def _version_key(text: str) -> tuple[int, ...] | None:
    try:
        return tuple(int(part) for part in text.split("."))
    except ValueError:
        return None


def _newest(version: str, defined: frozenset[tuple[int, str]]) -> str:
    """The highest ``PREFIX_N.N`` of ``defined`` in the family of ``version``
    (``GLIBC_2.38`` -> ``GLIBC_2.36``), for telling the user what the node has."""
    prefix, sep, _rest = version.rpartition("_")
    if not sep:
        return ""
    best: tuple[tuple[int, ...], str] | None = None
    for _hash, name in defined:
        head, sep2, tail = name.rpartition("_")
        key = _version_key(tail) if sep2 and head == prefix else None
        if key is not None and (best is None or key > best[0]):
            best = (key, name)
    return best[1] if best else ""


def _placeholder(name: str) -> ElfInfo:
    return ElfInfo(path=name, elf_class=0, data=0, machine=0, e_type=0, osabi=0, phentsize=0,
                   interp=None, load_segments=(), relro=None, has_dynamic=False, needed=(),
                   soname=name, rpath=None, runpath=None, flags_1=0)


__all__ = [
    "CANONICAL_INTERP",
    "Candidate",
    "Fatal",
    "LoadTree",
    "LoadedObject",
    "Missing",
    "Process",
    "VersionMissing",
    "machine_name",
    "resolve",
    "supported_hwcaps",
    "system_dirs",
]
