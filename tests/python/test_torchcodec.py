"""torchcodec_issues on the real torchcodec 0.11.0 aarch64 wheel, with stub
FFmpeg libraries built by the cross compiler under the real sonames (field
notes §8), on LD_LIBRARY_PATH or in a node image's system directory."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from fixtures.build import AARCH64_SYSROOT, ElfBuilder, loader_list

from grace_policy import fsprobe
from grace_policy.budget import Budget, BudgetExceeded
from grace_policy.elf import read_elf
from grace_policy.node import NodeProfile
from grace_policy.python.torchcodec import FFMPEG_PREFIXES, core_variants, torchcodec_issues
from grace_policy.rules import Catalogue

from .torch_layouts import torchcodec_site

#: FFmpeg major -> sonames (avutil avcodec avformat avdevice avfilter swscale swresample).
SONAMES = {
    4: (56, 58, 58, 58, 7, 5, 3),
    5: (57, 59, 59, 59, 8, 6, 4),
    6: (58, 60, 60, 60, 9, 7, 4),
    7: (59, 61, 61, 61, 10, 8, 5),
    8: (60, 62, 62, 62, 11, 9, 6),
    9: (61, 63, 63, 63, 12, 10, 7),
}
LIBS = ("avutil", "avcodec", "avformat", "avdevice", "avfilter", "swscale", "swresample")

NODE = NodeProfile("aarch64", 65536, (2, 36), root=AARCH64_SYSROOT)

pytestmark = [pytest.mark.network, pytest.mark.cross]


@pytest.fixture(scope="module")
def site() -> Path:
    return torchcodec_site()


def sonames(major: int) -> list[str]:
    return [f"lib{lib}.so.{n}" for lib, n in zip(LIBS, SONAMES[major])]


def ffmpeg(builder: ElfBuilder, where: str, major: int, *, arch: str = "aarch64",
           skip: str = "", avcodec_needs: str = "") -> Path:
    """Stub FFmpeg libraries of ``major`` in ``builder.root/where``."""
    out = builder.path(where)
    for soname in sonames(major):
        if soname.startswith(skip or "\0"):
            continue
        kwargs: dict[str, object] = {}
        if avcodec_needs and soname.startswith("libavcodec."):
            # A call into the dependency, so the linker keeps its DT_NEEDED.
            dep = builder.library(f"{where}-deps/{avcodec_needs}", arch=arch,
                                  source="int x264_dep(void) { return 1; }\n")
            kwargs = {"needed_libs": (avcodec_needs.split(".so")[0][3:],),
                      "lib_dirs": (dep.parent,),
                      "source": "int x264_dep(void);\nint avcodec_stub(void) "
                                "{ return x264_dep(); }\n"}
        builder.library(f"{where}/{soname}", arch=arch, **kwargs)
    return out


def issues(site: Path, env: dict[str, str] | None = None, node: NodeProfile = NODE,
           budget: Budget | None = None, files: fsprobe.Files = fsprobe.HOST) -> list:
    return torchcodec_issues(str(site / "torchcodec"), env or {}, "/", node,
                             budget or Budget(), files)


def test_the_wheel_is_what_the_module_expects(site: Path) -> None:
    names = sorted(p.name for p in (site / "torchcodec").iterdir())
    assert [m for m, _ in core_variants(names)] == [8, 7, 6, 5, 4]
    for major in (8, 7, 6, 5, 4):
        info = read_elf(str(site / "torchcodec" / f"libtorchcodec_core{major}.so"))
        assert info.machine_name == "aarch64" and info.rpath is None and info.runpath is None
        got = [n for n in info.needed if n.startswith(FFMPEG_PREFIXES)]
        assert got == sonames(major), major  # field notes §8, and the order


def test_the_majors_come_from_the_files_not_a_table(elf_builder: ElfBuilder) -> None:
    """torchcodec 0.17.0 carries a sixth core, for FFmpeg 9: found, named, and
    satisfied by an FFmpeg 9 alone."""
    new = torchcodec_site(newest=True)
    info = read_elf(str(new / "torchcodec" / "libtorchcodec_core9.so"))
    assert [n for n in info.needed if n.startswith(FFMPEG_PREFIXES)] == sonames(9)
    [issue] = issues(new)
    assert issue.fact("majors") == "9, 8, 7, 6, 5, 4"
    assert issue.fact("missing").startswith("libavutil.so.61 (FFmpeg 9), libavutil.so.60")
    lib = ffmpeg(elf_builder, "ffmpeg9", 9)
    assert issues(new, {"LD_LIBRARY_PATH": str(lib)}) == []


def test_no_ffmpeg_on_the_node_names_every_major(site: Path) -> None:
    found = issues(site)
    assert [i.rule for i in found] == ["torchcodec-no-ffmpeg"]
    issue = found[0]
    assert issue.fact("majors") == "8, 7, 6, 5, 4"
    assert issue.fact("missing").startswith("libavutil.so.60 (FFmpeg 8), libavutil.so.59")
    assert issue.fact("candidates") == ""
    finding = Catalogue.load().finding(issue, {"node_arch": "aarch64", "partition": "gb200"})
    assert finding is not None and finding.severity == "error"
    assert finding.predicted_error == (
        "RuntimeError: Could not load libtorchcodec (tried FFmpeg 8, 7, 6, 5, 4): "
        "libavutil.so.60: cannot open shared object file: No such file or directory")
    assert "LD_LIBRARY_PATH" in finding.remediation and "aarch64" in finding.remediation
    assert "{" not in finding.remediation


@pytest.mark.parametrize("major", [6, 4])
def test_a_matching_ffmpeg_on_ld_library_path_is_enough(site: Path, elf_builder: ElfBuilder,
                                                        major: int) -> None:
    lib = ffmpeg(elf_builder, f"ffmpeg{major}", major)
    assert issues(site, {"LD_LIBRARY_PATH": f"/nonexistent:{lib}"}) == []


@pytest.mark.qemu
def test_the_real_loader_agrees_on_the_stub_ffmpeg(site: Path, elf_builder: ElfBuilder) -> None:
    """qemu + the aarch64 glibc loader resolve the real variant's FFmpeg names
    to the stubs (its torch and CUDA names stay unresolved: torch loads those)."""
    lib = ffmpeg(elf_builder, "ffmpeg6", 6)
    listing = loader_list(site / "torchcodec" / "libtorchcodec_core6.so", arch="aarch64",
                          env={"LD_LIBRARY_PATH": str(lib)}, check=False)
    resolved = listing.normalized()
    for soname in sonames(6):
        assert resolved.get(soname) == str(lib / soname), (soname, resolved)
    assert resolved.get("libtorch.so") is None


def test_an_x86_64_ffmpeg_is_passed_over(site: Path, elf_builder: ElfBuilder) -> None:
    lib = ffmpeg(elf_builder, "ffmpeg6-x86", 6, arch="x86_64")
    found = issues(site, {"LD_LIBRARY_PATH": str(lib)})
    assert [i.rule for i in found] == ["torchcodec-no-ffmpeg"]
    assert f"{lib}/libavutil.so.58 (x86_64)" in found[0].fact("candidates")
    finding = Catalogue.load().finding(found[0], {"node_arch": "aarch64"})
    assert finding is not None and "another architecture" in finding.remediation


def test_an_incomplete_ffmpeg_does_not_count(site: Path, elf_builder: ElfBuilder) -> None:
    lib = ffmpeg(elf_builder, "ffmpeg7", 7, skip="libavfilter.")
    found = issues(site, {"LD_LIBRARY_PATH": str(lib)})
    assert "libavfilter.so.10 (FFmpeg 7)" in found[0].fact("missing")


def test_what_the_ffmpeg_libraries_need_is_followed(site: Path, elf_builder: ElfBuilder) -> None:
    lib = ffmpeg(elf_builder, "ffmpeg5", 5, avcodec_needs="libx264.so.164")
    found = issues(site, {"LD_LIBRARY_PATH": str(lib)})
    assert "libx264.so.164 (FFmpeg 5)" in found[0].fact("missing")
    # With its dependency reachable too, FFmpeg 5 loads.
    deps = elf_builder.path("ffmpeg5-deps")
    assert issues(site, {"LD_LIBRARY_PATH": f"{lib}:{deps}"}) == []


def test_ffmpeg_in_the_node_images_system_dir(site: Path, elf_builder: ElfBuilder,
                                              tmp_path: Path) -> None:
    image = tmp_path / "image"
    (image / "usr" / "lib").mkdir(parents=True)
    (image / "lib").symlink_to(f"{AARCH64_SYSROOT}/lib")  # glibc and friends
    shutil.copytree(ffmpeg(elf_builder, "ffmpeg8", 8), image / "usr" / "lib" / "aarch64-linux-gnu")
    node = NodeProfile("aarch64", 65536, (2, 36), root=str(image))
    assert issues(site, node=node) == []
    bare = tmp_path / "bare"
    (bare / "usr" / "lib" / "aarch64-linux-gnu").mkdir(parents=True)
    (bare / "lib").symlink_to(f"{AARCH64_SYSROOT}/lib")
    assert len(issues(site, node=NodeProfile("aarch64", 65536, (2, 36), root=str(bare)))) == 1


def test_variants_of_another_machine_are_left_to_other_rules(site: Path) -> None:
    x86 = NodeProfile("x86_64", 4096, (2, 36))
    assert issues(site, node=x86) == []


def test_odd_packages_never_raise(tmp_path: Path, site: Path) -> None:
    assert torchcodec_issues(str(tmp_path / "absent"), {}, "/", NODE, Budget()) == []
    pkg = tmp_path / "torchcodec"
    pkg.mkdir()
    (pkg / "libtorchcodec_core7.so").write_bytes(b"\x7fELF garbage")
    (pkg / "libtorchcodec_coreX.so").write_bytes(b"")
    (pkg / "libtorchcodec_core\u00b2.so").write_bytes(b"")  # isdigit() but not int()
    (pkg / "libtorchcodec_core9.so").mkdir()
    assert torchcodec_issues(str(pkg), {}, "/", NODE, Budget()) == []
    # Garbage beside a real variant: the real one is still judged.
    shutil.copy2(site / "torchcodec" / "libtorchcodec_core6.so", pkg)
    assert [i.fact("majors") for i in torchcodec_issues(str(pkg), {}, "/", NODE, Budget())] \
        == ["6"]


def test_the_budget_bounds_the_search(site: Path) -> None:
    with pytest.raises(BudgetExceeded):
        issues(site, budget=Budget(max_files=2))


def test_an_ffmpeg_installed_after_the_verdict_breaks_its_record(
        site: Path, elf_builder: ElfBuilder, tmp_path: Path) -> None:

    llp = tmp_path / "ffmpeg-later"
    llp.mkdir()
    env = {"LD_LIBRARY_PATH": str(llp)}
    files = fsprobe.Files.recorded()
    assert len(issues(site, env, files=files)) == 1
    record = files.records()
    assert fsprobe.still_true(record)
    built = ffmpeg(elf_builder, "ffmpeg7", 7)
    for lib in built.iterdir():
        shutil.copy2(lib, llp / lib.name)
    assert not fsprobe.still_true(record)
    assert issues(site, env) == []


def test_a_non_elf_file_under_an_ffmpeg_name_stops_that_variant(site: Path,
                                                               tmp_path: Path) -> None:
    """glibc stops at a candidate that is not ELF ("invalid ELF header")
    instead of searching on: that variant fails, and the finding says why."""
    llp = tmp_path / "broken"
    llp.mkdir()
    (llp / "libavutil.so.60").write_text("INPUT(-lavutil)\n")  # a linker script
    found = issues(site, {"LD_LIBRARY_PATH": str(llp)})
    assert f"{llp}/libavutil.so.60 (invalid ELF header)" in found[0].fact("candidates")
    assert found[0].fact("missing").startswith("libavutil.so.60 (FFmpeg 8)")


def test_variants_of_the_other_byte_order_are_left_to_other_rules(
        tmp_path: Path, elf_builder: ElfBuilder) -> None:
    """A big-endian aarch64 build of a core variant (same machine and class,
    other byte order) is no variant this node's dlopen could load, so its
    FFmpeg needs are not this rule's finding (the old test compared machine
    and class only, and reported the variant's FFmpeg as missing)."""
    be = ("-mbig-endian", "-nostdlib")
    stub = elf_builder.library("be-ffmpeg/libavutil.so.59", arch="aarch64",
                               source="int av_stub(void) { return 1; }\n", extra_flags=be)
    pkg = tmp_path / "torchcodec"
    pkg.mkdir()
    core = elf_builder.library("be-core/libtorchcodec_core7.so", arch="aarch64",
                               source="int av_stub(void);\nint core(void) { return av_stub(); }\n",
                               needed_libs=("avutil",), lib_dirs=(stub.parent,), extra_flags=be)
    assert "libavutil.so.59" in read_elf(str(core)).needed
    shutil.copy(core, pkg / core.name)
    assert torchcodec_issues(str(pkg), {}, "/", NODE, Budget()) == []
    # The same variant built little-endian is judged: its FFmpeg is missing here.
    le_stub = elf_builder.library("le-ffmpeg/libavutil.so.59", arch="aarch64",
                                  source="int av_stub(void) { return 1; }\n")
    le = elf_builder.library("le-core/libtorchcodec_core7.so", arch="aarch64",
                             source="int av_stub(void);\nint core(void) { return av_stub(); }\n",
                             needed_libs=("avutil",), lib_dirs=(le_stub.parent,))
    shutil.copy(le, pkg / le.name)
    assert len(torchcodec_issues(str(pkg), {}, "/", NODE, Budget())) == 1
