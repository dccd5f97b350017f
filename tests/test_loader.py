"""The loader model on compiled dependency trees, against the real loader.

Why: each rule of glibc's search (field notes §4, ``elf/dl-load.c``) is a way
a job can be wrongly blocked or wrongly let through. Every scenario here is
built by the real toolchain in the test run and checked twice: against the
real loader (``ld.so`` in trace mode, natively or under ``qemu-aarch64``) and
against an explicit expectation written from glibc's rules, so a test fails
if the model drifts *or* if the scenario stops exercising the rule.

Scenarios run for x86_64 and, through the cross compiler and qemu, aarch64
(``--root``-style node profile over the cross sysroot, as qemu -L).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest
from fixtures.build import (
    AARCH64_LOADER,
    AARCH64_SYSROOT,
    X86_64_LOADER,
    ElfBuilder,
    LoaderListing,
    parse_loader_list,
    qemu_aarch64,
    src,
)

from grace_policy import loader
from grace_policy.elf import read_elf
from grace_policy.loader import LoadTree
from grace_policy.node import NodeProfile, detect, host_machine

pytestmark = pytest.mark.skipif(host_machine() != "x86_64",
                                reason="fixtures and oracles assume an x86_64 host")

GREET = src("libgreet.c")
CHAIN = src("libchain.c")
USE_GREET = src("use_greet.c")
USE_CHAIN = src("use_chain.c")
HELLO = src("hello.c")


@dataclass(frozen=True)
class Target:
    """One architecture under test: its node profile and its real loader."""

    arch: str
    node: NodeProfile
    other: str  # the foreign architecture for "wrong machine" candidates

    def trace(self, path: str | os.PathLike, *, env: Mapping[str, str] | None = None,
              cwd: str | os.PathLike | None = None, exec_mode: bool = False) -> LoaderListing:
        """The real loader's view of ``path``.

        ``exec_mode`` runs the program itself with LD_TRACE_LOADED_OBJECTS
        (what ``ldd`` does), so the kernel starts it and ``$ORIGIN`` is the
        real path's directory; otherwise ``ld.so FILE`` (the ``--list``
        semantics of ``fixtures.build.loader_list``), which also lets us set
        the cwd for relative search paths.
        """
        extra = dict(env or {})
        if self.arch == "x86_64":
            cmd = [os.fspath(path)] if exec_mode else [X86_64_LOADER, os.fspath(path)]
            run_env = {"PATH": "/usr/bin:/bin", **extra, "LD_TRACE_LOADED_OBJECTS": "1"}
        else:
            qemu = qemu_aarch64()
            assert qemu is not None
            cmd = [qemu, "-E", "LD_TRACE_LOADED_OBJECTS=1"]
            for key, value in extra.items():
                cmd += ["-E", f"{key}={value}"]
            cmd += ["-L", AARCH64_SYSROOT]
            cmd += [os.fspath(path)] if exec_mode else [AARCH64_LOADER, os.fspath(path)]
            run_env = {"PATH": "/usr/bin:/bin"}
        proc = subprocess.run(cmd, capture_output=True, text=True, errors="surrogateescape",
                              env=run_env, cwd=cwd, timeout=60, check=False)
        sysroot = AARCH64_SYSROOT if self.arch == "aarch64" else None
        if proc.returncode != 0:
            return LoaderListing({}, None, None, proc.returncode, proc.stdout, proc.stderr,
                                 sysroot)
        return parse_loader_list(_relative_hits(proc.stdout), stderr=proc.stderr,
                                 sysroot=sysroot)

    def resolve(self, path: str | os.PathLike, *, env: Mapping[str, str] | None = None,
                cwd: str | os.PathLike = "/", exec_origin: bool = False,
                node: NodeProfile | None = None) -> LoadTree:
        p = os.fspath(path)
        return loader.resolve(p, read_elf(p), node or self.node, dict(env or {}),
                              loader.Loading(cwd=os.fspath(cwd), exec_origin=exec_origin))


AARCH64_NODE = NodeProfile("aarch64", 65536, (2, 36), root=AARCH64_SYSROOT)


def _relative_hits(stdout: str) -> str:
    """A library found through a relative search dir whose path equals its
    name (LD_LIBRARY_PATH's empty element = the cwd) is printed as
    ``name (0x...)``, a form the shared parser keeps for vdso and interp
    lines; rewrite it to ``name => name (0x...)``."""
    out = []
    for line in stdout.splitlines():
        body = line.strip()
        name, _, rest = body.partition(" (0x")
        if (rest and " " not in name and "/" not in name
                and not name.startswith(("linux-vdso", "linux-gate"))):
            line = f"\t{name} => {name} (0x{rest}"
        out.append(line)
    return "\n".join(out) + "\n"


@pytest.fixture(params=["x86_64", pytest.param("aarch64",
                                               marks=[pytest.mark.cross, pytest.mark.qemu])])
def target(request: pytest.FixtureRequest) -> Target:
    if request.param == "x86_64":
        return Target("x86_64", detect(), "aarch64")
    return Target("aarch64", AARCH64_NODE, "x86_64")


def norm(mapping: Mapping[str, str | None]) -> dict[str, str | None]:
    return {k: (os.path.normpath(v) if v else v) for k, v in mapping.items()}


def agree(target: Target, path: Path, *, env: Mapping[str, str] | None = None,
          cwd: Path | None = None, exec_mode: bool = False) -> tuple[LoadTree, dict]:
    """Model and real loader must give the same ``{name: path}``; returns both
    the tree (for explicit checks) and the agreed mapping."""
    listing = target.trace(path, env=env, cwd=cwd, exec_mode=exec_mode)
    assert listing.returncode == 0, listing.stderr
    tree = target.resolve(path, env=env, cwd=cwd or "/", exec_origin=exec_mode)
    got, want = norm(tree.resolved()), listing.normalized()
    assert got == want, f"model {got}\nloader {want}"
    return tree, want


def refused(target: Target, path: Path, **kw) -> tuple[LoadTree, str]:
    """The real loader refuses to load ``path``; returns the model's tree and
    the loader's stderr so the test can compare the reason."""
    listing = target.trace(path, **kw)
    assert listing.returncode != 0, listing.stdout
    return target.resolve(path, **{k: v for k, v in kw.items() if k in ("env", "cwd")}), \
        listing.stderr


def via(tree: LoadTree, name: str) -> str:
    return next(o.found_via for o in tree.objects if o.name == name)


def chain_tree(b: ElfBuilder, arch: str, *, chain_runpath: str | None = None,
               chain_rpath: str | None = None) -> tuple[Path, Path]:
    """``g/libgreet.so.1`` and ``c/libchain.so.1`` (needs libgreet.so.1)."""
    greet = b.library("g/libgreet.so.1", arch=arch)
    kw: dict[str, object] = {}
    if chain_runpath is not None:
        kw["runpath"] = chain_runpath
    if chain_rpath is not None:
        kw["rpath"] = chain_rpath
    chain = b.library("c/libchain.so.1", source=CHAIN, arch=arch, needed_libs=("greet",),
                      lib_dirs=(greet.parent,), **kw)
    return greet, chain


def link_exe(b: ElfBuilder, arch: str, source: Path, out: str, libs: tuple[str, ...],
             dirs: tuple[Path, ...], **kw: object) -> Path:
    return b.compile(source, out, arch=arch, needed_libs=libs, lib_dirs=dirs,
                     extra_flags=[f"-Wl,-rpath-link,{d}" for d in dirs], **kw)


# -- RPATH / RUNPATH --------------------------------------------------------------


def test_exe_rpath_serves_a_grandchild_when_the_lib_has_no_runpath(
        target: Target, elf_builder: ElfBuilder) -> None:
    greet, chain = chain_tree(elf_builder, target.arch)
    exe = link_exe(elf_builder, target.arch, USE_CHAIN, "bin/app", ("chain",),
                   (chain.parent, greet.parent), rpath=[chain.parent, greet.parent])
    tree, got = agree(target, exe)
    assert got["libgreet.so.1"] == str(greet)
    assert via(tree, "libgreet.so.1") == "rpath"


def test_runpath_of_the_lib_disables_the_rpath_chain(
        target: Target, elf_builder: ElfBuilder) -> None:
    empty = elf_builder.path("empty")
    empty.mkdir()
    greet, chain = chain_tree(elf_builder, target.arch, chain_runpath=str(empty))
    exe = link_exe(elf_builder, target.arch, USE_CHAIN, "bin/app", ("chain",),
                   (chain.parent, greet.parent), rpath=[chain.parent, greet.parent])
    tree, got = agree(target, exe)
    assert got["libchain.so.1"] == str(chain)
    assert got["libgreet.so.1"] is None
    miss = next(m for m in tree.missing if m.name == "libgreet.so.1")
    assert miss.needed_by == str(chain)
    assert not any(s.startswith(str(greet.parent)) for s in miss.searched)


def test_runpath_is_not_inherited_by_deps(target: Target, elf_builder: ElfBuilder) -> None:
    greet, chain = chain_tree(elf_builder, target.arch)
    exe = link_exe(elf_builder, target.arch, USE_CHAIN, "bin/app", ("chain",),
                   (chain.parent, greet.parent), runpath=[chain.parent, greet.parent])
    _, got = agree(target, exe)
    assert got == {**got, "libchain.so.1": str(chain), "libgreet.so.1": None}


def test_lib_rpath_then_loader_rpath(target: Target, elf_builder: ElfBuilder) -> None:
    """The lib's own DT_RPATH is tried before the executable's."""
    greet, chain = chain_tree(elf_builder, target.arch)
    other = elf_builder.library("g2/libgreet.so.1", arch=target.arch)
    chain = elf_builder.library("c/libchain.so.1", source=CHAIN, arch=target.arch,
                                needed_libs=("greet",), lib_dirs=(greet.parent,),
                                rpath=str(other.parent))
    exe = link_exe(elf_builder, target.arch, USE_CHAIN, "bin/app", ("chain",),
                   (chain.parent, greet.parent), rpath=[chain.parent, greet.parent])
    _, got = agree(target, exe)
    assert got["libgreet.so.1"] == str(other)


# -- dynamic string tokens ---------------------------------------------------------


def test_origin_of_a_library_is_the_path_as_opened(
        target: Target, elf_builder: ElfBuilder) -> None:
    """libchain is reached through a symlink in lib/; its $ORIGIN is lib/,
    not the directory of the real file, where libgreet is absent."""
    greet = elf_builder.library("lib/libgreet.so.1", arch=target.arch)
    real = elf_builder.library("store/libchain.so.1", source=CHAIN, arch=target.arch,
                               needed_libs=("greet",), lib_dirs=(greet.parent,),
                               runpath="$ORIGIN")
    link = greet.parent / "libchain.so.1"
    link.symlink_to(real)
    exe = link_exe(elf_builder, target.arch, USE_CHAIN, "bin/app", ("chain",),
                   (real.parent, greet.parent), runpath=str(greet.parent))
    _, got = agree(target, exe)
    assert got == {**got, "libchain.so.1": str(link), "libgreet.so.1": str(greet)}


@pytest.mark.parametrize("exec_mode", [True, False], ids=["execve", "ld.so-FILE"])
def test_origin_of_a_symlinked_executable(target: Target, elf_builder: ElfBuilder,
                                          exec_mode: bool) -> None:
    """execve: $ORIGIN is the real path's directory (kernel AT_EXECFN and
    /proc/self/exe); ``ld.so FILE``: the directory as given."""
    greet = elf_builder.library("real/libgreet.so.1", arch=target.arch)
    exe = link_exe(elf_builder, target.arch, USE_GREET, "real/app", ("greet",),
                   (greet.parent,), runpath="$ORIGIN")
    link = elf_builder.path("bin/app")
    link.parent.mkdir()
    link.symlink_to(exe)
    _, got = agree(target, link, exec_mode=exec_mode)
    assert got["libgreet.so.1"] == (str(greet) if exec_mode else None)


def test_curly_origin_lib_and_platform(target: Target, elf_builder: ElfBuilder) -> None:
    """``${ORIGIN}``, ``$LIB`` and ``$PLATFORM`` expand to what this loader
    uses (here $PLATFORM may be a CPU name such as ``haswell``)."""
    platform = loader.loader_platform(target.node)
    lib = loader.lib_token(target.node)
    a = elf_builder.library(f"t/{lib}/liba.so", arch=target.arch)
    b = elf_builder.library(f"t/{platform}/libb.so", arch=target.arch)
    c = elf_builder.library("t/bin/sub/libc1.so", arch=target.arch)
    main = "int a(void);\nint main(void){return 0;}\n"
    exe = elf_builder.compile(
        main, "t/bin/app", arch=target.arch, lib_dirs=(a.parent, b.parent, c.parent),
        extra_flags=["-Wl,--no-as-needed", "-la", "-lb", "-lc1"],
        runpath=[f"{elf_builder.root}/t/$LIB", f"{elf_builder.root}/t/$PLATFORM",
                 "${ORIGIN}/sub"])
    _, got = agree(target, exe)
    assert got["liba.so"] == str(a)
    assert got["libb.so"] == str(b)
    assert got["libc1.so"] == str(c)


def test_ld_library_path_separators_and_empty_element(
        target: Target, elf_builder: ElfBuilder) -> None:
    """``:`` and ``;`` both split; an empty element is the current directory."""
    d1 = elf_builder.library("d1/liba.so", arch=target.arch)
    d2 = elf_builder.library("d2/libb.so", arch=target.arch)
    here = elf_builder.library("cwd/libc1.so", arch=target.arch)
    exe = elf_builder.compile("int main(void){return 0;}\n", "bin/app", arch=target.arch,
                              lib_dirs=(d1.parent, d2.parent, here.parent),
                              extra_flags=["-Wl,--no-as-needed", "-la", "-lb", "-lc1"])
    llp = f"{elf_builder.root}/none;{d1.parent}:{d2.parent}::"
    tree, got = agree(target, exe, env={"LD_LIBRARY_PATH": llp}, cwd=here.parent)
    assert got["liba.so"] == str(d1) and got["libb.so"] == str(d2)
    assert got["libc1.so"] == "libc1.so"  # relative to the cwd, printed as found
    assert via(tree, "libc1.so") == "LD_LIBRARY_PATH"


def test_ld_library_path_beats_runpath_but_not_rpath(
        target: Target, elf_builder: ElfBuilder) -> None:
    env_lib = elf_builder.library("env/libgreet.so.1", arch=target.arch)
    run_lib = elf_builder.library("run/libgreet.so.1", arch=target.arch)
    rp_lib = elf_builder.library("rp/libgreet.so.1", arch=target.arch)
    env = {"LD_LIBRARY_PATH": str(env_lib.parent)}
    exe_run = link_exe(elf_builder, target.arch, USE_GREET, "bin/run", ("greet",),
                       (run_lib.parent,), runpath=str(run_lib.parent))
    exe_rp = link_exe(elf_builder, target.arch, USE_GREET, "bin/rp", ("greet",),
                      (rp_lib.parent,), rpath=str(rp_lib.parent))
    assert agree(target, exe_run, env=env)[1]["libgreet.so.1"] == str(env_lib)
    assert agree(target, exe_rp, env=env)[1]["libgreet.so.1"] == str(rp_lib)


# -- DF_1_NODEFLIB -----------------------------------------------------------------


def test_nodeflib_skips_cache_and_system_dirs(target: Target, elf_builder: ElfBuilder) -> None:
    """The executable's lookup of libc.so.6 skips the cache and the system
    dirs; LD_LIBRARY_PATH still applies."""
    greet = elf_builder.library("g/libgreet.so.1", arch=target.arch)
    exe = link_exe(elf_builder, target.arch, USE_GREET, "bin/app", ("greet",),
                   (greet.parent,), runpath=str(greet.parent), nodeflib=True)
    assert read_elf(str(exe)).nodeflib
    tree, got = agree(target, exe)
    assert got["libc.so.6"] is None and got["libgreet.so.1"] == str(greet)
    exe_miss = next(m for m in tree.missing if m.name == "libc.so.6")
    assert exe_miss.needed_by == str(exe)
    assert not any(s.startswith(("/lib/", "/usr/lib/")) for s in exe_miss.searched)
    libdir = "/lib/x86_64-linux-gnu" if target.arch == "x86_64" else "/lib"
    tree, got = agree(target, exe, env={"LD_LIBRARY_PATH": libdir})
    assert os.path.dirname(got["libc.so.6"] or "") in (libdir, "/lib")
    assert via(tree, "libc.so.6") == "LD_LIBRARY_PATH"


@pytest.mark.parametrize("lib", ["/usr/lib/x86_64-linux-gnu/libfakeroot/libfakeroot-0.so",
                                 "/usr/local/cuda-13.0/lib/libnvvm.so.4"])
def test_nodeflib_drops_cache_entries_by_system_dir_prefix(
        elf_builder: ElfBuilder, lib: str) -> None:
    """glibc drops a cache hit whose path starts with a system dir *and a
    slash* (so /usr/lib/ covers /usr/lib/x86_64-linux-gnu/libfakeroot/) and
    keeps hits elsewhere (/usr/local/...)."""
    name = os.path.basename(lib)
    cache = loader.ldcache.load("/etc/ld.so.cache")
    if cache.lookup(name, 0x0303) != lib:
        pytest.skip(f"{name} is not in this host's ld.so.cache at {lib}")
    target = Target("x86_64", detect(), "aarch64")
    exe = elf_builder.compile(HELLO, "bin/app", nodeflib=True,
                              extra_flags=["-Wl,--no-as-needed", lib],
                              runpath="/lib/x86_64-linux-gnu")
    _, got = agree(target, exe)
    assert got[name] == (None if lib.startswith("/usr/lib/") else lib)


# -- candidates that are skipped or fatal -------------------------------------------


def test_foreign_candidate_is_skipped_and_recorded(
        target: Target, elf_builder: ElfBuilder, have_cross: str) -> None:
    foreign = elf_builder.library("a/libgreet.so.1", arch=target.other)
    native = elf_builder.library("b/libgreet.so.1", arch=target.arch)
    exe = link_exe(elf_builder, target.arch, USE_GREET, "bin/app", ("greet",),
                   (native.parent,), runpath=[foreign.parent, native.parent])
    tree, got = agree(target, exe)
    assert got["libgreet.so.1"] == str(native)
    obj = next(o for o in tree.objects if o.name == "libgreet.so.1")
    assert [(c.path, c.machine) for c in obj.skipped] == [(str(foreign), target.other)]


def test_only_foreign_candidates_give_missing_with_foreign(
        target: Target, elf_builder: ElfBuilder, have_cross: str) -> None:
    native = elf_builder.library("b/libgreet.so.1", arch=target.arch)
    foreign = elf_builder.library("a/libgreet.so.1", arch=target.other)
    exe = link_exe(elf_builder, target.arch, USE_GREET, "bin/app", ("greet",),
                   (native.parent,), runpath=str(foreign.parent))
    tree, got = agree(target, exe)
    assert got["libgreet.so.1"] is None
    miss = next(m for m in tree.missing if m.name == "libgreet.so.1")
    assert [(c.path, c.machine) for c in miss.foreign] == [(str(foreign), target.other)]


def test_wrong_elf_class_is_skipped(target: Target, elf_builder: ElfBuilder) -> None:
    """An i386 object (ELFCLASS32) is passed over silently on both 64-bit targets."""
    obj = elf_builder.path("f32.o")
    try:
        subprocess.run(["gcc", "-m32", "-fPIC", "-c", "-o", str(obj),
                        str(src("freestanding.c"))], check=True, capture_output=True)
    except (subprocess.CalledProcessError, FileNotFoundError) as exc:
        pytest.skip(f"gcc -m32 cannot compile here: {exc}")
    bad = elf_builder.path("a/libgreet.so.1")
    bad.parent.mkdir()
    subprocess.run(["ld", "-m", "elf_i386", "-shared", "-soname", "libgreet.so.1", "-o",
                    str(bad), str(obj)], check=True, capture_output=True)
    native = elf_builder.library("b/libgreet.so.1", arch=target.arch)
    exe = link_exe(elf_builder, target.arch, USE_GREET, "bin/app", ("greet",),
                   (native.parent,), runpath=[bad.parent, native.parent])
    tree, got = agree(target, exe)
    assert got["libgreet.so.1"] == str(native)
    obj_ = next(o for o in tree.objects if o.name == "libgreet.so.1")
    assert [(c.path, c.reason) for c in obj_.skipped] == [(str(bad), "wrong ELF class: ELFCLASS32")]


@pytest.mark.parametrize(("content", "reason"), [
    (b"this is a text file, not a shared object, and it is long enough\n" * 2,
     "invalid ELF header"),
    (b"x", "file too short"),
    (None, "cannot read file data: Error 21"),
], ids=["text", "short", "directory"])
def test_unusable_file_named_like_the_library_is_fatal(
        target: Target, elf_builder: ElfBuilder, content: bytes | None, reason: str) -> None:
    """glibc does not skip these and search on: it stops with an error (the
    field notes' "non-ELF is fatal" holds; checked against the loader)."""
    native = elf_builder.library("b/libgreet.so.1", arch=target.arch)
    bad = elf_builder.path("a/libgreet.so.1")
    bad.parent.mkdir()
    if content is None:
        bad.mkdir()
    else:
        bad.write_bytes(content)
    exe = link_exe(elf_builder, target.arch, USE_GREET, "bin/app", ("greet",),
                   (native.parent,), runpath=[bad.parent, native.parent])
    tree, stderr = refused(target, exe)
    assert f"{bad}: {reason}" in stderr
    assert [(f.path, f.reason) for f in tree.fatal] == [(str(bad), reason)]


# -- reuse, cycles, names with "/", interpreter ------------------------------------


def test_reuse_by_soname(target: Target, elf_builder: ElfBuilder) -> None:
    """The executable needs libalias.so, whose SONAME is libgreet.so.1;
    libchain's libgreet.so.1 then reuses it without any search (there is no
    libgreet.so.1 file anywhere on the path)."""
    d = elf_builder.path("lib")
    stub = elf_builder.compile(GREET, "lib/libalias.so", arch=target.arch, shared=True)
    greet_dev = elf_builder.library("dev/libgreet.so.1", arch=target.arch)
    chain = elf_builder.library("lib/libchain.so.1", source=CHAIN, arch=target.arch,
                                needed_libs=("greet",), lib_dirs=(greet_dev.parent,))
    exe = elf_builder.compile(
        USE_CHAIN, "bin/app", arch=target.arch, lib_dirs=(d,), runpath=str(d),
        extra_flags=["-Wl,--no-as-needed", "-lalias", "-lchain",
                     f"-Wl,-rpath-link,{greet_dev.parent}"])
    # Now the real libalias.so: same code, SONAME libgreet.so.1.
    elf_builder.compile(GREET, "lib/libalias.so", arch=target.arch, shared=True,
                        soname="libgreet.so.1")
    assert read_elf(str(stub)).soname == "libgreet.so.1"
    shutil.rmtree(greet_dev.parent)
    tree, got = agree(target, exe)
    assert got["libalias.so"] == str(stub)
    assert "libgreet.so.1" not in got
    assert (str(chain), str(stub)) in tree.edges


def test_reuse_of_the_same_file_under_another_name(
        target: Target, elf_builder: ElfBuilder) -> None:
    """No SONAME to match: the second name opens a symlink to the loaded file,
    and glibc's (dev, inode) check reuses the loaded object."""
    d = elf_builder.path("lib")
    one = elf_builder.compile(GREET, "lib/libone.so", arch=target.arch, shared=True)
    elf_builder.compile(GREET, "lib/libtwo.so", arch=target.arch, shared=True)
    exe = elf_builder.compile(HELLO, "bin/app", arch=target.arch, lib_dirs=(d,),
                              runpath=str(d),
                              extra_flags=["-Wl,--no-as-needed", "-lone", "-ltwo"])
    two = d / "libtwo.so"
    two.unlink()
    two.symlink_to("libone.so")
    tree, got = agree(target, exe)
    assert got["libone.so"] == str(one)
    assert "libtwo.so" not in got
    assert sum(1 for o in tree.objects if o.path == str(one)) == 1


def test_needed_cycle_terminates(target: Target, elf_builder: ElfBuilder) -> None:
    d = elf_builder.path("lib")
    lib_a = "int b_fn(void);\nint a_fn(void) { return 1; }\nint a_use(void) { return b_fn(); }\n"
    lib_b = "int a_fn(void);\nint b_fn(void) { return a_fn(); }\n"
    # liba without its dependency first, so that libb can link against it.
    elf_builder.compile("int a_fn(void) { return 1; }\n", "lib/liba.so", arch=target.arch,
                        shared=True, soname="liba.so")
    elf_builder.compile(lib_b, "lib/libb.so", arch=target.arch, shared=True, soname="libb.so",
                        extra_flags=["-Wl,--no-as-needed", f"-L{d}", "-la"])
    elf_builder.compile(lib_a, "lib/liba.so", arch=target.arch, shared=True, soname="liba.so",
                        extra_flags=["-Wl,--no-as-needed", f"-L{d}", "-lb"])
    assert read_elf(str(d / "liba.so")).needed[0] == "libb.so"
    assert "liba.so" in read_elf(str(d / "libb.so")).needed
    exe = elf_builder.compile(HELLO, "bin/app", arch=target.arch, lib_dirs=(d,),
                              rpath=str(d), extra_flags=["-Wl,--no-as-needed", "-la",
                                                           f"-Wl,-rpath-link,{d}"])
    tree, got = agree(target, exe)
    assert got["liba.so"] == str(d / "liba.so") and got["libb.so"] == str(d / "libb.so")
    assert (str(d / "libb.so"), str(d / "liba.so")) in tree.edges


def test_needed_name_with_a_slash_is_opened_as_given(
        target: Target, elf_builder: ElfBuilder) -> None:
    """A library linked by path without SONAME gets that path as DT_NEEDED;
    it is opened directly (relative: from the cwd), never searched."""
    absolute = elf_builder.compile(GREET, "abs/libx.so", arch=target.arch, shared=True)
    rel = elf_builder.compile(GREET, "work/rel/liby.so", arch=target.arch, shared=True)
    exe = rel.parent.parent / "app"
    # The fixture builder compiles in a temp dir; a relative input needs our cwd.
    subprocess.run([*_cc(target.arch), "-o", "app", str(HELLO), "-Wl,--no-as-needed",
                    str(absolute), "rel/liby.so"], cwd=exe.parent, check=True,
                   capture_output=True)
    info = read_elf(str(exe))
    assert str(absolute) in info.needed and "rel/liby.so" in info.needed
    tree, got = agree(target, exe, cwd=exe.parent)
    assert got[str(absolute)] == str(absolute)
    assert got["rel/liby.so"] == "rel/liby.so"
    assert via(tree, str(absolute)) == "path"


def _cc(arch: str) -> list[str]:
    return ["gcc"] if arch == "x86_64" else ["aarch64-linux-gnu-gcc"]


def test_missing_program_interpreter(target: Target, elf_builder: ElfBuilder) -> None:
    """The kernel fails execve (ENOENT) when PT_INTERP is missing; ld.so FILE
    does not care. The model reports it as a Missing of kind "interp" that
    ``resolved()`` (the ld.so view) leaves out."""
    exe = elf_builder.compile(HELLO, "bin/app", arch=target.arch,
                              extra_flags=["-Wl,--dynamic-linker=/nonexistent/ld.so.1"])
    tree, _ = agree(target, exe)
    assert [(m.name, m.kind) for m in tree.missing] == [("/nonexistent/ld.so.1", "interp")]
    if target.arch == "x86_64":
        with pytest.raises(FileNotFoundError):
            subprocess.run([str(exe)], check=False, capture_output=True)


# -- judging another node from here ----------------------------------------------------


@pytest.mark.cross
def test_aarch64_binary_judged_from_this_host_by_name(elf_builder: ElfBuilder) -> None:
    """Without an image, system libraries count as present when this host has
    a library of that name (``by_name_only``); user files are judged: an
    x86_64 libgreet next to the aarch64 binary is skipped as foreign."""
    x86 = elf_builder.library("lib/libgreet.so.1", arch="x86_64")
    arm = elf_builder.library("armlib/libgreet.so.1", arch="aarch64")
    exe = link_exe(elf_builder, "aarch64", USE_GREET, "bin/app", ("greet",), (arm.parent,),
                   runpath=str(x86.parent))
    node = detect().with_overrides(machine="aarch64")
    assert not node.root_is_native
    tree = loader.resolve(str(exe), read_elf(str(exe)), node, {})
    libc = next(o for o in tree.objects if o.name == "libc.so.6")
    assert libc.by_name_only and os.path.exists(libc.path)
    miss = next(m for m in tree.missing if m.name == "libgreet.so.1")
    assert [(c.path, c.machine) for c in miss.foreign] == [(str(x86), "x86_64")]
    assert not tree.fatal


@pytest.mark.cross
@pytest.mark.qemu
def test_root_image_paths_come_from_the_image_then_the_host(elf_builder: ElfBuilder) -> None:
    """``--root``: /lib/libc.so.6 is the image's file (the host's is x86_64);
    a path absent from the image (the job's own files) is the host's."""
    target = Target("aarch64", AARCH64_NODE, "x86_64")
    greet = elf_builder.library("lib/libgreet.so.1", arch="aarch64")
    exe = link_exe(elf_builder, "aarch64", USE_GREET, "bin/app", ("greet",), (greet.parent,),
                   runpath=str(greet.parent))
    tree, got = agree(target, exe)
    assert got["libgreet.so.1"] == str(greet)
    libc = next(o for o in tree.objects if o.name == "libc.so.6")
    assert libc.path.startswith("/lib") and not libc.by_name_only
    assert libc.info.machine_name == "aarch64"
