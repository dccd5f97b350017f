"""The pinned wheel corpus is what wheels.py says: pip's layout, pinned bytes."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from python.wheels import PINS, copy_site, installed_wheel, pin_for, wheel_site


@pytest.mark.network
@pytest.mark.parametrize("pin", PINS, ids=[p.key for p in PINS])
def test_pinned_and_installed_by_pip(pin) -> None:
    site = wheel_site(pin.key)
    wheel = site.parent / "wheel" / pin.filename
    assert hashlib.sha256(wheel.read_bytes()).hexdigest() == pin.sha256
    (meta,) = site.glob("*.dist-info")
    assert (meta / "INSTALLER").read_text() == "pip\n"
    assert (meta / "RECORD").is_file()
    assert any(site.rglob("*.so"))
    name, _, version = pin.requirement.partition("==")
    assert installed_wheel(pin.requirement, pin.platform, pin.python_version) == site
    bare = "x86_64" if pin.platform.endswith("x86_64") else "aarch64"
    assert installed_wheel(pin.requirement, bare, pin.python_version) == site
    assert meta.name.lower().startswith(f"{name}-{version}".lower())


@pytest.mark.network
def test_copy_site_merges_two_wheels(tmp_path: Path) -> None:
    dest = tmp_path / "home" / ".local" / "lib" / "python3.11" / "site-packages"
    copy_site("markupsafe-2.1.5-x86_64", dest)
    copy_site("bcrypt-4.1.2-abi3-x86_64", dest)
    assert (dest / "markupsafe" / "_speedups.cpython-311-x86_64-linux-gnu.so").is_file()
    assert (dest / "bcrypt" / "_bcrypt.abi3.so").is_file()


def test_unpinned_wheels_are_refused() -> None:
    with pytest.raises(KeyError):
        pin_for("numpy==2.0.0", "aarch64", "3.12")
    assert pin_for("numpy==1.19.0", "aarch64", "3.8").key == "numpy-1.19.0-aarch64"
    assert pin_for("markupsafe==2.1.5", "manylinux2014_x86_64", "3.11").key == \
        "markupsafe-2.1.5-x86_64"
