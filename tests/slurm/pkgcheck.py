"""What an admin sees with the installed package: run inside a release root
after ``dpkg -i`` (tests/slurm/test_matrix.py), as
``python3 -m tests.slurm.pkgcheck OUT.json``.

Slurm starts with a plugstack.conf that only includes
``/etc/slurm/plugstack.conf.d/*.conf`` (Debian's own plugstack.conf, whose
snippet the package ships), so the plugin line, config and audit log are the
packaged ones. The steps run first with the shipped config (warn), then after
the admin's switch to enforce (edit, ``grace-policy config check --compile``).
Writes what it saw as JSON; the test asserts on it. Imports only
:mod:`cluster`, which the root's python3 runs without the repo's dependencies.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from .cluster import Cluster

CONFIG = Path("/etc/slurm/grace-policy.toml")
AUDIT = Path("/var/log/slurm/grace-policy.jsonl")
PROGRAM_C = 'int main(void) { return 0; }\n'


def _step(cluster: Cluster, program: Path) -> dict[str, object]:
    res = cluster.srun([str(program)], user="nobody", timeout=120)
    return {"rc": res.returncode, "stderr": res.stderr, "stdout": res.stdout}


def _audit_actions() -> list[str]:
    if not AUDIT.exists():
        return []
    return [str(json.loads(line).get("action")) for line in AUDIT.read_text().splitlines()
            if line.strip()]


def main(out: Path) -> int:
    work = Path(tempfile.mkdtemp(prefix="grace-pkgcheck-"))
    work.chmod(0o755)
    files = work / "files"
    files.mkdir()
    files.chmod(0o755)
    (files / "p.c").write_text(PROGRAM_C)
    for cc, name in (("gcc", "native"), ("aarch64-linux-gnu-gcc", "foreign")):
        subprocess.run([cc, "-o", str(files / name), str(files / "p.c")], check=True)
    cluster = Cluster(work / "cluster")
    (cluster.root / "etc").mkdir(parents=True)
    cluster.set_plugstack(["include /etc/slurm/plugstack.conf.d/*.conf"])
    seen: dict[str, object] = {}
    try:
        cluster.start()
        seen["warn_native"] = _step(cluster, files / "native")
        seen["warn_foreign"] = _step(cluster, files / "foreign")
        seen["audit_after_warn"] = _audit_actions()
        # The admin's switch to enforce (README, grace-policy.toml(5)).
        CONFIG.write_text(CONFIG.read_text().replace('mode = "warn"', 'mode = "enforce"', 1))
        done = subprocess.run(["grace-policy", "config", "check", "--compile", str(CONFIG)],
                              capture_output=True, text=True, check=False)
        seen["compile"] = {"rc": done.returncode, "out": done.stdout + done.stderr}
        seen["enforce_native"] = _step(cluster, files / "native")
        seen["enforce_foreign"] = _step(cluster, files / "foreign")
        seen["audit_after_enforce"] = _audit_actions()
        seen["node_state"] = cluster.settled_node_state()
        seen["slurmd_log"] = cluster.slurmd_log_text()[-4000:]
    except Exception as exc:  # reported to the test, which fails on it
        seen["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        cluster.stop()
        shutil.rmtree(work, ignore_errors=True)
    out.write_text(json.dumps(seen, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
