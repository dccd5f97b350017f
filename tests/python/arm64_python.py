"""A real aarch64 CPython as the node's importer: Debian's python3.11-minimal
(arm64) run under qemu-aarch64, fetched once like tests/corpus.py's packages.

    from python.arm64_python import arm64_python
    cmd = arm64_python()      # ["qemu-aarch64", "-L", ROOT, ROOT/usr/bin/python3.11]
    subprocess.run([*cmd, "-I", "-S", "-c", code])

Only the minimal standard library is there (importlib, os, sys; no json).
Skips the test when offline or qemu is missing (fails under CI=1). Mark tests
``network`` and ``qemu``.
"""

from __future__ import annotations

import shutil

from corpus import CorpusUnavailable, _give_up, fetch_debian_arm64

PACKAGES = ("libc6", "zlib1g", "libexpat1", "python3.11-minimal", "libpython3.11-minimal")
VERSION = (3, 11)

_failure: list[str] = []


def arm64_python() -> list[str]:
    qemu = shutil.which("qemu-aarch64")
    if qemu is None:
        _give_up("qemu-aarch64 not installed (apt-get install qemu-user)")
    if _failure:
        _give_up(_failure[0])
    try:
        root = fetch_debian_arm64(PACKAGES, name="debian-arm64-python")
    except CorpusUnavailable as exc:
        _failure.append(f"Debian arm64 python3.11 unavailable (network?): {exc}")
        _give_up(_failure[0])
    python = root / "usr" / "bin" / "python3.11"
    if not python.is_file():
        _give_up(f"{python} missing from the unpacked packages")
    return [str(qemu), "-L", str(root), str(python)]
