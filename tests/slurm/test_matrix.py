"""The release matrix (issue 9): the plugin on Slurm 24.11 (Debian 13) and 26.05
(Debian sid), built inside each release's root against its headers and
python3, and the packages as admins use them.

- Scenarios: the whole of tests/slurm (reject, warn, off, env cleaning, batch
  steps, on_error faults, no drain, the verdict cache, concurrent steps, ...)
  runs inside the root with the root's python3 and pytest; the result counts
  must equal the host's collection of the same files, with nothing skipped.
  On 24.05+ the core scenarios run once more with
  ``SlurmdParameters=contain_spank`` (user_init in a clone child).
- The built plugin: ``plugin_version`` is the root's SLURM_VERSION_NUMBER, and
  ``slurm_spank_init_failure_mode`` is exported (= ESPANK_JOB_FAILURE) exactly
  on 25.05+.
- Packages: ``make deb`` inside each root (22.05: a Debian 12 root, never the
  machine itself), ``dpkg -i``, Slurm started with the packaged snippet and
  config (tests/slurm/pkgcheck.py), ``dpkg --purge`` leaves nothing behind; a
  package built for another release is refused by dpkg. ``make rpm`` on the
  host: file list, scriptlets, pin, ``rpm -i --root``.

Roots come from tests/slurm/roots.py (cached, overlay per use, everything
inside killed by pid and unmounted at the end). ``GRACE_SLURM_RELEASES=host``
runs none of this (the host's tests/slurm still run); unselected releases are
reported as skipped.
"""

from __future__ import annotations

import fcntl
import os
import re
import shlex
import shutil
import subprocess
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from . import roots
from .groups import CONTAINERS
from .roots import RELEASES, Root

pytestmark = [pytest.mark.slurm, pytest.mark.network]

HERE = Path(__file__).resolve().parent
SRC = "/src/grace-policy"
#: Not run inside the roots: the matrix itself (it would recurse), the
#: package tests (they open roots of their own), the container files
#: (tests/slurm/groups.py says why; test_containers_in_the_newest_release
#: runs them) and the GPU files.
#: GPU steps run on the host's Slurm only: their CUDA fixtures are built with
#: nvcc from PyPI, the host's g++ and the aarch64 cross g++, for the host's
#: Python (tests/gpu/fixtures.py); a release root has no cross g++ and
#: another Python, and what they test (the core's CUDA judgement, the C
#: cache's GPU facts) does not change with the Slurm release.
GPU = ("tests/slurm/test_gpu_arch.py", "tests/slurm/test_gpu_cache.py")
INNER_IGNORE = ("tests/slurm/test_matrix.py", "tests/slurm/test_packages.py", *CONTAINERS,
                *GPU)
#: What tests/slurm/test_containers.py needs in a root besides what the root
#: has (packaging/install-deps.sh's container line; mmdebstrap for the SIFs).
CONTAINER_DEBS = ("squashfs-tools", "parallel", "gawk", "makeself", "libmd-dev", "libbsd-dev",
                  "jq", "zstd", "curl", "libcap2-bin", "runc", "mmdebstrap", "apptainer",
                  "docker-registry", "skopeo", "python3-bcrypt")
#: What runs again under contain_spank: launch, verdict, env, batch, no drain,
#: cache, concurrent steps, the faults and the hung mounts (the check's helper
#: forked from the clone child); test_bypass's paths do not depend on where user_init runs.
#: test_release.py proves slurmctld really runs with the parameter. The node
#: checker too: slurmstepd's connection must reach user_init in the clone child.
CONTAIN_SPANK_FILES = ("tests/slurm/test_release.py", "tests/slurm/test_plugin.py",
                       "tests/slurm/test_cache.py", "tests/slurm/test_load.py",
                       "tests/slurm/test_faults.py", "tests/slurm/test_hungfs.py",
                       "tests/slurm/test_nodecheck.py")


def _selected_roots() -> list[str]:
    return [n for n in roots.selected() if n != roots.HOST]


def _deb_releases() -> list[str]:
    """Package tests: every selected release; ``host`` means 22.05 (in a root)."""
    names = roots.selected()
    return [("22.05" if n == roots.HOST else n) for n in names]


def _give_up(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(reason)
    pytest.skip(reason)


_prebuilt: dict[str, str] = {}


def _prebuild_all() -> None:
    """Cold cache: build every root this session needs at once (mostly network
    and dpkg, so the three overlap well on two cores)."""
    if _prebuilt:
        return
    wanted = sorted(set(_selected_roots()) | set(_deb_releases()))

    def one(name: str) -> str:
        try:
            roots.cached_root(RELEASES[name])
            return ""
        except roots.CorpusUnavailable as exc:
            return f"release root {name} unavailable: {exc}"

    with ThreadPoolExecutor(max_workers=3) as pool:
        for name, err in zip(wanted, pool.map(one, wanted)):
            _prebuilt[name] = err
    _prefetch_for_inner_runs()


def _prefetch_for_inner_runs() -> None:
    """What the inner runs of tests/slurm read from the shared test cache,
    fetched here on the host first. Otherwise they depend on the host's own
    tests having filled it earlier in the session (test_rollout and
    test_python_torch sort after this file), and a root reaches less than
    the host: the pinned torch+cpu wheel lies only on this machine's disk.
    What cannot be fetched here is not hidden: the inner run then skips, and
    the no-skip assertion names the test and why."""
    from corpus import CorpusUnavailable, fetch_node_exporter
    from python.torch_layouts import fetch_cpu_files

    for fetch in (fetch_node_exporter, fetch_cpu_files):
        try:
            fetch()
        except CorpusUnavailable:
            pass


def _open(name: str, tmp: Path) -> Root:
    _prebuild_all()
    if _prebuilt.get(name):
        _give_up(_prebuilt[name])
    try:
        root = roots.open_root(RELEASES[name], tmp)
    except roots.CorpusUnavailable as exc:
        _give_up(f"release root {name} unavailable: {exc}")
    root.copy_source(SRC)
    return root


@pytest.fixture(scope="module", params=_selected_roots() or [None],
                ids=lambda n: f"slurm-{n}" if n else "none-selected")
def release_root(request: pytest.FixtureRequest,
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[Root]:
    if request.param is None:
        pytest.skip("GRACE_SLURM_RELEASES selects no release root (host only)")
    root = _open(request.param, tmp_path_factory.mktemp("roots"))
    try:
        yield root
    finally:
        root.close()


def _host_collection(files: tuple[str, ...],
                     ignore: tuple[str, ...] = INNER_IGNORE) -> int:
    """How many tests the host collects from ``files``: the inner run must
    execute exactly as many (a smaller count would be a silently narrower run)."""
    done = subprocess.run(["python3", "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "--collect-only", *files,
                           *[f"--ignore={i}" for i in ignore]],
                          cwd=roots.REPO, capture_output=True, text=True, check=False)
    match = re.search(r"(\d+) tests? collected", done.stdout)
    assert match, done.stdout[-2000:] + done.stderr[-2000:]
    return int(match.group(1))


def _inner_pytest(root: Root, files: tuple[str, ...], junit: str,
                  env: dict[str, str] | None = None, *, ignore: tuple[str, ...] = INNER_IGNORE,
                  pivot: bool = False) -> tuple[dict[str, int], list[str]]:
    ignores = " ".join(f"--ignore={i}" for i in ignore)
    done = root.run(f"python3 -m pytest -q -rs -p no:cacheprovider -o addopts= "
                    f"--junitxml={junit} {' '.join(files)} {ignores}",
                    cwd=SRC, env=env, timeout=1200, pivot=pivot)
    report = root.path / junit.lstrip("/")
    assert report.exists(), done.stdout[-4000:] + done.stderr[-4000:]
    suite = ET.parse(report).getroot()
    if suite.tag == "testsuites":
        suite = suite[0]
    counts = {k: int(suite.get(k, "0")) for k in ("tests", "failures", "errors", "skipped")}
    assert counts["failures"] == counts["errors"] == 0, done.stdout[-8000:]
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    return counts, skipped_tests(suite)


def _skip_report(counts: dict[str, int], skipped: list[str]) -> str:
    """The counts and one line per skipped test (a str, which pytest shows
    whole; a tuple's repr would be cut in the middle)."""
    return f"{counts}; skipped in the release root:\n" + "\n".join(f"  {s}" for s in skipped)


def skipped_tests(suite: ET.Element) -> list[str]:
    """``file::test: reason`` for every test the junit ``suite`` reports
    skipped, so a failed no-skip assertion says which test and why."""
    out = []
    for case in suite.iter("testcase"):
        for skip in case.findall("skipped"):
            name = f"{case.get('classname', '')}::{case.get('name', '')}"
            reason = skip.get("message") or (skip.text or "").strip() or "(no reason given)"
            out.append(f"{name}: {reason}")
    return out


def test_skipped_tests_are_named_with_their_reason(tmp_path: Path) -> None:
    # A real pytest's junit XML, as the inner runs write it: the no-skip
    # assertions above name each skipped test and why, not just a count.
    (tmp_path / "test_two.py").write_text(
        "import pytest\n"
        "def test_runs():\n    pass\n"
        "def test_skips():\n    pytest.skip('node_exporter unavailable (network?): x')\n"
        "@pytest.mark.skipif(True, reason='never here')\ndef test_marked():\n    pass\n")
    junit = tmp_path / "junit.xml"
    subprocess.run(["python3", "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o",
                    "addopts=", f"--junitxml={junit}", "test_two.py"], cwd=tmp_path,
                   capture_output=True, check=True)
    suite = ET.parse(junit).getroot()
    assert skipped_tests(suite[0] if suite.tag == "testsuites" else suite) == [
        "test_two::test_skips: node_exporter unavailable (network?): x",
        "test_two::test_marked: never here",
    ]


def test_root_is_the_release(release_root: Root) -> None:
    done = release_root.run("slurmd -V; python3 -c 'import sys; print(sys.version)'")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[:2] == ["slurm-wlm", done.stdout.split()[1]]
    assert done.stdout.split()[1].startswith(release_root.release.slurm + "."), done.stdout


def test_scenarios_pass_on_release(release_root: Root) -> None:
    files = ("tests/slurm",)
    counts, skipped = _inner_pytest(release_root, files, "/tmp/junit-plain.xml")
    assert counts["skipped"] == 0, _skip_report(counts, skipped)
    assert counts["tests"] == _host_collection(files), counts


def _elf_symbol_bytes(path: Path, name: str, size: int) -> bytes | None:
    from elftools.elf.elffile import ELFFile
    from elftools.elf.sections import SymbolTableSection

    with open(path, "rb") as fh:
        elf = ELFFile(fh)
        dynsym = elf.get_section_by_name(".dynsym")
        assert isinstance(dynsym, SymbolTableSection)
        for sym in dynsym.iter_symbols():
            if sym.name == name and sym["st_shndx"] != "SHN_UNDEF":
                section = elf.get_section(sym["st_shndx"])
                offset = sym["st_value"] - section["sh_addr"]
                return section.data()[offset:offset + size]
    return None


def _root_constant(root: Root, header: str, expr: str) -> int:
    """The value of a C constant (macro or enum) as the root's compiler sees it."""
    src = f"#include <stdio.h>\n#include <{header}>\nint main(void) {{ " \
          f"printf(\"%ld\\n\", (long)({expr})); return 0; }}\n"
    (root.path / "tmp" / "const.c").write_text(src)
    done = root.run("gcc -o /tmp/const /tmp/const.c && /tmp/const")
    assert done.returncode == 0, done.stderr
    return int(done.stdout.strip())


def test_plugin_was_built_for_the_release(release_root: Root) -> None:
    """After the scenario run: the plugin the root's make built carries the
    root's Slurm version, and the 25.05+ init-failure mode only where it exists."""
    plugin = release_root.path / SRC.lstrip("/") / "build" / "spank_grace_policy.so"
    if not plugin.exists():
        release_root.run("make plugin", cwd=SRC, timeout=600)
    want = _root_constant(release_root, "slurm/slurm_version.h", "SLURM_VERSION_NUMBER")
    got = _elf_symbol_bytes(plugin, "plugin_version", 4)
    assert got is not None and int.from_bytes(got, "little") == want
    mode = _elf_symbol_bytes(plugin, "slurm_spank_init_failure_mode", 4)
    if want >= (25 << 16) + (5 << 8):
        job_failure = _root_constant(release_root, "slurm/spank.h", "ESPANK_JOB_FAILURE")
        assert mode is not None and int.from_bytes(mode, "little") == job_failure
    else:
        assert mode is None


def test_scenarios_pass_with_contain_spank(release_root: Root) -> None:
    """On the newest selected release only (the budget of make test: a second
    pass per release costs ~1 min; 24.11 was seen passing it too, docs/SPANK.md)."""
    version = tuple(int(x) for x in release_root.release.slurm.split("."))
    if version < (24, 5):
        pytest.skip(f"contain_spank is Slurm 24.05+; this root is {version}")
    newest = max(_selected_roots(), key=lambda n: tuple(int(x) for x in n.split(".")))
    if release_root.release.slurm != newest:
        pytest.skip(f"contain_spank runs on the newest selected release ({newest}) only; "
                    f"GRACE_SLURM_RELEASES={release_root.release.slurm} runs it here")
    counts, skipped = _inner_pytest(release_root, CONTAIN_SPANK_FILES, "/tmp/junit-contain.xml",
                                    env={"GRACE_SLURMD_PARAMETERS": "contain_spank"})
    assert counts["skipped"] == 0, _skip_report(counts, skipped)
    assert counts["tests"] == _host_collection(CONTAIN_SPANK_FILES), counts


def _newest() -> str:
    return max(_selected_roots(), key=lambda n: tuple(int(x) for x in n.split(".")))


def test_containers_in_the_newest_release(release_root: Root) -> None:
    """The container files (CONTAINERS: pyxis 0.24.0 + enroot 4.1.2 built here,
    runc, Apptainer's SIFs) inside the newest release's root, entered by
    pivot_root: clean images run, the other architecture and 4 KiB programs
    are refused, nothing skipped. Its deps are installed into the overlay."""
    if release_root.release.slurm != _newest():
        pytest.skip(f"container steps run on the newest selected release ({_newest()}) "
                    f"only; GRACE_SLURM_RELEASES={release_root.release.slurm} runs them here")
    done = release_root.run("apt-get update -qq\n"
                            f"apt-get install -y -qq {' '.join(CONTAINER_DEBS)} >/dev/null",
                            timeout=1200)
    if done.returncode != 0:
        _give_up(f"container deps not installable in the {release_root.release.slurm} "
                 f"root: {done.stderr[-1500:]}")
    from . import containers

    try:  # the pinned pyxis/enroot tarballs the inner run builds from
        third_party = containers.third_party_dir()
    except containers.CorpusUnavailable as exc:
        _give_up(str(exc))
    inside = "/src/third_party"
    shutil.copytree(third_party, release_root.path / inside.lstrip("/"), dirs_exist_ok=True)
    files = CONTAINERS
    others = tuple(i for i in INNER_IGNORE if i not in CONTAINERS)
    counts, skipped = _inner_pytest(release_root, files, "/tmp/junit-containers.xml",
                                    env={"GRACE_THIRD_PARTY": inside}, ignore=others,
                                    pivot=True)
    assert counts["skipped"] == 0, _skip_report(counts, skipped)
    assert counts["tests"] == _host_collection(files, others) > 10, counts


def test_closing_a_root_kills_what_runs_inside_and_unmounts(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """What a failed test leaves in a root (a daemon in its own session, a
    mount of its own) is gone after close(), found by pid and by mountinfo."""
    if not _deb_releases():
        pytest.skip("GRACE_SLURM_RELEASES=none: no release root")
    name = _deb_releases()[0]
    root = _open(name, tmp_path_factory.mktemp("close"))
    try:
        started = root.run("setsid sleep 600 </dev/null >/dev/null 2>&1 & echo $!\n"
                           "mkdir -p /mnt/t && mount -t tmpfs tmpfs /mnt/t")
        assert started.returncode == 0, started.stderr
        inside = roots.pids_inside(root.path)
        assert inside, "the daemon should be running inside the root"
        assert roots._mounts_under(root.path)
    finally:
        root.close()
    assert not set(inside) & set(roots.pids_inside(root.path))
    assert roots._mounts_under(root.path) == []
    assert not root.base.exists()


def test_a_pivoted_root_is_its_namespace_root_and_closes(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """run(pivot=True): the overlay is the mount namespace's root (a user
    namespace can be made, which a chroot refuses; the host's / is not
    reachable), and a daemon left inside is still found and killed."""
    if not _deb_releases():
        pytest.skip("GRACE_SLURM_RELEASES=none: no release root")
    name = _deb_releases()[0]
    root = _open(name, tmp_path_factory.mktemp("pivot"))
    try:
        chrooted = root.run("unshare --user --map-root-user true")
        assert chrooted.returncode != 0  # the kernel's chroot rule, the reason for pivot
        started = root.run("setsid sleep 600 </dev/null >/dev/null 2>&1 & echo $!\n"
                           "unshare --user --map-root-user true\n"
                           "test ! -e /.oldroot/proc && findmnt -n -o TARGET /", pivot=True)
        assert started.returncode == 0, started.stderr
        assert started.stdout.split()[1] == "/", started.stdout
        daemon = int(started.stdout.split()[0])
        assert daemon in roots.pids_inside(root.path)
    finally:
        root.close()
    assert daemon not in roots.pids_inside(root.path)
    assert not root.base.exists()


def test_a_pivoted_root_can_hold_a_newer_namespace(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """What job_container/tmpfs does for every job from slurmd's namespace
    (bind a newly made mount namespace's file, BasePath/NODE/JOB/.ns, to
    hold it) works in a pivoted root whichever CPU the new namespace is
    made on. The run starts pinned to the CPU that hands out the highest
    namespace ids now (the script may use every CPU, as slurmd's steps
    do): without roots.Root._pivot_argv's choice its
    namespace gets a higher id than one made next on another CPU, and the
    kernel refuses that bind (EINVAL: the 26.05 root's "ns base mount
    failed", its jobs requeued and left pending)."""
    if not _deb_releases():
        pytest.skip("GRACE_SLURM_RELEASES=none: no release root")
    cpus = sorted(os.sched_getaffinity(0))
    ids = roots.mntns_next_ids(cpus)
    if len(ids) < 2:
        pytest.skip(f"namespace ids per CPU unknown here (CPUs {cpus}, ids {ids})")
    worst = max(ids, key=ids.__getitem__)
    script = "".join(
        f"taskset -c {cpu} unshare --mount sleep 60 & pid=$!; i=0\n"
        # Until the child has its own namespace (bounded: 10 s).
        f'while [ "$(readlink /proc/$pid/ns/mnt)" = "$(readlink /proc/self/ns/mnt)" ] '
        f"&& [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done\n"
        f"touch /tmp/ns-{cpu}\n"
        f"if mount --bind /proc/$pid/ns/mnt /tmp/ns-{cpu}; then echo bound-{cpu}; "
        f"umount /tmp/ns-{cpu}; else echo refused-{cpu}; fi\n"
        "kill $pid\n" for cpu in cpus)
    root = _open(_deb_releases()[0], tmp_path_factory.mktemp("nsid"))
    try:
        os.sched_setaffinity(0, {worst})
        try:
            done = root.run(script, pivot=True, timeout=120, cpus=cpus)
        finally:
            os.sched_setaffinity(0, cpus)
    finally:
        root.close()
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [f"bound-{cpu}" for cpu in cpus], (ids, done.stdout,
                                                                     done.stderr)


def test_the_freezer_lock_is_one_file_for_the_host_and_the_roots(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """test_cgroup's clusters take turns with the machine's freezer
    hierarchy by a lock file in the tests' cache (they share its cgroup
    names, test_cgroup's docstring). A root, entered by chroot or by
    pivot_root, must lock that very file: while the host holds it, neither
    gets it; once released, both do. (A file of its own beside it: the real
    one may be held by a test_cgroup running now.)"""
    if not _deb_releases():
        pytest.skip("GRACE_SLURM_RELEASES=none: no release root")
    from .test_cgroup import freezer_lock

    lock = freezer_lock().with_name(f"probe-{os.getpid()}.lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    probe = ("python3 -c 'import fcntl, sys\n"
             "try:\n fcntl.flock(open(sys.argv[1], \"a\"), fcntl.LOCK_EX | fcntl.LOCK_NB)\n"
             "except BlockingIOError:\n print(\"held\")\n"
             f"else:\n print(\"free\")' {shlex.quote(str(lock))}")
    root = _open(_deb_releases()[0], tmp_path_factory.mktemp("lock"))
    try:
        seen = []
        with open(lock, "a") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                seen += [root.run(probe).stdout.strip(), root.run(probe, pivot=True).stdout.strip()]
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)
        seen += [root.run(probe).stdout.strip(), root.run(probe, pivot=True).stdout.strip()]
    finally:
        root.close()
        lock.unlink(missing_ok=True)
    assert seen == ["held", "held", "free", "free"]
