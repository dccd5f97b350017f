"""Cases a review found where the verdict was wrong; each fails on the code
before its fix. The real loader (or execve itself) is the oracle where the
case is about what would happen."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from fixtures.build import AARCH64_LOADER, ElfBuilder, loader_list, src

from grace_policy.decide import StepRequest, decide
from grace_policy.node import NodeProfile, detect
from grace_policy.policy import Limits, Policy

HOST = detect()
GRACE_FROM_HERE = HOST.with_overrides(machine="aarch64", page_size=65536)


def _rules(argv: list[str], env: dict[str, str] | None = None, *, node: NodeProfile = HOST,
           policy: Policy | None = None, cwd: str = "/") -> tuple[str, list[str]]:
    v = decide(policy or Policy(), StepRequest(partition=None, argv=argv,
                                               env=env or {"PATH": "/usr/bin"}, cwd=cwd, node=node))
    return v.action, [f.rule for f in v.findings]


def test_long_runpath_is_not_a_damaged_file(elf_builder: ElfBuilder, tmp_path: Path) -> None:
    """Spack-style RUNPATHs run past 4 KiB; glibc has no such limit."""
    dirs = [str(tmp_path / ("d" * 90) / f"pkg{i}" / "lib") for i in range(60)]
    exe = elf_builder.compile(src("hello.c"), "bin/app", runpath=dirs)
    assert subprocess.run([str(exe)], capture_output=True).returncode == 0
    assert _rules([str(exe)]) == ("allow", [])


def test_absent_search_paths_do_not_use_up_the_file_cap(elf_builder: ElfBuilder) -> None:
    """300 RUNPATH directories, the library in the last one: a handful of
    files are read, hundreds of paths probed. Probes are not files."""
    lib = elf_builder.library("deep/lib299/libgreet.so.1")
    dirs = [str(lib.parent.parent / f"lib{i}") for i in range(300)]
    exe = elf_builder.compile(src("use_greet.c"), "bin/app", needed_libs=("greet",),
                              lib_dirs=(lib.parent,), runpath=dirs)
    assert loader_list(exe, arch="x86_64").libs["libgreet.so.1"] == str(lib)
    policy = Policy(on_error="deny", limits=Limits(max_files=20))
    assert _rules([str(exe)], policy=policy) == ("allow", [])


def test_empty_runpath_searches_nothing(elf_builder: ElfBuilder, tmp_path: Path) -> None:
    """An empty DT_RUNPATH is ignored by glibc, not read as the cwd."""
    lib = elf_builder.library("work/libgreet.so.1")
    exe = elf_builder.compile(src("use_greet.c"), "bin/app", needed_libs=("greet",),
                              lib_dirs=(lib.parent,), runpath="")
    run = subprocess.run([str(exe)], cwd=lib.parent, capture_output=True, text=True)
    assert run.returncode != 0 and "libgreet.so.1" in run.stderr
    assert _rules([str(exe)], cwd=str(lib.parent)) == ("reject", ["lib-not-found"])


def test_a_foreign_env_on_a_shebang_line_is_judged(elf_builder: ElfBuilder, tmp_path: Path,
                                                   have_cross: str) -> None:
    fake_env = elf_builder.compile(src("hello.c"), "bin/env", arch="aarch64")
    script = tmp_path / "s"
    script.write_text(f"#!{fake_env} true\n")
    script.chmod(0o755)
    with pytest.raises(OSError):
        subprocess.run([str(script)], capture_output=True)
    action, rules = _rules([str(script)])
    assert action == "reject" and "exe-arch-mismatch" in rules


def test_a_directory_as_interpreter_fails(tmp_path: Path) -> None:
    script = tmp_path / "s"
    script.write_text(f"#!{tmp_path}\n")
    script.chmod(0o755)
    with pytest.raises(PermissionError):
        subprocess.run([str(script)], capture_output=True)
    # exe-format is a warning by default (binfmt_misc may run odd formats);
    # before the fix this step was allowed with an info line nobody sees.
    assert _rules([str(script)]) == ("warn", ["exe-format"])


def test_i386_program_runs_on_x86_64(tmp_path: Path) -> None:
    """A static i386 program (hand-made: exit(0) via int 0x80) runs on this
    x86_64 kernel, so it is not 'built for another CPU'."""
    if HOST.machine != "x86_64":
        pytest.skip("needs an x86_64 host")
    code = bytes([0x31, 0xDB, 0x31, 0xC0, 0x40, 0xCD, 0x80])  # xor ebx; xor eax; inc; int 80
    ehdr = (b"\x7fELF\x01\x01\x01" + bytes(9) + (2).to_bytes(2, "little")
            + (3).to_bytes(2, "little") + (1).to_bytes(4, "little")
            + (0x08048054).to_bytes(4, "little") + (52).to_bytes(4, "little") + bytes(4)
            + bytes(4) + (52).to_bytes(2, "little") + (32).to_bytes(2, "little")
            + (1).to_bytes(2, "little") + bytes(6))
    phdr = b"".join(x.to_bytes(4, "little") for x in
                    (1, 0, 0x08048000, 0x08048000, 84 + len(code), 84 + len(code), 5, 0x1000))
    prog = tmp_path / "h32"
    prog.write_bytes(ehdr + phdr + code)
    prog.chmod(0o755)
    assert subprocess.run([str(prog)]).returncode == 0
    assert _rules([str(prog)]) == ("allow", [])


def test_node_loader_soname_from_a_foreign_host(elf_builder: ElfBuilder, have_cross: str) -> None:
    """aarch64 libraries name ld-linux-aarch64.so.1 in DT_NEEDED; judged from
    this host the node's loader is not here, yet it is loaded on the node."""
    exe = elf_builder.compile(src("hello.c"), "bin/app", arch="aarch64", page_size=65536,
                              extra_flags=("-Wl,--no-as-needed", AARCH64_LOADER))
    assert "ld-linux-aarch64.so.1" in loader_list(exe, arch="aarch64").stdout
    assert _rules([str(exe)], node=GRACE_FROM_HERE) == ("allow", [])


def test_system_python_venv_from_a_foreign_host(tmp_path: Path) -> None:
    """A venv made with the system python runs on the node (its bin/python
    leads to the node's own /usr/bin/python3): the CLI must say so too."""
    system_python = shutil.which("python3", path="/usr/bin")
    if system_python is None:
        pytest.skip("no /usr/bin/python3")
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    os.symlink(system_python, venv / "bin" / "python3")
    env = {"PATH": f"{venv}/bin:/usr/bin", "VIRTUAL_ENV": str(venv)}
    assert _rules([f"{venv}/bin/python3", "-c", "1"], env, node=GRACE_FROM_HERE) == ("allow", [])


def test_damaged_foreign_candidate_is_skipped_like_glibc(elf_builder: ElfBuilder,
                                                         tmp_path: Path,
                                                         have_cross: str) -> None:
    """glibc decides from the first 64 bytes: a truncated aarch64 libgreet
    earlier on the path is skipped (wrong machine), not fatal, even though
    our reader cannot parse the rest of it."""
    native = elf_builder.library("good/libgreet.so.1")
    exe = elf_builder.compile(src("use_greet.c"), "bin/app", needed_libs=("greet",),
                              lib_dirs=(native.parent,))
    foreign = elf_builder.library("arm/libgreet.so.1", arch="aarch64")
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    (damaged / "libgreet.so.1").write_bytes(foreign.read_bytes()[:80])
    llp = f"{damaged}:{native.parent}"
    listing = loader_list(exe, arch="x86_64", env={"LD_LIBRARY_PATH": llp, "PATH": "/usr/bin"})
    assert listing.libs["libgreet.so.1"] == str(native)
    assert _rules([str(exe)], {"PATH": "/usr/bin", "LD_LIBRARY_PATH": llp}) == ("allow", [])


def test_same_machine_other_class_is_foreign(tmp_path: Path) -> None:
    """An ELFCLASS32 file with e_machine AArch64 (the ILP32 ABI) does not run
    on a Grace node's 64-bit-only kernel: the class alone makes it foreign.
    Hand-made header (no ILP32 toolchain here); judged for a Grace node."""
    ehdr = (b"\x7fELF\x01\x01\x01" + bytes(9) + (2).to_bytes(2, "little")
            + (183).to_bytes(2, "little") + (1).to_bytes(4, "little")
            + (0x10054).to_bytes(4, "little") + (52).to_bytes(4, "little") + bytes(4)
            + bytes(4) + (52).to_bytes(2, "little") + (32).to_bytes(2, "little")
            + (1).to_bytes(2, "little") + bytes(6))
    phdr = b"".join(x.to_bytes(4, "little") for x in
                    (1, 0, 0x10000, 0x10000, 0x60, 0x60, 5, 0x10000))
    prog = tmp_path / "ilp32"
    prog.write_bytes(ehdr + phdr + bytes(12))
    prog.chmod(0o755)
    grace = NodeProfile(machine="aarch64", page_size=65536, glibc=(2, 34))
    assert _rules([str(prog)], node=grace) == ("reject", ["exe-arch-mismatch"])
