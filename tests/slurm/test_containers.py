"""Container steps on a real Slurm (issue 15): pyxis 0.24.0 + enroot 4.1.2.

pyxis and enroot are built in the test run from the pinned tarballs in
``shared/third_party/`` (tests/slurm/containers.py); the images are real
Debian bookworm roots of each architecture (``mmdebstrap``, cached) with
programs compiled here, squashed with ``mksquashfs`` (lzo, enroot's
default); runc's bundles have the same roots as ``rootfs/``.
plugstack.conf lists ``required spank_pyxis.so`` before grace-policy, as the
packaged snippet's name now makes it sort.

What each scenario would show without the change it tests: a false
``exe-not-found`` warning for every container step (the program exists only
in the image), a host file at the image's path judged in its place, the
image of the other architecture reaching enroot's ``Exec format error``,
and an optional pyxis that failed letting the step exec on the host.

The steps run as root and, where it matters most (clean, other
architecture, 4 KiB programs), as ``nobody`` too: enroot is installed from
the tests' cache (under root's home) into the cluster's directory, and each
user has a HOME and XDG_RUNTIME_DIR of their own (enroot's data, cache and
runtime paths default under them).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from corpus import _give_up

from .harness import SIDE_EFFECT_C, SlurmEnv

pytestmark = pytest.mark.slurm

PREFIX = "grace-policy: "
ENROOT_EXEC_ERROR = "enroot-switchroot: failed to execute: /bin/sh: Exec format error"


@dataclass
class Pyxis:
    slurm: SlurmEnv
    plugin: Path
    work: Path
    images: dict[str, Path]

    def env(self, user: str = "root") -> dict[str, str]:
        """enroot's state for the step under ``work`` (enroot takes its data,
        runtime and temp paths from HOME, XDG_RUNTIME_DIR and TMPDIR of the
        job's environment; pyxis passes it the rest of the job's). Another
        user than root gets directories of their own, owned by them."""
        # TMPDIR stays /tmp: slurmstepd creates it after pyxis' task_init,
        # inside the container.
        # PWD: the cwd as a shell exports it (srun passes PWD on; the plugin
        # and pyxis take the job's cwd from it; cluster.run's subprocess cwd
        # does not update it).
        base = self.work if user == "root" else _user_dirs(self.work / "users", user)
        env = {"HOME": str(base / "home"), "XDG_RUNTIME_DIR": str(base / "run"),
               "TMPDIR": "/tmp", "PWD": str(self.slurm.cluster.shared)}
        if user != "root":
            # runuser sets HOME from the password file (nobody's is
            # /nonexistent): enroot's config, data and cache paths follow
            # the XDG variables first.
            home = base / "home"
            env.update(XDG_CONFIG_HOME=str(home / ".config"),
                       XDG_DATA_HOME=str(home / ".local/share"),
                       XDG_CACHE_HOME=str(home / ".cache"))
        if user == "root" and not _userns_ok():
            # In a chroot (the release matrix's roots) no user namespace can be
            # made: enroot's and pyxis' privileged mode (root, no userns).
            env["ENROOT_ALLOW_SUPERUSER"] = "y"
        return env

    def use(self, config: str = "base", pyxis: str = "required", order: str = "pyxis-first"
            ) -> None:
        ours = "required " + self.slurm.plugin_line(
            self.slurm.plugin, f"config={self.slurm.configs[config]}",
            f"audit={self.slurm.audit_log}")
        theirs = f"{pyxis} {self.plugin} runtime_path={self.work / 'pyxis-runtime'}"
        lines = [theirs, ours] if order == "pyxis-first" else [ours, theirs]
        self.slurm.cluster.set_plugstack(lines)

    def srun(self, args: list[str], user: str = "root",
             **kw: object) -> subprocess.CompletedProcess[str]:
        return self.slurm.cluster.srun(args, env=self.env(user), user=user, timeout=180,
                                       **kw)  # type: ignore[arg-type]

    def records(self, before: int) -> list[dict[str, object]]:
        return [json.loads(line) for line in self.slurm.audit_lines()[before:]]


def _slurm_major() -> int:
    done = subprocess.run(["slurmd", "-V"], capture_output=True, text=True, check=False)
    words = done.stdout.split()
    return int(words[1].split(".")[0]) if len(words) > 1 else 0


def _user_dirs(base: Path, user: str) -> Path:
    """``base/user`` with ``home`` and ``run`` owned by ``user`` (mode 700,
    as a login would make XDG_RUNTIME_DIR)."""
    import pwd

    ent = pwd.getpwnam(user)
    base.mkdir(exist_ok=True)
    base.chmod(0o755)
    mine = base / user
    for sub in ("", "home", "run"):
        path = mine / sub
        path.mkdir(exist_ok=True)
        os.chown(path, ent.pw_uid, ent.pw_gid)
        path.chmod(0o755 if not sub else 0o700)
    return mine


def _userns_ok() -> bool:
    done = subprocess.run(["unshare", "--user", "true"], capture_output=True, check=False)
    return done.returncode == 0


def _compile(cc: str, src: Path, out: Path, *flags: str) -> Path:
    subprocess.run([cc, "-O1", "-o", str(out), str(src), *flags], check=True,
                   capture_output=True, text=True)
    return out


@pytest.fixture(scope="module")
def pyxis(slurm: SlurmEnv) -> Iterator[Pyxis]:
    from . import containers

    try:
        containers.enroot_prefix()
        plugin = containers.pyxis_plugin()
        containers.debian_root("amd64")
        containers.debian_root("arm64")
    except containers.CorpusUnavailable as exc:
        _give_up(f"pyxis/enroot/Debian roots not available: {exc}")
    if shutil.which("mksquashfs") is None:
        _give_up("mksquashfs not installed (bash packaging/install-deps.sh)")
    work = slurm.cluster.root.parent / "pyxis"
    for sub in ("home", "run", "tmp", "pyxis-runtime", "src"):
        (work / sub).mkdir(parents=True, exist_ok=True)
    # pyxis runs `enroot` with slurmstepd's PATH (cluster.bin_dir is first on
    # it), as the job's user: a copy any user can run, not root's cache.
    prefix = containers.install_enroot(work / "enroot")
    for tool in (prefix / "bin").iterdir():
        link = slurm.cluster.bin_dir / tool.name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(tool)
    # srun (as the user) dlopen()s the plugin: a copy outside root's cache.
    # A new file, renamed over the old: a slurmd started with pyxis in
    # plugstack.conf has the old one mapped, and rewriting it in place
    # (truncate, write) drops the relocated pages of that mapping - slurmd
    # then crashed in pyxis' destructor at its exit.
    local = work / "spank_pyxis.so"
    fresh = work / "spank_pyxis.so.new"
    shutil.copy2(plugin, fresh)
    os.replace(fresh, local)

    src = work / "src" / "side_effect.c"
    src.write_text(SIDE_EFFECT_C)
    native = _compile("gcc", src, work / "src" / "native")
    native4k = _compile("gcc", src, work / "src" / "native-4k", "-Wl,-z,max-page-size=4096")
    native64k = _compile("gcc", src, work / "src" / "native-64k",
                         "-Wl,-z,max-page-size=65536", "-Wl,-z,common-page-size=65536")
    foreign = _compile("aarch64-linux-gnu-gcc", src, work / "src" / "foreign")
    foreign4k = _compile("aarch64-linux-gnu-gcc", src, work / "src" / "foreign-4k",
                         "-Wl,-z,max-page-size=4096")
    shared = slurm.cluster.shared
    # A host `tool` first on the job's PATH, foreign: the image's own PATH
    # (/etc/environment) finds its native one (judging the host's would
    # refuse the step).
    shadow = work / "host-bin"
    shadow.mkdir(exist_ok=True)
    shutil.copy2(foreign, shadow / "tool")
    images: dict[str, Path] = {}
    roots = {
        "clean": ("amd64", {"/opt/app/bin/tool": native}),
        "arm64": ("arm64", {"/opt/app/bin/tool": foreign, "/opt/app/bin/tool-4k": foreign4k}),
        "pages": ("amd64", {"/opt/app/bin/tool": native4k}),
        "pages64k": ("amd64", {"/opt/app/bin/tool": native64k}),
    }
    for name, (arch, files) in roots.items():
        root = containers.make_image_root(work / f"root-{name}", arch, files=files)
        images[name] = containers.mksquashfs(root, shared / f"{name}.sqsh")
    # A simulated GB200 node: [node] says aarch64 with 64 KiB pages (this
    # x86_64 machine cannot run the arm64 image; the check judges it as that
    # node would run it).
    arm = slurm.configs["base"].parent / "grace-arm64-64k.toml"
    text = slurm.configs["grace64k"].read_text()
    assert "[node]\n" in text
    arm.write_text(text.replace("[node]\n", '[node]\narch = "aarch64"\n', 1))
    arm.chmod(0o644)
    slurm.configs["arm64-64k"] = arm
    env = Pyxis(slurm=slurm, plugin=local, work=work, images=images)
    try:
        yield env
    finally:
        slurm.configs.pop("arm64-64k", None)
        slurm.use("base")


#: Who runs the steps that matter most: root, and a real unprivileged user
#: (enroot then runs as that user, in a user namespace).
USERS = pytest.mark.parametrize("user", ["root", "nobody"])


@USERS
def test_clean_image_runs_in_silence(pyxis: Pyxis, user: str) -> None:
    """The program exists only in the image: no host exe-not-found."""
    pyxis.use()
    before = len(pyxis.slurm.audit_lines())
    res = pyxis.srun(["--container-image=./clean.sqsh", "tool"], user=user)
    assert res.returncode == 0, res.stderr
    assert "side-effect program ran" in res.stdout
    assert PREFIX not in res.stderr
    [rec] = pyxis.records(before)
    assert (rec["action"], rec["rules"], rec["skipped"]) == ("allow", [], None)
    # Judged inside the image (the audit's program is IMAGE:argv0).
    assert (rec["image"], rec["program"]) == (f"{pyxis.slurm.cluster.shared}/clean.sqsh", "tool")
    import pwd

    uid = pwd.getpwnam(user).pw_uid
    assert rec["uid"] == uid
    if user != "root":
        # enroot ran as the user: its data directory is theirs.
        data = Path(pyxis.env(user)["XDG_DATA_HOME"]) / "enroot"
        assert data.is_dir() and data.stat().st_uid == uid


@USERS
def test_image_of_the_other_architecture(pyxis: Pyxis, user: str) -> None:
    """Refused with our message before pyxis starts the container; in warn
    mode it runs and enroot fails exactly as predicted."""
    pyxis.use()
    image = f"{pyxis.slurm.cluster.shared}/arm64.sqsh"
    res = pyxis.srun(["--container-image=./arm64.sqsh", "tool"], user=user)
    assert res.returncode != 0
    assert f"{PREFIX}ERROR image-arch-mismatch: {image}" in res.stderr
    assert f"{PREFIX}  without this check: {ENROOT_EXEC_ERROR}" in res.stderr
    assert "task_init_privileged() failed" in res.stderr
    assert "pyxis: printing enroot log file" not in res.stderr  # never started
    res = pyxis.srun(["-p", "warnp", "--container-image=./arm64.sqsh", "tool"], user=user)
    assert res.returncode != 0
    assert f"{PREFIX}ERROR image-arch-mismatch: {image}" in res.stderr
    assert f"{PREFIX}the step runs anyway (partition warnp, mode warn)" in res.stderr
    assert f"pyxis:     {ENROOT_EXEC_ERROR}" in res.stderr  # the real failure


@USERS
def test_4k_program_in_the_image_on_a_64k_partition(pyxis: Pyxis, user: str) -> None:
    """The simulated 64 KiB partition: the image's 4 KiB-linked program is
    refused in the loader's words; the clean image's is not."""
    pyxis.use(config="grace64k")
    res = pyxis.srun(["-p", "gb200sim", "--container-image=./pages.sqsh", "tool"], user=user)
    assert res.returncode != 0
    image = f"{pyxis.slurm.cluster.shared}/pages.sqsh"
    # The program is mapped by the kernel's ELF loader: the rule quotes what
    # execve does with it on a 64 KiB node.
    assert f"{PREFIX}ERROR page-congruence: {image}:/opt/app/bin/tool" in res.stderr
    assert "the kernel maps the program at the wrong file offsets" in res.stderr
    assert "side-effect program ran" not in res.stdout
    res = pyxis.srun(["-p", "gb200sim", "--container-image=./pages64k.sqsh", "tool"], user=user)
    # Runs: the program is 64 KiB-linked (the image's own Debian loader and
    # libc are warned about: page-overlap, a warning).
    assert res.returncode == 0 and f"{PREFIX}ERROR" not in res.stderr, res.stderr
    assert "side-effect program ran" in res.stdout


@USERS
def test_4k_aarch64_program_in_the_arm64_image_on_a_64k_partition(pyxis: Pyxis,
                                                                   user: str) -> None:
    """The Debian arm64 image on the simulated GB200 partition (aarch64,
    64 KiB pages): its 4 KiB-linked program is refused in the loader's words;
    the image's 64 KiB-linked one and its own glibc (Debian's arm64 build)
    raise nothing, so what is refused is the program, not the image."""
    pyxis.use(config="arm64-64k")
    image = f"{pyxis.slurm.cluster.shared}/arm64.sqsh"
    res = pyxis.srun(["-p", "gb200sim", "--container-image=./arm64.sqsh", "tool-4k"], user=user)
    assert res.returncode != 0
    assert f"{PREFIX}ERROR page-congruence: {image}:/opt/app/bin/tool-4k" in res.stderr
    assert "image-arch-mismatch" not in res.stderr  # the partition is aarch64
    assert "pyxis: printing enroot log file" not in res.stderr  # refused before it started
    before = len(pyxis.slurm.audit_lines())
    res = pyxis.srun(["-p", "gb200sim", "--container-image=./arm64.sqsh", "tool"], user=user)
    assert PREFIX not in res.stderr
    [rec] = pyxis.records(before)
    assert (rec["action"], rec["rules"], rec["skipped"]) == ("allow", [], None)
    # (This x86_64 node then cannot exec it: enroot's own failure, not ours.)
    assert ENROOT_EXEC_ERROR in res.stderr


def test_unreadable_image_is_skipped_with_one_audit_reason(pyxis: Pyxis) -> None:
    """A truncated squashfs: no finding, no traceback; pyxis reports its own
    failure to unpack it; the audit line says why nothing was judged."""
    pyxis.use()
    broken = pyxis.slurm.cluster.shared / "truncated.sqsh"
    broken.write_bytes(pyxis.images["clean"].read_bytes()[:4096])
    before = len(pyxis.slurm.audit_lines())
    res = pyxis.srun(["--container-image=./truncated.sqsh", "tool"])
    assert res.returncode != 0
    assert PREFIX not in res.stderr and "Traceback" not in res.stderr
    assert "pyxis:" in res.stderr
    [rec] = pyxis.records(before)
    assert rec["action"] == "allow" and "not judged" in str(rec["skipped"])


def test_host_file_at_the_image_path_decides_nothing(pyxis: Pyxis) -> None:
    """The job's PATH finds a foreign `tool` on the host; in the image, its
    own PATH finds a native one. The host's is never judged (it was refused
    before container steps were known)."""
    pyxis.use()
    path = {"PATH": f"{pyxis.work / 'host-bin'}:/usr/bin:/bin"}
    host = pyxis.slurm.cluster.srun(["tool"], env=path)
    assert host.returncode != 0 and PREFIX in host.stderr  # the host's copy is foreign
    res = pyxis.slurm.cluster.srun([f"--container-image={pyxis.images['clean']}", "tool"],
                                   env={**pyxis.env(), **path}, timeout=180)
    assert res.returncode == 0, res.stderr
    assert "side-effect program ran" in res.stdout
    assert PREFIX not in res.stderr


def test_pyxis_env_default_is_a_container_step(pyxis: Pyxis) -> None:
    """PYXIS_CONTAINER_IMAGE, pyxis' own default for --container-image."""
    pyxis.use()
    env = {**pyxis.env(), "PYXIS_CONTAINER_IMAGE": "./clean.sqsh"}
    res = pyxis.slurm.cluster.srun(["tool"], env=env, timeout=180)
    assert res.returncode == 0, res.stderr
    assert PREFIX not in res.stderr


def test_image_pyxis_cannot_import_is_pyxis_error(pyxis: Pyxis) -> None:
    """A registry image whose registry cannot be reached (no network here):
    the check's read of its manifest (issue 25, tests/slurm/test_registry.py)
    fails within the deadline and follows on_error (allow in base) like any
    check failure: a check-limit warning naming the image, no traceback;
    pyxis reports its own import failure; the audit line has the reason."""
    pyxis.use()
    before = len(pyxis.slurm.audit_lines())
    res = pyxis.srun(["--container-image=docker.invalid#none/none:1", "tool"])
    assert res.returncode != 0
    assert "pyxis:" in res.stderr
    assert f"{PREFIX}WARNING check-limit" in res.stderr and "Traceback" not in res.stderr
    [rec] = pyxis.records(before)
    assert rec["action"] == "allow"
    assert "registry image docker.invalid#none/none:1" in json.dumps(rec)


def test_optional_pyxis_that_failed_cannot_run_the_step_on_the_host(pyxis: Pyxis) -> None:
    """An optional pyxis whose container did not start: Slurm would exec
    argv on the host, which nobody judged. grace-policy, after pyxis, refuses."""
    pyxis.use(pyxis="optional")
    out = pyxis.slurm.side_file("optional-pyxis.out")
    res = pyxis.srun(["--container-image=./missing.sqsh", str(pyxis.slurm.files / "native"),
                      str(out)])
    assert res.returncode != 0
    assert not out.exists()
    assert (PREFIX + "this step was refused: it asked for a pyxis container, but the "
            "container was not started") in res.stderr
    # Without grace-policy the same step runs on the host (the hole this closes).
    pyxis.slurm.cluster.set_plugstack([f"optional {pyxis.plugin} "
                                       f"runtime_path={pyxis.work / 'pyxis-runtime'}"])
    res = pyxis.srun(["--container-image=./missing.sqsh", str(pyxis.slurm.files / "native"),
                      str(out)])
    assert res.returncode == 0 and out.read_text() == "executed\n"


def test_host_step_with_pyxis_loaded_is_judged_on_the_host(pyxis: Pyxis) -> None:
    """pyxis in the stack, no container asked: a host step as before."""
    pyxis.use()
    before = len(pyxis.slurm.audit_lines())
    foreign = pyxis.slurm.files / "foreign"
    res = pyxis.srun([str(foreign)])
    assert res.returncode != 0
    assert f"{PREFIX}ERROR exe-arch-mismatch: {foreign}" in res.stderr, res.stderr
    [rec] = pyxis.records(before)
    assert rec["action"] == "reject" and rec.get("image") is None, rec


# -- Slurm's own OCI containers (srun --container=BUNDLE, runc) ----------------


@pytest.fixture(scope="module")
def oci(slurm: SlurmEnv, pyxis: Pyxis) -> Iterator[dict[str, Path]]:
    """Bundles beside pyxis' images, and oci.conf beside slurm.conf (read by
    slurmstepd at each step); removed afterwards."""
    from . import containers

    if shutil.which("runc") is None:
        _give_up("runc not installed (bash packaging/install-deps.sh)")
    src = pyxis.work / "src"
    bundles = {
        "clean": containers.make_bundle(pyxis.work / "bundle-clean", "amd64",
                                        {"/opt/app/bin/tool": src / "native"}),
        "arm64": containers.make_bundle(pyxis.work / "bundle-arm64", "arm64",
                                        {"/opt/app/bin/tool": src / "foreign"}),
        "pages": containers.make_bundle(pyxis.work / "bundle-pages", "amd64",
                                        {"/opt/app/bin/tool": src / "native-4k"}),
    }
    for bundle in bundles.values():
        bundle.chmod(0o755)
    conf = slurm.cluster.conf.parent / "oci.conf"
    (pyxis.work / "runc").mkdir(exist_ok=True)
    conf.write_text(containers.oci_conf(pyxis.work / "runc"))
    try:
        yield bundles
    finally:
        conf.unlink()


def test_oci_clean_bundle_runs_in_silence(pyxis: Pyxis, oci: dict[str, Path]) -> None:
    """Slurm hands the plugin /bin/sh for such a step; the check judges the
    bundle's program (it exists only there: no host exe-not-found)."""
    pyxis.use()
    before = len(pyxis.slurm.audit_lines())
    res = pyxis.slurm.cluster.srun([f"--container={oci['clean']}", "/opt/app/bin/tool"])
    assert res.returncode == 0, res.stderr
    assert "side-effect program ran" in res.stdout
    assert PREFIX not in res.stderr
    [rec] = pyxis.records(before)
    assert (rec["action"], rec["rules"], rec["skipped"]) == ("allow", [], None)
    # judged in the bundle
    assert (rec["image"], rec["program"]) == (str(oci["clean"]), "/opt/app/bin/tool")


def test_oci_bundle_of_the_other_architecture(pyxis: Pyxis, oci: dict[str, Path]) -> None:
    pyxis.use()
    args = [f"--container={oci['arm64']}", "/opt/app/bin/tool"]
    res = pyxis.slurm.cluster.srun(args)
    assert res.returncode != 0
    assert PREFIX + "ERROR image-arch-mismatch: " + str(oci["arm64"]) in res.stderr
    # Refused in task_init, before runc ran (the text is only our prediction).
    assert not [line for line in res.stderr.splitlines()
                if "exec format error" in line and not line.startswith(PREFIX)]
    # warn mode: it runs, and runc fails as predicted, word for word.
    res = pyxis.slurm.cluster.srun(["-p", "warnp", *args])
    assert res.returncode != 0
    assert PREFIX + "ERROR image-arch-mismatch: " + str(oci["arm64"]) in res.stderr
    assert PREFIX + "the step runs anyway (partition warnp, mode warn)" in res.stderr
    [real] = [line for line in res.stderr.splitlines()
              if "exec format error" in line and not line.startswith(PREFIX)]
    assert real == "exec /opt/app/bin/tool: exec format error"  # runc's own line
    assert f"{PREFIX}  without this check: {real}\n" in res.stderr


def test_a_false_slurm_container_leaves_no_host_step_unjudged(pyxis: Pyxis,
                                                              oci: dict[str, Path]) -> None:
    """SLURM_CONTAINER is the user's: srun keeps an exported value. It never
    makes a host step a container step, nor names the bundle that runs."""
    pyxis.use()
    foreign = str(pyxis.slurm.files / "foreign")
    env = {"SLURM_CONTAINER": str(oci["clean"])}
    res = pyxis.slurm.cluster.srun([foreign], env=env)
    assert res.returncode != 0 and PREFIX + "ERROR" in res.stderr
    # A real --container with the variable pointing elsewhere (srun keeps it).
    res = pyxis.slurm.cluster.srun([f"--container={oci['arm64']}", "/opt/app/bin/tool"],
                                   env=env)
    assert res.returncode != 0
    if _slurm_major() < 23:
        # 22.05: judged from slurmstepd's own copy of the bundle's config.json.
        assert PREFIX + "ERROR image-arch-mismatch: " + str(oci["arm64"]) in res.stderr
    else:
        # Newer Slurm writes that copy only per task, after the plugins: the
        # bundle is known from the variable alone, so the user's false one
        # makes their own step be judged as the other bundle (the known
        # limit, docs/SECURITY.md); runc then fails as it would anyway.
        assert PREFIX not in res.stderr
        assert "exec format error" in res.stderr


def test_oci_canary_run_by_hand_is_a_host_step(pyxis: Pyxis, oci: dict[str, Path]) -> None:
    """Slurm's canary argv typed by a user, with no bundle: a host step."""
    pyxis.use()
    before = len(pyxis.slurm.audit_lines())
    canary = "echo 'this should never execute with a container'; exit 1"
    res = pyxis.slurm.cluster.srun(["/bin/sh", "-c", canary])
    assert res.returncode != 0  # its own exit 1
    [rec] = pyxis.records(before)
    assert (rec["program"], rec["skipped"], rec["image"]) == ("/bin/sh", None, None)


def test_oci_4k_program_on_a_64k_partition(pyxis: Pyxis, oci: dict[str, Path]) -> None:
    pyxis.use(config="grace64k")
    res = pyxis.slurm.cluster.srun(["-p", "gb200sim", f"--container={oci['pages']}",
                                    "/opt/app/bin/tool"])
    assert res.returncode != 0
    assert f"{PREFIX}ERROR page-congruence: {oci['pages']}:/opt/app/bin/tool" in res.stderr
    assert "side-effect program ran" not in res.stdout


def test_repeated_container_step_is_a_cache_hit_keyed_on_the_image(pyxis: Pyxis) -> None:
    """The same image and command: the second step is a verdict-cache hit
    (no Python); another image at the same path is judged again."""
    pyxis.use()
    image = pyxis.slurm.cluster.shared / "cached.sqsh"
    shutil.copy2(pyxis.images["clean"], image)
    before = len(pyxis.slurm.audit_lines())
    for _ in range(2):
        res = pyxis.srun(["--container-image=./cached.sqsh", "tool"])
        assert res.returncode == 0, res.stderr
    first, second = pyxis.records(before)
    assert (first.get("cache"), second.get("cache")) == (None, "hit")
    assert (second["image"], second["program"]) == (f"{pyxis.slurm.cluster.shared}/cached.sqsh",
                                                    "tool")
    # A host step of the same name never replays the image's entry (nor
    # the other way round): judged on the host, where `tool` is missing.
    res = pyxis.slurm.cluster.srun(["tool"], env={"PWD": str(pyxis.slurm.cluster.shared)})
    assert PREFIX + "WARNING exe-not-found" in res.stderr
    # The other architecture's image at the same path: a miss, refused.
    image.unlink()
    shutil.copy2(pyxis.images["arm64"], image)
    before = len(pyxis.slurm.audit_lines())
    res = pyxis.srun(["--container-image=./cached.sqsh", "tool"])
    assert res.returncode != 0
    assert PREFIX + "ERROR image-arch-mismatch" in res.stderr
    [rec] = pyxis.records(before)
    assert rec.get("cache") is None and rec["rules"] == ["image-arch-mismatch"]


# -- Apptainer (srun apptainer exec IMG.sif CMD) ---------------------------------


@pytest.fixture(scope="module")
def sifs(slurm: SlurmEnv, pyxis: Pyxis) -> dict[str, Path]:
    """SIFs built by Apptainer 1.4.5 (a Debian sid root, tests/image/sif_root.py)
    and that root's real ``apptainer`` as the step's program where this
    host's glibc starts it. On Debian 12 it needs GLIBC_2.38 and is refused
    on its own (lib-version-missing, tests/image/test_apptainer_steps.py),
    so a program built here under that name stands in: what is tested is
    what the plugin decides about the image before apptainer would start."""
    import os

    from corpus import CorpusUnavailable
    from image.roots import make_root as image_root
    from image.sif_root import apptainer_root, build_sif

    if shutil.which("mmdebstrap") is None or os.geteuid() != 0:
        _give_up("building SIFs needs root and mmdebstrap")
    out: dict[str, Path] = {}
    try:
        app = apptainer_root() / "usr/bin/apptainer"
        # srun runs it as given; the user must be able to read it.
        host = pyxis.work / "host-apptainer"
        host.mkdir(exist_ok=True)
        shutil.copy2(app, host / "apptainer")
        if subprocess.run([str(app), "version"], capture_output=True,
                          timeout=60).returncode != 0:
            (host / "standin.c").write_text("int main(void) { return 1; }\n")
            subprocess.run(["gcc", "-O1", "-o", str(host / "apptainer"),
                            str(host / "standin.c")], check=True)
        out["apptainer"] = host / "apptainer"
        for arch in ("x86_64", "aarch64"):
            root = image_root(pyxis.work / f"sif-{arch}", arch)
            (root / "usr/bin/up").unlink()  # apptainer refuses links out of the tree
            out[arch] = build_sif(root, slurm.cluster.shared / f"{arch}.sif")
    except CorpusUnavailable as exc:
        _give_up(f"no Apptainer root: {exc}")
    return out


def test_apptainer_sif_of_the_other_architecture(pyxis: Pyxis, sifs: dict[str, Path]) -> None:
    pyxis.use()
    out = pyxis.slurm.side_file("apptainer-ran.out")
    argv = [str(sifs["apptainer"]), "exec", "./aarch64.sif", "/opt/app/tool"]
    res = pyxis.slurm.cluster.srun(argv, env={"PWD": str(pyxis.slurm.cluster.shared)})
    assert res.returncode != 0
    assert f"{PREFIX}ERROR image-arch-mismatch: {pyxis.slurm.cluster.shared}/aarch64.sif" \
        in res.stderr
    assert "task_init() failed" in res.stderr  # refused before apptainer started
    assert not out.exists()


def test_apptainer_clean_sif_is_judged_inside(pyxis: Pyxis, sifs: dict[str, Path]) -> None:
    pyxis.use()
    before = len(pyxis.slurm.audit_lines())
    argv = [str(sifs["apptainer"]), "exec", "./x86_64.sif", "hello"]
    res = pyxis.slurm.cluster.srun(argv, env={"PWD": str(pyxis.slurm.cluster.shared)})
    assert PREFIX not in res.stderr
    # (apptainer itself then fails here: sid's glibc / this sandbox; not ours.)
    [rec] = pyxis.records(before)
    assert (rec["action"], rec["rules"], rec["skipped"]) == ("allow", [], None)
    # The step's program is apptainer; the image it was judged in is named.
    assert (rec["image"], rec["program"]) == (f"{pyxis.slurm.cluster.shared}/x86_64.sif",
                                              str(sifs["apptainer"]))



def test_container_mounts_are_judged_as_pyxis_mounts_them(pyxis: Pyxis) -> None:
    """--container-mounts=SRC:DST: the program at DST is the host's SRC
    (a native one runs in silence, a foreign one is refused), and
    --container-workdir is where a relative program is looked up."""
    pyxis.use()
    host = pyxis.work / "mounted"
    host.mkdir(exist_ok=True)
    shutil.copy2(pyxis.work / "src" / "native", host / "native")
    shutil.copy2(pyxis.work / "src" / "foreign", host / "foreign")
    mount = f"--container-mounts={host}:/mnt/app"
    res = pyxis.srun(["--container-image=./clean.sqsh", mount, "/mnt/app/native"])
    assert res.returncode == 0, res.stderr
    assert "side-effect program ran" in res.stdout and PREFIX not in res.stderr
    res = pyxis.srun(["--container-image=./clean.sqsh", mount, "/mnt/app/foreign"])
    assert res.returncode != 0
    assert PREFIX + "ERROR" in res.stderr and "/mnt/app/foreign" in res.stderr
    res = pyxis.srun(["--container-image=./clean.sqsh", mount,
                      "--container-workdir=/mnt/app", "./native"])
    assert res.returncode == 0, res.stderr
    assert PREFIX not in res.stderr


def test_n_tasks_on_a_node_are_judged_once(pyxis: Pyxis) -> None:
    pyxis.use()
    before = len(pyxis.slurm.audit_lines())
    res = pyxis.slurm.cluster.run(["srun", "-N1", "-n2", "--container-image=./clean.sqsh",
                                   "tool"], env=pyxis.env(), timeout=180)
    assert res.returncode == 0, res.stderr
    assert res.stdout.count("side-effect program ran") == 2
    # One check for the node's two tasks: a check per task would write an
    # audit line per task.
    [rec] = pyxis.records(before)
    assert rec["image"] == f"{pyxis.slurm.cluster.shared}/clean.sqsh"
