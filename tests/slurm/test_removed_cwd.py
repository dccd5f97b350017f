"""A step whose cwd is gone by the time the check runs (issue 27, R5), on a
real Slurm 22.05.

slurmstepd enters the step's directory before ``user_init``; a plugin
listed before ours (a stand-in compiled here, as a site's cleanup plugin
could be) removes it there, so the check's ``getcwd`` fails as it does for
any directory removed under a starting step. Before, the plugin then took
PWD from the step's environment (the submitting shell's, any text the user
chose, possibly relative) and judged ``./tool`` there: here a foreign
program the task could never reach was refused in its name. Now the cwd is
unknown: nothing is resolved against PWD, and no entry is cached.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from .harness import SlurmEnv

pytestmark = pytest.mark.slurm

PREFIX = "grace-policy: "

RMCWD_PLUGIN_C = r"""
#include <limits.h>
#include <unistd.h>
#include <slurm/spank.h>
SPANK_PLUGIN(rmcwd, 1);
int slurm_spank_user_init(spank_t sp, int ac, char **av)
{
    char cwd[PATH_MAX];
    (void)sp; (void)ac; (void)av;
    if (getcwd(cwd, sizeof(cwd)) != NULL) rmdir(cwd);
    return 0;
}
"""


def _rmcwd_plugin(slurm: SlurmEnv) -> Path:
    so = slurm.files / "spank_rmcwd.so"
    if not so.exists():
        src = slurm.files / "rmcwd.c"
        src.write_text(RMCWD_PLUGIN_C)
        subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(so), str(src)], check=True,
                       capture_output=True, text=True)
    return so


def test_a_removed_cwd_is_not_replaced_by_pwd(slurm: SlurmEnv) -> None:
    shared = slurm.cluster.shared
    elsewhere = shared / "pwd-elsewhere"
    elsewhere.mkdir(exist_ok=True)
    shutil.copy2(slurm.files / "foreign", elsewhere / "tool")
    line = slurm.plugin_line(slurm.plugin, f"config={slurm.configs['base']}",
                             f"audit={slurm.audit_log}")
    slurm.cluster.set_plugstack([f"required {_rmcwd_plugin(slurm)}", f"required {line}"])
    try:
        for pwd in (str(elsewhere), "pwd-elsewhere"):
            gone = shared / "gone"
            gone.mkdir(exist_ok=True)
            before = len(slurm.audit_lines())
            res = slurm.cluster.srun([f"--chdir={gone}", "./tool"],
                                     env={"PWD": pwd}, cwd=str(shared))
            assert not gone.exists()  # the stand-in did remove it
            assert "Traceback" not in res.stderr + res.stdout
            assert "exe-arch-mismatch" not in res.stderr, res.stderr
            assert "Exec format error" not in res.stderr
            [rec] = [json.loads(x) for x in slurm.audit_lines()[before:]]
            # Judged against "/", where there is no ./tool: the warning the
            # task's own failure (no such file) bears out.
            assert (rec["action"], rec["rules"]) == ("warn", ["exe-not-found"]), rec
            assert "No such file or directory" in res.stderr, res.stderr
            assert rec.get("cache") is None
    finally:
        slurm.use("base")
