"""The lean ELF reader against pyelftools (the reference) and against bad input.

Corpus: ELF files compiled here (x86_64, aarch64, 4/64 KiB pages, RPATH,
RUNPATH, NODEFLIB, static, non-PIE, 32-bit, big-endian, non-UTF-8 names), a
deterministic sample of this machine's /usr/bin and /usr/lib/x86_64-linux-gnu
(all of them with GRACE_VERIFY_FULL=1), and real Debian arm64 files.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import socket
import struct
import threading
from pathlib import Path
from typing import Any

import pytest
from corpus import Corpus, list_elf_files
from elftools.common.exceptions import ELFError as PyElfError
from elftools.elf.elffile import ELFFile
from elftools.elf.enums import ENUM_E_MACHINE, ENUM_E_TYPE, ENUM_EI_OSABI
from fixtures.build import ElfBuilder, LoaderListing, loader_list, parse_loader_list, src

from grace_policy import elf as E
from grace_policy.elf import ElfError, ElfInfo, read_elf, read_head

SYSTEM_DIRS = ("/usr/bin", "/usr/lib/x86_64-linux-gnu")
SYSTEM_SAMPLE = 150


# --------------------------------------------------------------------------
# Reference facts from pyelftools, and the same shape from the lean reader
# --------------------------------------------------------------------------


def _enum(value: Any, table: dict[str, int]) -> int:
    return value if isinstance(value, int) else table[value]


def reference_facts(path: Path) -> dict[str, Any]:
    """What pyelftools says, with glibc's choices: first PT_INTERP (the kernel's),
    last PT_DYNAMIC / PT_GNU_RELRO, last SONAME/RPATH/RUNPATH/FLAGS_1 tag."""
    with open(path, "rb") as fh:
        elf = ELFFile(fh)
        h = elf.header
        facts: dict[str, Any] = {
            "machine": _enum(h["e_machine"], ENUM_E_MACHINE),
            "elf_class": 2 if elf.elfclass == 64 else 1,
            "data": 1 if elf.little_endian else 2,
            "e_type": _enum(h["e_type"], ENUM_E_TYPE),
            "osabi": _enum(h["e_ident"]["EI_OSABI"], ENUM_EI_OSABI),
            "interp": None, "loads": [], "relro": None, "has_dynamic": False,
            "needed": [], "soname": None, "rpath": None, "runpath": None, "flags_1": 0,
        }
        dynamic = None
        for seg in elf.iter_segments():
            t = seg["p_type"]
            if t == "PT_LOAD":
                facts["loads"].append((seg["p_offset"], seg["p_vaddr"], seg["p_filesz"],
                                       seg["p_memsz"], seg["p_flags"], seg["p_align"]))
            elif t == "PT_INTERP" and facts["interp"] is None:
                facts["interp"] = seg.get_interp_name()
            elif t == "PT_GNU_RELRO":
                facts["relro"] = (seg["p_vaddr"], seg["p_memsz"])
            elif t == "PT_DYNAMIC":
                dynamic = seg
        if dynamic is not None:
            facts["has_dynamic"] = True
            for tag in dynamic.iter_tags():
                d = tag.entry.d_tag
                if d == "DT_NEEDED":
                    facts["needed"].append(tag.needed)
                elif d == "DT_SONAME":
                    facts["soname"] = tag.soname
                elif d == "DT_RPATH":
                    facts["rpath"] = tag.rpath
                elif d == "DT_RUNPATH":
                    facts["runpath"] = tag.runpath
                elif d == "DT_FLAGS_1":
                    facts["flags_1"] = tag.entry.d_val
    return facts


def lean_facts(info: ElfInfo) -> dict[str, Any]:
    return {
        "machine": info.machine, "elf_class": info.elf_class, "data": info.data,
        "e_type": info.e_type, "osabi": info.osabi, "interp": info.interp,
        "loads": [(s.offset, s.vaddr, s.filesz, s.memsz, s.flags, s.align)
                  for s in info.load_segments],
        "relro": info.relro, "has_dynamic": info.has_dynamic, "needed": list(info.needed),
        "soname": info.soname, "rpath": info.rpath, "runpath": info.runpath,
        "flags_1": info.flags_1,
    }


def differences(ref: dict[str, Any], got: dict[str, Any]) -> list[str]:
    return [f"{k}: pyelftools={ref[k]!r} lean={got.get(k)!r}"
            for k in ref if ref[k] != got.get(k)]


def compare_corpus(paths: list[Path]) -> tuple[int, list[str]]:
    """Compare every file; returns (files compared, mismatch descriptions).
    Files pyelftools itself cannot parse are not counted (the lean reader must
    then raise ElfError, never anything else)."""
    compared, problems = 0, []
    for path in paths:
        try:
            ref = reference_facts(path)
        except (PyElfError, struct.error, KeyError, ValueError, UnicodeDecodeError):
            try:
                read_elf(str(path))
            except ElfError:
                pass
            except Exception as exc:
                problems.append(f"{path}: pyelftools failed, lean raised {exc!r}")
            continue
        try:
            got = lean_facts(read_elf(str(path)))
        except ElfError as exc:
            problems.append(f"{path}: lean ElfError {exc.reason!r}, pyelftools read it")
            continue
        compared += 1
        problems += [f"{path}: {d}" for d in differences(ref, got)]
    return compared, problems


# --------------------------------------------------------------------------
# Corpora
# --------------------------------------------------------------------------


def _build_compiled(b: ElfBuilder, arch: str) -> list[Path]:
    out: list[Path] = []
    a = arch
    for page in (None, 4096, 65536):
        tag = f"{a}-p{page or 'default'}"
        lib = b.library(f"{tag}/lib/libgreet.so.1", arch=a, page_size=page)
        out.append(lib)
        out.append(b.compile(src("hello.c"), f"{tag}/bin/hello", arch=a, page_size=page))
        out.append(b.compile(src("use_greet.c"), f"{tag}/bin/rpath", arch=a, page_size=page,
                             needed_libs=("greet",), lib_dirs=(lib.parent,),
                             rpath=["$ORIGIN/../lib", "/opt/site/lib"]))
        out.append(b.compile(src("use_greet.c"), f"{tag}/bin/runpath", arch=a, page_size=page,
                             needed_libs=("greet",), lib_dirs=(lib.parent,),
                             runpath="$ORIGIN/../lib"))
        out.append(b.compile(src("use_greet.c"), f"{tag}/bin/nodeflib", arch=a,
                             page_size=page, needed_libs=("greet",), lib_dirs=(lib.parent,),
                             runpath="$ORIGIN/../lib", nodeflib=True))
        out.append(b.library(f"{tag}/lib/libchain.so.2", source=src("libchain.c"), arch=a,
                             page_size=page, needed_libs=("greet",), lib_dirs=(lib.parent,),
                             rpath="$ORIGIN", nodeflib=True))
    out.append(b.compile(src("hello.c"), f"{a}/bin/hello-nopie", arch=a,
                         extra_flags=("-no-pie", "-fno-pie")))
    out.append(b.compile(src("hello.c"), f"{a}/bin/hello-static", arch=a,
                         extra_flags=("-static",)))
    return out


def _sample_system(limit: int | None) -> list[Path]:
    seen: set[tuple[int, int]] = set()
    files: list[Path] = []
    for d in SYSTEM_DIRS:
        for path in list_elf_files(Path(d)):
            st = path.stat()
            if (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
            files.append(path)
    # A hash order is deterministic on one machine yet spreads over both dirs.
    files.sort(key=lambda p: hashlib.sha256(str(p).encode()).digest())
    return files if limit is None else files[:limit]


# --------------------------------------------------------------------------
# Agreement with pyelftools
# --------------------------------------------------------------------------


def test_comparison_detects_a_difference(session_elf_builder: ElfBuilder) -> None:
    """Guard against a comparison that can never fail."""
    exe = session_elf_builder.compile(src("use_greet.c"), "guard/app",
                                      needed_libs=("greet",), runpath="/x",
                                      lib_dirs=(session_elf_builder.library(
                                          "guard/lib/libgreet.so.1").parent,))
    info = read_elf(str(exe))
    ref = reference_facts(exe)
    assert differences(ref, lean_facts(info)) == []
    for change in ({"needed": ("libc.so.6", "libgreet.so.1")}, {"runpath": "/y"},
                   {"flags_1": 1}, {"relro": None}, {"load_segments": info.load_segments[:-1]}):
        assert differences(ref, lean_facts(dataclasses.replace(info, **change))), change


def test_agrees_on_compiled_x86_64(session_elf_builder: ElfBuilder) -> None:
    files = _build_compiled(session_elf_builder, "x86_64")
    compared, problems = compare_corpus(files)
    assert problems == []
    assert compared == len(files)


@pytest.mark.cross
def test_agrees_on_compiled_aarch64(session_elf_builder: ElfBuilder) -> None:
    files = _build_compiled(session_elf_builder, "aarch64")
    compared, problems = compare_corpus(files)
    assert problems == []
    assert compared == len(files)
    aligns = {read_elf(str(f)).min_load_align for f in files}
    assert {4096, 65536} <= aligns, "page_size must reach the PT_LOAD alignment"


def test_agrees_on_system_sample() -> None:
    full = os.environ.get("GRACE_VERIFY_FULL") == "1"
    files = _sample_system(None if full else SYSTEM_SAMPLE)
    compared, problems = compare_corpus(files)
    assert problems == []
    assert compared >= min(len(files), SYSTEM_SAMPLE) * 0.9


@pytest.mark.network
def test_agrees_on_debian_arm64(debian_arm64: Corpus) -> None:
    compared, problems = compare_corpus(list(debian_arm64.elf_files))
    assert problems == []
    assert compared >= 100
    machines = {read_elf(str(p)).machine_name for p in debian_arm64.elf_files}
    assert machines == {"aarch64"}


@pytest.mark.network
def test_agrees_on_aarch64_wheel(aarch64_wheel: Corpus) -> None:
    compared, problems = compare_corpus(list(aarch64_wheel.elf_files))
    assert problems == []
    assert compared == len(aarch64_wheel.elf_files) >= 1


@pytest.mark.network
def test_debian_facts_are_the_expected_ones(debian_arm64: Corpus) -> None:
    """Spot checks against known package contents, independent of pyelftools."""
    zstd = read_elf(str(debian_arm64.matching("libzstd.so.1.")[0]))
    assert zstd.soname == "libzstd.so.1" and zstd.e_type == E.ET_DYN
    bash = read_elf(str(debian_arm64.root / "bin" / "bash"))
    assert bash.interp == "/lib/ld-linux-aarch64.so.1"
    assert "libc.so.6" in bash.needed
    assert bash.machine_name == "aarch64" and bash.bits == 64


# --------------------------------------------------------------------------
# Specific real builds
# --------------------------------------------------------------------------


def test_rpath_runpath_nodeflib_are_read(elf_builder: ElfBuilder) -> None:
    lib = elf_builder.library("lib/libgreet.so.1")
    kw: dict[str, Any] = {"needed_libs": ("greet",), "lib_dirs": (lib.parent,)}
    rp = read_elf(str(elf_builder.compile(src("use_greet.c"), "rp", rpath="$ORIGIN/a:/b", **kw)))
    ru = read_elf(str(elf_builder.compile(src("use_greet.c"), "ru", runpath="/c",
                                          nodeflib=True, **kw)))
    assert (rp.rpath, rp.runpath, rp.nodeflib) == ("$ORIGIN/a:/b", None, False)
    assert (ru.rpath, ru.runpath, ru.nodeflib) == (None, "/c", True)
    assert rp.needed == ("libgreet.so.1", "libc.so.6")
    assert read_elf(str(lib)).soname == "libgreet.so.1"


def test_32bit_objects(elf_builder: ElfBuilder) -> None:
    """Real i386 files: gcc -m32 without a 32-bit libc works with -nostdlib."""
    lib = elf_builder.library("lib/libf32.so.1", source=src("freestanding.c"),
                              extra_flags=("-m32", "-nostdlib"))
    exe = elf_builder.compile(
        "int answer(void); void _start(void) { answer(); for (;;) {} }\n", "bin/app32",
        needed_libs=("f32",), lib_dirs=(lib.parent,), runpath="$ORIGIN/../lib",
        extra_flags=("-m32", "-nostdlib", "-fPIE", "-pie",
                     "-Wl,-dynamic-linker,/lib/ld-linux.so.2"))
    for path in (lib, exe):
        info = read_elf(str(path))
        assert (info.bits, info.machine_name, info.phentsize) == (32, "i386", 32)
        assert differences(reference_facts(path), lean_facts(info)) == []
    info = read_elf(str(exe))
    assert (info.interp, info.needed, info.runpath) == (
        "/lib/ld-linux.so.2", ("libf32.so.1",), "$ORIGIN/../lib")


@pytest.mark.cross
def test_big_endian_aarch64(elf_builder: ElfBuilder) -> None:
    lib = elf_builder.library("lib/libbe.so.1", source=src("freestanding.c"), arch="aarch64",
                              extra_flags=("-mbig-endian", "-nostdlib"), runpath="/be")
    info = read_elf(str(lib))
    assert (info.data, info.machine_name, info.soname, info.runpath) == (
        E.ELFDATA2MSB, "aarch64", "libbe.so.1", "/be")
    assert differences(reference_facts(lib), lean_facts(info)) == []


def test_non_utf8_names_round_trip(elf_builder: ElfBuilder) -> None:
    bad = "libgr\udcffet.so.1"  # byte 0xff, as os.fsencode writes it into argv
    lib = elf_builder.library("lib/" + bad)
    exe = elf_builder.compile(src("use_greet.c"), "app", extra_flags=(str(lib),),
                              runpath="/d\udcfe")
    info = read_elf(str(exe))
    assert info.needed[0] == bad
    assert info.needed[0].encode("utf-8", "surrogateescape") == b"libgr\xffet.so.1"
    assert info.runpath.encode("utf-8", "surrogateescape") == b"/d\xfe"  # type: ignore[union-attr]


def test_names_past_the_first_megabyte_of_dynstr(elf_builder: ElfBuilder) -> None:
    """Regression: strings were read from a 1 MiB window of the string table, so a
    DT_NEEDED/SONAME stored after a big symbol-name blob came out as an error."""
    syms = "".join(f"int s_{i:05d}_{'x' * 72} = {i};\n" for i in range(16000))
    syms += "int greet(int);\nint (*use_greet)(int) = greet;\n"  # keep DT_NEEDED (as-needed)
    lib = elf_builder.library("lib/libgreet.so.1")
    big = elf_builder.compile(syms, "libbig.so", shared=True, soname="libbig.so.7",
                              needed_libs=("greet",), lib_dirs=(lib.parent,),
                              runpath="/far/away")
    with open(big, "rb") as fh:
        dynstr = ELFFile(fh).get_section_by_name(".dynstr")
        assert dynstr is not None and dynstr["sh_size"] > 1 << 20
        raw = dynstr.data()
    assert raw.index(b"libbig.so.7\0") > 1 << 20, "fixture must put the name past 1 MiB"
    info = read_elf(str(big))
    assert (info.soname, info.needed[0], info.runpath) == ("libbig.so.7", "libgreet.so.1",
                                                          "/far/away")


# --------------------------------------------------------------------------
# Odd files: a clear ElfError (or OSError for open problems), never a hang
# --------------------------------------------------------------------------


def test_non_elf_and_empty(tmp_path: Path) -> None:
    (tmp_path / "script").write_bytes(b"#!/bin/sh\necho hi\n")
    (tmp_path / "empty").write_bytes(b"")
    (tmp_path / "magic-only").write_bytes(b"\x7fELF")
    for name in ("script", "empty", "magic-only"):
        with pytest.raises(ElfError) as exc:
            read_elf(str(tmp_path / name))
        assert exc.value.not_elf
    assert read_head(str(tmp_path / "script"), 2) == b"#!"


def test_directory_and_dev_zero(tmp_path: Path) -> None:
    for path in (str(tmp_path), "/dev/zero", "/dev/null"):
        with pytest.raises(ElfError, match="not a regular file"):
            read_elf(path)
        with pytest.raises(ElfError, match="not a regular file"):
            read_head(path)


def _in_thread(fn: Any, timeout: float = 5.0) -> BaseException | None:
    """Run ``fn`` in a daemon thread: a blocking open would hang the thread, not
    the suite, and the join timeout turns that hang into a failure."""
    result: list[BaseException | None] = []

    def target() -> None:
        try:
            fn()
            result.append(None)
        except BaseException as exc:
            result.append(exc)

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), "read blocked"
    return result[0]


def test_fifo_does_not_block(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for fn in (read_elf, read_head):
        exc = _in_thread(lambda fn=fn: fn(str(fifo)))
        assert isinstance(exc, ElfError) and exc.not_elf
    # And a FIFO named through a symlink, as PATH lookups meet them.
    (tmp_path / "link").symlink_to(fifo)
    assert isinstance(_in_thread(lambda: read_elf(str(tmp_path / "link"))), ElfError)


def test_socket_and_missing_are_errors(tmp_path: Path) -> None:
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.bind(str(tmp_path / "sock"))
        with pytest.raises(ElfError, match="not a regular file"):
            read_elf(str(tmp_path / "sock"))
    finally:
        sock.close()
    with pytest.raises(FileNotFoundError):
        read_elf(str(tmp_path / "nope"))
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    with pytest.raises(OSError):
        read_elf(str(tmp_path / "loop"))


def test_proc_file_is_not_elf() -> None:
    with pytest.raises(ElfError):
        read_elf("/proc/self/status")


# --------------------------------------------------------------------------
# Malformed files: real builds with single fields broken
# --------------------------------------------------------------------------


class Patcher:
    """Edit fields of a real 64-bit little-endian ELF file in place."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.data = bytearray(path.read_bytes())
        self.info = read_elf(str(path))
        self.phoff, = struct.unpack_from("<Q", self.data, 32)
        self.phnum, = struct.unpack_from("<H", self.data, 56)

    def phdrs(self) -> list[tuple[int, tuple[int, ...]]]:
        return [(self.phoff + i * 56, struct.unpack_from("<IIQQQQQQ", self.data,
                                                         self.phoff + i * 56))
                for i in range(self.phnum)]

    def dynamic(self) -> list[tuple[int, int, int]]:
        """(file offset, tag, value) of each entry up to and including the first DT_NULL."""
        off, size = next((p[2], p[5]) for _, p in self.phdrs() if p[0] == E.PT_DYNAMIC)
        out = []
        for pos in range(off, off + size, 16):
            tag, val = struct.unpack_from("<qQ", self.data, pos)
            out.append((pos, tag, val))
            if tag == 0:
                break
        return out

    def set(self, fmt: str, offset: int, *values: int) -> None:
        struct.pack_into(fmt, self.data, offset, *values)

    def write(self, name: str) -> str:
        out = self.path.with_name(name)
        out.write_bytes(bytes(self.data))
        return str(out)


@pytest.fixture
def patcher(elf_builder: ElfBuilder) -> Patcher:
    lib = elf_builder.library("lib/libgreet.so.1")
    exe = elf_builder.compile(src("use_greet.c"), "app", needed_libs=("greet",),
                              lib_dirs=(lib.parent,), runpath="/opt/rp")
    return Patcher(exe)


def test_truncated_files(patcher: Patcher) -> None:
    data = bytes(patcher.data)
    dyn_end = max(pos for pos, _, _ in patcher.dynamic()) + 16
    for n in (5, 16, 20, 63, 64, patcher.phoff + 56 * patcher.phnum - 1, dyn_end - 8):
        path = patcher.path.with_name(f"cut{n}")
        path.write_bytes(data[:n])
        with pytest.raises(ElfError):
            read_elf(str(path))


def test_huge_phnum_and_phdrs_beyond_eof(patcher: Patcher) -> None:
    patcher.set("<H", 56, 0xFFFF)
    with pytest.raises(ElfError, match="too many program headers"):
        read_elf(patcher.write("phnum"))
    patcher.set("<H", 56, patcher.phnum)
    patcher.set("<Q", 32, len(patcher.data) - 10)
    with pytest.raises(ElfError, match="beyond the end"):
        read_elf(patcher.write("phoff"))
    patcher.set("<Q", 32, patcher.phoff)
    patcher.set("<H", 54, 8)
    with pytest.raises(ElfError, match="entry size"):
        read_elf(patcher.write("phentsize"))


def test_phentsize_larger_than_the_struct_is_honoured(elf_builder: ElfBuilder) -> None:
    """e_phentsize is the stride: a file with padded entries still parses."""
    p = Patcher(elf_builder.compile(src("hello.c"), "hello"))
    rows = [bytes(p.data[o:o + 56]) for o, _ in p.phdrs()]
    table = b"".join(r + b"\0" * 8 for r in rows)
    new_off = len(p.data)
    p.data += table
    p.set("<Q", 32, new_off)
    p.set("<H", 54, 64)
    info = read_elf(p.write("stride"))
    assert info.load_segments == p.info.load_segments and info.interp == p.info.interp


def test_dynamic_without_dt_null(patcher: Patcher) -> None:
    """Every DT_NULL replaced by DT_DEBUG: the reader stops at the segment end."""
    off, size = next((p[2], p[5]) for _, p in patcher.phdrs() if p[0] == E.PT_DYNAMIC)
    for pos in range(off, off + size, 16):
        tag, _ = struct.unpack_from("<qQ", patcher.data, pos)
        if tag == E.DT_NULL:
            patcher.set("<qQ", pos, 21, 0)  # DT_DEBUG
    info = read_elf(patcher.write("nonull"))
    assert info.needed == patcher.info.needed and info.runpath == "/opt/rp"


def test_string_offsets_out_of_range(patcher: Patcher) -> None:
    needed = next(pos for pos, tag, _ in patcher.dynamic() if tag == E.DT_NEEDED)
    patcher.set("<Q", needed + 8, 1 << 40)
    with pytest.raises(ElfError, match="outside the dynamic string table"):
        read_elf(patcher.write("stroff"))


def test_unterminated_string(patcher: Patcher) -> None:
    entries = patcher.dynamic()
    needed_val = next(val for _, tag, val in entries if tag == E.DT_NEEDED)
    strsz_pos = next(pos for pos, tag, _ in entries if tag == E.DT_STRSZ)
    patcher.set("<Q", strsz_pos + 8, needed_val + 3)  # table ends inside the name
    with pytest.raises(ElfError, match="unterminated"):
        read_elf(patcher.write("unterm"))


def test_strtab_outside_every_load(patcher: Patcher) -> None:
    strtab_pos = next(pos for pos, tag, _ in patcher.dynamic() if tag == E.DT_STRTAB)
    patcher.set("<Q", strtab_pos + 8, 1 << 44)
    with pytest.raises(ElfError, match="DT_STRTAB"):
        read_elf(patcher.write("strtab"))


def test_bad_class_and_encoding(patcher: Patcher) -> None:
    patcher.data[4] = 3
    with pytest.raises(ElfError, match="class"):
        read_elf(patcher.write("class"))
    patcher.data[4], patcher.data[5] = 2, 7
    with pytest.raises(ElfError, match="encoding"):
        read_elf(patcher.write("encoding"))
    patcher.data[5] = 2  # a little-endian file claiming big-endian: garbage, but no crash
    try:
        read_elf(patcher.write("swapped"))
    except ElfError:
        pass


def test_dynamic_is_read_at_its_address_like_glibc(patcher: Patcher) -> None:
    """A PT_DYNAMIC whose p_offset points at junk: glibc reads p_vaddr, so do we."""
    for pos, p in patcher.phdrs():
        if p[0] == E.PT_DYNAMIC:
            patcher.set("<Q", pos + 8, 0)  # p_offset -> the ELF header
    info = read_elf(patcher.write("dynoff"))
    assert info.needed == patcher.info.needed


def test_read_budget_is_enforced(patcher: Patcher) -> None:
    with pytest.raises(ElfError, match="read limit"):
        read_elf(str(patcher.path), max_bytes=100)


# --------------------------------------------------------------------------
# The fixture builder and loader oracle themselves
# --------------------------------------------------------------------------


def test_parse_loader_list_forms() -> None:
    text = ("\tlinux-vdso.so.1 (0x00007ffd1)\n"
            "\tlibgreet.so.1 => not found\n"
            "\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f0)\n"
            "\t/abs/libz.so (0x00007f1)\n"
            "\t/lib64/ld-linux-x86-64.so.2 (0x00007f2)\n")
    got: LoaderListing = parse_loader_list(text)
    assert got.libs == {"libgreet.so.1": None, "libc.so.6": "/lib/x86_64-linux-gnu/libc.so.6",
                        "/abs/libz.so": "/abs/libz.so"}
    assert (got.vdso, got.interp, got.missing) == (
        "linux-vdso.so.1", "/lib64/ld-linux-x86-64.so.2", ["libgreet.so.1"])
    q = parse_loader_list("\tlibc.so.6 => /lib/libc.so.6 (0x55)\n\t/lib/ld-linux-aarch64.so.1 "
                          "=> /usr/aarch64-linux-gnu/lib/ld-linux-aarch64.so.1 (0x55)\n",
                          sysroot="/usr/aarch64-linux-gnu")
    assert q.interp == "/lib/ld-linux-aarch64.so.1" and list(q.libs) == ["libc.so.6"]
    with pytest.raises(ValueError):
        parse_loader_list("\tsomething odd\n")


def test_compile_cache_hits(elf_builder: ElfBuilder) -> None:
    assert elf_builder.cache is not None
    a = elf_builder.compile(src("hello.c"), "one", page_size=16384)
    hits = elf_builder.cache.hits
    b = elf_builder.compile(src("hello.c"), "two", page_size=16384)
    assert elf_builder.cache.hits == hits + 1
    assert a.read_bytes() == b.read_bytes()
    b.write_bytes(b"scribble")  # a test damaging its copy must not poison the cache
    c = elf_builder.compile(src("hello.c"), "three", page_size=16384)
    assert c.read_bytes() == a.read_bytes()


@pytest.mark.parametrize("arch", ["x86_64", pytest.param("aarch64", marks=pytest.mark.qemu)])
def test_loader_oracle_on_a_tree(elf_builder: ElfBuilder, arch: str) -> None:
    """The oracle reports RUNPATH/$ORIGIN hits, not-found names, LD_LIBRARY_PATH
    from ``env`` and --library-path, each the way the real loader resolves them."""
    lib = elf_builder.library("lib/libgreet.so.1", arch=arch)
    chain = elf_builder.library("lib2/libchain.so.1", source=src("libchain.c"), arch=arch,
                                needed_libs=("greet",), lib_dirs=(lib.parent,),
                                runpath="$ORIGIN/../lib")
    exe = elf_builder.compile(src("use_chain.c"), "bin/app", arch=arch, needed_libs=("chain",),
                              lib_dirs=(chain.parent, lib.parent), runpath="$ORIGIN/../lib2")
    tree = loader_list(exe, arch=arch)  # type: ignore[arg-type]
    assert tree.normalized()["libchain.so.1"] == str(chain)
    assert tree.normalized()["libgreet.so.1"] == str(lib)
    assert "libc.so.6" in tree.libs and tree.interp
    plain = elf_builder.compile(src("use_greet.c"), "bin/plain", arch=arch,
                                needed_libs=("greet",), lib_dirs=(lib.parent,))
    assert loader_list(plain, arch=arch).missing == ["libgreet.so.1"]  # type: ignore[arg-type]
    via_env = loader_list(plain, arch=arch,  # type: ignore[arg-type]
                          env={"LD_LIBRARY_PATH": str(lib.parent)})
    assert via_env.libs["libgreet.so.1"] == str(lib)
    via_arg = loader_list(plain, arch=arch, library_path=[lib.parent])  # type: ignore[arg-type]
    assert via_arg.libs["libgreet.so.1"] == str(lib)
