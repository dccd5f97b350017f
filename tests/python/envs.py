"""Python environments on disk, shaped like the real ones, for the step tests.

A judged interpreter is never run, so it need not be a working CPython; it
must *look* like one in the places the model reads: its name
(``python3.X``), its DT_NEEDED ``libpython3.X.so.1.0``, the ``lib/python3.X/
os.py`` landmark of its prefix and a ``pyvenv.cfg`` for a venv. For an
aarch64 node an aarch64 interpreter is compiled with the cross compiler;
site-packages hold real wheels installed by pip (:mod:`python.wheels`) or
packages built here from C (:func:`add_package`), with pip's own metadata.
"""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from fixtures.build import ElfBuilder

#: The interpreter stand-in: it needs libpython like a shared-library build.
PYTHON_C = """
int Py_BytesMain(int argc, char **argv);
int main(int argc, char **argv) { return Py_BytesMain(argc, argv); }
"""
LIBPYTHON_C = "int Py_BytesMain(int argc, char **argv) { (void)argv; return argc; }\n"


def base_python(b: ElfBuilder, root: str, version: str = "3.8", arch: str = "aarch64",
                page_size: int = 65536) -> Path:
    """``root/bin/python{version}`` with ``root/lib/libpython{version}.so.1.0``
    and the stdlib landmark; returns the interpreter."""
    lib = b.library(f"{root}/lib/libpython{version}.so.1.0", source=LIBPYTHON_C, arch=arch,
                    page_size=page_size)
    exe = b.compile(PYTHON_C, f"{root}/bin/python{version}", arch=arch, page_size=page_size,
                    extra_flags=(str(lib),), rpath="$ORIGIN/../lib")
    stdlib = b.path(f"{root}/lib/python{version}")
    (stdlib / "lib-dynload").mkdir(parents=True, exist_ok=True)
    (stdlib / "os.py").write_text("# landmark\n")
    (stdlib / "site-packages").mkdir(exist_ok=True)
    (b.path(f"{root}/bin") / "python3").symlink_to(f"python{version}")
    return exe


def make_venv(base: Path, venv: Path, *, system_site: bool = False) -> Path:
    """A venv as ``python -m venv --symlinks`` lays it out; returns bin/python."""
    version = base.name[len("python"):]
    (venv / "bin").mkdir(parents=True)
    (venv / "lib" / f"python{version}" / "site-packages").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text(
        f"home = {base.parent}\n"
        f"include-system-site-packages = {'true' if system_site else 'false'}\n"
        f"version = {version}.0\n")
    (venv / "bin" / f"python{version}").symlink_to(base)
    (venv / "bin" / "python3").symlink_to(f"python{version}")
    (venv / "bin" / "python").symlink_to(f"python{version}")
    return venv / "bin" / "python"


def site_packages(venv: Path) -> Path:
    return next((venv / "lib").glob("python3*/site-packages"))


def copy_site(src: Path, dest: Path) -> None:
    """Copy an installed site dir (a cached wheel install) into ``dest``."""
    for entry in src.iterdir():
        target = dest / entry.name
        if entry.is_dir():
            shutil.copytree(entry, target, symlinks=True)
        else:
            shutil.copy2(entry, target)


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return "sha256=" + digest.decode()


def build_wheel(out_dir: Path, name: str, version: str, files: dict[str, bytes],
                requires: tuple[str, ...] = (), tag: str = "py3-none-any") -> Path:
    """A real wheel file (zip with dist-info and RECORD) that pip installs."""
    dist_info = f"{name}-{version}.dist-info"
    meta = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    meta += [f"Requires-Dist: {r}" for r in requires]
    content = dict(files)
    content[f"{dist_info}/METADATA"] = ("\n".join(meta) + "\n").encode()
    content[f"{dist_info}/WHEEL"] = (f"Wheel-Version: 1.0\nGenerator: grace-policy-tests\n"
                                     f"Root-Is-Purelib: false\nTag: {tag}\n").encode()
    record = [f"{path},{_record_hash(data)},{len(data)}" for path, data in content.items()]
    record.append(f"{dist_info}/RECORD,,")
    content[f"{dist_info}/RECORD"] = ("\n".join(record) + "\n").encode()
    wheel = out_dir / f"{name}-{version}-{tag}.whl"
    out_dir.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel, "w") as zf:
        for path, data in content.items():
            info = zipfile.ZipInfo(path)
            info.external_attr = 0o644 << 16
            zf.writestr(info, data)
    return wheel


def pip_install(wheel: Path, site: Path) -> None:
    """Install with the real pip, as a user would (``--target`` keeps it out
    of this interpreter's own site-packages)."""
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                    "--no-index", "--disable-pip-version-check", "--target", str(site),
                    "--upgrade", str(wheel)], check=True, timeout=120,
                   env={**os.environ, "PIP_NO_WARN_SCRIPT_LOCATION": "1"})
