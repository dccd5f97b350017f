"""finder.py against the real importer.

The oracle is a real CPython (the one running the tests, and pyenv's others)
asked ``importlib.util.find_spec(name)`` with ``sys.path`` set to the same
entries, in a child process started with ``-I -S`` so nothing else is on the
path. The trees are built per test; extension "modules" are real files of
the right names (find_spec never opens them).
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from grace_policy.budget import Budget, BudgetExceeded
from grace_policy.node import NodeProfile
from grace_policy.python.finder import Located, Scope, find_top_level, package_extensions
from grace_policy.python.suffixes import extension_suffixes

HOST_VERSION = sys.version_info[:2]
X86 = extension_suffixes(HOST_VERSION, "x86_64")
ARM = extension_suffixes(HOST_VERSION, "aarch64")
TAG_X86 = X86[0]
TAG_ARM = ARM[0]

#: Runs under any CPython, including Debian's python3.11-minimal (no json):
#: argv = entries... "--" names...; prints a repr() the test reads back.
_ORACLE = r"""
import importlib.util, sys
args = sys.argv[1:]
cut = args.index("--")
entries, names = args[:cut], args[cut + 1:]
sys.path[:] = entries
out = {}
for name in names:
    spec = importlib.util.find_spec(name)
    if spec is None:
        out[name] = ["missing", "", []]
        continue
    loader = type(spec.loader).__name__ if spec.loader is not None else "None"
    out[name] = [loader, spec.origin or "", list(spec.submodule_search_locations or [])]
print(repr(out))
"""


def oracle(entries: list[str], names: list[str], cwd: Path,
           python: Sequence[str] = (sys.executable,)) -> dict[str, tuple[str, str]]:
    """(kind, path) per name as the real importer finds it."""
    proc = subprocess.run([*python, "-I", "-S", "-c", _ORACLE, *entries, "--", *names],
                          capture_output=True, text=True, cwd=cwd, check=True, timeout=120)
    raw = ast.literal_eval(proc.stdout.strip())
    out: dict[str, tuple[str, str]] = {}
    for name, (loader, origin, locs) in raw.items():
        if loader == "missing":
            out[name] = ("missing", "")
        elif loader in ("None", "NamespaceLoader", "_NamespaceLoader"):
            out[name] = ("namespace", locs[0])
        elif locs:
            out[name] = ("package", locs[0])
        else:
            kind = {"ExtensionFileLoader": "extension", "SourceFileLoader": "source",
                    "SourcelessFileLoader": "bytecode"}[loader]
            out[name] = (kind, origin)
    return out


def touch(path: Path, data: bytes = b"") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def model(name: str, entries: list[str], suffixes=X86, cwd: str = "/",
          budget: Budget | None = None, node: NodeProfile | None = None) -> Located:
    return find_top_level(name, entries, suffixes, budget or Budget(deadline_ms=10_000),
                          Scope(node, cwd))


@pytest.fixture
def tree(tmp_path: Path) -> dict[str, Path]:
    """Three sys.path entries covering FileFinder's orders and precedence."""
    a, b, c = (tmp_path / n for n in ("a", "b", "c"))
    # regular packages, each with a different __init__ kind
    touch(a / "pkg_src" / "__init__.py")
    touch(a / "pkg_pyc" / "__init__.pyc")
    touch(a / "pkg_ext" / f"__init__{TAG_X86}")
    touch(a / "pkg_abi3" / "__init__.abi3.so")
    # extension before source before bytecode, in one dir
    touch(a / f"both{TAG_X86}")
    touch(a / "both.py")
    touch(a / "abi_vs_plain.abi3.so")
    touch(a / "abi_vs_plain.so")
    touch(a / "src_vs_pyc.py")
    touch(a / "src_vs_pyc.pyc")
    # a package directory beats a module file of the same name
    touch(a / "dir_and_mod" / "__init__.py")
    touch(a / "dir_and_mod.py")
    # a namespace portion loses to a module file in the same dir ...
    (a / "ns_vs_mod").mkdir(parents=True)
    touch(a / "ns_vs_mod.py")
    # ... and to a module in a later entry; several portions become one namespace
    (a / "ns_later").mkdir(parents=True)
    touch(c / "ns_later.py")
    (a / "ns_only").mkdir(parents=True)
    (b / "ns_only").mkdir(parents=True)
    # only foreign builds: not found, the files named
    touch(b / f"foreign_only{TAG_ARM}")
    touch(b / "foreign_only.cpython-38-x86_64-linux-gnu.so")
    # foreign first, a good build later: found later
    touch(a / f"foreign_then_good{TAG_ARM}")
    touch(c / "foreign_then_good.abi3.so")
    # first entry wins
    touch(b / "first.py")
    touch(c / "first.py")
    # a directory named like a module file is not a file
    (a / f"dirfile{TAG_X86}").mkdir(parents=True)
    touch(b / "dirfile.py")
    # a library, not a module
    touch(a / "libthing.so.1")
    return {"a": a, "b": b, "c": c, "root": tmp_path}


NAMES = ["pkg_src", "pkg_pyc", "pkg_ext", "pkg_abi3", "both", "abi_vs_plain", "src_vs_pyc",
         "dir_and_mod", "ns_vs_mod", "ns_later", "ns_only", "foreign_only", "foreign_then_good",
         "first", "dirfile", "libthing", "nothing_here"]


def test_matches_real_importer(tree: dict[str, Path]) -> None:
    entries = [str(tree["a"]), str(tree["b"]), str(tree["c"])]
    want = oracle(entries, NAMES, tree["root"])
    for name in NAMES:
        got = model(name, entries)
        assert (got.kind, got.path) == want[name], name


def test_foreign_files_named_when_nothing_loads(tree: dict[str, Path]) -> None:
    entries = [str(tree["a"]), str(tree["b"]), str(tree["c"])]
    got = model("foreign_only", entries)
    assert got.kind == "missing"
    assert sorted(os.path.basename(f) for f in got.foreign) == sorted(
        [f"foreign_only{TAG_ARM}", "foreign_only.cpython-38-x86_64-linux-gnu.so"])
    # Found further down the path: the earlier foreign build is still named
    later = model("foreign_then_good", entries)
    assert later.kind == "extension" and later.path.endswith("foreign_then_good.abi3.so")
    assert [os.path.basename(f) for f in later.foreign] == [f"foreign_then_good{TAG_ARM}"]
    # A well-built module has no foreign files
    assert model("both", entries).foreign == ()


def test_same_tree_seen_from_the_other_machine(tree: dict[str, Path]) -> None:
    """The aarch64 node finds the aarch64 builds and not the x86_64 ones."""
    entries = [str(tree["a"]), str(tree["b"]), str(tree["c"])]
    got = model("foreign_only", entries, suffixes=ARM)
    assert got.kind == "extension" and got.path.endswith(TAG_ARM)
    both = model("both", entries, suffixes=ARM)
    # the pure-Python file next to it imports: the x86_64 build does not matter
    assert both.kind == "source" and both.foreign == ()
    ext_pkg = model("pkg_ext", entries, suffixes=ARM)
    assert ext_pkg.kind == "namespace"    # the only __init__ is an x86_64 build


def test_namespace_portions_in_order(tree: dict[str, Path]) -> None:
    entries = [str(tree["a"]), str(tree["b"]), str(tree["c"])]
    got = model("ns_only", entries)
    assert got.kind == "namespace"
    assert got.portions == (str(tree["a"] / "ns_only"), str(tree["b"] / "ns_only"))
    assert got.entry == str(tree["a"])


def test_cwd_relative_and_missing_entries(tree: dict[str, Path]) -> None:
    root = tree["root"]
    touch(root / "here" / "cwdmod.py")
    entries = ["", "b", "/nonexistent/dir", str(root / "a" / "both.py"), "c"]
    names = ["cwdmod", "first", "ns_later"]
    want = oracle(entries, names, root / "here")
    for name in names:
        got = model(name, entries, cwd=str(root / "here"))
        # the oracle reports absolute paths; the model joins relative entries with cwd
        assert (got.kind, os.path.normpath(got.path) if got.path else "") == want[name], name


def test_hostile_names_and_entries(tmp_path: Path) -> None:
    d = tmp_path / "d"
    touch(d / "ok.py")
    name = os.fsdecode(b"bad\xff")
    touch(d / name)    # a non-UTF-8 file name
    (d / "loop").symlink_to(d / "loop")
    entries = [str(d), str(d / "loop"), "\0bad", str(d / "ok.py"), os.fsdecode(b"/x\xfe")]
    assert model("ok", entries).kind == "source"
    for weird in ["", "a.b", "a/b", "\0", "..", name, "loop"]:
        got = model(weird, entries)
        assert got.kind in ("missing", "namespace"), weird


def test_budget_bounds_a_long_path(tmp_path: Path) -> None:
    entries = [str(tmp_path / f"e{i}") for i in range(5000)]
    budget = Budget(deadline_ms=10_000, max_files=10)
    budget.deadline = 0.0    # already past: the first tick raises
    with pytest.raises(BudgetExceeded):
        model("x", entries, budget=budget)


def test_node_image_read_first(tmp_path: Path) -> None:
    """With a node image mounted at root, /opt/site is read inside it; a path
    the image lacks is read here (shared storage)."""
    image = tmp_path / "image"
    touch(image / "opt" / "site" / f"imgmod{ARM[0]}")
    shared = tmp_path / "shared"
    touch(shared / "sharedmod.py")
    node = NodeProfile(machine="aarch64", page_size=65536, glibc=(2, 36), root=str(image),
                       root_is_native=True)
    got = model("imgmod", ["/opt/site", str(shared)], suffixes=ARM, node=node)
    assert got.kind == "extension" and got.path == f"/opt/site/imgmod{ARM[0]}"
    assert model("sharedmod", ["/opt/site", str(shared)], suffixes=ARM, node=node).path == \
        str(shared / "sharedmod.py")


@pytest.mark.parametrize("version", ["3.8.18", "3.10.13", "3.12.1", "3.13.0"])
def test_other_real_interpreters(tree: dict[str, Path], version: str) -> None:
    python = f"/root/.pyenv/versions/{version}/bin/python3"
    if not os.path.exists(python):
        pytest.skip(f"{python} not installed")
    ver = tuple(int(x) for x in version.split(".")[:2])
    sfx = extension_suffixes(ver, "x86_64")
    a = tree["a"]
    touch(a / f"verext{sfx[0]}")
    touch(a / f"verext{TAG_X86}")            # the test interpreter's tag
    touch(a / f"verpkg/__init__{sfx[0]}")
    entries = [str(tree["a"]), str(tree["b"]), str(tree["c"])]
    names = [*NAMES, "verext", "verpkg"]
    want = oracle(entries, names, tree["root"], python=(python,))
    for name in names:
        got = model(name, entries, suffixes=sfx)
        assert (got.kind, got.path) == want[name], (version, name)


# -- package_extensions --------------------------------------------------------

#: FileFinder on one directory, as the importer runs it for ``pkg.sub.name``
#: once ``pkg.sub`` is imported (without executing any package's __init__).
_SPEC_ORACLE = r"""
import importlib.machinery, sys
out = {}
for arg in sys.argv[1:]:
    directory, _, name = arg.rpartition("/")
    spec = importlib.machinery.PathFinder.find_spec(name, [directory])
    out[arg] = [type(spec.loader).__name__ if spec and spec.loader else "None",
                (spec.origin or "") if spec else ""]
print(repr(out))
"""


def _spec_oracle(site: Path, names: list[str],
                 python: Sequence[str] = (sys.executable,)) -> dict[str, str]:
    """dotted name -> the extension file the real importer picks (extensions only)."""
    args = []
    for name in names:
        parts = name.split(".")
        args.append(str(site.joinpath(*parts[:-1])) + "/" + parts[-1])
    proc = subprocess.run([*python, "-I", "-S", "-c", _SPEC_ORACLE, *args],
                          capture_output=True, text=True, check=True, timeout=120)
    raw = ast.literal_eval(proc.stdout.strip())
    out: dict[str, str] = {}
    for name, arg in zip(names, args):
        loader, origin = raw[arg]
        if loader == "ExtensionFileLoader":
            out[name] = origin
    return out


@pytest.fixture
def pkg_tree(tmp_path: Path) -> Path:
    site = tmp_path / "site"
    p = site / "pkg"
    touch(p / "__init__.py")
    touch(p / f"fast{TAG_X86}")
    touch(p / "fast.abi3.so")                 # shadowed by the tagged one
    touch(p / "fast.so")
    touch(p / "stable.abi3.so")
    touch(p / "plain.so")
    touch(p / f"armonly{TAG_ARM}")             # foreign only
    touch(p / f"armfallback{TAG_ARM}")         # foreign, but a .py imports
    touch(p / "armfallback.py")
    touch(p / f"armpyc{TAG_ARM}")
    touch(p / "armpyc.pyc")
    touch(p / "libdep.so.3")                   # a library, not a module
    touch(p / "sub" / "__init__.py")
    touch(p / "sub" / f"deep{TAG_X86}")
    touch(p / "sub" / "old.cpython-38-x86_64-linux-gnu.so")
    touch(p / "nspkg" / f"inns{TAG_X86}")      # namespace subpackage: importable
    touch(p / "extpkg" / f"__init__{TAG_X86}")  # a package whose __init__ is an extension
    touch(p / "shadow" / "__init__.py")        # package dir beats module file
    touch(p / f"shadow{TAG_X86}")
    touch(p / "__pycache__" / f"cached{TAG_X86}")   # never imported
    touch(p / "pkg.libs" / f"inlibs{TAG_X86}")      # not reachable by an import name
    return site


def test_package_extensions_matches_real_importer(pkg_tree: Path) -> None:
    loaded, foreign = package_extensions(str(pkg_tree / "pkg"), X86, Budget(deadline_ms=10_000))
    got = dict(loaded)
    stems = set()
    for dirpath, _dirs, files in os.walk(pkg_tree / "pkg"):
        rel = Path(dirpath).relative_to(pkg_tree)
        for f in files:
            stem = f.split(".", 1)[0]
            parts = [*rel.parts] if stem == "__init__" else [*rel.parts, stem]
            stems.add(".".join(parts))
    names = sorted(n for n in stems if "__pycache__" not in n and ".libs" not in n)
    want = _spec_oracle(pkg_tree, names)
    assert got == want
    assert dict(foreign) == {
        "pkg.armonly": (str(pkg_tree / "pkg" / f"armonly{TAG_ARM}"),),
        "pkg.sub.old": (str(pkg_tree / "pkg" / "sub" / "old.cpython-38-x86_64-linux-gnu.so"),),
    }


def test_package_extensions_from_the_other_machine(pkg_tree: Path) -> None:
    loaded, foreign = package_extensions(str(pkg_tree / "pkg"), ARM, Budget(deadline_ms=10_000))
    got = dict(loaded)
    assert got["pkg.armonly"].endswith(f"armonly{TAG_ARM}")
    assert got["pkg.fast"].endswith("fast.abi3.so")          # next in the node's order
    assert "pkg.sub.deep" not in got
    assert set(dict(foreign)) == {"pkg.sub.deep", "pkg.sub.old", "pkg.nspkg.inns", "pkg.extpkg"}


def test_package_extensions_symlink_loops_and_odd_files(tmp_path: Path) -> None:
    p = tmp_path / "pkg"
    touch(p / f"a{TAG_X86}")
    (p / "loop").symlink_to(p)                       # the package inside itself
    (p / "sub").mkdir()
    (p / "sub" / "up").symlink_to(p / "sub")
    (p / "dangling").symlink_to(tmp_path / "nowhere")
    touch(p / os.fsdecode(b"bad\xff") / f"b{TAG_X86}")
    unreadable = p / "locked"
    touch(unreadable / f"c{TAG_X86}")
    unreadable.chmod(0)
    try:
        loaded, _ = package_extensions(str(p), X86, Budget(deadline_ms=10_000))
    finally:
        unreadable.chmod(0o755)
    names = [n for n, _ in loaded]
    assert "pkg.a" in names and names.count("pkg.a") == 1
    assert os.fsdecode(b"pkg.bad\xff.b") in names
    # each real directory once: the package seen through its own symlink is not walked again
    assert not any(n.startswith(("pkg.loop", "pkg.sub.up")) for n in names)
    # (root reads the locked dir anyway; either way: no exception)


def test_package_extensions_missing_or_file(tmp_path: Path) -> None:
    touch(tmp_path / "f.py")
    b = Budget(deadline_ms=10_000)
    assert package_extensions(str(tmp_path / "absent"), X86, b) == ([], [])
    assert package_extensions(str(tmp_path / "f.py"), X86, b) == ([], [])


def test_package_extensions_budget(tmp_path: Path) -> None:
    p = tmp_path / "pkg"
    for i in range(50):
        touch(p / f"d{i}" / f"m{TAG_X86}")
    b = Budget(deadline_ms=10_000)
    b.deadline = 0.0
    with pytest.raises(BudgetExceeded):
        package_extensions(str(p), X86, b)


# -- real wheels, installed by pip ---------------------------------------------


def _tagged_files(site: Path, top: str, suffix: str) -> set[str]:
    return {str(p) for p in (site / top).rglob(f"*{suffix}") if "__pycache__" not in p.parts}


@pytest.mark.network
def test_numpy_aarch64_wheel_seen_by_each_node() -> None:
    from python.wheels import wheel_site
    site = wheel_site("numpy-1.19.0-aarch64")
    arm38 = extension_suffixes((3, 8), "aarch64")
    top = model("numpy", [str(site)], suffixes=arm38)
    assert top.kind == "package" and top.path == str(site / "numpy")
    loaded, foreign = package_extensions(top.path, arm38, Budget(deadline_ms=10_000))
    files = _tagged_files(site, "numpy", arm38[0])
    assert {f for _, f in loaded} == files and len(files) >= 15
    assert ("numpy.core._multiarray_umath",
            str(site / "numpy/core/_multiarray_umath.cpython-38-aarch64-linux-gnu.so")) in loaded
    assert foreign == []
    # the libraries auditwheel bundled are not modules
    assert not any(".libs" in f for _, f in loaded)
    # an x86_64 3.8, or an aarch64 3.11, sees none of them: all foreign
    for sfx in (extension_suffixes((3, 8), "x86_64"), extension_suffixes((3, 11), "aarch64")):
        loaded2, foreign2 = package_extensions(top.path, sfx, Budget(deadline_ms=10_000))
        assert loaded2 == []
        assert {f for _, fs in foreign2 for f in fs} == files


@pytest.mark.network
def test_markupsafe_x86_64_wheel_on_aarch64_node() -> None:
    from python.wheels import wheel_site
    site = wheel_site("markupsafe-2.1.5-x86_64")
    arm = extension_suffixes((3, 11), "aarch64")
    loaded, foreign = package_extensions(str(site / "markupsafe"), arm, Budget(deadline_ms=10_000))
    assert loaded == []
    assert foreign == [("markupsafe._speedups",
                        (str(site / "markupsafe/_speedups.cpython-311-x86_64-linux-gnu.so"),))]
    # and the real x86_64 3.11 picks it up (the oracle for the x86_64 view)
    if HOST_VERSION == (3, 11):
        want = _spec_oracle(site, ["markupsafe._speedups"])
        loaded_x86, _ = package_extensions(str(site / "markupsafe"), X86, Budget(deadline_ms=1e4))
        assert dict(loaded_x86) == want


@pytest.mark.network
def test_bcrypt_abi3_x86_64_is_loaded_by_aarch64_node() -> None:
    """abi3 carries no machine: the aarch64 importer picks the x86_64 file (and
    dlopen then fails) — it is 'loaded', not 'foreign'."""
    from python.wheels import wheel_site
    site = wheel_site("bcrypt-4.1.2-abi3-x86_64")
    arm = extension_suffixes((3, 11), "aarch64")
    assert model("bcrypt", [str(site)], suffixes=arm).kind == "package"
    loaded, foreign = package_extensions(str(site / "bcrypt"), arm, Budget(deadline_ms=10_000))
    assert loaded == [("bcrypt._bcrypt", str(site / "bcrypt/_bcrypt.abi3.so"))]
    assert foreign == []


# -- the node's own importer: a real aarch64 CPython under qemu ----------------------


@pytest.mark.network
@pytest.mark.qemu
def test_aarch64_interpreter_is_the_oracle(tree: dict[str, Path]) -> None:
    from python.arm64_python import VERSION, arm64_python
    cmd = arm64_python()
    sfx = extension_suffixes(VERSION, "aarch64")
    a = tree["a"]
    touch(a / f"armext{sfx[0]}")
    touch(a / f"armpkg/__init__{sfx[0]}")
    touch(a / "x86only.cpython-311-x86_64-linux-gnu.so")
    entries = [str(tree["a"]), str(tree["b"]), str(tree["c"])]
    names = [*NAMES, "armext", "armpkg", "x86only"]
    want = oracle(entries, names, tree["root"], python=cmd)
    assert want["x86only"] == ("missing", "")
    assert want["armext"][0] == "extension"
    for name in names:
        got = model(name, entries, suffixes=sfx)
        assert (got.kind, got.path) == want[name], name
    assert model("x86only", entries, suffixes=sfx).foreign == (
        str(a / "x86only.cpython-311-x86_64-linux-gnu.so"),)


@pytest.mark.network
@pytest.mark.qemu
@pytest.mark.parametrize("key", ["markupsafe-2.1.5-x86_64", "markupsafe-2.1.5-aarch64",
                                 "bcrypt-4.1.2-abi3-x86_64"])
def test_real_wheels_as_the_aarch64_interpreter_sees_them(key: str) -> None:
    from python.arm64_python import VERSION, arm64_python
    from python.wheels import wheel_site
    cmd = arm64_python()
    site = wheel_site(key)
    sfx = extension_suffixes(VERSION, "aarch64")
    top = key.split("-")[0]
    loaded, _foreign = package_extensions(str(site / top), sfx, Budget(deadline_ms=10_000))
    candidates = sorted({f"{top}." + p.name.split(".", 1)[0]
                         for p in (site / top).glob("*.so")})
    assert candidates
    assert dict(loaded) == _spec_oracle(site, candidates, python=cmd)


def test_whole_site_walk(pkg_tree: Path) -> None:
    """prefix="" walks a site dir: top-level modules and all packages."""
    touch(pkg_tree / f"_top{TAG_X86}")
    touch(pkg_tree / f"_armtop{TAG_ARM}")
    touch(pkg_tree / "x-1.0.dist-info" / f"hidden{TAG_X86}")
    b = Budget(deadline_ms=10_000)
    loaded, foreign = package_extensions(str(pkg_tree), X86, b, prefix="")
    pkg_loaded, pkg_foreign = package_extensions(str(pkg_tree / "pkg"), X86, b)
    assert sorted(loaded) == sorted([("_top", str(pkg_tree / f"_top{TAG_X86}")), *pkg_loaded])
    assert sorted(foreign) == sorted(
        [("_armtop", (str(pkg_tree / f"_armtop{TAG_ARM}"),)), *pkg_foreign])
    assert dict(loaded)["_top"] == oracle([str(pkg_tree)], ["_top"], pkg_tree)["_top"][1]


def test_zip_entries_are_not_searched(tmp_path: Path) -> None:
    """zipimport is not modelled (no extension module loads from a zip): a
    zip on the path contributes nothing and costs no error."""
    import zipfile
    z = tmp_path / "lib.zip"
    with zipfile.ZipFile(z, "w") as zf:
        zf.writestr("zipped.py", "x = 1\n")
    touch(tmp_path / "d" / "zipped.py")
    assert model("zipped", [str(z)]).kind == "missing"
    assert model("zipped", [str(z), str(tmp_path / "d")]).path == str(tmp_path / "d" / "zipped.py")


@pytest.mark.network
@pytest.mark.parametrize(("key", "rules"), [("numpy-1.19.0-aarch64", ["page-congruence"]),
                                            ("numpy-1.19.5-aarch64", [])])
def test_numpy_corpus_is_what_wheels_py_says(key: str, rules: list[str]) -> None:
    """The corpus fact the integration tests rely on (numpy issue 16677):
    1.19.0's _multiarray_umath breaks on 64 KiB pages, 1.19.5's does not."""
    from grace_policy.elf import read_elf
    from grace_policy.layout import page_issues
    from python.wheels import wheel_site
    site = wheel_site(key)
    sfx = extension_suffixes((3, 8), "aarch64")
    loaded, _ = package_extensions(str(site / "numpy"), sfx, Budget(deadline_ms=10_000))
    path = dict(loaded)["numpy.core._multiarray_umath"]
    node = NodeProfile(machine="aarch64", page_size=65536, glibc=(2, 36))
    got = [i.rule for i in page_issues(path, read_elf(path), node, mapped_by_kernel=False)]
    assert got == rules


def test_skip_dirs(pkg_tree: Path) -> None:
    from grace_policy.python.finder import DATA_DIRS
    touch(pkg_tree / "pkg" / "include" / "deep" / f"h{TAG_X86}")
    b = Budget(deadline_ms=10_000)
    every = dict(package_extensions(str(pkg_tree / "pkg"), X86, b)[0])
    some = dict(package_extensions(str(pkg_tree / "pkg"), X86, b, skip_dirs=DATA_DIRS)[0])
    assert "pkg.include.deep.h" in every
    assert set(every) - set(some) == {"pkg.include.deep.h"}


def test_find_module_dotted_matches_real_importer(tree: dict[str, Path]) -> None:
    from grace_policy.python.finder import find_module
    a, b, c = tree["a"], tree["b"], tree["c"]
    touch(a / "pkg_src" / "run.py")
    touch(a / "pkg_src" / "sub" / "__init__.py")
    touch(a / "pkg_src" / "sub" / f"fast{TAG_X86}")
    touch(a / "pkg_src" / "sub" / f"armonly{TAG_ARM}")
    touch(a / "ns_only" / "left.py")
    touch(b / "ns_only" / "right" / "__init__.py")
    touch(b / "ns_only" / "right" / "leaf.pyc")
    touch(c / "first.py")
    entries = [str(a), str(b), str(c)]
    names = ["pkg_src.run", "pkg_src.sub", "pkg_src.sub.fast", "pkg_src.sub.armonly",
             "pkg_src.nothing", "ns_only.left", "ns_only.right", "ns_only.right.leaf",
             "ns_only.absent", "first", "pkg_src"]
    want = oracle(entries, names, tree["root"])
    for name in names:
        got = find_module(name, entries, X86, Budget(deadline_ms=10_000))
        assert (got.kind, got.path) == want[name], name
    armonly = find_module("pkg_src.sub.armonly", entries, X86, Budget(deadline_ms=10_000))
    assert armonly.foreign == (str(a / "pkg_src" / "sub" / f"armonly{TAG_ARM}"),)
    assert armonly.entry == "" and armonly.kind == "missing"
    assert find_module("pkg_src.sub.fast", entries, X86, Budget(deadline_ms=1e4)).entry == str(a)


def test_find_module_parent_not_a_package(tree: dict[str, Path]) -> None:
    """`import first.x` where first is a module: ModuleNotFoundError in CPython."""
    from grace_policy.python.finder import find_module
    entries = [str(tree["a"]), str(tree["b"]), str(tree["c"])]
    proc = subprocess.run([sys.executable, "-I", "-S", "-c",
                           f"import sys; sys.path[:] = {entries!r}; import first.x"],
                          capture_output=True, text=True, timeout=60)
    assert "ModuleNotFoundError" in proc.stderr and "not a package" in proc.stderr
    assert find_module("first.x", entries, X86, Budget(deadline_ms=1e4)).kind == "missing"
    assert find_module("a..b", entries, X86, Budget(deadline_ms=1e4)).kind == "missing"


@pytest.mark.network
@pytest.mark.qemu
def test_loaded_x86_64_abi3_fails_on_aarch64_as_predicted() -> None:
    """What package_extensions calls 'loaded' for an x86_64 abi3 file is what
    the aarch64 interpreter really tries, and the error py-ext-arch predicts
    (field notes §8: "cannot open shared object file", not "wrong ELF class")."""
    from python.arm64_python import arm64_python
    from python.wheels import wheel_site
    site = wheel_site("bcrypt-4.1.2-abi3-x86_64")
    code = ("import importlib.machinery as m, importlib.util, sys\n"
            "spec = m.PathFinder.find_spec('_bcrypt', [sys.argv[1]])\n"
            "try:\n    importlib.util.module_from_spec(spec)\n"
            "except ImportError as e:\n    print('ImportError:', e)\n")
    out = subprocess.run([*arm64_python(), "-I", "-S", "-c", code, str(site / "bcrypt")],
                         capture_output=True, text=True, check=True, timeout=120).stdout
    path = str(site / "bcrypt" / "_bcrypt.abi3.so")
    assert out.strip() == f"ImportError: {path}: cannot open shared object file: " \
                          "No such file or directory"


def test_walk_is_recorded_for_the_verdict_cache(pkg_tree: Path) -> None:
    """Every directory the walk lists is a "D" record; a module added after
    the check makes the record stale (a cache miss, never a stale allow)."""
    from grace_policy import fsprobe
    files = fsprobe.Files.recorded()
    package_extensions(str(pkg_tree / "pkg"), X86, Budget(deadline_ms=10_000),
                       scope=Scope(files=files))
    records = files.records()
    listed = {path for op, path, _ in records if op == "D"}
    walked = {d for d, _, _ in os.walk(pkg_tree / "pkg")
              if "__pycache__" not in d and ".libs" not in d}
    assert {str(p) for p in walked} <= listed
    assert fsprobe.still_true(records)
    touch(pkg_tree / "pkg" / "sub" / f"new{TAG_X86}")
    assert not fsprobe.still_true(records)
