"""How the CUDA driver picks a kernel image for a GPU, as code and data.

At module load the driver looks through a fat binary for an image the
device can run (docs/CUDA.md cites NVIDIA's documents for each rule):

- a cubin ``sm_XY`` runs on compute capability X.Z for Z >= Y (same major);
- a cubin ``sm_XYa`` runs on X.Y only;
- a cubin ``sm_XYf`` runs on the members of family XYf (``data/cuda.toml``)
  from X.Y on;
- PTX ``compute_XY`` is JIT-compiled for any device of capability X.Y or
  newer, ``compute_XYa`` for X.Y only, ``compute_XYf`` within the family;
  and only when the driver's own CUDA release reads that PTX ISA version;
- a cubin that fits wins over PTX; the newest fitting image is taken.

The tables (families, PTX ISA version -> CUDA release, sonames that name a
CUDA major) are data, read lazily: only a step whose files carry kernels and
that has GPUs pays for the TOML parser.
"""

from __future__ import annotations

import os

from .._record import dataclass

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Any

    from .fatbin import Entry

CUDA_TOML = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                         "data", "cuda.toml")

Version = tuple[int, int]


def parse_version(text: str) -> Version | None:
    """``"13.0"`` -> (13, 0); ``"sm_100"``/``"10.0"`` style capability text
    goes through :func:`parse_capability`. None for anything else."""
    major, dot, minor = text.strip().partition(".")
    if not (major.isdigit() and (not dot or minor.isdigit())) or len(major) > 4 \
            or len(minor) > 4:
        return None
    return int(major), int(minor or 0)


def parse_capability(text: str) -> Version | None:
    """``"sm_100"``, ``"sm_90"``, ``"10.0"``, ``"9.0"`` -> (10, 0), (9, 0),
    ... None for anything else (``sm_90a`` names a target, not a GPU)."""
    text = text.strip().lower()
    if text.startswith("sm_"):
        digits = text[3:]
        if not digits.isdigit() or not 2 <= len(digits) <= 4:
            return None
        return divmod(int(digits), 10)
    return parse_version(text)


def sm_name(cc: Version) -> str:
    """(10, 0) -> ``"sm_100"``."""
    return f"sm_{cc[0]}{cc[1]}"


def cuda_version_from_nvml(value: int) -> Version:
    """NVML's and cuDriverGetVersion's encoding, major*1000 + minor*10."""
    return value // 1000, (value % 1000) // 10


@dataclass(frozen=True)
class Tables:
    #: "100f" -> {(10, 0), (10, 3)}
    families: dict[str, frozenset[Version]]
    #: PTX ISA version -> first CUDA release whose driver reads it.
    ptx_isa: dict[Version, Version]
    #: soname -> the CUDA major it belongs to.
    runtime_sonames: dict[str, int]

    def ptx_needs(self, isa: Version) -> Version | None:
        """The oldest CUDA release (driver) that reads PTX ISA ``isa``; None
        when ``isa`` is newer than every row (then it needs a driver newer
        than the last row's release)."""
        known = self.ptx_isa.get(isa)
        if known is not None:
            return known
        older = [cuda for v, cuda in self.ptx_isa.items() if v <= isa]
        if older and isa <= max(self.ptx_isa):
            return max(older)  # a version between rows: the next-older row's release
        return None


_tables: Tables | None = None


def _load(path: str) -> dict[str, Any]:
    try:
        import tomllib
    except ImportError:  # Python < 3.11
        import tomli as tomllib  # type: ignore[no-redef]
    with open(path, "rb") as f:
        return tomllib.load(f)


def parse_tables(data: dict[str, Any]) -> Tables:
    """The tables of a cuda.toml document; strict (a broken data file fails
    the tests, never a step: the file ships with the package)."""
    families = {}
    for name, members in data["families"].items():
        caps = [parse_version(m) for m in members]
        if not caps or None in caps:
            raise ValueError(f"family {name}: bad member in {members}")
        families[name] = frozenset(c for c in caps if c is not None)
    ptx = {}
    for isa, cuda in data["ptx_isa"].items():
        a, b = parse_version(isa), parse_version(cuda)
        if a is None or b is None:
            raise ValueError(f"ptx_isa {isa} = {cuda}")
        ptx[a] = b
    sonames = {k: int(v) for k, v in data["runtime_sonames"].items()}
    return Tables(families=families, ptx_isa=ptx, runtime_sonames=sonames)


def tables() -> Tables:
    global _tables
    if _tables is None:
        _tables = parse_tables(_load(CUDA_TOML))
    return _tables


def _fits(sm: int, variant: str, gpu: Version, t: Tables) -> bool:
    """Whether a target's code can serve a GPU: for a cubin as it is, for
    PTX after compilation (the target rules are the same; what differs is
    that PTX of an older major also serves newer majors, see
    :func:`ptx_fits`)."""
    target = divmod(sm, 10)
    if variant == "a":
        return gpu == target
    if variant == "f":
        members = t.families.get(f"{sm}f")
        if members is not None:
            return gpu in members and gpu >= target
    return gpu[0] == target[0] and gpu[1] >= target[1]


def cubin_runs(entry: Entry, gpu: Version, t: Tables | None = None) -> bool:
    """A cubin's machine code runs on ``gpu`` as it is."""
    return _fits(entry.sm, entry.variant, gpu, t or tables())


def ptx_fits(entry: Entry, gpu: Version, t: Tables | None = None) -> bool:
    """PTX that the driver may compile for ``gpu`` (its ISA version aside):
    any newer GPU for a plain target, the same or the family for a/f."""
    t = t or tables()
    if entry.variant in ("a", "f"):
        return _fits(entry.sm, entry.variant, gpu, t)
    return gpu >= divmod(entry.sm, 10)


def driver_reads(isa: Version, driver: Version, t: Tables | None = None) -> bool:
    """Whether a driver supporting CUDA ``driver`` can JIT PTX ISA ``isa``."""
    t = t or tables()
    needs = t.ptx_needs(isa)
    if needs is None:  # newer than every row: newer than the last row's release
        return driver > max(t.ptx_isa.values())
    return driver >= needs


@dataclass(frozen=True)
class Choice:
    """What the driver would do with one file's images on one GPU."""

    #: "cubin": a cubin fits; "jit": only PTX fits and the driver reads it;
    #: "ptx-too-new": only PTX fits and the driver cannot read its ISA;
    #: "none": nothing fits.
    outcome: str
    #: The image used (the newest PTX that fits for "ptx-too-new").
    entry: Entry | None = None


def choose(entries: Iterable[Entry], gpu: Version, driver: Version | None,
           t: Tables | None = None) -> Choice:
    """The image the driver would load for ``gpu`` (``driver``: the CUDA
    version it supports; None when unknown, then PTX is assumed readable)."""
    t = t or tables()
    cubins, ptx = [], []
    for e in entries:
        if e.kind == "cubin" and _fits(e.sm, e.variant, gpu, t):
            cubins.append(e)
        elif e.kind == "ptx" and ptx_fits(e, gpu, t):
            ptx.append(e)
    if cubins:
        return Choice("cubin", max(cubins, key=lambda e: (e.sm, e.variant != "")))
    if not ptx:
        return Choice("none")
    readable = [e for e in ptx if driver is None or driver_reads(e.version, driver, t)]
    if readable:
        return Choice("jit", max(readable, key=lambda e: (e.sm, e.version)))
    return Choice("ptx-too-new", max(ptx, key=lambda e: (e.sm, e.version)))


def runtime_major(soname: str, t: Tables | None = None) -> int | None:
    """The CUDA major a library's soname names (``libcudart.so.13`` -> 13),
    None for libraries whose sonames do not follow the CUDA release."""
    return (t or tables()).runtime_sonames.get(soname)
