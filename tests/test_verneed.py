"""Symbol version needs (DT_VERNEED) against what the loader defines.

Why: a program built on a newer system than the node (a Debian 13 login
node, Debian 12 compute nodes) passes every library search and still dies at
start with glibc's "version `GLIBC_2.38' not found". glibc checks, for every
loaded object, each DT_VERNEED entry against the DT_VERDEF of the object
loaded for that file name (``elf/dl-version.c``: ``_dl_check_map_versions``,
``match_symbol``): a missing version is fatal unless the need is weak; an
object without DT_VERDEF accepts everything.

Every scenario is compiled here and run by the real loader, whose stderr is
the oracle for our predicted text; the scenario's own shape (weak flag, no
verdef) is asserted too, so a test fails if the toolchain stops producing it.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from bench.core import elf_files
from grace_policy.budget import Budget
from grace_policy.check import check_step
from grace_policy.elf import read_elf
from grace_policy.loader import Loading, Process
from grace_policy.node import detect, host_machine
from grace_policy.rules import Catalogue

pytestmark = pytest.mark.skipif(host_machine() != "x86_64",
                                reason="the oracle is this host's x86_64 loader")

ENV = {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent"}

LIB_C = """
int f1(void) { return 1; }
#ifdef WITH_F2
int f2(void) { return 2; }
#endif
"""
BOTH_VERSIONS = "VERS_1 { global: f1; local: *; };\nVERS_2 { global: f2; } VERS_1;\n"
ONLY_VERS_1 = "VERS_1 { global: f1; local: *; };\n"

PROG_C = """
int f2(void);
int main(void) { return f2() == 2 ? 0 : 3; }
"""
#: Calls f2 only when given five arguments, linked with lazy binding: the
#: version check at start is all that runs against libv.so.
LAZY_PROG_C = """
int f2(void);
int main(int argc, char **argv) { (void)argv; return argc > 5 ? f2() : 0; }
"""


def _gcc(*args: str | Path) -> None:
    subprocess.run(["gcc", *map(str, args)], check=True, capture_output=True)


def _lib(directory: Path, *, script: str | None, with_f2: bool) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    source = directory / "libv.c"
    source.write_text(LIB_C)
    out = directory / "libv.so"
    args: list[str | Path] = ["-shared", "-fPIC", "-o", out, source, "-Wl,-soname,libv.so"]
    if with_f2:
        args.append("-DWITH_F2")
    if script is not None:
        (directory / "v.map").write_text(script)
        args.append(f"-Wl,--version-script={directory / 'v.map'}")
    _gcc(*args)
    return out


def _prog(tmp: Path, source_text: str, build_lib: Path, run_dir: Path,
          *extra: str) -> Path:
    """A program linked against ``build_lib`` that finds libv.so in ``run_dir``
    (absolute DT_RUNPATH: glibc's object name is that directory + name)."""
    tmp.mkdir(parents=True, exist_ok=True)
    source = tmp / "prog.c"
    source.write_text(source_text)
    prog = tmp / "prog"
    _gcc("-o", prog, source, "-L", build_lib.parent, "-lv", f"-Wl,-rpath,{run_dir}", *extra)
    return prog


def _make_needs_weak(prog: Path, version: str) -> None:
    """Set VER_FLG_WEAK on the program's need of ``version``. GNU ld 2.40
    sets the flag on no need we could make it produce (a weak reference
    loses its version instead), so the bit is patched into a real build;
    the real loader then shows that it honours it."""
    from elftools.elf.elffile import ELFFile

    data = bytearray(prog.read_bytes())
    with open(prog, "rb") as fh:
        section = ELFFile(fh).get_section_by_name(".gnu.version_r")
        base, strtab = section["sh_offset"], section.stringtable
        pos = base
        while True:
            _ver, _cnt, _file, vn_aux, vn_next = struct.unpack_from("<HHIII", data, pos)
            aux = pos + vn_aux
            while True:
                _hash, _flags, _other, name, vna_next = struct.unpack_from("<IHHII", data, aux)
                if strtab.get_string(name) == version:
                    struct.pack_into("<H", data, aux + 4, 0x2)
                    prog.write_bytes(bytes(data))
                    return
                if not vna_next:
                    break
                aux += vna_next
            if not vn_next:
                raise AssertionError(f"{prog} needs no {version}")
            pos += vn_next


def _run(prog: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(prog)], capture_output=True, text=True, env=ENV, timeout=60)


def _report(prog: Path):
    budget = Budget(deadline_ms=60_000, max_files=100_000, max_bytes=1 << 32)
    return check_step([str(prog)], ENV, "/", detect(), budget=budget)


def _versions(prog: Path):
    return [i for i in _report(prog).issues if i.rule == "lib-version-missing"]


# ---------------------------------------------------------------------------
# The reader


def test_reader_reads_needs_and_definitions(tmp_path: Path) -> None:
    lib = _lib(tmp_path / "new", script=BOTH_VERSIONS, with_f2=True)
    prog = _prog(tmp_path, PROG_C, lib, lib.parent)
    info = read_elf(str(prog))
    needs = dict(info.verneed)
    assert [(v, w) for v, _h, w in needs["libv.so"]] == [("VERS_2", False)]
    defined = {name for _h, name in read_elf(str(lib)).verdef or ()}
    # The base version (the soname) is a record too; glibc matches against it.
    assert defined == {"libv.so", "VERS_1", "VERS_2"}
    assert read_elf(str(_lib(tmp_path / "plain", script=None, with_f2=True))).verdef is None


def test_reader_agrees_with_pyelftools_on_system_libraries() -> None:
    """The reference reader on real distro files: every need and definition."""
    from elftools.elf.elffile import ELFFile
    from elftools.elf.gnuversions import GNUVerDefSection, GNUVerNeedSection

    libdir = Path("/usr/lib/x86_64-linux-gnu")
    files = [Path(p) for p in elf_files(str(libdir)) if ".so" in p]
    checked = 0
    for path in files[::7]:
        with open(path, "rb") as fh:
            elf = ELFFile(fh)
            ref_need: list[tuple[str, tuple[tuple[str, int, bool], ...]]] = []
            ref_def: set[tuple[int, str]] | None = None
            for sec in elf.iter_sections():
                if isinstance(sec, GNUVerNeedSection):
                    for vn, auxes in sec.iter_versions():
                        ref_need.append((vn.name, tuple(
                            (a.name, a["vna_hash"], bool(a["vna_flags"] & 2)) for a in auxes)))
                elif isinstance(sec, GNUVerDefSection):
                    ref_def = {(vd["vd_hash"], next(iter(auxes)).name)
                               for vd, auxes in sec.iter_versions()}
        info = read_elf(str(path))
        assert info.verneed == tuple(ref_need), path
        assert info.verdef == (frozenset(ref_def) if ref_def is not None else None), path
        checked += 1
    assert checked > 20


# ---------------------------------------------------------------------------
# Against the real loader


def test_missing_version_matches_the_loader(tmp_path: Path) -> None:
    new = _lib(tmp_path / "new", script=BOTH_VERSIONS, with_f2=True)
    old = _lib(tmp_path / "old", script=ONLY_VERS_1, with_f2=False)
    prog = _prog(tmp_path, PROG_C, new, old.parent)

    real = _run(prog)
    assert real.returncode != 0
    found = _versions(prog)
    assert len(found) == 1, found
    assert real.stderr == found[0].predicted_error + "\n"
    assert found[0].predicted_error == (
        f"{prog}: {old}: version `VERS_2' not found (required by {prog})")
    assert found[0].fact("detail") == f"{old} defines VERS_1 at most"

    # The same program against the library it was built with: runs, no finding.
    good = _prog(tmp_path, PROG_C, new, new.parent)
    assert _run(good).returncode == 0
    assert _versions(good) == []


def test_weak_need_is_allowed(tmp_path: Path) -> None:
    new = _lib(tmp_path / "new", script=BOTH_VERSIONS, with_f2=True)
    old = _lib(tmp_path / "old", script=ONLY_VERS_1, with_f2=False)
    prog = _prog(tmp_path, LAZY_PROG_C, new, old.parent, "-Wl,-z,lazy")
    assert _run(prog).returncode != 0  # the strong need fails at start
    assert len(_versions(prog)) == 1
    _make_needs_weak(prog, "VERS_2")
    assert [w for _v, _h, w in dict(read_elf(str(prog)).verneed)["libv.so"]] == [True]

    real = _run(prog)
    # rtld checks verbosely at start: it names the weak miss and goes on.
    assert real.returncode == 0, real.stderr
    assert real.stderr == f"{prog}: {old}: weak version `VERS_2' not found (required by {prog})\n"
    assert _versions(prog) == []


def test_library_without_version_definitions(tmp_path: Path) -> None:
    """The version check accepts a library without DT_VERDEF; glibc before
    2.41 then aborts when a versioned reference binds to it (dl-lookup.c
    check_match), 2.41 removed that assert."""
    new = _lib(tmp_path / "new", script=BOTH_VERSIONS, with_f2=True)
    plain = _lib(tmp_path / "plain", script=None, with_f2=True)
    assert read_elf(str(plain)).verdef is None

    lazy = _prog(tmp_path / "lazy", LAZY_PROG_C, new, plain.parent, "-Wl,-z,lazy")
    real = _run(lazy)
    assert real.returncode == 0, real.stderr  # nothing bound: only the notice
    assert real.stderr == (f"{lazy}: {plain}: no version information available "
                           f"(required by {lazy})\n")

    prog = _prog(tmp_path, PROG_C, new, plain.parent)
    real = _run(prog)
    found = _versions(prog)
    if detect().glibc >= (2, 41):
        assert real.returncode == 0 and found == []
        return
    assert real.returncode == 127
    assert len(found) == 1, found
    assert real.stderr.splitlines()[-1] == found[0].predicted_error
    assert found[0].fact("detail") == f"{plain} was built without symbol versions"
    # Severity: with lazy binding the abort comes only if a symbol there is
    # ever called (the lazy program above ran), so a warning; a program
    # linked -z now binds everything at start, so it cannot run: an error.
    catalogue = Catalogue.load()
    facts = {"glibc": ".".join(map(str, detect().glibc)), "node_arch": "x86_64"}
    [lazy_found] = _versions(lazy)
    assert catalogue.finding(lazy_found, facts).severity == "warning"
    now = _prog(tmp_path / "now", PROG_C, new, plain.parent, "-Wl,-z,now")
    real_now = _run(now)
    assert real_now.returncode == 127, real_now.stderr
    [now_found] = _versions(now)
    assert real_now.stderr.splitlines()[-1] == now_found.predicted_error
    assert catalogue.finding(now_found, facts).severity == "error"
    # The same files judged for a node with glibc 2.41: nothing to report.
    node = detect().with_overrides(glibc=(2, 41))
    budget = Budget(deadline_ms=60_000, max_files=100_000, max_bytes=1 << 32)
    report = check_step([str(prog)], ENV, "/", node, budget=budget)
    assert [i for i in report.issues if i.rule == "lib-version-missing"] == []


STUB_LIBC_C = """
#include <stddef.h>
int __libc_start_main(int (*main)(int, char **, char **), int argc, char **argv,
                      void (*init)(void), void (*fini)(void), void (*rtld_fini)(void),
                      void *stack_end) { return 0; }
size_t strlcpy(char *dst, const char *src, size_t size) { return 0; }
"""
#: The versions of glibc 2.38 that these two symbols carry there.
STUB_LIBC_MAP = """GLIBC_2.2.5 { local: *; };
GLIBC_2.34 { global: __libc_start_main; } GLIBC_2.2.5;
GLIBC_2.38 { global: strlcpy; } GLIBC_2.34;
"""
NEW_LIBC_PROG_C = """
#include <stddef.h>
size_t strlcpy(char *dst, const char *src, size_t size);
int main(void) { char b[4]; return (int)strlcpy(b, "x", sizeof b); }
"""


def _glibc_minor() -> int:
    return int(os.confstr("CS_GNU_LIBC_VERSION").split()[1].split(".")[1])


@pytest.mark.skipif(_glibc_minor() >= 38, reason="needs a host glibc older than 2.38")
def test_program_built_against_a_newer_glibc(tmp_path: Path) -> None:
    """A program linked against a libc.so.6 that defines strlcpy@@GLIBC_2.38
    (as glibc 2.38 does), run on this host's older glibc."""
    stub = tmp_path / "stub"
    stub.mkdir()
    (stub / "c.c").write_text(STUB_LIBC_C)
    (stub / "c.map").write_text(STUB_LIBC_MAP)
    _gcc("-shared", "-fPIC", "-nostdlib", "-o", stub / "libc.so.6", stub / "c.c",
         "-Wl,-soname,libc.so.6", f"-Wl,--version-script={stub / 'c.map'}")
    (stub / "libc.so").symlink_to("libc.so.6")
    source = tmp_path / "prog.c"
    source.write_text(NEW_LIBC_PROG_C)
    prog = tmp_path / "prog"
    _gcc("-o", prog, source, "-nodefaultlibs", "-L", stub, "-lc")
    assert read_elf(str(prog)).needed == ("libc.so.6",)

    real = _run(prog)
    assert real.returncode != 0
    found = _versions(prog)
    assert len(found) == 1, found
    assert real.stderr == found[0].predicted_error + "\n"
    libc = found[0].predicted_error.split(": ")[1]
    assert os.path.realpath(libc) == os.path.realpath("/lib/x86_64-linux-gnu/libc.so.6")
    minor = _glibc_minor()
    assert found[0].fact("detail") == f"{libc} defines GLIBC_2.{minor} at most"

    # What the user reads: the rule's remedy names the version, library and glibc.
    finding = Catalogue.load().finding(found[0], {"glibc": f"2.{minor}",
                                                    "node_arch": "x86_64"})
    assert finding is not None and finding.severity == "error"
    assert "GLIBC_2.38" in finding.remediation and "libc.so.6" in finding.remediation
    assert f"glibc 2.{minor}" in finding.remediation


def test_dlopen_matches_dlerror_and_maps_nothing(tmp_path: Path) -> None:
    """An extension-like module needing VERS_2, opened by a real CPython
    (ctypes: dlopen with RTLD_LOCAL); dlerror's text is the oracle."""
    new = _lib(tmp_path / "new", script=BOTH_VERSIONS, with_f2=True)
    old = _lib(tmp_path / "old", script=ONLY_VERS_1, with_f2=False)
    mod_c = tmp_path / "mod.c"
    mod_c.write_text("int f2(void);\nint call(void) { return f2(); }\n")
    mod = tmp_path / "mod.so"
    _gcc("-shared", "-fPIC", "-o", mod, mod_c, "-L", new.parent, "-lv",
         f"-Wl,-rpath,{old.parent}")

    real = subprocess.run(
        [sys.executable, "-c", "import ctypes, sys\ntry:\n ctypes.CDLL(sys.argv[1])\n"
         "except OSError as e:\n print(e)\n", str(mod)],
        capture_output=True, text=True, timeout=60, check=True)

    exe = os.path.realpath(sys.executable)
    process = Process(exe, read_elf(exe), detect(), ENV)
    tree = process.dlopen(str(mod), read_elf(str(mod)))
    assert [v.message() for v in tree.versions] == [real.stdout.strip()]
    # A failed dlopen maps nothing: the next one sees the same failure.
    again = process.dlopen(str(mod), read_elf(str(mod)))
    assert len(again.versions) == 1


# ---------------------------------------------------------------------------
# Real distribution files built for a newer glibc (Debian sid), on this host


def _sid_root() -> Path:
    from corpus import CorpusUnavailable
    from image.sif_root import apptainer_root

    try:
        return apptainer_root()
    except CorpusUnavailable as exc:
        pytest.skip(f"the pinned Debian sid root is not available: {exc}")


def _real_version_lines(path: str) -> set[str]:
    """The version errors ``ld.so --list`` prints for ``path`` on this host
    (trace mode runs the same check, verbosely, and goes on)."""
    res = subprocess.run(["/lib64/ld-linux-x86-64.so.2", "--list", path], capture_output=True,
                         text=True, timeout=60, env={"LC_ALL": "C"})
    return {line.strip() for line in (res.stdout + res.stderr).splitlines()
            if "version `" in line and "' not found (required by " in line
            and ": weak version `" not in line}


@pytest.mark.network
def test_debian_sid_files_match_the_loader() -> None:
    """Every x86_64 program and library of the pinned sid root (apptainer
    1.4.5 and Debian's essential set, built against glibc 2.41+), resolved
    against this host's libraries: our version errors equal the real
    loader's, file by file, and most files have some (or the test proves
    nothing)."""
    root = _sid_root()
    node = detect()
    checked = failing = 0
    diffs: list[str] = []
    for path in elf_files_under(root):
        info = read_elf(path)
        if info.machine != 62 or not info.needed:
            continue
        tree = Process(path, info, node, ENV, Loading(exec_origin=False)).tree
        ours = {f"{path}: {v.message()}" for v in tree.versions if v.kind == "missing"}
        real = _real_version_lines(path)
        if ours != real:
            diffs.append(f"{path}: ours-only {sorted(ours - real)} real-only {sorted(real - ours)}")
        checked += 1
        failing += bool(real)
    assert not diffs, "\n".join(diffs[:10])
    assert checked >= 50 and failing >= 10, (checked, failing)
    print(f"{checked} files, {failing} with version errors")


def elf_files_under(root: Path) -> list[str]:
    out = []
    for sub in ("usr/bin", "usr/sbin", "usr/lib/x86_64-linux-gnu", "usr/libexec"):
        for dirpath, dirnames, filenames in os.walk(root / sub):
            dirnames.sort()
            for name in sorted(filenames):
                p = os.path.join(dirpath, name)
                if os.path.islink(p) or not os.path.isfile(p):
                    continue
                with open(p, "rb") as fh:
                    if fh.read(4) == b"\x7fELF":
                        out.append(p)
    return out
