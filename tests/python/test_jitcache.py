"""jit_cache_issues on cache trees laid out as torch's cpp_extension, Triton
and TorchInductor write them, holding real shared objects built here for
x86_64 (gcc) and aarch64 (the cross compiler)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from fixtures.build import ElfBuilder, src

from grace_policy import fsprobe
from grace_policy.budget import Budget, BudgetExceeded
from grace_policy.node import NodeProfile
from grace_policy.python.jitcache import cache_dirs, jit_cache_issues
from grace_policy.rules import Catalogue

GRACE = NodeProfile("aarch64", 65536, (2, 36), root_is_native=False)

pytestmark = pytest.mark.cross


def so(builder: ElfBuilder, dest: Path, arch: str) -> Path:
    """A real shared object of ``arch`` at ``dest``."""
    built = builder.library(f"build-{arch}/lib{dest.stem.strip('_')}.so.1", arch=arch)
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_bytes(built.read_bytes())
    return dest


def torch_extensions(root: Path, builder: ElfBuilder, arch: str) -> Path:
    """What cpp_extension.load(name="fused_adam") leaves: py311_cu124/fused_adam/."""
    build = root / "py311_cu124" / "fused_adam"
    so(builder, build / "fused_adam.so", arch)
    (build / "build.ninja").write_text("ninja_required_version = 1.3\n")
    (build / "fused_adam.o").write_bytes(b"\x7fELF not read")
    (build / "lock").write_text("")
    return build / "fused_adam.so"


def triton(root: Path, builder: ElfBuilder, arch: str, key: str) -> Path:
    entry = root / key
    launcher = so(builder, entry / "__triton_launcher.so", arch)
    # A CUDA binary is an ELF file too (EM_CUDA = 190): GPU code, never opened.
    cubin = b"\x7fELF\x02\x01\x01" + b"\0" * 9 + b"\x02\x00\xbe\x00"
    (entry / "add_kernel.cubin").write_bytes(cubin)
    (entry / "add_kernel.json").write_text("{}")
    return launcher


def env_for(home: Path, **extra: str) -> dict[str, str]:
    return {"HOME": str(home), "USER": "u", "TMPDIR": str(home / "tmp"), **extra}


def test_default_locations_from_the_step_environment() -> None:
    assert cache_dirs({"HOME": "/home/u", "USER": "u"}) == [
        ("TORCH_EXTENSIONS_DIR", "/home/u/.cache/torch_extensions"),
        ("TRITON_CACHE_DIR", "/home/u/.triton/cache"),
        ("TORCHINDUCTOR_CACHE_DIR", "/tmp/torchinductor_u"),
        ("FLASHINFER_WORKSPACE_BASE", "/home/u/.cache/flashinfer"),
    ]
    assert cache_dirs({"HOME": "/h", "XDG_CACHE_HOME": "/x", "TRITON_HOME": "/t",
                       "TMPDIR": "/scratch/", "LOGNAME": "l", "USER": "u",
                       "FLASHINFER_WORKSPACE_BASE": "/f"}) == [
        ("TORCH_EXTENSIONS_DIR", "/x/torch_extensions"),
        ("TRITON_CACHE_DIR", "/t/.triton/cache"),
        ("TORCHINDUCTOR_CACHE_DIR", "/scratch/torchinductor_l"),
        ("FLASHINFER_WORKSPACE_BASE", "/f/.cache/flashinfer"),
    ]
    same = cache_dirs({"TORCH_EXTENSIONS_DIR": "/c/", "TRITON_CACHE_DIR": "/c",
                       "TORCHINDUCTOR_CACHE_DIR": "rel/dir",
                       "FLASHINFER_WORKSPACE_BASE": "rel"})
    assert same == [("TORCH_EXTENSIONS_DIR", "/c")]  # duplicates and relative dirs dropped
    assert cache_dirs({}) == []
    assert cache_dirs({"HOME": "/"}) == [("TORCH_EXTENSIONS_DIR", "/.cache/torch_extensions"),
                                        ("TRITON_CACHE_DIR", "/.triton/cache"),
                                        ("FLASHINFER_WORKSPACE_BASE", "/.cache/flashinfer")]


def test_foreign_builds_in_each_cache_are_one_warning_each(tmp_path: Path,
                                                           elf_builder: ElfBuilder) -> None:
    home = tmp_path / "home"
    torch_extensions(home / ".cache" / "torch_extensions", elf_builder, "x86_64")
    triton(home / ".triton" / "cache", elf_builder, "x86_64", "RKQ7CJ3WUK4ND2ZA")
    triton(home / ".triton" / "cache", elf_builder, "aarch64", "Q2MHZP5LQXE4Y7TA")
    so(elf_builder, home / "tmp" / "torchinductor_u" / "ab" / "cabxyz.so", "aarch64")
    # flashinfer/jit/env.py: <base>/.cache/flashinfer/<GPU archs>/cached_ops/<op>/<op>.so
    so(elf_builder, home / ".cache" / "flashinfer" / "90_100" / "cached_ops" / "norm" / "norm.so",
       "x86_64")
    issues = jit_cache_issues(env_for(home), GRACE, Budget())
    assert [(i.rule, i.path, i.fact("name"), i.fact("count")) for i in issues] == [
        ("jit-cache-foreign", f"{home}/.cache/torch_extensions", "TORCH_EXTENSIONS_DIR", "1"),
        ("jit-cache-foreign", f"{home}/.triton/cache", "TRITON_CACHE_DIR", "1"),
        ("jit-cache-foreign", f"{home}/.cache/flashinfer", "FLASHINFER_WORKSPACE_BASE", "1"),
    ]
    assert issues[2].fact("files") == "90_100/cached_ops/norm/norm.so"
    assert issues[0].fact("files") == "py311_cu124/fused_adam/fused_adam.so"
    assert issues[1].fact("files") == "RKQ7CJ3WUK4ND2ZA/__triton_launcher.so"
    assert issues[1].fact("file_arch") == "x86_64"
    finding = Catalogue.load().finding(issues[1], {"node_arch": "aarch64"})
    assert finding is not None and finding.severity == "warning"
    assert "export TRITON_CACHE_DIR=$HOME/.triton/cache-$(uname -m)" in finding.remediation
    assert "x86_64" in finding.remediation and "{" not in finding.remediation


def test_only_the_cache_the_step_names_is_scanned(tmp_path: Path,
                                                  elf_builder: ElfBuilder) -> None:
    home = tmp_path / "home"
    triton(home / ".triton" / "cache", elf_builder, "x86_64", "OLD")
    own = tmp_path / "scratch" / "triton-aarch64"
    triton(own, elf_builder, "aarch64", "NEW")
    assert jit_cache_issues(env_for(home, TRITON_CACHE_DIR=str(own)), GRACE, Budget()) == []
    # Seen from an x86_64 node, the same per-architecture cache is the foreign one.
    x86 = NodeProfile("x86_64", 4096, (2, 36))
    found = jit_cache_issues(env_for(home, TRITON_CACHE_DIR=str(own)), x86, Budget())
    assert [i.fact("file_arch") for i in found] == ["aarch64"]


def test_a_native_cache_is_clean(tmp_path: Path, elf_builder: ElfBuilder) -> None:
    home = tmp_path / "home"
    torch_extensions(home / ".cache" / "torch_extensions", elf_builder, "aarch64")
    assert jit_cache_issues(env_for(home), GRACE, Budget()) == []


def test_many_files_are_counted_and_few_named(tmp_path: Path, elf_builder: ElfBuilder) -> None:
    cache = tmp_path / "cache"
    first = triton(cache, elf_builder, "x86_64", "K0")
    for i in range(1, 6):
        os.makedirs(cache / f"K{i}")
        os.link(first, cache / f"K{i}" / "__triton_launcher.so")
    found = jit_cache_issues({"TRITON_CACHE_DIR": str(cache)}, GRACE, Budget())
    assert found[0].fact("count") == "6"
    assert found[0].fact("files").count(".so") == 3 and found[0].fact("files").endswith(", ...")
    stopped = jit_cache_issues({"TRITON_CACHE_DIR": str(cache)}, GRACE, Budget(),
                               max_entries=8)
    assert stopped[0].fact("count").startswith("at least ")
    assert "stopped after 8 entries" in stopped[0].fact("detail")


def test_hostile_trees_never_raise_or_loop(tmp_path: Path, elf_builder: ElfBuilder) -> None:
    cache = tmp_path / "cache"
    (cache / "a" / "b").mkdir(parents=True)
    (cache / "a" / "b" / "loop").symlink_to(cache)  # a directory loop
    os.mkfifo(cache / "a" / "pipe.so")  # must not block
    (cache / "a" / "dangling.so").symlink_to(tmp_path / "nowhere")
    (cache / "a" / "short.so").write_bytes(b"\x7fELF")
    (cache / os.fsdecode(b"bad\xffname.so")).write_bytes(b"")
    so(elf_builder, cache / "a" / "b" / "deep" / "x.so", "x86_64")
    (cache / "notadir").write_text("")
    so(elf_builder, cache / "py3.11_cu130" / "op" / "op.so", "x86_64")  # a dotted directory
    found = jit_cache_issues({"TRITON_CACHE_DIR": str(cache)}, GRACE, Budget())
    assert [i.fact("files") for i in found] == ["a/b/deep/x.so, py3.11_cu130/op/op.so"]
    assert jit_cache_issues({"TRITON_CACHE_DIR": str(cache / "notadir")}, GRACE, Budget()) == []


def test_the_deadline_covers_the_scan(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    for i in range(50):
        (cache / f"d{i}").mkdir(parents=True)
    with pytest.raises(BudgetExceeded):
        jit_cache_issues({"TRITON_CACHE_DIR": str(cache)}, GRACE, Budget(deadline_ms=0))


def test_what_the_scan_asks_is_recorded(tmp_path: Path, elf_builder: ElfBuilder) -> None:
    cache = tmp_path / "cache"
    launcher = triton(cache, elf_builder, "x86_64", "K")
    files = fsprobe.Files.recorded()
    jit_cache_issues({"TRITON_CACHE_DIR": str(cache), "HOME": "/nonexistent"}, GRACE,
                     Budget(), files=files)
    record = files.records()
    assert ("v", "TRITON_CACHE_DIR", f"={cache}") in record
    assert ("v", "HOME", "=/nonexistent") in record
    paths = {path for _op, path, _answer in record}
    assert {str(cache), str(cache / "K"), str(launcher)} <= paths
    assert str(cache / "K" / "add_kernel.json") not in paths  # not a shared object: not opened


def test_a_foreign_build_added_after_a_clean_verdict_breaks_its_record(
        tmp_path: Path, elf_builder: ElfBuilder) -> None:
    cache = tmp_path / "cache"
    triton(cache, elf_builder, "aarch64", "K")
    env = {"TRITON_CACHE_DIR": str(cache)}
    files = fsprobe.Files.recorded()
    assert jit_cache_issues(env, GRACE, Budget(), files=files) == []
    # Environment variables ("v") are the step's inputs, matched by the C
    # side against the next step's environment; the rest is the filesystem.
    record = [r for r in files.records() if r[0] != "v"]
    assert fsprobe.still_true(record)
    triton(cache, elf_builder, "x86_64", "K2")  # a new entry in the cache root
    assert not fsprobe.still_true(record)
    assert len(jit_cache_issues(env, GRACE, Budget())) == 1


def test_a_build_of_the_other_byte_order_is_foreign(tmp_path: Path,
                                                   elf_builder: ElfBuilder) -> None:
    """A big-endian aarch64 launcher does not load on a little-endian Grace
    node (same e_machine read in the other order): a foreign build, named
    with its byte order."""
    home = tmp_path / "home"
    built = elf_builder.library("be/libtl.so.1", source=src("freestanding.c"), arch="aarch64",
                                extra_flags=("-mbig-endian", "-nostdlib"))
    entry = home / ".triton" / "cache" / "BE"
    entry.mkdir(parents=True)
    (entry / "__triton_launcher.so").write_bytes(built.read_bytes())
    (issue,) = jit_cache_issues(env_for(home), GRACE, Budget())
    assert issue.rule == "jit-cache-foreign" and issue.fact("file_arch") == "aarch64 (big-endian)"
