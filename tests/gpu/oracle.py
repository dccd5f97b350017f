"""cuobjdump as the judge of what a file's fat binaries hold.

Two questions, both asked of the pinned cuobjdump:

- ``cuobjdump -all -ptx FILE`` prints, for every entry of every fat binary
  (executable and relocatable), a header block: ``Fatbin elf code`` or
  ``Fatbin ptx code``, ``arch = sm_100f``, ``code version = [9,5]`` and a
  line ``compressed`` when it is; PTX entries then have their text, whose
  ``.version`` line is the PTX ISA version.
- ``cuobjdump --list-elf --list-ptx FILE`` names the images the default
  selection holds (the executable fat binaries, or the relocatable ones when
  there are none): ``x.3.sm_90a.cubin``, ``x.1.sm_100f.ptx``. Its cubin
  names drop an ``f`` (``-elf`` and ``-ptx`` show it).

Answers are cached under the cache root, keyed by the file's identity and
the tool, so the torch library's 20-second dump runs once.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from corpus import cache_root

from grace_policy import atomicfile

_BLOCK = re.compile(r"^Fatbin (elf|ptx) code:$")
_ARCH = re.compile(r"^arch = (\S+)$")
_CODE = re.compile(r"^code version = \[(\d+),(\d+)\]$")
_VERSION = re.compile(r"^\.version (\d+)\.(\d+)\s*$")
_LISTED = re.compile(r"^(ELF|PTX) file\s+\d+: .*\.(sm_\w+)\.(cubin|ptx)$")


@dataclass(frozen=True)
class Dumped:
    kind: str  # "cubin" | "ptx"
    arch: str  # nvcc's name: sm_100f / compute_90a
    version: tuple[int, int]
    compressed: bool
    #: The PTX text's .version (None for cubins).
    text_version: tuple[int, int] | None


def _cached(tool: Path, args: list[str], path: Path) -> str:
    st = path.stat()
    key = hashlib.sha256(json.dumps([str(tool), tool.stat().st_size, args, str(path),
                                     st.st_size, st.st_mtime_ns, st.st_ino]).encode())
    cache = cache_root() / "cuda-oracle" / f"{key.hexdigest()[:32]}.txt"
    if cache.is_file():
        return cache.read_text()
    proc = subprocess.run([str(tool), *args, str(path)], capture_output=True, text=True,
                          timeout=900, check=False)
    out = proc.stdout
    if proc.returncode != 0 and "does not contain device code" not in proc.stderr \
            and "No " not in proc.stderr:
        raise AssertionError(f"cuobjdump {args} {path} failed: {proc.stderr.strip()}")
    cache.parent.mkdir(parents=True, exist_ok=True)
    atomicfile.replace(str(cache), out.encode())  # parts running side by side share it
    return out


def dump(tool: Path, path: Path) -> list[Dumped]:
    """Every entry, in cuobjdump's order (``-all -ptx``)."""
    out: list[dict] = []
    cur: dict | None = None
    for line in _cached(tool, ["-all", "-ptx"], path).splitlines():
        m = _BLOCK.match(line)
        if m:
            cur = {"kind": "cubin" if m.group(1) == "elf" else "ptx", "arch": None,
                   "version": None, "compressed": False, "text": None, "in_text": False}
            out.append(cur)
            continue
        if cur is None:
            continue
        if not cur["in_text"]:
            if (a := _ARCH.match(line)) and cur["arch"] is None:
                cur["arch"] = a.group(1)
            elif (c := _CODE.match(line)) and cur["version"] is None:
                cur["version"] = (int(c.group(1)), int(c.group(2)))
            elif line == "compressed":
                cur["compressed"] = True
            elif line.startswith("."):
                cur["in_text"] = True
        if cur["in_text"] and cur["text"] is None and (v := _VERSION.match(line)):
            cur["text"] = (int(v.group(1)), int(v.group(2)))
    result = []
    for d in out:
        arch = d["arch"] or "?"
        if d["kind"] == "ptx" and arch.startswith("sm_"):
            arch = "compute_" + arch[3:]
        result.append(Dumped(d["kind"], arch, d["version"] or (0, 0), d["compressed"],
                             d["text"]))
    return result


def listed(tool: Path, path: Path) -> list[tuple[str, str]]:
    """(kind, arch as listed) of the default selection, in order."""
    got = []
    for line in _cached(tool, ["--list-elf", "--list-ptx"], path).splitlines():
        m = _LISTED.match(line.strip())
        if m:
            got.append(("cubin" if m.group(1) == "ELF" else "ptx", m.group(2)))
    return got
