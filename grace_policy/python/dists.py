"""The distributions installed in a site directory, and which one a file belongs to.

Why: severity follows use. A step that imports ``torch`` uses the
distributions ``torch`` needs on the node (its ``Requires-Dist`` after the
node's markers), not every package of the environment; a broken package
nobody imports is a warning naming its distribution. So the checker needs,
per site dir, each distribution's name, what it provides to ``import`` and
what it requires -- read from the metadata files themselves, without
``importlib.metadata``/``email``/``csv``/``packaging`` (too heavy for the
launch path), each file stat'ed through fsprobe and read within the Budget.

Formats read: ``*.dist-info`` (``METADATA`` headers, ``top_level.txt``,
``RECORD``), ``*.egg-info`` directories (``PKG-INFO``, ``requires.txt``,
``top_level.txt``, ``installed-files.txt``) and ``*.egg-info`` files (a bare
``PKG-INFO``). Not read: ``.egg`` directories and ``.egg-link``/editable
finders (their code lives on other ``sys.path`` entries, which the caller
lists separately).
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from .. import fsprobe
from .._record import dataclass
from ..budget import Budget
from ..node import NodeProfile
from .markers import required
from .nodepath import host_path, read_text, read_until
from .nodepath import listdir as _listdir
from .suffixes import split_extension

#: Per metadata file: what is read at most (a METADATA with a 10 MB README
#: body still yields its headers from the first part).
MAX_META_BYTES = 256 * 1024
MAX_RECORD_BYTES = 4 * 1024 * 1024
_META_SUFFIXES = (".dist-info", ".egg-info")


@dataclass(frozen=True)
class Dist:
    name: str                  # normalized (PEP 503: lower, runs of -_. -> -)
    version: str
    meta_dir: str              # the .dist-info / .egg-info path (node path)
    site_dir: str
    top_level: tuple[str, ...]  # top-level import names it provides
    requires: tuple[str, ...]  # normalized names of Requires-Dist after the node's markers


def normalize(name: str) -> str:
    """PEP 503 name normalization without ``re``."""
    out: list[str] = []
    sep = False
    for ch in name.strip().lower():
        if ch in "-_.":
            sep = True
            continue
        if sep and out:
            out.append("-")
        sep = False
        out.append(ch)
    return "".join(out)


# -- bounded reads ------------------------------------------------------------


def _read(host: str, budget: Budget, limit: int, files: fsprobe.Files) -> str | None:
    """A regular file's first ``limit`` bytes as text, or None."""
    return read_text(host, limit, budget, files)


def _read_head(host: str, budget: Budget, files: fsprobe.Files,
               limit: int = MAX_META_BYTES) -> str | None:
    """The header part of METADATA/PKG-INFO: read in chunks up to the first
    blank line (the body is the project's README, often far bigger)."""
    data = read_until(host, limit, budget, b"\n\n", files=files)
    return None if data is None else data.decode("utf-8", "surrogateescape")


_WANTED = frozenset({"name", "version", "requires-dist"})


def _headers(text: str) -> dict[str, list[str]]:
    """The headers this module uses (Name, Version, Requires-Dist) up to the
    first blank line of METADATA / PKG-INFO (RFC 822 style: a line starting
    with whitespace continues the previous header, even when blank)."""
    out: dict[str, list[str]] = {}
    last: list[str] | None = None
    for line in text.splitlines():
        first = line[:1]
        if first == " " or first == "\t":
            if last is not None:
                last[-1] += " " + line.strip()
            continue
        if not line:
            break
        last = None
        if first not in "NnVvRr":
            continue
        key, colon, value = line.partition(":")
        if not colon:
            continue
        key = key.strip().lower()
        if key in _WANTED:
            last = out.setdefault(key, [])
            last.append(value.strip())
    return out


def requirement_name(spec: str) -> tuple[str, str | None]:
    """``'foo[bar] (>=1) ; python_version < "3.9"'`` -> ``("foo", 'python_version < "3.9"')``."""
    body, semi, marker = spec.partition(";")
    i = 0
    body = body.strip()
    while i < len(body) and (body[i].isalnum() or body[i] in "-_."):
        i += 1
    return normalize(body[:i]), (marker.strip() if semi else None)


def record_paths(text: str) -> list[str]:
    """The path column of a RECORD (CSV: a path holding a comma is quoted)."""
    out: list[str] = []
    for line in text.splitlines():
        if not line:
            continue
        if line[0] == '"':
            i, buf = 1, []
            while i < len(line):
                c = line[i]
                if c == '"':
                    if line[i + 1:i + 2] == '"':
                        buf.append('"')
                        i += 2
                        continue
                    break
                buf.append(c)
                i += 1
            out.append("".join(buf))
        else:
            out.append(line.split(",", 1)[0])
    return out


def _top_name(rel: str) -> str | None:
    """The import name a site-relative path provides, if any."""
    if rel.startswith("/") or rel.startswith(".."):
        return None
    first, slash, _rest = rel.partition("/")
    if slash:
        return first if first and "." not in first and first != "__pycache__" else None
    if first.endswith(".py"):
        stem = first[:-3]
        return stem if stem and "." not in stem else None
    split = split_extension(first)
    if split is not None:
        return split[0]
    return None


def _top_from_paths(paths: Iterable[str]) -> tuple[str, ...]:
    """Import names provided by site-relative paths. A RECORD has thousands of
    lines and a handful of distinct first components: reduce first."""
    firsts: dict[tuple[str, str], None] = {}
    for rel in paths:
        if "./" in rel or "//" in rel:
            rel = os.path.normpath(rel)
        firsts[rel.partition("/")[:2]] = None
    found: dict[str, None] = {}
    for first, slash in firsts:
        name = _top_name(first + "/x" if slash else first)
        if name:
            found[name] = None
    return tuple(found)


def _record_tops(text: str) -> tuple[str, ...]:
    """:func:`_top_from_paths` of a RECORD's paths, in one pass over its text."""
    if '"' in text:
        return _top_from_paths(record_paths(text))
    return _top_from_paths(line.partition(",")[0] for line in text.splitlines() if line)


def _lines(text: str | None) -> list[str]:
    if not text:
        return []
    return [s for s in (line.strip() for line in text.splitlines()) if s and s[0] != "#"]


def _egg_requires(text: str | None, node: NodeProfile, version: tuple[int, int]) -> list[str]:
    """setuptools' requires.txt: plain lines, ``[extra]``, ``[extra:marker]``, ``[:marker]``."""
    out: list[str] = []
    keep = True
    for line in _lines(text):
        if line.startswith("[") and line.endswith("]"):
            extra, _, marker = line[1:-1].partition(":")
            keep = not extra.strip() and required(marker, node, version)
            continue
        if keep:
            name, marker = requirement_name(line)
            if name and required(marker, node, version):
                out.append(name)
    return out


# -- one distribution ---------------------------------------------------------


def _read_dist(meta_host: str, where: tuple[str, str], node: NodeProfile,
               version: tuple[int, int], budget: Budget, files: fsprobe.Files) -> Dist | None:
    """The distribution whose metadata is ``entry`` of ``site_dir`` (``where``;
    a node path), read at ``meta_host`` in ``files``."""
    site_dir, entry = where
    meta_node = os.path.join(site_dir, entry)
    budget.tick()
    is_dist_info = entry.endswith(".dist-info")
    stem = entry[:-len(".dist-info")] if is_dist_info else entry[:-len(".egg-info")]
    fallback_name, _, fallback_version = stem.partition("-")
    if is_dist_info:
        meta = _read_head(os.path.join(meta_host, "METADATA"), budget, files)
    elif files.isdir(meta_host):
        meta = _read_head(os.path.join(meta_host, "PKG-INFO"), budget, files)
    else:
        meta = _read_head(meta_host, budget, files)      # an egg-info *file*
    heads = _headers(meta or "")
    name = normalize((heads.get("name") or [fallback_name])[0] or fallback_name)
    if not name:
        return None
    ver = (heads.get("version") or [fallback_version.partition("-")[0]])[0]
    reqs: list[str] = []
    for spec in heads.get("requires-dist", []):
        rname, marker = requirement_name(spec)
        if rname and required(marker, node, version):
            reqs.append(rname)
    is_dir = is_dist_info or files.isdir(meta_host)
    if not is_dist_info and is_dir:
        reqs += _egg_requires(_read(os.path.join(meta_host, "requires.txt"), budget,
                                    MAX_META_BYTES, files), node, version)
    top: tuple[str, ...] = ()
    if is_dir:
        top = tuple(dict.fromkeys(
            t.split("/", 1)[0] for t in _lines(_read(os.path.join(meta_host, "top_level.txt"),
                                                     budget, MAX_META_BYTES, files))
            if t.split("/", 1)[0] and "." not in t.split("/", 1)[0]))
        if not top and is_dist_info:
            top = _record_tops(
                _read(os.path.join(meta_host, "RECORD"), budget, MAX_RECORD_BYTES, files) or "")
        elif not top:
            listed = _lines(_read(os.path.join(meta_host, "installed-files.txt"), budget,
                                  MAX_RECORD_BYTES, files))
            top = _top_from_paths(os.path.normpath(os.path.join(entry, f)) for f in listed)
    if not top:
        top = (name.replace("-", "_"),)
    return Dist(name=name, version=ver, meta_dir=meta_node, site_dir=site_dir, top_level=top,
                requires=tuple(dict.fromkeys(r for r in reqs if r != name)))


def dists_in(site_dir: str, node: NodeProfile, version: tuple[int, int], budget: Budget,
             files: fsprobe.Files = fsprobe.HOST) -> tuple[Dist, ...]:
    """Every distribution whose metadata lies in ``site_dir`` (a node path),
    sorted by metadata directory name. Unreadable or garbage metadata gives a
    distribution named after its directory; never raises (but BudgetExceeded)."""
    host = host_path(site_dir, node, "/", files)
    try:
        names = sorted(_listdir(host, files))
    except (OSError, ValueError):
        return ()
    out: list[Dist] = []
    for entry in names:
        if not entry.endswith(_META_SUFFIXES):
            continue
        budget.tick()
        dist = _read_dist(os.path.join(host, entry), (site_dir, entry), node, version, budget,
                          files)
        if dist is not None:
            out.append(dist)
    return tuple(out)


# -- relations ----------------------------------------------------------------


def closure(roots: Iterable[str], dists: Iterable[Dist]) -> set[str]:
    """Names of the distributions reachable from ``roots`` (dist names, any
    spelling) over ``requires``, the roots included. Required names that are
    not installed are in the set too (they have no Dist to judge)."""
    by_name: dict[str, list[Dist]] = {}
    for d in dists:
        by_name.setdefault(d.name, []).append(d)
    seen: set[str] = set()
    todo = [normalize(r) for r in roots]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for d in by_name.get(name, ()):
            todo.extend(r for r in d.requires if r not in seen)
    return seen


def owners(dists: Iterable[Dist]) -> dict[str, list[Dist]]:
    """Top-level import name -> the distributions providing it (several for
    namespace directories such as ``nvidia/`` or ``google/``)."""
    out: dict[str, list[Dist]] = {}
    for d in dists:
        for top in d.top_level:
            out.setdefault(top, []).append(d)
    return out


#: RECORD path sets already read, by host path and file identity.
_records: dict[tuple[str, str], frozenset[str]] = {}
_MAX_RECORDS = 256


def _record_of(dist: Dist, node: NodeProfile | None, budget: Budget,
               files: fsprobe.Files) -> frozenset[str]:
    host = host_path(os.path.join(dist.meta_dir, "RECORD"), node, "/", files)
    try:
        st = files.stat(host)
    except OSError:
        st = None
    if st is None:
        listed = os.path.join(dist.meta_dir, "installed-files.txt")
        text = _read(host_path(listed, node, "/", files), budget, MAX_RECORD_BYTES, files)
        entry = os.path.basename(dist.meta_dir)
        return frozenset(os.path.normpath(os.path.join(entry, f)) for f in _lines(text))
    key = (host, fsprobe.signature(st))
    got = _records.get(key)
    if got is None:
        got = frozenset(os.path.normpath(p) for p in record_paths(
            _read(host, budget, MAX_RECORD_BYTES, files) or "") if p)
        if len(_records) >= _MAX_RECORDS:
            _records.clear()      # a long-lived CLI process: stay bounded
        _records[key] = got
    return got


def dist_of_file(path: str, site_dir: str, dists: Iterable[Dist], budget: Budget, *,
                 node: NodeProfile | None = None,
                 files: fsprobe.Files = fsprobe.HOST) -> Dist | None:
    """The distribution a file under ``site_dir`` belongs to (node paths).

    By its first path component: a top-level import name (``numpy/...``,
    ``six.py``, ``_cffi_backend.cpython-311-...so``); ``NAME.libs`` (the
    libraries auditwheel bundles, named after the package or the
    distribution); a ``.dist-info``/``.egg-info`` directory. When several
    distributions share the top-level name (``nvidia/``), their RECORDs are
    read (bounded, once) to find the one listing the file; a file no RECORD
    lists -> None.
    """
    site = site_dir.rstrip("/")
    if not path.startswith(site + "/"):
        return None
    rel = os.path.normpath(path[len(site) + 1:])
    first = rel.split("/", 1)[0]
    all_dists = [d for d in dists if d.site_dir.rstrip("/") == site]
    if first.endswith(_META_SUFFIXES):
        for d in all_dists:
            if os.path.basename(d.meta_dir) == first:
                return d
        return None
    stems = [first]
    if first.endswith(".libs"):
        stems = [first[:-5]]
    else:
        top = _top_name(rel) if "/" not in rel else first
        if top:
            stems = [top]
    candidates: list[Dist] = []
    for stem in stems:
        candidates = [d for d in all_dists if stem in d.top_level]
        if not candidates and first.endswith(".libs"):
            candidates = [d for d in all_dists if d.name == normalize(stem)]
        if candidates:
            break
    if len(candidates) == 1:
        return candidates[0]
    pool = candidates or all_dists
    for d in pool:
        budget.tick()
        if rel in _record_of(d, node, budget, files):
            return d
    return None
