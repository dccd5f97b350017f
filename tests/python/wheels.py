"""Real wheels, installed as pip lays them out, for the Python-step tests and bench.

API (everything returns paths in a shared, read-only cache: copy before you modify):

    from python.wheels import installed_wheel, wheel_site, PINS

    site = installed_wheel("numpy==1.19.0", "aarch64", "3.8")   # -> Path of the site dir
    # site/numpy/..., site/numpy.libs/..., site/numpy-1.19.0.dist-info/ (pip's own layout,
    # RECORD/INSTALLER included); raises corpus.CorpusUnavailable when it cannot be fetched.

    site = wheel_site("numpy-1.19.0-aarch64")    # the same by key, but *skips* the test when
                                                 # offline (fails under CI=1, like tests/corpus.py)
    installed_wheel(...).parent / "wheel"        # the downloaded .whl itself, if you need it

    copy_site("markupsafe-2.1.5-x86_64", home / ".local/lib/python3.11/site-packages")
                                                 # a private, writable copy where a test needs
                                                 # it (a user site, a venv); skips like wheel_site

``platform`` is a pip ``--platform`` tag or a bare machine (``aarch64`` ->
``manylinux2014_aarch64``); ``python_version`` is ``"X.Y"``. Only pinned wheels
(:data:`PINS`: requirement, platform, Python, file name and sha256) can be
fetched: pip downloads them with ``--require-hashes`` and the file is checked
again here, so a changed upload fails instead of silently changing the tests.
Each is installed with ``pip install --target SITE --no-deps --platform ...
--only-binary=:all:`` (pip accepts foreign wheels that way), once, under
``~/.cache/grace-policy-tests/wheel-<key>/`` (``GRACE_TEST_CACHE``), with the
locked build-once helper of ``tests/corpus.py``. Mark tests ``network``.

The pinned corpus (small; the numpy ones are 12 MB each):
- ``numpy-1.19.0-aarch64``: its ``_multiarray_umath`` PT_LOADs are congruent
  only modulo 4 KiB (numpy issue 16677): fails on a 64 KiB-page node.
- ``numpy-1.19.5-aarch64``: the fixed build of the same code.
- ``markupsafe-2.1.5-x86_64`` / ``markupsafe-2.1.5-aarch64``: one package, both
  machines (``markupsafe/_speedups.cpython-311-<triplet>.so`` plus a pure fallback).
- ``bcrypt-4.1.2-abi3-x86_64``: an x86_64 ``.abi3.so`` (``bcrypt/_bcrypt.abi3.so``):
  an aarch64 CPython tries it and fails with "cannot open shared object file"-class
  errors (wrong ELF machine), not ModuleNotFoundError.
- ``bcrypt-4.1.2-abi3-aarch64``: the same for aarch64 (what an x86_64 node's
  CPython refuses, tests/python/test_loginnode.py).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from corpus import NET_TIMEOUT, CorpusUnavailable, _cached_tree, _give_up, _run, sha256_file

from grace_policy._record import dataclass


@dataclass(frozen=True)
class WheelPin:
    key: str
    requirement: str        # name==version
    platform: str           # pip --platform
    python_version: str     # X.Y
    filename: str
    sha256: str


PINS: tuple[WheelPin, ...] = (
    WheelPin("numpy-1.19.0-aarch64", "numpy==1.19.0", "manylinux2014_aarch64", "3.8",
             "numpy-1.19.0-cp38-cp38-manylinux2014_aarch64.whl",
             "7b57f26e5e6ee2f14f960db46bd58ffdca25ca06dd997729b1b179fddd35f5a3"),
    WheelPin("numpy-1.19.5-aarch64", "numpy==1.19.5", "manylinux2014_aarch64", "3.8",
             "numpy-1.19.5-cp38-cp38-manylinux2014_aarch64.whl",
             "99abf4f353c3d1a0c7a5f27699482c987cf663b1eac20db59b8c7b061eabd7fc"),
    WheelPin("markupsafe-2.1.5-x86_64", "markupsafe==2.1.5", "manylinux2014_x86_64", "3.11",
             "MarkupSafe-2.1.5-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
             "b91c037585eba9095565a3556f611e3cbfaa42ca1e865f7b8015fe5c7336d5a5"),
    WheelPin("markupsafe-2.1.5-aarch64", "markupsafe==2.1.5", "manylinux2014_aarch64", "3.11",
             "MarkupSafe-2.1.5-cp311-cp311-manylinux_2_17_aarch64.manylinux2014_aarch64.whl",
             "6ec585f69cec0aa07d945b20805be741395e28ac1627333b1c5b0105962ffced"),
    WheelPin("bcrypt-4.1.2-abi3-x86_64", "bcrypt==4.1.2", "manylinux2014_x86_64", "3.11",
             "bcrypt-4.1.2-cp39-abi3-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
             "387e7e1af9a4dd636b9505a465032f2f5cb8e61ba1120e79a0e1cd0b512f3dfc"),
    WheelPin("bcrypt-4.1.2-abi3-aarch64", "bcrypt==4.1.2", "manylinux2014_aarch64", "3.11",
             "bcrypt-4.1.2-cp39-abi3-manylinux_2_17_aarch64.manylinux2014_aarch64.whl",
             "68e3c6642077b0c8092580c819c1684161262b2e30c4f45deb000c38947bf483"),
)

_BY_KEY = {p.key: p for p in PINS}


def _platform(platform: str) -> str:
    if platform.startswith(("manylinux", "musllinux", "linux_")):
        return platform
    return f"manylinux2014_{platform}"


def pin_for(requirement: str, platform: str, python_version: str) -> WheelPin:
    plat = _platform(platform)
    want = requirement.replace(" ", "").lower()
    for pin in PINS:
        if (pin.requirement == want and pin.platform == plat
                and pin.python_version == python_version):
            return pin
    known = ", ".join(f"{p.requirement} {p.platform} {p.python_version}" for p in PINS)
    raise KeyError(f"no pinned wheel for {requirement} {plat} {python_version} (pinned: {known})")



def _install(pin: WheelPin) -> Path:
    def build(work: Path) -> Path:
        dl = work / "dl"
        dl.mkdir()
        req = work / "requirements.txt"
        req.write_text(f"{pin.requirement} --hash=sha256:{pin.sha256}\n")
        target = ["--platform", pin.platform, "--python-version", pin.python_version,
                  "--implementation", "cp", "--only-binary=:all:", "--no-deps"]
        _run(["python3", "-m", "pip", "download", "-q", *target, "--require-hashes",
              "--timeout", str(NET_TIMEOUT), "-d", str(dl), "-r", str(req)])
        wheel = dl / pin.filename
        if not wheel.is_file():
            got = sorted(p.name for p in dl.iterdir())
            raise CorpusUnavailable(f"pip downloaded {got}, wanted {pin.filename}")
        if sha256_file(wheel) != pin.sha256:
            raise CorpusUnavailable(f"{pin.filename}: sha256 differs from the pin")
        root = work / "root"
        (root / "wheel").mkdir(parents=True)
        shutil.copy2(wheel, root / "wheel" / pin.filename)
        _run(["python3", "-m", "pip", "install", "-q", "--no-compile", "--no-index",
              "--disable-pip-version-check", "--target", str(root / "site"), *target,
              str(wheel)])
        return root

    root = _cached_tree(f"wheel-{pin.key}", {"pin": list(_pin_fields(pin))}, build)
    return root / "site"


def _pin_fields(pin: WheelPin) -> tuple[str, ...]:
    return (pin.requirement, pin.platform, pin.python_version, pin.filename, pin.sha256)


def installed_wheel(requirement: str, platform: str, python_version: str) -> Path:
    """The site dir holding the pinned wheel as pip installs it (downloaded and
    installed once). Raises :class:`corpus.CorpusUnavailable` (or KeyError for
    a wheel that is not pinned)."""
    return _install(pin_for(requirement, platform, python_version))


def copy_site(key: str, dest: Path) -> Path:
    """Copy the pinned wheel's installed files into ``dest`` (created; merged
    with what is there, as a second ``pip install --target`` would); returns
    ``dest``. Skips/fails like :func:`wheel_site` when offline."""
    shutil.copytree(wheel_site(key), dest, symlinks=True, dirs_exist_ok=True)
    return dest


_failures: dict[str, str] = {}


def wheel_site(key: str) -> Path:
    """:func:`installed_wheel` by :data:`PINS` key, skipping the test (failing
    under CI) when the wheel cannot be fetched."""
    if key in _failures:
        _give_up(_failures[key])
    try:
        return _install(_BY_KEY[key])
    except CorpusUnavailable as exc:
        _failures[key] = f"wheel {key} unavailable (network?): {exc}"
        _give_up(_failures[key])
        raise   # not reached: _give_up skips or fails
