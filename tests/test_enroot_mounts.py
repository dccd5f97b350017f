"""What enroot 4.1.2 mounts from the host into a pyxis container
(grace_policy/container/enroot.py), read from a real enroot install: the
script built from the pinned tarball (tests/slurm/containers.py), with its
configuration where a site keeps it, and fstab files as admins write them.
The real mounts are tests/slurm/test_enroot_mounts.py's oracle."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "slurm"))

from grace_policy.container.enroot import enroot_environ, enroot_mounts
from grace_policy.container.pyxis import mounts


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import containers

    return containers.site_enroot_or_skip(tmp_path_factory.mktemp("site"))


def _fstab(site: Path, name: str, text: str) -> None:
    (site / "etc/enroot/mounts.d" / name).write_text(text)


def test_site_and_user_mounts_d_in_enroot_order(site: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / ".config/enroot/mounts.d").mkdir(parents=True)
    (home / ".config/enroot/mounts.d/10-mine.fstab").write_text(
        f"{home}/tools /opt/tools none x-create=dir,bind,ro\n")
    _fstab(site, "50-site.fstab",
           "# the site's software\n/apps /opt/apps none x-create=dir,rbind,ro,nosuid 0 -1\n"
           "${SITE_SCRATCH} /scratch none bind\n"
           "tmpfs /opt/tmp tmpfs x-create=dir,rw\n")
    _fstab(site, "40-early.fstab", "/early /opt/early none bind\n")
    _fstab(site, "60-ignored.conf", "/nope /opt/nope none bind\n")
    got = enroot_mounts({"HOME": str(home), "SITE_SCRATCH": "/lustre/scratch"},
                        search=str(site / "bin"))
    assert got is not None
    # The built-in 20-config.fstab binds /etc/hosts and friends (files), the
    # pseudo file systems of 10-system.fstab are left out.
    assert ("/etc/hosts", "/etc/hosts") in got
    assert not any(inner.startswith(("/proc", "/sys", "/dev")) for inner, _ in got)
    ours = [m for m in got if not m[0].startswith("/etc/")]
    assert ours == [("/opt/early", "/early"), ("/opt/apps", "/apps"),
                    ("/scratch", "/lustre/scratch"), ("/opt/tools", f"{home}/tools")]


def test_enroot_conf_and_what_pyxis_withholds(site: Path, tmp_path: Path) -> None:
    """enroot.conf can move the user config; the job cannot move the site's
    (pyxis withholds ENROOT_SYSCONF_PATH from enroot's environment)."""
    other = tmp_path / "elsewhere"
    (other / "mounts.d").mkdir(parents=True)
    (other / "mounts.d/a.fstab").write_text("/data /data none bind\n")
    conf = site / "etc/enroot/enroot.conf"
    saved = conf.read_text()
    try:
        conf.write_text(saved + f"ENROOT_CONFIG_PATH {other}\n")
        got = enroot_mounts({"HOME": str(tmp_path)}, search=str(site / "bin")) or []
        assert ("/data", "/data") in got
        # The job's own value comes first (config::export keeps it).
        got = enroot_mounts({"HOME": str(tmp_path), "ENROOT_CONFIG_PATH": str(tmp_path)},
                            search=str(site / "bin")) or []
        assert ("/data", "/data") not in got
        # Values as admins write them: quoted, with $VAR / ${VAR} (eval echo).
        conf.write_text(saved + '#ENROOT_CONFIG_PATH /nope\nENROOT_CONFIG_PATH="$WHERE/${LEAF}"\n')
        got = enroot_mounts({"HOME": str(tmp_path), "WHERE": str(tmp_path), "LEAF": "elsewhere"},
                            search=str(site / "bin")) or []
        assert ("/data", "/data") in got
        conf.write_text(saved + "ENROOT_CONFIG_PATH $(echo /x)\n")  # not guessed: the default
        got = enroot_mounts({"HOME": str(tmp_path)}, search=str(site / "bin")) or []
        assert ("/data", "/data") not in got
    finally:
        conf.write_text(saved)
    got = enroot_mounts({"HOME": str(tmp_path), "ENROOT_SYSCONF_PATH": str(other)},
                        search=str(site / "bin")) or []
    assert ("/data", "/data") not in got


def test_home_mount_follows_pyxis_then_env_then_enroot_conf(site: Path, tmp_path: Path
                                                            ) -> None:
    home = str(tmp_path / "u")
    search = str(site / "bin")
    assert (home, home) not in (enroot_mounts({"HOME": home}, search=search) or [])
    assert (home, home) in (enroot_mounts({"HOME": home, "ENROOT_MOUNT_HOME": "yes"},
                                          search=search) or [])
    # pyxis' --no-container-mount-home wins over the job's variable.
    assert (home, home) not in (enroot_mounts({"HOME": home, "ENROOT_MOUNT_HOME": "y"},
                                              mount_home=False, search=search) or [])
    assert ("/root", home) in (enroot_mounts({"HOME": home, "ENROOT_REMAP_ROOT": "true"},
                                             mount_home=True, search=search) or [])
    conf = site / "etc/enroot/enroot.conf"
    saved = conf.read_text()
    try:
        conf.write_text(saved + "ENROOT_MOUNT_HOME yes\n")
        assert (home, home) in (enroot_mounts({"HOME": home}, search=search) or [])
        # "no" in the job's environment unsets it (config::fini).
        assert (home, home) not in (enroot_mounts({"HOME": home, "ENROOT_MOUNT_HOME": "no"},
                                                  search=search) or [])
    finally:
        conf.write_text(saved)


def test_no_enroot_found_keeps_the_flags_own_rule(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    env = {"HOME": "/home/u"}
    assert enroot_mounts(env, search=str(tmp_path)) is None
    monkeypatch.setenv("PATH", str(tmp_path))  # slurmstepd's PATH: no enroot on it
    assert mounts({"mount_home": "1", "mounts": "/a:/b"}, env) == [
        ("/home/u", "/home/u"), ("/b", "/a")]
    assert mounts({"mount_home": "0"}, {**env, "PYXIS_CONTAINER_MOUNT_HOME": "1"}) == []
    assert mounts({}, {**env, "PYXIS_CONTAINER_MOUNT_HOME": "1"}) == [("/home/u", "/home/u")]


def test_the_images_own_fstab_comes_first(tmp_path: Path) -> None:
    """enroot reads the image's /etc/fstab before mounts.d (runtime.sh)."""
    env = {"HOME": str(tmp_path), "DATA": "/lustre/data", "PATH": "/job/bin"}
    got = mounts({"mounts": "/x:/opt/x"}, env,
                 "${DATA} /data none x-create=dir,bind\n${PATH} /p none bind\n")
    # PATH is one of what pyxis withholds from enroot: empty there.
    assert got[0] == ("/data", "/lustre/data") and ("/p", "/job/bin") not in got
    assert got[-1] == ("/opt/x", "/x")


def test_environ_d_of_the_site_then_the_user(site: Path, tmp_path: Path) -> None:
    home = tmp_path / "h"
    (home / ".config/enroot/environ.d").mkdir(parents=True)
    (home / ".config/enroot/environ.d/x.env").write_text("B=user\n")
    envd = site / "etc/enroot/environ.d"
    (envd / "50-site.env").write_text("PATH=/opt/site/bin:${SITE_TAIL}\nB=site\nexport C='c'\n")
    try:
        got = dict(enroot_environ({"HOME": str(home), "SITE_TAIL": "/usr/bin"},
                                  search=str(site / "bin")))
    finally:
        (envd / "50-site.env").unlink()
    # enroot's own 10-terminal.env (TERM=${TERM}) is there too.
    assert got == {"TERM": "", "PATH": "/opt/site/bin:/usr/bin", "B": "user", "C": "c"}


def test_a_fifo_in_the_users_config_never_blocks_the_check(site: Path, tmp_path: Path) -> None:
    """A FIFO as ``mounts.d/*.fstab`` or ``environ.d/*.env`` (and as the
    enroot.conf drop-in) is left out at once: a blocking open would hold
    the check to its deadline and ``on_error=allow`` would let the step run
    unchecked. Run in a child with a timeout, so the old code fails the test
    instead of hanging it."""
    import os
    import subprocess

    home = tmp_path / "h"
    for sub in ("mounts.d", "environ.d"):
        (home / ".config/enroot" / sub).mkdir(parents=True)
    os.mkfifo(home / ".config/enroot/mounts.d/00-pipe.fstab")
    os.mkfifo(home / ".config/enroot/environ.d/00-pipe.env")
    (home / ".config/enroot/mounts.d/10-real.fstab").write_text("/data /data none bind\n")
    code = (
        "import sys\n"
        "from grace_policy import fsprobe\n"
        "from grace_policy.container.enroot import enroot_environ, enroot_mounts\n"
        "env = {'HOME': sys.argv[1]}\n"
        "files = fsprobe.Files.recorded()\n"
        "got = enroot_mounts(env, search=sys.argv[2], files=files)\n"
        "enroot_environ(env, search=sys.argv[2], files=files)\n"
        "rec = files.records()\n"
        "print(('/data', '/data') in got)\n"
        "print(sorted({op for op, p, a in rec if p.endswith('00-pipe.fstab')}),"
        " [a for op, p, a in rec if p.endswith('00-pipe.fstab')][:1])\n")
    repo = Path(__file__).resolve().parent.parent
    done = subprocess.run([sys.executable, "-c", code, str(home), str(site / "bin")],
                          capture_output=True, text=True, timeout=60, check=False,
                          cwd=repo)
    assert done.returncode == 0, done.stderr
    found, recorded = done.stdout.splitlines()
    assert found == "True"  # the regular file beside it still counts
    # The FIFO was stat'ed, not opened, and its answer is in the record.
    assert recorded == "['s'] ['o10000']"


def test_every_enroot_file_read_is_in_the_record(site: Path, tmp_path: Path) -> None:
    """The script, enroot.conf, the mounts.d directories (listed: a new
    ``.fstab`` changes their times) and each file: a verdict that depended
    on them is replayed only while they are the same."""
    from grace_policy import fsprobe

    home = tmp_path / "h"
    (home / ".config/enroot/mounts.d").mkdir(parents=True)
    mine = home / ".config/enroot/mounts.d/10-mine.fstab"
    mine.write_text("/data /data none bind\n")
    files = fsprobe.Files.recorded()
    enroot_mounts({"HOME": str(home)}, search=str(site / "bin"), files=files)
    rec = files.records()
    asked = {(op, path) for op, path, _a in rec}
    assert ("s", str(site / "bin/enroot")) in asked
    assert ("D", str(home / ".config/enroot/mounts.d")) in asked
    assert ("D", str(site / "etc/enroot/mounts.d")) in asked
    assert ("s", str(mine)) in asked
    assert fsprobe.still_true(rec)
    (home / ".config/enroot/mounts.d/20-new.fstab").write_text("/x /x none bind\n")
    assert not fsprobe.still_true(rec)


def test_the_job_variables_enroot_follows_are_in_the_record(
        site: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Which mounts.d enroot reads, and what its lines expand to, follow
    the job's variables (review of issue 27 item 4: a clean step cached with
    one ENROOT_CONFIG_PATH replayed for another whose mounts.d binds a
    foreign /usr/bin). Each name looked up is recorded with the job's value,
    absent ones too; the step's other variables are not."""
    from grace_policy import fsprobe, verdict_cache

    home = tmp_path / "h"
    other = tmp_path / "other"
    (other / "mounts.d").mkdir(parents=True)
    (other / "mounts.d/x.fstab").write_text("${MYBIN} /usr/bin none bind\n")
    job = {"HOME": str(home), "SLURM_STEP_ID": "3"}
    monkeypatch.setenv("PATH", str(site / "bin"))  # the enroot pyxis runs
    files = fsprobe.Files.recorded()
    base = mounts({}, job, files=files)
    rec = files.records()
    env_read = {p: a for op, p, a in rec if op == "v"}
    assert env_read["HOME"] == "=" + str(home)
    assert env_read["ENROOT_CONFIG_PATH"] == "-"
    assert env_read["XDG_CONFIG_HOME"] == "-"
    assert env_read["PYXIS_CONTAINER_MOUNT_HOME"] == "-"
    assert "SLURM_STEP_ID" not in env_read
    # The same step with the user's own ENROOT_CONFIG_PATH is another verdict.
    changed = {**job, "ENROOT_CONFIG_PATH": str(other), "MYBIN": "/x86/bin"}
    assert ("/usr/bin", "/x86/bin") not in base
    assert ("/usr/bin", "/x86/bin") in mounts({}, changed)
    text = verdict_cache.entry([], "allow", rec)
    assert text is not None
    assert verdict_cache.lookup(text, [], env=changed) is None
    assert verdict_cache.lookup(text, [], env={**job, "SLURM_STEP_ID": "4"}) == "allow"


def test_pyxis_mount_grammar(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """pyxis 0.24.0 args.c: relative sources (from the job's cwd, where
    enroot runs), relative targets (in the container), flags, ``tmpfs`` and
    ``umount``; items pyxis refuses are not mounts."""
    monkeypatch.setenv("PATH", str(tmp_path))  # no enroot: only the option's mounts
    env = {"HOME": "/home/u"}
    got = mounts({"mounts": "./x86bin:/usr/local/bin,bin:/opt/b,/a:./opt/a:ro+nosuid,"
                            "/file,/d:rel,,../up:/up"}, env, cwd="/home/u/job")
    assert got == [("/usr/local/bin", "/home/u/job/x86bin"), ("/opt/a", "/a"),
                   ("/file", "/file"), ("/up", "/home/u/up")]
    # umount takes away the latest mount at that point; tmpfs hides every
    # mount at and below it.
    got = mounts({"mounts": "/a:/opt/x,/b:/opt/x,umount:/opt/x,/c:/srv/y,/d:/srv/y/z,"
                            "tmpfs:/srv/y"}, env, cwd="/w")
    assert got == [("/opt/x", "/a")]
    # No cwd to resolve a relative source against: not guessed.
    assert mounts({"mounts": "./x:/y"}, env) == []
