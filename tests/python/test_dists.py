"""dists.py and markers.py against importlib.metadata and packaging.

Oracles: ``importlib.metadata`` (distributions, versions, requires, files,
``packages_distributions``) over real site dirs (this machine's pyenv and
Debian site-packages, the pinned wheels) and ``packaging.markers`` for marker
evaluation in the node's environment.
"""

from __future__ import annotations

import importlib.metadata as md
import os
import sys
import sysconfig
from pathlib import Path

import pytest
from packaging.markers import Marker
from packaging.requirements import InvalidRequirement, Requirement

from grace_policy.budget import Budget
from grace_policy.node import NodeProfile
from grace_policy.python.dists import Dist, closure, dist_of_file, dists_in, normalize, owners
from grace_policy.python.markers import evaluate, node_environment, required

ARM = NodeProfile(machine="aarch64", page_size=65536, glibc=(2, 36))
X86 = NodeProfile(machine="x86_64", page_size=4096, glibc=(2, 36))
HOST = sys.version_info[:2]

def _real_sites() -> list[str]:
    """This machine's site dirs that hold enough distributions to compare
    (on a fresh CI machine: where pip put the test dependencies, and
    Debian's dist-packages)."""
    candidates = [
        os.path.join(sys.prefix, "lib", f"python{HOST[0]}.{HOST[1]}", "site-packages"),
        sysconfig.get_paths()["purelib"],
        "/usr/lib/python3/dist-packages",
    ]
    out: list[str] = []
    for path in dict.fromkeys(os.path.realpath(c) for c in candidates):
        if os.path.isdir(path) and sum(
                n.endswith((".dist-info", ".egg-info")) for n in os.listdir(path)) >= 6:
            out.append(path)
    return out


REAL_SITES = _real_sites()


def budget() -> Budget:
    return Budget(deadline_ms=60_000, max_files=100_000, max_bytes=1 << 30)


def _packaging_env(node: NodeProfile, version: tuple[int, int]) -> dict[str, str]:
    env = node_environment(node, version)
    env.update(platform_release="", platform_version="")
    return env


def _oracle_requires(dist: md.Distribution, node: NodeProfile,
                     version: tuple[int, int]) -> set[str] | None:
    """Names required on the node per packaging; None when a requirement's
    marker depends on something neither side knows (the patch level)."""
    out: set[str] = set()
    for spec in dist.requires or []:
        try:
            req = Requirement(spec)
        except InvalidRequirement:
            return None
        if req.marker is not None:
            lo = req.marker.evaluate(_packaging_env(node, version))
            env_hi = _packaging_env(node, version)
            env_hi.update(python_full_version=f"{version[0]}.{version[1]}.99",
                          implementation_version=f"{version[0]}.{version[1]}.99")
            if lo != req.marker.evaluate(env_hi):
                return None
            if not lo:
                continue
        out.add(normalize(req.name))
    return out


@pytest.mark.parametrize("site", REAL_SITES)
@pytest.mark.parametrize("node", [ARM, X86], ids=["aarch64", "x86_64"])
def test_dists_match_importlib_metadata(site: str, node: NodeProfile) -> None:
    got = dists_in(site, node, HOST, budget())
    real = list(md.distributions(path=[site]))
    assert len(real) > 5
    assert sorted((d.name, d.version) for d in got) == sorted(
        (normalize(r.metadata["Name"]), r.version) for r in real)
    by_meta = {d.meta_dir: d for d in got}
    checked = 0
    for r in real:
        meta = str(r._path)  # type: ignore[attr-defined]
        mine = by_meta[meta]
        want = _oracle_requires(r, node, HOST)
        if want is None:
            continue
        assert set(mine.requires) == want - {mine.name}, mine.name
        checked += 1
    assert checked > 5


@pytest.mark.parametrize("site", REAL_SITES)
def test_owners_match_packages_distributions(site: str) -> None:
    """importlib.metadata.packages_distributions(): top_level.txt, else the
    top-level names RECORD's files provide."""
    got = owners(dists_in(site, ARM, HOST, budget()))
    # (a name may come twice: Debian ships cryptography with a .dist-info and an .egg-info)
    mine = {top: sorted({d.name for d in ds}) for top, ds in got.items()}
    saved = sys.path[:]
    try:
        sys.path[:] = [site]
        want_raw = md.packages_distributions()
    finally:
        sys.path[:] = saved
    want: dict[str, list[str]] = {}
    for top, names in want_raw.items():
        if "." in top or "/" in top or not top:
            continue    # packages_distributions also keys .pth/.pyi stems and dotted paths
        want[top] = sorted({normalize(n) for n in names})
    # every import name the oracle knows is owned by the same distributions
    for top, names in want.items():
        assert mine.get(top) == names, top


@pytest.mark.parametrize("site", REAL_SITES)
def test_dist_of_file_agrees_with_record(site: str) -> None:
    dists = dists_in(site, ARM, HOST, budget())
    by_name = {(d.name, d.version): d for d in dists}
    shared: dict[str, int] = {}
    real = list(md.distributions(path=[site]))
    for r in real:
        for f in r.files or []:
            shared[os.path.normpath(str(f))] = shared.get(os.path.normpath(str(f)), 0) + 1
    checked = 0
    for r in real:
        mine = by_name[(normalize(r.metadata["Name"]), r.version)]
        for f in (r.files or [])[:40]:
            rel = os.path.normpath(str(f))
            if rel.startswith("..") or shared[rel] > 1 or rel.startswith("__pycache__"):
                continue
            got = dist_of_file(os.path.join(site, rel), site, dists, budget())
            if got is None:
                # only files under no import name and in no RECORD we could read
                assert not mine.top_level or rel.split("/")[0] not in mine.top_level
                continue
            assert got.name == mine.name, rel
            checked += 1
    assert checked > 20


# -- built layouts ------------------------------------------------------------


def write(path: Path, text: str = "") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.fixture
def site(tmp_path: Path) -> Path:
    s = tmp_path / "site"
    # dist-info with top_level.txt and markers
    write(s / "Alpha_Pkg-1.0.dist-info" / "METADATA",
          "Metadata-Version: 2.1\nName: Alpha_Pkg\nVersion: 1.0\n"
          "Requires-Dist: beta (>=2)\n"
          'Requires-Dist: gamma ; platform_machine == "x86_64"\n'
          'Requires-Dist: delta ; platform_machine == "aarch64"\n'
          "Requires-Dist: pytest ; extra == 'tests'\n"
          'Requires-Dist: weird ; platform_release >= "5"\n'
          "\nRequires-Dist: not-a-header-this-is-the-body\n")
    write(s / "Alpha_Pkg-1.0.dist-info" / "top_level.txt", "alpha\n\n")
    write(s / "alpha" / "__init__.py")
    # dist-info without top_level.txt: RECORD tells
    write(s / "beta-2.0.dist-info" / "METADATA",
          "Name: beta\nVersion: 2.0\nRequires-Dist: Alpha.Pkg\n")
    write(s / "beta-2.0.dist-info" / "RECORD",
          "beta_mod.py,sha256=x,1\nbeta_ext.cpython-311-aarch64-linux-gnu.so,,\n"
          '"beta_pkg/a,b.py",,\nbeta.libs/libz.so.1,,\nbeta-2.0.dist-info/METADATA,,\n'
          "../../bin/beta,,\n__pycache__/beta_mod.cpython-311.pyc,,\n")
    # neither: its name
    write(s / "no_top-0.1.dist-info" / "METADATA", "Name: no-top\nVersion: 0.1\n")
    # egg-info directory with requires.txt sections and installed-files.txt
    egg = s / "eggy-3.0-py3.11.egg-info"
    write(egg / "PKG-INFO", "Metadata-Version: 1.1\nName: eggy\nVersion: 3.0\n")
    write(egg / "requires.txt", "alpha-pkg\n\n[extra1]\nnever\n[:platform_machine == 'aarch64']\n"
          "armdep\n[:platform_machine == 'x86_64']\nx86dep\n")
    write(egg / "installed-files.txt", "../eggmod/__init__.py\n../eggmod/x.py\nPKG-INFO\n")
    # egg-info as a single file
    write(s / "flat-1.2-py3.11.egg-info", "Metadata-Version: 1.1\nName: flat\nVersion: 1.2\n")
    # namespace directory shared by two dists
    for n in ("nvidia-cublas-cu12", "nvidia-cudnn-cu12"):
        sub = n.split("-")[1]
        write(s / f"{n.replace('-', '_')}-1.0.dist-info" / "METADATA", f"Name: {n}\nVersion: 1.0\n")
        write(s / f"{n.replace('-', '_')}-1.0.dist-info" / "top_level.txt", "nvidia\n")
        write(s / f"{n.replace('-', '_')}-1.0.dist-info" / "RECORD",
              f"nvidia/{sub}/lib/lib{sub}.so.12,,\nnvidia/{sub}/__init__.py,,\n")
    # garbage metadata
    (s / "garbage-9.dist-info").mkdir(parents=True)
    (s / "garbage-9.dist-info" / "METADATA").write_bytes(b"\xff\xfe\x00\x01" * 100)
    (s / "dir_meta-1.dist-info" / "METADATA").mkdir(parents=True)    # METADATA a directory
    return s


def test_built_layout(site: Path) -> None:
    dists = {d.name: d for d in dists_in(str(site), ARM, (3, 11), budget())}
    assert set(dists) == {"alpha-pkg", "beta", "no-top", "eggy", "flat", "nvidia-cublas-cu12",
                          "nvidia-cudnn-cu12", "garbage", "dir-meta"}
    a = dists["alpha-pkg"]
    assert a.version == "1.0" and a.top_level == ("alpha",)
    assert a.requires == ("beta", "delta", "weird")    # weird: unknown marker -> kept
    assert dists_in(str(site), X86, (3, 11), budget())[0].requires == ("beta", "gamma", "weird")
    assert dists["beta"].top_level == ("beta_mod", "beta_ext", "beta_pkg")
    assert dists["beta"].requires == ("alpha-pkg",)
    assert dists["no-top"].top_level == ("no_top",)
    assert dists["eggy"].requires == ("alpha-pkg", "armdep")
    assert dists["eggy"].top_level == ("eggmod",)
    assert dists["flat"].version == "1.2"
    assert dists["garbage"].version == "9"


def test_closure_and_owners(site: Path) -> None:
    dists = dists_in(str(site), ARM, (3, 11), budget())
    assert closure(["eggy"], dists) == {"eggy", "alpha-pkg", "beta", "delta", "weird", "armdep"}
    assert closure(["Alpha_Pkg"], dists) == {"alpha-pkg", "beta", "delta", "weird"}
    assert closure([], dists) == set()
    own = owners(dists)
    assert sorted(d.name for d in own["nvidia"]) == ["nvidia-cublas-cu12", "nvidia-cudnn-cu12"]


def test_dist_of_file(site: Path) -> None:
    dists = dists_in(str(site), ARM, (3, 11), budget())
    s = str(site)

    def of(rel: str) -> str | None:
        d = dist_of_file(f"{s}/{rel}", s, dists, budget())
        return d.name if d else None

    assert of("alpha/__init__.py") == "alpha-pkg"
    assert of("beta.libs/libz.so.1") == "beta"
    assert of("beta_ext.cpython-311-aarch64-linux-gnu.so") == "beta"
    assert of("beta_mod.py") == "beta"
    assert of("nvidia/cudnn/lib/libcudnn.so.12") == "nvidia-cudnn-cu12"
    assert of("nvidia/cublas/lib/libcublas.so.12") == "nvidia-cublas-cu12"
    assert of("nvidia/unknown.so") is None
    assert of("Alpha_Pkg-1.0.dist-info/METADATA") == "alpha-pkg"
    assert of("eggmod/x.py") == "eggy"
    assert of("nothing/here.so") is None
    assert dist_of_file("/elsewhere/alpha/x.py", s, dists, budget()) is None


@pytest.mark.network
def test_real_wheels() -> None:
    from python.wheels import wheel_site
    numpy_site = wheel_site("numpy-1.19.0-aarch64")
    (numpy,) = dists_in(str(numpy_site), ARM, (3, 8), budget())
    assert (numpy.name, numpy.version, numpy.top_level, numpy.requires) == (
        "numpy", "1.19.0", ("numpy",), ())
    lib = next((numpy_site / "numpy.libs").iterdir())
    assert dist_of_file(str(lib), str(numpy_site), [numpy], budget()) == numpy
    bcrypt_site = wheel_site("bcrypt-4.1.2-abi3-x86_64")
    (bcrypt,) = dists_in(str(bcrypt_site), ARM, (3, 11), budget())
    assert bcrypt.requires == () and bcrypt.top_level == ("bcrypt",)
    ms = wheel_site("markupsafe-2.1.5-x86_64")
    assert [d.name for d in dists_in(str(ms), ARM, (3, 11), budget())] == ["markupsafe"]


# -- markers ------------------------------------------------------------------

MARKERS = [
    'python_version < "3.9"', 'python_version >= "3.8"', "python_version == '3.11'",
    'python_version ~= "3.8"', 'python_version == "3.*"', 'python_version != "3.11.*"',
    'python_full_version >= "3.8.0"', 'python_full_version < "3.11.4"',
    'platform_machine == "x86_64"', 'platform_machine != "aarch64"',
    "platform_machine in 'x86_64 aarch64'", "'arm' in platform_machine",
    'platform_machine not in "ppc64le s390x"',
    'sys_platform == "linux" and platform_machine == "aarch64"',
    'sys_platform == "win32" or (os_name == "posix" and python_version > "3.6")',
    "implementation_name == 'cpython'", 'platform_python_implementation != "PyPy"',
    'platform_system == "Darwin"', "extra == 'gpu'", "extra != 'gpu'",
    '(extra == "a" or extra == "b") and python_version >= "3"',
    'platform_machine == "aarch64" and extra == "cuda"',
    "os.name == 'posix'", "python_version >= '3.10' and python_version < '3.12'",
    'platform_machine == "x86_64" or platform_machine == "AMD64"',
    "python_version>'3.7'", '"3.8" <= python_version',
    'implementation_version >= "3.11"',
]


@pytest.mark.parametrize("version", [(3, 8), (3, 11), (3, 13)])
@pytest.mark.parametrize("node", [ARM, X86], ids=["aarch64", "x86_64"])
def test_markers_match_packaging(node: NodeProfile, version: tuple[int, int]) -> None:
    env = _packaging_env(node, version)
    for text in MARKERS:
        want = Marker(text).evaluate(env)
        got = evaluate(text, env)
        assert got is want, text


@pytest.mark.parametrize("text", [
    "", "(", "python_version <", "python_version < '3.8' and", "'unterminated",
    "platform_release >= '5'", "python_version < '3.8'" * 1000, "((((((" * 20,
    "python_version ?? '3'", "and", "not in", "python_version < 'abc'",
])
def test_markers_never_raise(text: str) -> None:
    env = node_environment(ARM, (3, 11))
    assert evaluate(text, env) in (True, False, None)
    assert required(text or None, ARM, (3, 11)) in (True, False)


def test_patch_level_unknown_is_kept() -> None:
    # 3.11.x: true for early patch releases, false for late ones -> required
    assert required('python_full_version < "3.11.4"', ARM, (3, 11))
    assert not required('python_full_version < "3.10.4"', ARM, (3, 11))


def test_dist_is_a_record() -> None:
    d = Dist(name="a", version="1", meta_dir="/s/a-1.dist-info", site_dir="/s",
             top_level=("a",), requires=())
    assert d == Dist(name="a", version="1", meta_dir="/s/a-1.dist-info", site_dir="/s",
                     top_level=("a",), requires=())
    assert hash(d) == hash(d)


def test_hostile_site(tmp_path: Path) -> None:
    s = tmp_path / "site"
    s.mkdir()
    (s / "loop-1.dist-info").symlink_to(s / "loop-1.dist-info")
    big = s / "big-1.dist-info"
    write(big / "METADATA", "Name: big\nVersion: 1\n" + "Classifier: x\n" * 300_000)  # 4 MB
    write(big / "RECORD", '"unterminated,\n\0\0,\n' + "a" * 100_000 + ",,\n,,\n\"q\"\"x\",,\n")
    odd = s / os.fsdecode(b"odd\xff-2.dist-info")
    odd.mkdir()
    (odd / "METADATA").write_bytes(b"Name: odd\xff\nVersion: 2\n")     # not UTF-8
    write(s / "dangling-3.dist-info" / "RECORD", "dangling/__init__.py,,\n")
    (s / "dangling-3.dist-info" / "METADATA").symlink_to(tmp_path / "nowhere")
    write(s / "notmeta.dist-infox", "")
    b = budget()
    dists = {d.name: d for d in dists_in(str(s), ARM, (3, 11), b)}
    assert dists["big"].version == "1"
    assert b.bytes_read < 1024 * 1024     # headers and a RECORD: the 4 MB body is never read
    assert set(dists) == {"loop", "big", normalize(os.fsdecode(b"odd\xff")), "dangling"}
    assert dists["dangling"].top_level == ("dangling",)
    assert dists_in(str(tmp_path / "absent"), ARM, (3, 11), budget()) == ()
    assert dists_in(str(big / "METADATA"), ARM, (3, 11), budget()) == ()


def test_budget_stops_a_huge_site(tmp_path: Path) -> None:
    s = tmp_path / "site"
    for i in range(30):
        write(s / f"p{i}-1.dist-info" / "METADATA", f"Name: p{i}\nVersion: 1\n")
    from grace_policy.budget import BudgetExceeded
    with pytest.raises(BudgetExceeded):
        dists_in(str(s), ARM, (3, 11), Budget(deadline_ms=60_000, max_files=10))


def test_fifos_are_never_opened(tmp_path: Path) -> None:
    """A FIFO where METADATA or a script should be would block an open()."""
    from grace_policy.python.usage import command_imports
    s = tmp_path / "site"
    (s / "fifo-1.dist-info").mkdir(parents=True)
    os.mkfifo(s / "fifo-1.dist-info" / "METADATA")
    os.mkfifo(s / "fifo-1.dist-info" / "top_level.txt")
    (d,) = dists_in(str(s), ARM, (3, 11), budget())
    assert (d.name, d.version, d.top_level) == ("fifo", "1", ("fifo",))
    os.mkfifo(tmp_path / "job.py")
    assert command_imports("script", str(tmp_path / "job.py"), cwd="/", node=ARM,
                           budget=budget()) == ()


# -- markers, generated ---------------------------------------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_VARS = ["python_version", "python_full_version", "platform_machine", "sys_platform",
         "platform_system", "os_name", "implementation_name",
         "platform_python_implementation", "extra", "implementation_version"]
_VALUES = ["3.8", "3.11", "3.11.4", "3.13", "3", "3.*", "3.11.*", "x86_64", "aarch64",
           "linux", "win32", "Linux", "posix", "cpython", "CPython", "PyPy", "gpu", ""]
_OPS_GEN = ["==", "!=", "<", "<=", ">", ">=", "~=", "in", "not in"]


def _cmp() -> st.SearchStrategy[str]:
    var = st.sampled_from(_VARS)
    val = st.sampled_from(_VALUES).map(lambda v: f'"{v}"')
    op = st.sampled_from(_OPS_GEN)
    return st.one_of(
        st.builds(lambda a, o, b: f"{a} {o} {b}", var, op, val),
        st.builds(lambda a, o, b: f"{a} {o} {b}", val, op, var))


_MARKER = st.recursive(_cmp(), lambda inner: st.one_of(
    st.builds(lambda a, b: f"{a} and {b}", inner, inner),
    st.builds(lambda a, b: f"{a} or {b}", inner, inner),
    inner.map(lambda a: f"({a})")), max_leaves=6)


@settings(max_examples=400, deadline=None)
@given(text=_MARKER, node=st.sampled_from([ARM, X86]),
       version=st.sampled_from([(3, 8), (3, 11), (3, 13)]))
def test_generated_markers_agree_with_packaging(text: str, node: NodeProfile,
                                                version: tuple[int, int]) -> None:
    """Whenever the evaluator decides, it decides as packaging does."""
    env = _packaging_env(node, version)
    got = evaluate(text, env)
    try:
        want = Marker(text).evaluate(env)
    except Exception:       # packaging refuses it (e.g. ~= on a one-part version)
        return
    if got is not None:
        assert got is want, text
