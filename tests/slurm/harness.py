"""The plugin scenarios' world: the installed plugin, configs, test programs and
the running cluster. Shared by the ``slurm`` fixture (conftest.py) and the demo
(``python3 -m tests.slurm.demo``); kept out of conftest.py so both can import it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from .cluster import Cluster, missing_binaries

REPO = Path(__file__).resolve().parent.parent.parent

#: The side-effect program: if it ever runs, it leaves a file behind.
SIDE_EFFECT_C = r"""
#include <stdio.h>
int main(int argc, char **argv) {
    FILE *f = fopen(argc > 1 ? argv[1] : "/dev/null", "a");
    if (f) { fputs("executed\n", f); fclose(f); }
    puts("side-effect program ran");
    return 0;
}
"""

#: The tests' own contact text (tests look for it in messages); the demos show
#: a site's instead (:func:`site_contact`).
TEST_CONTACT = "the test suite"

BASE_CONFIG = """\
# grace-policy config of the test cluster: one partition per mode.
mode = "enforce"
contact = {contact}
deadline_ms = 5000
{extra}
[partitions.warnp]
mode = "warn"

[partitions.offp]
mode = "off"

[partitions.gb200sim]
mode = "enforce"
allow_user_lower = true
"""


def site_contact() -> str:
    """Whom a site's messages name: the ``contact`` of the example config
    (packaging/grace-policy.example.toml), as an admin would set it in
    /etc/slurm/grace-policy.toml. The demos show this, not the tests' text."""
    import tomllib

    text = (REPO / "packaging" / "grace-policy.example.toml").read_text()
    return str(tomllib.loads(text)["contact"])


def _compile(cc: str, src: Path, out: Path, *flags: str) -> None:
    subprocess.run([cc, "-O1", "-o", str(out), str(src), *flags], check=True,
                   capture_output=True, text=True)
    out.chmod(0o755)




@dataclass
class SlurmEnv:
    """What the scenarios use: the cluster, the installed plugin, configs, files."""

    cluster: Cluster
    prefix: Path
    files: Path
    audit_log: Path
    configs: dict[str, Path] = field(default_factory=dict)

    @property
    def plugin(self) -> Path:
        return self.prefix / "lib" / "slurm" / "spank_grace_policy.so"

    @property
    def python_part(self) -> Path:
        """The library the plugin dlopen()s on a verdict-cache miss."""
        return self.prefix / "lib" / "grace-policy" / "grace_policy_py.so"

    @property
    def cache_dir(self) -> Path:
        """The tests' verdict cache (never the machine's /run/grace-policy)."""
        return self.cluster.root.parent / "verdict-cache"

    @property
    def checker_socket(self) -> Path:
        """This cluster's node-checker socket (never the machine's
        /run/grace-policy/checker): under the cluster's own root-owned run
        dir, the server makes its directory root 0700. Inside a release root
        the cluster dir is the root's, so is the socket."""
        return self.cluster.root / "run" / "grace-checker" / "socket"

    def copy_prefix(self, name: str) -> Path:
        """A fresh copy of the installed prefix (plugin + its Python dir), for
        tests that break or swap a part without touching the shared install."""
        dest = self.cluster.root.parent / name
        if dest.exists():
            shutil.rmtree(dest)
        shutil.copytree(self.prefix, dest, symlinks=True)
        return dest

    def testhooks_prefix(self, name: str) -> Path:
        """A copy of the install (:meth:`copy_prefix`) whose stub is the test
        build (make plugin-testhooks: -DGRACE_TEST_HOOKS), for the failures
        a real Slurm never produces on demand (an env edit that fails, a
        pre-started helper that dies or hangs): the hook sits at one call
        site, everything after it is the real code."""
        prefix = self.copy_prefix(name)
        build = self.cluster.root.parent / f"build-{name}"
        done = subprocess.run(["make", "-C", str(REPO), "plugin-testhooks", f"BUILD={build}"],
                              capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        shutil.copy2(build / "testhooks" / "spank_grace_policy.so",
                     prefix / "lib" / "slurm" / "spank_grace_policy.so")
        return prefix

    def restore_and_check_node(self) -> None:
        """After a test that set its own plugstack: the base line again, and
        the node must still take jobs (not drained, not down)."""
        self.use("base")
        state = self.cluster.settled_node_state()
        assert state in ("idle", "mixed", "allocated"), (state, self.cluster.node_reason())

    def use(self, config: str | Path | None = "base", *extra: str) -> None:
        """Point plugstack.conf at the plugin with ``config`` (a name from
        ``configs`` or a path) and extra ``key=value`` arguments. ``audit=`` names
        the test audit log unless ``extra`` gives one (``audit=`` alone: none)."""
        args = []
        if config is not None:
            path = self.configs.get(str(config), config)
            args.append(f"config={path}")
        if not any(e.startswith("audit=") for e in extra):
            args.append(f"audit={self.audit_log}")
        extra = tuple(e for e in extra if e != "audit=")
        self.set_plugin_line(self.plugin, *args, *extra)

    def set_plugin_line(self, plugin: str | Path, *args: str) -> None:
        """plugstack.conf with one ``required`` line (:meth:`plugin_line`)."""
        self.cluster.set_plugstack([f"required {self.plugin_line(plugin, *args)}"])

    def plugin_line(self, plugin: str | Path, *args: str) -> str:
        """Our plugstack line without its ``required``: ``plugin`` and ``args`` as
        given, plus ``cache_dir=`` and ``checker_socket=`` this cluster's own
        unless ``args`` has them.

        The node checker (the default ``checker=node``) is the one slurmd
        started from the line in place at its start (:func:`prepare`: the
        base line): later lines for the same install are served by it, as
        config, audit and on_error travel with each step. A line for another
        install (a copied prefix, ``python_path=``) is one that server would
        turn away ('V', logged with every step): such a line is a test of
        the in-slurmstepd path, so it gets ``checker=step`` unless it names a
        checker (tests/slurm/test_nodecheck.py tests the turning away)."""
        if not any(a.startswith("cache_dir=") for a in args):
            args = (*args, f"cache_dir={self.cache_dir}")
        if not any(a.startswith("checker_socket=") for a in args):
            args = (*args, f"checker_socket={self.checker_socket}")
        other = Path(plugin) != self.plugin or any(a.startswith("python_path=") for a in args)
        if other and not any(a.startswith("checker=") for a in args):
            args = (*args, "checker=step")
        return f"{plugin} {' '.join(args)}"

    def audit_lines(self) -> list[str]:
        return self.audit_log.read_text().splitlines()

    def side_file(self, name: str) -> Path:
        """A path in the shared dir no earlier step has touched."""
        path = self.cluster.shared / name
        if path.exists():
            path.unlink()
        return path


def skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "the local Slurm cluster needs root (slurmd runs steps as other users)"
    missing = missing_binaries()
    if missing:
        return f"not installed: {', '.join(missing)} (bash packaging/install-deps.sh)"
    for tool in ("gcc", "aarch64-linux-gnu-gcc", "make"):
        if shutil.which(tool) is None:
            return f"{tool} not installed (bash packaging/install-deps.sh)"
    if not Path("/usr/bin/python3").exists():
        return "/usr/bin/python3 (the interpreter the plugin embeds) is missing"
    return None


class SetupError(RuntimeError):
    """The plugin or the test files could not be built: a failure, not a skip."""


def prepare(root: Path, *, contact: str = TEST_CONTACT) -> SlurmEnv:
    """Install the plugin under ``root`` (make install PREFIX=root/prefix), build
    the test programs and configs (``contact``: their ``contact`` setting), and
    start the cluster. The caller stops it (``env.cluster.stop()``) whatever
    happens."""
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o755)
    prefix = root / "prefix"
    build = subprocess.run(["make", "-C", str(REPO), "install", f"PREFIX={prefix}"],
                           capture_output=True, text=True, check=False)
    if build.returncode != 0:
        raise SetupError(f"make install failed:\n{build.stdout[-3000:]}\n"
                         f"{build.stderr[-3000:]}")

    files = root / "files"
    files.mkdir()
    files.chmod(0o755)
    src = files / "side_effect.c"
    src.write_text(SIDE_EFFECT_C)
    _compile("gcc", src, files / "native")
    # 4 KiB-aligned segments: fine here, wrong on a 64 KiB-page Grace node.
    _compile("gcc", src, files / "native-4k", "-Wl,-z,max-page-size=4096")
    _compile("aarch64-linux-gnu-gcc", src, files / "foreign")
    # A venv made on an aarch64 login node, and one made here.
    for name, python in (("venv-foreign", files / "foreign"), ("venv-native", None)):
        venv = files / name / "bin"
        venv.mkdir(parents=True)
        if python is None:
            (venv / "python").symlink_to("/usr/bin/python3")
        else:
            shutil.copy2(python, venv / "python")
        (files / name / "pyvenv.cfg").write_text("home = /usr/bin\n")
    # A batch-style script whose #! interpreter cannot run here.
    foreign_script = files / "foreign-interp.sh"
    foreign_script.write_text(f"#!{files / 'foreign'}\necho should not run\n")
    foreign_script.chmod(0o755)

    audit_dir = root / "audit"
    audit_dir.mkdir()
    audit_dir.chmod(0o755)
    audit_log = audit_dir / "audit.log"
    audit_log.touch()
    audit_log.chmod(0o640)  # root's: the plugin opens it as root (audit=, docs/SECURITY.md)

    etc = root / "etc-grace"
    etc.mkdir()
    etc.chmod(0o755)
    configs = {
        "base": etc / "grace-policy.toml",
        "grace64k": etc / "grace-64k.toml",
        "broken": etc / "broken.toml",
    }
    quoted = json.dumps(contact)  # a TOML basic string
    configs["base"].write_text(BASE_CONFIG.format(extra="", contact=quoted))
    configs["grace64k"].write_text(BASE_CONFIG.format(extra="[node]\npage_size = 65536\n",
                                                      contact=quoted))
    configs["broken"].write_text('mode = "enforced"\n[partitions.warnp]\nmode = 3\n')
    for cfg in configs.values():
        cfg.chmod(0o644)
    # What an admin does after editing the config (steps never write the
    # compiled form themselves, so without this they validate every time).
    # The installed launcher, with an empty environment: it must need none.
    for name in ("base", "grace64k"):
        done = subprocess.run([str(prefix / "bin" / "grace-policy"), "config", "check",
                               "--compile", "--plugstack", "none", str(configs[name])],
                              env={}, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise SetupError(f"grace-policy config check --compile {configs[name]}: "
                             f"{done.stdout}{done.stderr}")

    cluster = Cluster(root / "cluster")
    env = SlurmEnv(cluster=cluster, prefix=prefix, files=files, audit_log=audit_log,
                   configs=configs)
    # The base line before slurmd starts: slurmd starts the node checker
    # (the default checker=node) only from the line it finds at its start.
    cluster.write_config()
    env.use("base")
    cluster.start()
    return env
