"""``make demo``: a local one-node Slurm with grace-policy, and what users see.

Builds and installs the plugin into a temporary prefix, starts munged,
slurmctld and slurmd (the same code as the tests), runs a clean step, a
rejected one, a warned one, one with a leaked environment and a 4 KiB-page
build on a simulated 64 KiB-page Grace node, prints each
command with exactly what the user got back, and stops everything it started.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .harness import SetupError, SlurmEnv, prepare, site_contact, skip_reason

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


@dataclass(frozen=True)
class Step:
    """One step the demo submits: its heading, the config it runs under,
    srun's arguments (``{files}``: the test programs) and extra environment."""

    title: str
    config: str
    args: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)


#: What ``make demo`` shows, in order (tests/test_demos.py checks each).
STEPS = (
    Step("A native program runs as usual, without a word from the plugin", "base",
         ("{files}/native",)),
    Step("An aarch64 program on this x86_64 node (partition enforce): refused before exec",
         "base", ("{files}/foreign",)),
    Step("The same on a partition in warn mode: told, then it runs (and fails as predicted)",
         "base", ("-p", "warnp", "{files}/foreign")),
    Step("A venv activated on an aarch64 login node leaks into the job: removed", "base",
         ("sh", "-c", "echo VIRTUAL_ENV=${VIRTUAL_ENV:-unset}; echo PATH=$PATH"),
         {"VIRTUAL_ENV": "{files}/venv-foreign",
          "PATH": "{files}/venv-foreign/bin:/usr/bin:/bin"}),
    Step("Simulated Grace node (64 KiB pages, [node] page_size = 65536): a native "
         "program linked for 4 KiB pages is refused", "grace64k", ("{files}/native-4k",)),
)


def run_demo(env: SlurmEnv, contact: str) -> None:
    files = str(env.files)
    env.use("base")
    print(f"{BOLD}grace-policy demo{RESET}: one-node Slurm on this machine, plugin from "
          f"{env.plugin}")
    print(f"plugstack.conf: {env.cluster.plugstack.read_text().strip()}")
    print(f"partitions: enforce (default), warnp (mode warn), offp (mode off); "
          f"programs in {files}")
    print(f"contact = {json.dumps(contact)}: whom the messages tell users to ask, as a "
          "site sets it in /etc/slurm/grace-policy.toml")

    for step in STEPS:
        env.use(step.config)
        _show(env, step.title, [a.replace("{files}", files) for a in step.args],
              extra_env={k: v.replace("{files}", files) for k, v in step.env.items()} or None)
    env.use("base")

    print(f"\n{BOLD}== The audit log ({env.audit_log}){RESET}")
    for line in env.audit_lines()[-len(STEPS):]:
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
        contact = site_contact()
        env = prepare(root, contact=contact)
        run_demo(env, contact)
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
