"""The real Slurm the plugin scenarios run on.

Session fixture ``slurm``: installs the plugin with ``make install PREFIX=<tmp>``
(the same path an admin takes), starts munged/slurmctld/slurmd
(:mod:`cluster`), writes the configs and test executables, and stops every
daemon it started at the end, also when a test failed. Missing daemons or
compilers skip the tests with the reason; a plugin that does not build fails.

``plugstack.conf`` is re-read by Slurm at every launch, so each test states the
plugin line it needs (``slurm.use(...)``) without restarting anything.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from .cluster import Cluster, missing_binaries
from .harness import SlurmEnv

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

BASE_CONFIG = """\
# grace-policy config of the test cluster: one partition per mode.
mode = "enforce"
contact = "the test suite"
deadline_ms = 5000
{extra}
[partitions.warnp]
mode = "warn"

[partitions.offp]
mode = "off"

[partitions.gb200sim]
mode = "enforce"

[audit]
path = "{audit}"
"""


def _compile(cc: str, src: Path, out: Path, *flags: str) -> None:
    subprocess.run([cc, "-O1", "-o", str(out), str(src), *flags], check=True,
                   capture_output=True, text=True)
    out.chmod(0o755)


def _skip_reason() -> str | None:
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


@pytest.fixture(scope="session")
def slurm() -> Iterator[SlurmEnv]:
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    root = Path(tempfile.mkdtemp(prefix="grace-slurm-"))
    root.chmod(0o755)
    prefix = root / "prefix"
    build = subprocess.run(["make", "-C", str(REPO), "install", f"PREFIX={prefix}"],
                           capture_output=True, text=True, check=False)
    if build.returncode != 0:
        pytest.fail(f"make install failed:\n{build.stdout[-3000:]}\n{build.stderr[-3000:]}")

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
    audit_log.chmod(0o666)  # steps write it as the job's user (see docs/SPANK.md)

    etc = root / "etc-grace"
    etc.mkdir()
    etc.chmod(0o755)
    configs = {
        "base": etc / "grace-policy.toml",
        "grace64k": etc / "grace-64k.toml",
        "broken": etc / "broken.toml",
    }
    configs["base"].write_text(BASE_CONFIG.format(extra="", audit=audit_log))
    configs["grace64k"].write_text(BASE_CONFIG.format(
        extra="[node]\npage_size = 65536\n", audit=audit_log))
    configs["broken"].write_text('mode = "enforced"\n[partitions.warnp]\nmode = 3\n')
    for cfg in configs.values():
        cfg.chmod(0o644)
    # What an admin does after editing the config (so steps, which run as the
    # user and cannot write next to it, take the fast compiled path).
    for name in ("base", "grace64k"):
        subprocess.run(
            ["/usr/bin/python3", "-I", "-c",
             "import sys; sys.path.insert(0, sys.argv[1]); "
             "from grace_policy.policy import compile_config; compile_config(sys.argv[2])",
             str(prefix / "lib" / "grace-policy" / "python"), str(configs[name])],
            check=True, capture_output=True, text=True)

    cluster = Cluster(root / "cluster")
    cluster.start()
    env = SlurmEnv(cluster=cluster, prefix=prefix, files=files, audit_log=audit_log,
                   configs=configs)
    try:
        yield env
    finally:
        cluster.stop()
        if os.environ.get("GRACE_KEEP_CLUSTER"):
            print(f"\nkept {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def grace(slurm: SlurmEnv) -> SlurmEnv:
    """The plugin with the base config, whatever the previous test left."""
    slurm.use("base")
    return slurm

