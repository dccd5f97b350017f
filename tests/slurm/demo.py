"""``make demo``: a local one-node Slurm with grace-policy, and what users see.

Builds and installs the plugin into a temporary prefix, starts munged,
slurmctld and slurmd (the same code as the tests), runs a clean step, a
rejected one, a warned one, one with a leaked environment and a 4 KiB-page
build on a simulated 64 KiB-page Grace node, prints each
command with exactly what the user got back, and stops everything it started.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from .harness import SetupError, SlurmEnv, prepare, skip_reason

BOLD, DIM, RESET = ("\033[1m", "\033[2m", "\033[0m") if sys.stdout.isatty() else ("", "", "")


def _show(env: SlurmEnv, title: str, args: Sequence[str], *, user: str = "nobody",
          extra_env: Mapping[str, str] | None = None) -> None:
    print(f"\n{BOLD}== {title}{RESET}")
    shown_env = " ".join(f"{k}={v}" for k, v in (extra_env or {}).items())
    print(f"{DIM}[{user}]${RESET} {shown_env + ' ' if shown_env else ''}srun {' '.join(args)}")
    res = env.cluster.srun(list(args), user=user, env=extra_env)
    for line in (res.stdout + res.stderr).splitlines():
        print(f"  {line}")
    print(f"{DIM}  (exit status {res.returncode}){RESET}")


def run_demo(env: SlurmEnv) -> None:
    files = env.files
    env.use("base")
    print(f"{BOLD}grace-policy demo{RESET}: one-node Slurm on this machine, plugin from "
          f"{env.plugin}")
    print(f"plugstack.conf: {env.cluster.plugstack.read_text().strip()}")
    print(f"partitions: enforce (default), warnp (mode warn), offp (mode off); "
          f"programs in {files}")

    _show(env, "A native program runs as usual, without a word from the plugin",
          [str(files / "native")])
    _show(env, "An aarch64 program on this x86_64 node (partition enforce): refused "
               "before exec", [str(files / "foreign")])
    _show(env, "The same on a partition in warn mode: told, then it runs (and fails as "
               "predicted)", ["-p", "warnp", str(files / "foreign")])
    venv = files / "venv-foreign"
    _show(env, "A venv activated on an aarch64 login node leaks into the job: removed",
          ["sh", "-c", "echo VIRTUAL_ENV=${VIRTUAL_ENV:-unset}; echo PATH=$PATH"],
          extra_env={"VIRTUAL_ENV": str(venv), "PATH": f"{venv}/bin:/usr/bin:/bin"})

    env.use("grace64k")
    _show(env, "Simulated Grace node (64 KiB pages, [node] page_size = 65536): a native "
               "program linked for 4 KiB pages is refused", [str(files / "native-4k")])
    env.use("base")

    print(f"\n{BOLD}== The audit log ({env.audit_log}){RESET}")
    for line in env.audit_lines()[-5:]:
        print(f"  {line}")
    print(f"\nnode state after all of it: {env.cluster.node_state()}")


def main(argv: Sequence[str]) -> int:
    reason = skip_reason()
    if reason:
        print(f"demo: cannot run: {reason}", file=sys.stderr)
        return 1
    root = Path(tempfile.mkdtemp(prefix="grace-demo-"))
    env = None
    try:
        print("building and installing the plugin, starting Slurm ...", flush=True)
        env = prepare(root)
        run_demo(env)
        return 0
    except SetupError as exc:
        print(f"demo: {exc}", file=sys.stderr)
        return 1
    finally:
        if env is not None:
            env.cluster.stop()
            print("cluster stopped.")
        if "--keep" in argv or os.environ.get("GRACE_KEEP_CLUSTER"):
            print(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
