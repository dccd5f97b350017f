"""What a release does with the plugin's refusals, for docs/SPANK.md: run as
``python3 -m tests.slurm.observe`` on the host or inside a release root
(``python3 -m tests.slurm.roots shell 24.11``, then in /src/grace-policy).
Set ``GRACE_SLURMD_PARAMETERS=contain_spank`` to see 24.05+'s clone child.

Prints, as JSON: srun's exit code and Slurm's own lines for a step the plugin
refuses in task_init, the state, exit code and reason of a refused batch job,
and the node's state afterwards. Observations, not assertions: the tests
assert what must hold on every release."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .harness import prepare


def _slurm_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line and "grace-policy" not in line
            and not line.startswith(" ")]


def main() -> int:
    root = Path(tempfile.mkdtemp(prefix="grace-observe-"))
    env = prepare(root)
    seen: dict[str, object] = {}
    try:
        env.use("base")
        slurmd = subprocess.run(["slurmd", "-V"], capture_output=True, text=True).stdout
        seen["slurm"] = slurmd.strip()
        seen["python"] = sys.version.split()[0]
        res = env.cluster.srun([str(env.files / "foreign")], user="nobody")
        seen["srun_refused"] = {"rc": res.returncode, "slurm_lines": _slurm_lines(res.stderr)}
        job = env.cluster.sbatch(f"#!/bin/sh\nsrun {env.files / 'foreign'}\n",
                                 ["-o", str(env.cluster.shared / "obs-%j.out")], user="nobody")
        state = env.cluster.wait_job(job)
        show = env.cluster.run(["scontrol", "-o", "show", "job", str(job)]).stdout.split()
        seen["batch_refused_step"] = {"state": state, **{
            w.split("=", 1)[0]: w.split("=", 1)[1] for w in show
            if w.startswith(("ExitCode=", "Reason="))}}
        # A batch script whose own interpreter is foreign: the batch step itself.
        script = env.files / "foreign-interp.sh"
        job = env.cluster.sbatch(script.read_text(), user="nobody")
        state = env.cluster.wait_job(job)
        show = env.cluster.run(["scontrol", "-o", "show", "job", str(job)]).stdout.split()
        seen["batch_script_refused"] = {"state": state, **{
            w.split("=", 1)[0]: w.split("=", 1)[1] for w in show
            if w.startswith(("ExitCode=", "Reason="))}}
        time.sleep(1)
        seen["node_after"] = env.cluster.settled_node_state()
        seen["node_reason"] = env.cluster.node_reason()
        cfg = env.cluster.run(["scontrol", "show", "config"]).stdout
        seen["SlurmdParameters"] = [line.split("=", 1)[1].strip() for line in cfg.splitlines()
                                    if line.startswith("SlurmdParameters")]
    finally:
        env.cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(seen, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
