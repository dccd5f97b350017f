"""The packages as admins use them (issue 9): ``make deb`` and ``make rpm``.

.deb, per selected release, in a fresh overlay of that release's Debian root
(22.05: a Debian 12 root, with the .deb ``make deb`` built on this machine;
24.11 and 26.05: built inside the root against its Slurm and python3):
``dpkg -i``, Slurm started with the packaged plugstack snippet and config
(tests/slurm/pkgcheck.py: warn as shipped, then enforce as the README says),
``dpkg --purge`` leaves the root as it was; and the 22.05 package is refused
by dpkg on a newer release (the upgrade hazard the pin exists for).

.rpm, built on this machine: the file list, config files, scriptlets and pin;
``rpm -i --root`` into an empty root (dependencies and scriptlets cannot be
satisfied there: without --nodeps rpm refuses, naming the Slurm pin; with
--nodeps --noscripts it installs, verifies and erases cleanly), and into a
Debian 12 root with --nodeps, where the scriptlets run for real.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from . import roots
from .roots import RELEASES, Root
from .test_matrix import SRC, _give_up, _open

pytestmark = [pytest.mark.slurm, pytest.mark.network]

#: Paths whose changes are the package manager's own bookkeeping or the
#: test's scratch space, not something the package left behind.
NOT_COMPARED = ("proc", "sys", "dev", "src", "tmp", "root", "var/lib/dpkg", "var/lib/apt",
                "var/cache/apt", "var/cache/debconf", "var/log/dpkg.log", "var/log/apt",
                "var/log/alternatives.log", "var/lib/rpm", "var/lib/rpm-state",
                "usr/lib/sysimage/rpm", "etc/grace-test-ca.crt", "etc/resolv.conf",
                # man-db's index, rebuilt by its trigger whenever man pages come or go
                "var/cache/man")


def _host_release() -> str:
    done = subprocess.run(["make", "-s", "-C", str(roots.REPO), "--eval",
                           "x: ; @echo $(SLURM_RELEASE) $(SLURM_NEXT)", "x"],
                          capture_output=True, text=True, check=True)
    return done.stdout.strip()


def snapshot(top: Path) -> dict[str, tuple[object, ...]]:
    """Every path under ``top`` (but :data:`NOT_COMPARED`): type, and for
    files size and mtime, so a file changed in place shows too."""
    found: dict[str, tuple[object, ...]] = {}
    # The test cache is bound into the root at its host path (roots.py), and
    # other parts write to it meanwhile (GRACE_TEST_CACHE may put it outside
    # /root): none of it is the package's.
    cached = str(roots._test_cache()).lstrip("/")
    skip = {str(top / p) for p in (*NOT_COMPARED, cached)}
    for dirpath, dirnames, filenames in os.walk(top):
        dirnames[:] = [d for d in dirnames if os.path.join(dirpath, d) not in skip]
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            if path in skip:
                continue
            st = os.lstat(path)
            rel = os.path.relpath(path, top)
            if os.path.isdir(path) and not os.path.islink(path):
                found[rel] = ("dir", st.st_mode)
            else:
                found[rel] = ("file", st.st_mode, st.st_size, st.st_mtime_ns)
    return found


def _diff(before: dict[str, tuple[object, ...]], after: dict[str, tuple[object, ...]],
          *, unowned_dirs: bool = False) -> dict[str, list[str]]:
    """What changed. ``unowned_dirs``: directories rpm created for its files
    and leaves (in an EL root the ``filesystem`` package owns them) are not
    counted; a file left in them still is."""
    added = set(after) - set(before)
    if unowned_dirs:
        added = {p for p in added if after[p][0] != "dir"}
    return {"added": sorted(added)[:40],
            "removed": sorted(set(before) - set(after))[:40],
            "changed": sorted(p for p in set(before) & set(after)
                              if before[p] != after[p])[:40]}


@pytest.fixture(scope="session")
def host_deb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``make deb`` on this machine (Debian 12, Slurm 22.05)."""
    build = tmp_path_factory.mktemp("deb-build")
    done = subprocess.run(["make", "-C", str(roots.REPO), "deb", f"BUILD={build}"],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    [deb] = sorted((build / "deb").glob("grace-policy_*.deb"))
    return deb


@pytest.fixture(scope="session")
def host_rpm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``make rpm`` on this machine."""
    build = tmp_path_factory.mktemp("rpm-build")
    done = subprocess.run(["make", "-C", str(roots.REPO), "rpm", f"BUILD={build}"],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    [rpm] = sorted((build / "rpm" / "RPMS").rglob("grace-policy-*.rpm"))
    return rpm


def test_host_deb_is_pinned_to_the_host_release(host_deb: Path) -> None:
    release, nxt = _host_release().split()
    fields = subprocess.run(["dpkg-deb", "-f", str(host_deb), "Version", "Depends", "Breaks",
                             "Recommends"],
                            capture_output=True, text=True, check=True).stdout
    assert f"+slurm{release}" in fields
    # enroot's images are lzo by default: liblzo2 reads them in C.
    assert "Recommends: liblzo2-2" in fields.splitlines()
    assert f"slurm-client (>= {release}~), slurm-client (<< {nxt}~)" in fields
    assert f"slurmd (<< {release}~)" in fields and f"slurmd (>= {nxt}~)" in fields
    listing = subprocess.run(["dpkg-deb", "-c", str(host_deb)], capture_output=True,
                             text=True, check=True).stdout
    for path in ("./usr/lib/x86_64-linux-gnu/slurm-wlm/spank_grace_policy.so",
                 "./usr/lib/x86_64-linux-gnu/grace-policy/grace_policy_py.so",
                 "./usr/lib/x86_64-linux-gnu/grace-policy/python/grace_policy/__init__.py",
                 "./usr/lib/x86_64-linux-gnu/grace-policy/python/pydantic/__init__.py",
                 "./usr/bin/grace-policy", "./etc/slurm/grace-policy.toml",
                 "./etc/slurm/plugstack.conf.d/zz-grace-policy.conf",
                 "./etc/logrotate.d/grace-policy", "./usr/lib/tmpfiles.d/grace-policy.conf",
                 "./usr/share/man/man1/grace-policy.1.gz",
                 "./usr/share/man/man5/grace-policy.toml.5.gz",
                 "./usr/share/man/man8/spank_grace_policy.8.gz",
                 "./usr/share/doc/grace-policy/examples/grace-policy.toml"):
        assert path in listing, path


@pytest.fixture(scope="module", params=[n for n in roots.selected() if n != roots.HOST]
                + (["22.05"] if roots.HOST in roots.selected() else []) or [None],
                ids=lambda n: f"deb-slurm-{n}" if n else "none-selected")
def deb_root(request: pytest.FixtureRequest,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[Root]:
    if request.param is None:
        pytest.skip("GRACE_SLURM_RELEASES=none: no release root")
    root = _open(request.param, tmp_path_factory.mktemp("deb-roots"))
    try:
        yield root
    finally:
        root.close()


def test_deb_installs_runs_and_purges(deb_root: Root, host_deb: Path) -> None:
    release = deb_root.release
    if release.slurm == "22.05":
        deb_in_root = "/tmp/" + host_deb.name
        shutil.copy2(host_deb, deb_root.path / "tmp" / host_deb.name)
    else:
        built = deb_root.run("make deb BUILD=/tmp/debbuild", cwd=SRC, timeout=900)
        assert built.returncode == 0, built.stdout[-4000:] + built.stderr[-4000:]
        [deb] = sorted((deb_root.path / "tmp" / "debbuild" / "deb").glob("grace-policy_*.deb"))
        deb_in_root = "/" + str(deb.relative_to(deb_root.path))
        assert f"+slurm{release.slurm}_" in deb.name
    before = snapshot(deb_root.path)

    if release.slurm != "22.05":
        # The 22.05 package on a newer Slurm: dpkg refuses to unpack it.
        shutil.copy2(host_deb, deb_root.path / "tmp" / host_deb.name)
        refused = deb_root.run(f"dpkg -i /tmp/{host_deb.name}")
        assert refused.returncode != 0
        assert "grace-policy" in refused.stderr and "slurmd" in refused.stderr, refused.stderr
        status = deb_root.run("dpkg-query -W -f='${Status}' grace-policy 2>/dev/null || true")
        assert "installed" not in status.stdout.replace("not-installed", ""), status.stdout
        assert _diff(before, snapshot(deb_root.path)) == {"added": [], "removed": [],
                                                          "changed": []}

    installed = deb_root.run(f"dpkg -i {deb_in_root}")
    assert installed.returncode == 0, installed.stdout + installed.stderr
    assert (deb_root.path / "etc/slurm/grace-policy.toml.compiled.json").exists()
    version = deb_root.run("grace-policy --version")
    assert version.returncode == 0 and version.stdout.startswith("grace-policy "), version

    seen_done = deb_root.run("python3 -m tests.slurm.pkgcheck /tmp/pkgcheck.json", cwd=SRC,
                             timeout=600)
    assert seen_done.returncode == 0, seen_done.stderr[-4000:]
    seen = json.loads((deb_root.path / "tmp" / "pkgcheck.json").read_text())
    assert "error" not in seen, seen
    prefix = "grace-policy: "
    # Shipped config: warn. The foreign program is reported and still exec'd.
    assert seen["warn_native"]["rc"] == 0 and prefix not in seen["warn_native"]["stderr"]
    assert f"{prefix}ERROR exe-arch-mismatch" in seen["warn_foreign"]["stderr"], seen
    assert "the step runs anyway" in seen["warn_foreign"]["stderr"]
    assert "step not started" not in seen["warn_foreign"]["stderr"]
    assert "warn" in seen["audit_after_warn"], seen["audit_after_warn"]
    # The admin's switch to enforce: refused before exec; native still runs.
    assert seen["compile"]["rc"] == 0, seen["compile"]
    assert seen["enforce_foreign"]["rc"] != 0
    assert "step not started" in seen["enforce_foreign"]["stderr"], seen["enforce_foreign"]
    assert seen["enforce_native"]["rc"] == 0, seen["enforce_native"]
    assert seen["node_state"] in ("idle", "mixed"), seen["node_state"]

    purged = deb_root.run("dpkg --purge grace-policy")
    assert purged.returncode == 0, purged.stdout + purged.stderr
    assert _diff(before, snapshot(deb_root.path)) == {"added": [], "removed": [], "changed": []}


# -- RPM ---------------------------------------------------------------------

def _rpm_query(rpm: Path, *what: str) -> str:
    return subprocess.run(["rpm", "-qp", *what, str(rpm)], capture_output=True, text=True,
                          check=True).stdout


def test_rpm_files_config_and_pin(host_rpm: Path) -> None:
    release, nxt = _host_release().split()
    files = set(_rpm_query(host_rpm, "-l").split())
    for path in ("/usr/lib64/slurm/spank_grace_policy.so",
                 "/usr/lib64/grace-policy/grace_policy_py.so",
                 "/usr/lib64/grace-policy/python/grace_policy/__init__.py",
                 "/usr/lib64/grace-policy/python/pydantic/__init__.py",
                 "/usr/lib64/grace-policy/python/cffi/__init__.py",
                 "/usr/bin/grace-policy", "/etc/slurm/grace-policy.toml",
                 "/etc/slurm/plugstack.conf.d/zz-grace-policy.conf",
                 "/etc/logrotate.d/grace-policy", "/usr/lib/tmpfiles.d/grace-policy.conf",
                 "/usr/share/man/man1/grace-policy.1", "/usr/share/man/man5/grace-policy.toml.5",
                 "/usr/share/man/man8/spank_grace_policy.8"):
        assert path in files, path
    assert set(_rpm_query(host_rpm, "-c").split()) == {
        "/etc/slurm/grace-policy.toml", "/etc/slurm/plugstack.conf.d/zz-grace-policy.conf",
        "/etc/logrotate.d/grace-policy"}
    requires = _rpm_query(host_rpm, "--requires").splitlines()
    assert f"slurm >= {release}" in requires and f"slurm < {nxt}" in requires, requires
    assert _rpm_query(host_rpm, "--recommends").splitlines() == ["lzo"]
    conflicts = _rpm_query(host_rpm, "--conflicts").splitlines()
    assert f"slurm-slurmd < {release}" in conflicts and f"slurm-slurmd >= {nxt}" in conflicts
    scripts = _rpm_query(host_rpm, "--scripts")
    assert "postinstall scriptlet" in scripts and "config check --compile" in scripts
    assert "postuninstall scriptlet" in scripts and '"$1" = 0' in scripts


def test_rpm_into_an_empty_root(host_rpm: Path, tmp_path: Path) -> None:
    release, nxt = _host_release().split()
    empty = tmp_path / "empty"
    empty.mkdir()
    subprocess.run(["rpm", "--root", str(empty), "--initdb"], check=True)
    refused = subprocess.run(["rpm", "-i", "--root", str(empty), str(host_rpm)],
                             capture_output=True, text=True, check=False)
    assert refused.returncode != 0
    assert f"slurm >= {release} is needed" in refused.stderr, refused.stderr
    assert f"slurm < {nxt} is needed" in refused.stderr
    before = snapshot(empty)
    # No /bin/sh in an empty root: the scriptlets are run in the next test.
    done = subprocess.run(["rpm", "-i", "--root", str(empty), "--nodeps", "--noscripts",
                           str(host_rpm)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert (empty / "usr/lib64/slurm/spank_grace_policy.so").is_file()
    verify = subprocess.run(["rpm", "-V", "--root", str(empty), "--nodeps", "grace-policy"],
                            capture_output=True, text=True, check=False)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    erased = subprocess.run(["rpm", "-e", "--root", str(empty), "--noscripts", "grace-policy"],
                            capture_output=True, text=True, check=False)
    assert erased.returncode == 0, erased.stderr
    assert _diff(before, snapshot(empty), unowned_dirs=True) == {
        "added": [], "removed": [], "changed": []}


def test_rpm_scriptlets_in_a_debian_12_root(host_rpm: Path, tmp_path: Path) -> None:
    """The closest to an EL node here: a root with /bin/sh and the python3 the
    package was built for, where rpm runs the scriptlets chrooted."""
    if "22.05" not in RELEASES or roots.HOST not in roots.selected():
        pytest.skip("the host release is not selected (GRACE_SLURM_RELEASES)")
    try:
        root = roots.open_root(RELEASES["22.05"], tmp_path)
    except roots.CorpusUnavailable as exc:
        _give_up(f"release root 22.05 unavailable: {exc}")
    try:
        subprocess.run(["rpm", "--root", str(root.path), "--initdb"], check=True)
        before = snapshot(root.path)
        done = subprocess.run(["rpm", "-i", "--root", str(root.path), "--nodeps",
                               str(host_rpm)], capture_output=True, text=True, check=False)
        assert done.returncode == 0 and "scriptlet failed" not in done.stderr, done.stderr
        assert (root.path / "etc/slurm/grace-policy.toml.compiled.json").exists()
        snippet = (root.path / "etc/slurm/plugstack.conf.d/zz-grace-policy.conf").read_text()
        assert "required /usr/lib64/slurm/spank_grace_policy.so config=" in snippet
        version = root.run("grace-policy --version")
        assert version.returncode == 0 and version.stdout.startswith("grace-policy "), version
        erased = subprocess.run(["rpm", "-e", "--root", str(root.path), "grace-policy"],
                                capture_output=True, text=True, check=False)
        assert erased.returncode == 0, erased.stderr
        assert _diff(before, snapshot(root.path), unowned_dirs=True) == {
            "added": [], "removed": [], "changed": []}
    finally:
        root.close()
