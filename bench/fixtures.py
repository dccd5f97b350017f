"""Bench fixtures, built with gcc at bench time (never committed).

* ``lib100``: an executable with 100 DT_NEEDED libraries of its own (found
  through ``RUNPATH=$ORIGIN/lib``), plus libc: the "first-seen executable with
  ~100 shared libraries" of issue 4.
* ``tree500``: an executable whose dependency tree has 500 files of its own
  (50 direct libraries, each needing 9 more), breadth like a Python extension
  stack, so the loader model works through RUNPATH search on every level.

Both are built once into a directory keyed by this module's ``VERSION``; a
rerun of the bench reuses them. The libraries are real gcc output (so the ELF
reader sees what it sees in the field), but built from one object file per
shape and linked in parallel to keep a fresh build in seconds.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

#: Bump when the shapes below change: the cached build is rebuilt.
VERSION = "1"

_LIB_C = "int grace_bench_fn(void) { return 1; }\n"
_MAIN_C = "int main(void) { return 0; }\n"


def _run(argv: list[str]) -> None:
    subprocess.run(argv, check=True, capture_output=True, text=True)


def _link_lib(cc: str, obj: Path, out: Path, needs: list[str]) -> None:
    """One shared library: the common object, its own soname, its DT_NEEDED
    list (``-Wl,--no-as-needed`` keeps every entry: nothing is referenced)."""
    argv = [cc, "-shared", "-o", str(out), str(obj), f"-Wl,-soname,{out.name}",
            "-Wl,--no-as-needed", "-Wl,--enable-new-dtags,-rpath,$ORIGIN",
            f"-L{out.parent}", *[f"-l:{n}" for n in needs]]
    _run(argv)


def _build_exe(cc: str, root: Path, libdir: Path, needs: list[str]) -> Path:
    src = root / "main.c"
    src.write_text(_MAIN_C)
    exe = root / "app"
    _run([cc, "-O1", "-o", str(exe), str(src), "-Wl,--no-as-needed",
          "-Wl,--enable-new-dtags,-rpath,$ORIGIN/lib", f"-L{libdir}",
          *[f"-l:{n}" for n in needs]])
    exe.chmod(0o755)
    return exe


def _build(root: Path, cc: str, direct: int, per_lib: int) -> Path:
    """``direct`` libraries needed by the executable, each needing ``per_lib``
    leaf libraries of its own; leaves are linked first (the linker checks that
    every -l exists)."""
    libdir = root / "lib"
    libdir.mkdir(parents=True)
    src = root / "lib.c"
    src.write_text(_LIB_C)
    obj = root / "lib.o"
    _run([cc, "-O1", "-fPIC", "-c", "-o", str(obj), str(src)])
    leaves = [f"libleaf{i}.so" for i in range(direct * per_lib)]
    tops = [f"libtop{i}.so" for i in range(direct)]
    jobs = max(2, os.cpu_count() or 2)
    with ThreadPoolExecutor(jobs) as pool:
        list(pool.map(lambda n: _link_lib(cc, obj, libdir / n, []), leaves))
        list(pool.map(
            lambda i: _link_lib(cc, obj, libdir / tops[i],
                                leaves[i * per_lib:(i + 1) * per_lib]),
            range(direct)))
    return _build_exe(cc, root, libdir, tops)


def build_all(base: Path, cc: str = "gcc") -> dict[str, Path]:
    """Build (or reuse) both fixtures under ``base``; returns name -> executable.
    Everything is world-readable: the cluster runs steps as ``nobody``."""
    out: dict[str, Path] = {}
    shapes = {"lib100": (100, 0), "tree500": (50, 9)}
    for name, (direct, per_lib) in shapes.items():
        root = base / f"{name}-v{VERSION}"
        exe = root / "app"
        if not (root / ".done").exists():
            if root.exists():
                shutil.rmtree(root)
            _build(root, cc, direct, per_lib)
            (root / ".done").touch()
        for path in [root, *root.rglob("*")]:
            path.chmod(0o755 if path.is_dir() or path.name == "app" else 0o644)
        out[name] = exe
    base.chmod(0o755)
    return out


def tree_files(exe: Path) -> list[Path]:
    """The executable and its own libraries (not libc): what 'N files' counts."""
    return [exe, *sorted((exe.parent / "lib").glob("*.so"))]
