"""suffixes.py against real interpreters' EXTENSION_SUFFIXES and real file names."""

from __future__ import annotations

import ast
import glob
import json
import os
import subprocess
import sys

import pytest

from grace_policy.python.suffixes import describe_suffix, extension_suffixes, split_extension

PYENV = "/root/.pyenv/versions"


def _real_pythons() -> list[str]:
    found = sorted(glob.glob(f"{PYENV}/3.*/bin/python3"))
    found += [p for p in ("/usr/bin/python3", sys.executable) if os.path.exists(p)]
    return list(dict.fromkeys(os.path.realpath(p) for p in found))


def _ask(python: str) -> tuple[tuple[int, int], list[str], str, list[str]]:
    code = ("import importlib.machinery as m, sys, sysconfig, os, json;"
            "d = sysconfig.get_config_var('DESTSHARED') or '';"
            "print(json.dumps([sys.version_info[:2], m.EXTENSION_SUFFIXES, os.uname().machine,"
            " sorted(os.listdir(d)) if os.path.isdir(d) else []]))")
    out = subprocess.run([python, "-I", "-c", code], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    ver, sfx, machine, dynload = json.loads(out)
    return (ver[0], ver[1]), sfx, machine, dynload


@pytest.mark.parametrize("python", _real_pythons())
def test_matches_real_interpreter(python: str) -> None:
    version, want, machine, dynload = _ask(python)
    assert extension_suffixes(version, machine) == tuple(want)
    # every extension module of its lib-dynload splits into a suffix it accepts
    mods = [f for f in dynload if f.endswith(".so")]
    for fname in mods:
        split = split_extension(fname)
        assert split is not None and split[1] in want, fname
        assert split[0] + split[1] == fname


def test_other_machines_and_versions() -> None:
    assert extension_suffixes((3, 11), "aarch64") == (
        ".cpython-311-aarch64-linux-gnu.so", ".abi3.so", ".so")
    assert extension_suffixes((3, 11), "arm64")[0] == ".cpython-311-aarch64-linux-gnu.so"
    assert extension_suffixes((3, 7), "aarch64")[0] == ".cpython-37m-aarch64-linux-gnu.so"
    assert extension_suffixes((3, 12), "ppc64le")[0] == ".cpython-312-powerpc64le-linux-gnu.so"
    assert extension_suffixes((3, 12), "i686")[0] == ".cpython-312-i386-linux-gnu.so"
    assert extension_suffixes((3, 12), "s390x")[0] == ".cpython-312-s390x-linux-gnu.so"
    assert extension_suffixes((3, 12), "riscv64")[0] == ".cpython-312-riscv64-linux-gnu.so"
    assert extension_suffixes((3, 13), "aarch64", free_threaded=True) == (
        ".cpython-313t-aarch64-linux-gnu.so", ".so")
    assert extension_suffixes((3, 15), "x86_64") == (
        ".cpython-315-x86_64-linux-gnu.so", ".abi3-x86_64-linux-gnu.so", ".abi3.so",
        ".abi3t-x86_64-linux-gnu.so", ".abi3t.so", ".so")


@pytest.mark.parametrize(("fname", "want"), [
    ("_multiarray_umath.cpython-38-aarch64-linux-gnu.so",
     ("_multiarray_umath", ".cpython-38-aarch64-linux-gnu.so")),
    ("foo.abi3.so", ("foo", ".abi3.so")),
    ("foo.so", ("foo", ".so")),
    ("foo.cpython-37m-x86_64-linux-gnu.so", ("foo", ".cpython-37m-x86_64-linux-gnu.so")),
    ("foo.cpython-313t-x86_64-linux-gnu.so", ("foo", ".cpython-313t-x86_64-linux-gnu.so")),
    ("foo.pypy39-pp73-x86_64-linux-gnu.so", ("foo", ".pypy39-pp73-x86_64-linux-gnu.so")),
    ("libfoo.so.1", None),
    ("libfoo.so.1.2.3", None),
    ("libcudnn.8.so", None),
    (".so", None),
    ("foo.py", None),
    ("a/b.so", None),
    ("foo.cpython-311-x86_64-linux-gnu.so.bak", None),
])
def test_split_extension(fname: str, want: tuple[str, str] | None) -> None:
    assert split_extension(fname) == want


@pytest.mark.parametrize(("suffix", "want"), [
    (".cpython-311-x86_64-linux-gnu.so", "CPython 3.11, x86_64"),
    (".cpython-38-aarch64-linux-gnu.so", "CPython 3.8, aarch64"),
    (".cpython-37m-x86_64-linux-gnu.so", "CPython 3.7, x86_64"),
    (".cpython-313t-aarch64-linux-gnu.so", "CPython 3.13 free-threaded, aarch64"),
    (".cpython-312-powerpc64le-linux-gnu.so", "CPython 3.12, ppc64le"),
    (".abi3.so", "the stable ABI (abi3), any machine"),
    (".abi3-aarch64-linux-gnu.so", "the stable ABI (abi3), aarch64"),
    (".so", "any Python (untagged .so)"),
    (".cpython-310-darwin.so", "CPython 3.10, macOS"),
])
def test_describe_suffix(suffix: str, want: str) -> None:
    assert describe_suffix(suffix) == want


def test_describe_never_raises_on_odd_input() -> None:
    for odd in ["", ".", "x", ".cpython-.so", ".cpython-3-.so", ".abi3", "\0", ".cpython-x-y.so"]:
        assert isinstance(describe_suffix(odd), str)


@pytest.mark.network
@pytest.mark.qemu
def test_matches_real_aarch64_interpreter() -> None:
    from python.arm64_python import VERSION, arm64_python
    code = ("import importlib.machinery as m, os, sys; "
            "print(repr([tuple(sys.version_info[:2]), m.EXTENSION_SUFFIXES, os.uname().machine,"
            " sorted(os.listdir(os.path.join(sys.prefix, 'lib', 'python3.11', 'lib-dynload')))"
            " if os.path.isdir(os.path.join(sys.prefix, 'lib', 'python3.11', 'lib-dynload'))"
            " else []]))")
    out = subprocess.run([*arm64_python(), "-I", "-S", "-c", code], capture_output=True,
                         text=True, check=True, timeout=120).stdout
    version, want, machine, dynload = ast.literal_eval(out.strip())
    assert (version, machine) == (VERSION, "aarch64")
    assert extension_suffixes(version, "aarch64") == tuple(want)
    for fname in (f for f in dynload if f.endswith(".so")):
        split = split_extension(fname)
        assert split is not None and split[1] in want, fname
