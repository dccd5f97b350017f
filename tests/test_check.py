"""check_step end to end on compiled files: cleaned env first, then what
execve runs, its #! chain, its libraries, every file's layout."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from fixtures.build import ElfBuilder, src

from grace_policy.budget import Budget
from grace_policy.check import check_step
from grace_policy.node import NodeProfile, detect

HOST = detect()


def rules_of(report) -> list[str]:  # type: ignore[no-untyped-def]
    return [i.rule for i in report.issues]


@pytest.fixture
def foreign_exe(elf_builder: ElfBuilder, have_cross: str) -> Path:
    exe = elf_builder.compile(src("hello.c"), "foreign/hello", arch="aarch64")
    exe.chmod(0o755)
    return exe


def test_argv_is_resolved_with_the_cleaned_path(tmp_path: Path, foreign_exe: Path,
                                                elf_builder: ElfBuilder) -> None:
    """PATH leads into a leaked foreign venv first: after cleaning, the
    native ``tool`` further down PATH is what runs, so the step is clean."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    os.link(foreign_exe, venv / "bin" / "python")
    os.link(foreign_exe, venv / "bin" / "tool")
    native = elf_builder.compile(src("hello.c"), "native/tool")
    env = {"VIRTUAL_ENV": str(venv), "PATH": f"{venv}/bin:{native.parent}:/usr/bin"}
    report = check_step(["tool"], env, str(tmp_path), HOST)
    assert report.exe == str(native)
    assert rules_of(report) == ["env-leak"]
    # Without the leak vars nothing is cleaned, and the foreign tool is found.
    dirty = check_step(["tool"], {"PATH": env["PATH"]}, str(tmp_path), HOST)
    assert dirty.exe == f"{venv}/bin/tool" and "exe-arch-mismatch" in rules_of(dirty)


def test_lib_not_found_lists_foreign_candidates(elf_builder: ElfBuilder,
                                                have_cross: str) -> None:
    native_lib = elf_builder.library("native/libgreet.so.1")
    exe = elf_builder.compile(src("use_greet.c"), "bin/app", needed_libs=("greet",),
                              lib_dirs=(native_lib.parent,))
    foreign = elf_builder.library("wheel/libgreet.so.1", arch="aarch64")
    env = {"LD_LIBRARY_PATH": str(foreign.parent), "PATH": "/usr/bin"}
    report = check_step([str(exe)], env, "/", HOST)
    (issue,) = [i for i in report.issues if i.rule == "lib-not-found"]
    assert issue.fact("name") == "libgreet.so.1"
    assert f"{foreign} (aarch64)" in issue.fact("candidates")
    assert "another architecture" in issue.predicted_error


def test_script_with_foreign_interpreter_names_the_script(tmp_path: Path,
                                                          foreign_exe: Path) -> None:
    s = tmp_path / "job.sh"
    s.write_text(f"#!{foreign_exe}\n")
    s.chmod(0o755)
    report = check_step([str(s)], {"PATH": "/usr/bin"}, str(tmp_path), HOST)
    (issue,) = report.issues
    assert issue.rule == "exe-arch-mismatch" and issue.path == str(foreign_exe)
    assert issue.fact("script") == str(s) and str(s) in issue.predicted_error
    assert issue.fact("file_arch") == "aarch64"


def test_bare_name_not_in_path_runs_from_the_cwd(tmp_path: Path, foreign_exe: Path) -> None:
    """execve resolves the bare name against the cwd: judged, not 'not found'."""
    os.link(foreign_exe, tmp_path / "prog")
    report = check_step(["prog"], {"PATH": "/nonexistent"}, str(tmp_path), HOST)
    assert rules_of(report) == ["exe-arch-mismatch"]


def test_not_found(tmp_path: Path) -> None:
    report = check_step(["nosuchprog"], {"PATH": "/nonexistent"}, str(tmp_path), HOST)
    (issue,) = report.issues
    assert issue.rule == "exe-not-found" and issue.fact("PATH") == "/nonexistent"


def test_big_endian_aarch64_is_foreign_on_grace(elf_builder: ElfBuilder,
                                                have_cross: str) -> None:
    """The kernel reads e_machine in its own byte order: 0xb700, not AArch64."""
    be = elf_builder.library("be/libbe.so.1", source=src("freestanding.c"), arch="aarch64",
                             extra_flags=("-mbig-endian", "-nostdlib"))
    be.chmod(0o755)
    grace = NodeProfile(machine="aarch64", page_size=65536, glibc=(2, 34), root_is_native=False)
    report = check_step([str(be)], {}, "/", grace)
    (issue,) = report.issues
    assert issue.rule == "exe-arch-mismatch" and "big-endian" in issue.fact("file_arch")


def test_runs_is_machine_class_and_byte_order(elf_builder: ElfBuilder,
                                             have_cross: str) -> None:
    """The one predicate every reader asks, on real builds of each kind: only
    the node's own machine, class and byte order run there."""
    from grace_policy.elf import read_elf
    from grace_policy.node import Ident

    built = {
        "x86_64": elf_builder.library("r/libx.so.1", source=src("freestanding.c"),
                                      extra_flags=("-nostdlib",)),
        "i386": elf_builder.library("r/lib32.so.1", source=src("freestanding.c"),
                                    extra_flags=("-m32", "-nostdlib")),
        "aarch64": elf_builder.library("r/liba.so.1", source=src("freestanding.c"),
                                       arch="aarch64", extra_flags=("-nostdlib",)),
        "aarch64_be": elf_builder.library("r/libbe.so.1", source=src("freestanding.c"),
                                          arch="aarch64",
                                          extra_flags=("-mbig-endian", "-nostdlib")),
    }
    nodes = {name: NodeProfile(name, 4096, (2, 36), root_is_native=False)
             for name in ("x86_64", "i386", "aarch64")}
    runs = {(n, f) for n, node in nodes.items() for f, path in built.items()
            if node.runs(read_elf(str(path)))}
    assert runs == {("x86_64", "x86_64"), ("i386", "i386"), ("aarch64", "aarch64")}
    # A bare header (a cache scan's 20 bytes) is asked the same way.
    be = read_elf(str(built["aarch64_be"]))
    assert not nodes["aarch64"].runs(Ident(be.machine, be.elf_class, be.data))
    assert nodes["aarch64"].arch_of(be) == "aarch64 (big-endian)"
    assert nodes["x86_64"].arch_of(read_elf(str(built["i386"]))) == "i386"


def test_relocatable_object_is_exec_format(elf_builder: ElfBuilder, tmp_path: Path) -> None:
    obj = elf_builder.compile(src("hello.c"), "hello.o", extra_flags=("-c",))
    obj.chmod(0o755)
    report = check_step([str(obj)], {}, "/", HOST)
    assert rules_of(report) == ["exe-format"]


def test_4k_build_on_a_64k_node_is_judged_for_exe_and_libs(elf_builder: ElfBuilder,
                                                          have_cross: str) -> None:
    lib = elf_builder.library("lib/libgreet.so.1", arch="aarch64", page_size=4096)
    exe = elf_builder.compile(src("use_greet.c"), "bin/app", arch="aarch64", page_size=4096,
                              needed_libs=("greet",), lib_dirs=(lib.parent,),
                              runpath="$ORIGIN/../lib")
    grace = NodeProfile(machine="aarch64", page_size=65536, glibc=(2, 34), root_is_native=False)
    report = check_step([str(exe)], {}, "/", grace)
    by_path = {(i.rule, os.path.normpath(i.path)) for i in report.issues}
    assert ("page-congruence", str(exe)) in by_path
    assert ("page-align", str(lib)) in by_path
    assert ("page-align", str(exe)) not in by_path  # the kernel maps the exe
    assert report.limit is None


def test_budget_stop_keeps_what_was_found(elf_builder: ElfBuilder, foreign_padding) -> None:
    """A 4 KiB build on a 64 KiB node, plus an LD_LIBRARY_PATH of directories
    holding foreign copies of its library, enough to exhaust the file cap:
    the executable's own fatal layout is still reported, so padding the
    environment cannot hide it."""
    lib = elf_builder.library("lib/libgreet.so.1", page_size=4096)
    exe = elf_builder.compile(src("use_greet.c"), "bin/app", page_size=4096,
                              needed_libs=("greet",), lib_dirs=(lib.parent,))
    node = NodeProfile(machine="x86_64", page_size=65536, glibc=(2, 36))
    env = {"LD_LIBRARY_PATH": foreign_padding("libgreet.so.1", 30)}
    report = check_step([str(exe)], env, "/", node, budget=Budget(max_files=20))
    assert report.limit is not None and "20 files" in report.limit
    assert ("page-congruence", str(exe)) in {(i.rule, i.path) for i in report.issues}


def test_python_script_end_to_end(tmp_path: Path) -> None:
    s = tmp_path / "train.py"
    s.write_text("#!/usr/bin/env python3\nprint(1)\n")
    s.chmod(0o755)
    env = {"PATH": f"{os.path.dirname(sys.executable)}:/usr/bin:/bin"}
    report = check_step(["./train.py"], env, str(tmp_path), HOST)
    assert report.issues == () and report.hops[-1].kind == "elf"


def test_foreign_node_from_here_takes_system_programs_by_name(elf_builder: ElfBuilder) -> None:
    """Asking about a Grace partition from this x86_64 host: /usr/bin/true
    stands for the node's own aarch64 build, but a program the user built
    here is judged and found foreign."""
    grace = detect().with_overrides(machine="aarch64", page_size=65536)
    assert not grace.root_is_native
    env = {"PATH": "/usr/bin:/bin"}
    system = check_step(["/usr/bin/true"], env, "/", grace)
    assert [i.rule for i in system.issues] == []
    own = elf_builder.compile(src("hello.c"), "home/bin/hello")
    mine = check_step([str(own)], env, "/", grace)
    assert [i.rule for i in mine.issues] == ["exe-arch-mismatch"]


def test_an_image_node_owns_no_system_file() -> None:
    """Whether a system path is the node's own build is a fact of the node
    judged (an image's files are the image's), not of which files happen to
    be read at the moment: asked of the node, with no view in use."""
    from grace_policy._record import replace
    from grace_policy.node import node_owns
    from grace_policy.python.sitepath import is_system

    assert node_owns(HOST, "/bin/true") and is_system("/usr/lib/python3/x", HOST)
    image = replace(HOST, in_image=True)
    assert not node_owns(image, "/bin/true") and not is_system("/usr/lib/python3/x", image)
    assert not node_owns(HOST, "/home/u/venv/bin/tool")
