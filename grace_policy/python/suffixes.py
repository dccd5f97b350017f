"""The file names the node's CPython accepts for extension modules.

``importlib.machinery.EXTENSION_SUFFIXES`` comes from ``_imp.extension_suffixes()``,
i.e. CPython's ``_PyImport_DynLoadFiletab`` (Python/dynload_shlib.c):
``"." SOABI ".so"``, the stable-ABI name, then plain ``".so"``, in that order;
``FileFinder`` tries them in that order, before ``.py`` and ``.pyc``. SOABI is
``cpython-{XY}{ABIFLAGS}-{PLATFORM_TRIPLET}`` (configure.ac; the triplet from
Misc/platform_triplet.c). A wheel built on the login node carries the login
node's tag, which the Grace node's importer never even tries: that is why a
module "is not found" there although its file is on ``sys.path``.

Checked against real interpreters: pyenv's 3.6-3.13 on x86_64
(tests/python/test_suffixes.py); the aarch64 tags against real wheels.

- 3.6/3.7: ABIFLAGS ``m`` (pymalloc); 3.8 dropped it (``cpython-38-...``).
- free-threaded builds (3.13t, 3.14t): ABIFLAGS ``t`` and no ``.abi3.so``
  (the stable ABI is not loadable there: cpython issue 111870).
- 3.15 adds the platform-tagged stable ABI ``.abi3-{triplet}.so`` before
  ``.abi3.so``, and ``abi3t`` (both builds); recorded from a 3.15.0rc2's
  ``_imp.extension_suffixes()``, not verified here.
"""

from __future__ import annotations

from ..node import normalize_arch

#: PLATFORM_TRIPLET per (normalized) machine, glibc flavour (Misc/platform_triplet.c).
TRIPLETS: dict[str, str] = {
    "x86_64": "x86_64-linux-gnu",
    "aarch64": "aarch64-linux-gnu",
    "i386": "i386-linux-gnu",
    "ppc64": "powerpc64le-linux-gnu",   # node.normalize_arch folds ppc64le into ppc64
    "ppc64le": "powerpc64le-linux-gnu",
    "s390x": "s390x-linux-gnu",
    "riscv64": "riscv64-linux-gnu",
    "arm": "arm-linux-gnueabihf",
}

#: Triplet -> the machine name messages use (reverse of TRIPLETS).
_MACHINE_OF = {
    "x86_64-linux-gnu": "x86_64",
    "aarch64-linux-gnu": "aarch64",
    "i386-linux-gnu": "i386",
    "i686-linux-gnu": "i386",
    "powerpc64le-linux-gnu": "ppc64le",
    "powerpc64-linux-gnu": "ppc64",
    "s390x-linux-gnu": "s390x",
    "riscv64-linux-gnu": "riscv64",
    "arm-linux-gnueabihf": "arm",
    "arm-linux-gnueabi": "arm (soft float)",
    "x86_64-linux-musl": "x86_64 musl",
    "aarch64-linux-musl": "aarch64 musl",
    "darwin": "macOS",
}


def triplet(machine: str) -> str:
    name = normalize_arch(machine)
    return TRIPLETS.get(name, f"{name}-linux-gnu")


def extension_suffixes(version: tuple[int, int], machine: str, *,
                       free_threaded: bool = False) -> tuple[str, ...]:
    """``EXTENSION_SUFFIXES`` of a CPython ``version`` on ``machine`` (Linux,
    glibc), in the order ``FileFinder`` tries them."""
    major, minor = version[0], version[1]
    trip = triplet(machine)
    flags = "t" if free_threaded else ("m" if (major, minor) < (3, 8) else "")
    out = [f".cpython-{major}{minor}{flags}-{trip}.so"]
    if (major, minor) >= (3, 15):
        if not free_threaded:
            out += [f".abi3-{trip}.so", ".abi3.so"]
        out += [f".abi3t-{trip}.so", ".abi3t.so"]
    elif not free_threaded:
        out.append(".abi3.so")
    out.append(".so")
    return tuple(out)


def split_extension(filename: str) -> tuple[str, str] | None:
    """``(module name, suffix)`` when ``filename`` is named like an extension
    module of *some* CPython (any tag), else None. ``libfoo.so.1`` (a versioned
    library) and names whose stem is not a module name are None; a plain
    ``foo.so`` is a module name to every CPython, so it is one here too."""
    if not filename.endswith(".so") or "/" in filename:
        return None
    body = filename[:-3]
    stem, dot, tag = body.partition(".")
    if not stem:
        return None
    if not dot:
        return stem, ".so"
    if "." in tag:
        return None
    if tag.startswith("cpython-") or tag.startswith("pypy") or tag.startswith("abi3") \
            or tag.startswith("graalpy"):
        return stem, "." + tag + ".so"
    return None


def describe_suffix(suffix: str) -> str:
    """``.cpython-311-x86_64-linux-gnu.so`` -> ``CPython 3.11, x86_64``: what
    a message says the file was built for."""
    tag = suffix[1:-3] if suffix.startswith(".") and suffix.endswith(".so") else suffix
    if tag == "" or suffix == ".so":
        return "any Python (untagged .so)"
    if tag.startswith("abi3"):
        free = tag.startswith("abi3t")
        rest = tag[5:] if free else tag[4:]
        what = "the stable ABI (free-threaded)" if free else "the stable ABI (abi3)"
        if rest.startswith("-"):
            return f"{what}, {_MACHINE_OF.get(rest[1:], rest[1:])}"
        return f"{what}, any machine"
    if tag.startswith("cpython-"):
        ver, _, trip = tag[8:].partition("-")
        flags = ""
        while ver and not ver[-1].isdigit():
            flags = ver[-1] + flags
            ver = ver[:-1]
        pretty = f"{ver[0]}.{ver[1:]}" if len(ver) >= 2 and ver.isdigit() else ver
        name = f"CPython {pretty}" + (" free-threaded" if "t" in flags else "")
        if trip:
            return f"{name}, {_MACHINE_OF.get(trip, trip)}"
        return name
    if tag.startswith("pypy"):
        ver, _, trip = tag.partition("-")
        return f"PyPy ({ver}), {_MACHINE_OF.get(trip, trip)}" if trip else f"PyPy ({ver})"
    return tag
