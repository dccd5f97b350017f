"""The loader model's dlopen, held to glibc's own dlopen.

A Python interpreter maps extension modules after start, so their libraries
are searched with the process already running: the RPATH chain of the caller
(conda's python carries ``$ORIGIN/../lib``), sonames already loaded, and never
the executable's RUNPATH. Each case compiles a real program that dlopens real
files, runs it, and compares with :meth:`grace_policy.loader.Process.dlopen`.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from fixtures.build import ElfBuilder, src

from grace_policy.elf import read_elf
from grace_policy.loader import Process
from grace_policy.node import detect


def _real(exe: Path, *files: Path, env: dict[str, str] | None = None) -> list[str]:
    out = subprocess.run([str(exe), *map(str, files)], capture_output=True, text=True,
                         env=env or {}, timeout=30)
    return [line.split(" ", 1)[0] for line in out.stdout.splitlines()]


def _model(exe: Path, *files: Path, env: dict[str, str] | None = None) -> list[str]:
    process = Process(str(exe), read_elf(str(exe)), detect(), env or {})
    verdicts = []
    for f in files:
        tree = process.dlopen(str(f), read_elf(str(f)))
        verdicts.append("fail" if tree.missing or tree.fatal else "ok")
    return verdicts


def _ext(b: ElfBuilder, rel: str, lib_dir: Path, **kw: object) -> Path:
    return b.compile(src("ext_greet.c"), rel, shared=True, needed_libs=("greet",),
                     lib_dirs=(lib_dir,), **kw)


def test_exe_rpath_serves_a_dlopened_module(elf_builder: ElfBuilder) -> None:
    # conda: bin/python has RPATH $ORIGIN/../lib, the module none of its own.
    lib = elf_builder.library("env/lib/libgreet.so.1")
    exe = elf_builder.compile(src("dlopener.c"), "env/bin/python", rpath="$ORIGIN/../lib",
                              extra_flags=("-ldl",))
    ext = _ext(elf_builder, "env/site/mod.so", lib.parent)
    assert _real(exe, ext) == ["ok"]
    assert _model(exe, ext) == ["ok"]


def test_exe_runpath_does_not_serve_a_dlopened_module(elf_builder: ElfBuilder) -> None:
    lib = elf_builder.library("env/lib/libgreet.so.1")
    exe = elf_builder.compile(src("dlopener.c"), "env/bin/python", runpath="$ORIGIN/../lib",
                              extra_flags=("-ldl",))
    ext = _ext(elf_builder, "env/site/mod.so", lib.parent)
    assert _real(exe, ext) == ["fail"]
    assert _model(exe, ext) == ["fail"]


def test_module_runpath_origin_and_ld_library_path(elf_builder: ElfBuilder) -> None:
    lib = elf_builder.library("pkg.libs/libgreet.so.1")
    exe = elf_builder.compile(src("dlopener.c"), "bin/python", extra_flags=("-ldl",))
    ext = _ext(elf_builder, "pkg/mod.so", lib.parent, runpath="$ORIGIN/../pkg.libs")
    bare = _ext(elf_builder, "other/mod.so", lib.parent)
    assert _real(exe, ext, bare) == _model(exe, ext, bare) == ["ok", "ok"]
    # A fresh process: the bare module alone, with and without LD_LIBRARY_PATH.
    assert _real(exe, bare) == _model(exe, bare) == ["fail"]
    env = {"LD_LIBRARY_PATH": str(lib.parent)}
    assert _real(exe, bare, env=env) == _model(exe, bare, env=env) == ["ok"]


def test_a_failed_dlopen_leaves_nothing_for_the_next(elf_builder: ElfBuilder) -> None:
    # The first module finds libgreet but misses another library: dlopen fails
    # and unmaps libgreet again, so the second (bare) module cannot reuse it.
    lib = elf_builder.library("pkg.libs/libgreet.so.1")
    gone = elf_builder.library("gone/libgone.so.1", source="int gone(int x) { return x; }\n")
    exe = elf_builder.compile(src("dlopener.c"), "bin/python", extra_flags=("-ldl",))
    broken = elf_builder.compile("int greet(int); int gone(int);\n"
                                 "int ext_call(void) { return greet(gone(1)); }\n",
                                 "pkg/broken.so", shared=True,
                                 needed_libs=("greet", "gone"),
                                 lib_dirs=(lib.parent, gone.parent),
                                 runpath="$ORIGIN/../pkg.libs")
    gone.unlink()
    bare = _ext(elf_builder, "other/mod.so", lib.parent)
    assert _real(exe, broken, bare) == _model(exe, broken, bare) == ["fail", "fail"]
