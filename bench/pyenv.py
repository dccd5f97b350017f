"""A synthetic Python environment shaped like a torch install, for the bench.

A real CUDA torch environment holds ~30,000 files (headers, Python source,
tests) in ~2,000 directories, ~300 extension modules and a few dozen bundled
libraries. This builds the same shape with gcc in seconds: a real venv of
the system python, one distribution ``faketorch`` whose RECORD lists every
file, extension modules in 30 subpackages (each needs three of 24 bundled
libraries through ``RUNPATH $ORIGIN/../lib``), and filler files. Every ELF
file is a real, distinct file, so the check reads each one as it would on a
node.
"""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import subprocess
from pathlib import Path

PY = "/usr/bin/python3"
LIBS = 24
SUBPACKAGES = 30


def _run(argv: list[str]) -> None:
    subprocess.run(argv, check=True, capture_output=True, timeout=300)


def _suffix() -> str:
    out = subprocess.run([PY, "-c", "import sysconfig; print(sysconfig.get_config_var("
                          "'EXT_SUFFIX'))"], capture_output=True, text=True, check=True)
    return out.stdout.strip()


def _site(venv: Path) -> Path:
    return next((venv / "lib").glob("python3*/site-packages"))


def build(root: Path, files: int = 30_000, modules: int = 300) -> Path:
    """The venv's ``bin/python``, with ``faketorch`` of about ``files`` files
    and ``modules`` extension modules installed (RECORD included)."""
    if root.exists():
        shutil.rmtree(root)
    venv = root / "venv"
    _run([PY, "-m", "venv", "--without-pip", str(venv)])
    site = _site(venv)
    pkg = site / "faketorch"
    lib = pkg / "lib"
    lib.mkdir(parents=True)
    work = root / "src"
    work.mkdir()
    (work / "lib.c").write_text("int fake_lib(int x) { return x + 1; }\n")
    for i in range(LIBS):
        _run(["gcc", "-shared", "-fPIC", "-O1", "-o", str(lib / f"libfake{i}.so"),
              f"-Wl,-soname,libfake{i}.so", str(work / "lib.c")])
    ext_src = work / "ext.c"
    ext_src.write_text("int fake_lib(int);\nint PyInit_ext(void) { return fake_lib(1); }\n")
    suffix = _suffix()
    written: list[Path] = []
    per_pkg = max(1, modules // SUBPACKAGES)
    count = 0
    for p in range(SUBPACKAGES):
        sub = pkg / f"sub{p}"
        sub.mkdir()
        (sub / "__init__.py").write_text("")
        written.append(sub / "__init__.py")
        for m in range(per_pkg):
            if count >= modules:
                break
            needs = [f"-lfake{(count + k) % LIBS}" for k in range(3)]
            out = sub / f"_ext{m}{suffix}"
            # Distinct files (a marker define changes the bytes), as in a real wheel.
            _run(["gcc", "-shared", "-fPIC", "-O1", f"-DMARK={count}", "-o", str(out),
                  str(ext_src), f"-L{lib}", *needs, "-Wl,--enable-new-dtags",
                  "-Wl,-rpath,$ORIGIN/../lib"])
            written.append(out)
            count += 1
    written += sorted(lib.iterdir())
    (pkg / "__init__.py").write_text("# imports nothing compiled, so the step runs\n")
    written.append(pkg / "__init__.py")
    filler = files - len(written)
    per_dir = 15
    for d in range(max(0, filler // per_dir)):
        directory = pkg / "include" / f"group{d % 40}" / f"part{d}"
        directory.mkdir(parents=True)
        for f in range(per_dir):
            path = directory / f"header{f}.h"
            path.write_text("/* filler */\n")
            written.append(path)
    dist = site / "faketorch-2.0.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: faketorch\nVersion: 2.0.0\n")
    (dist / "top_level.txt").write_text("faketorch\n")
    (dist / "INSTALLER").write_text("pip\n")
    lines = []
    for path in written:
        digest = base64.urlsafe_b64encode(hashlib.sha256(path.read_bytes()).digest())
        lines.append(f"{path.relative_to(site)},sha256={digest.rstrip(b'=').decode()},"
                     f"{path.stat().st_size}")
    for name in ("METADATA", "top_level.txt", "INSTALLER"):
        lines.append(f"{dist.name}/{name},,")
    lines.append(f"{dist.name}/RECORD,,")
    (dist / "RECORD").write_text("\n".join(lines) + "\n")
    for dirpath, _dirs, _files in os.walk(root):
        os.chmod(dirpath, 0o755)
    return venv / "bin" / "python"


def count_files(venv_python: Path) -> int:
    return sum(len(f) for _d, _s, f in os.walk(_site(venv_python.parent.parent)))
