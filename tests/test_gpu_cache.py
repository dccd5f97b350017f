"""GPU steps judged on NVML's facts stay cacheable (follow-up to issue 26).

The node checker publishes the facts it read from NVML in the cache
directory (grace_policy/cuda/nodegpus.py); an entry judged on them records
them as its ``gpus`` input, which the plugin's C lookup compares with the
file it read as root (spank/grace_cache.c). Real parts: the node checker's
server process reading the NVML ABI stand-in of tests/gpu/test_nvml.py
(installed as libnvidia-ml.so.1), the bridge writing a real entry for a
host program gcc links against an nvcc-built fixture library, and the
plugin's own grace_cache.c compiled here into a small driver that opens the
cache as the plugin does and answers hit or miss. Slurm is not involved:
the node checker a test cluster starts (grace_node.c) has a fixed
environment, so the NVML stand-in cannot be put where it loads it without
installing it system-wide on this shared machine.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from gpu.test_nvml import STANDIN
from test_cuda_check import _env, cudart13, fx, progs  # noqa: F401  (fixtures)

from grace_policy import __version__, slurm_bridge
from grace_policy.cuda import nodegpus
from grace_policy.cuda.nvml import Gpu, NodeGpus

pytestmark = [pytest.mark.network,
              pytest.mark.skipif(os.geteuid() != 0,
                                 reason="the facts file and the cache are root's")]

REPO = Path(__file__).resolve().parents[1]
BOOT = ("import sys; sys.path.insert(0, sys.argv[1]); from grace_policy.nodecheck import "
        "main; sys.exit(main(sys.argv[2:]))")

#: The plugin's cache lookup, driven from the command line: the cache opened
#: as slurm_spank_init opens it (this process's uid as the job's), then one
#: lookup of the step given by the arguments.
DRIVER = r"""
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "grace.h"

spank_err_t spank_get_item(spank_t sp, spank_item_t item, ...)
{
	va_list ap;
	uid_t *uid;

	(void)sp;
	if (item != S_JOB_UID)
		return ESPANK_BAD_ARG;
	va_start(ap, item);
	uid = va_arg(ap, uid_t *);
	va_end(ap);
	*uid = getuid();
	return ESPANK_SUCCESS;
}

/* CACHE_DIR CONFIG CODE NODE CWD ARGC ARGV... ENV... */
int main(int argc, char **argv)
{
	struct grace_context ctx;
	struct grace_step step;
	char mode[64];

	memset(&ctx, 0, sizeof(ctx));
	memset(&step, 0, sizeof(step));
	ctx.cache_dir = argv[1];
	grace_cache_open(&ctx, NULL);
	if (ctx.cache_fd < 0) {
		fprintf(stderr, "%s\n", ctx.cache_error);
		return 2;
	}
	step.config = argv[2];
	step.code = argv[3];
	step.node = argv[4];
	step.cwd = argv[5];
	step.argc = atoi(argv[6]);
	step.argv = argv + 7;
	step.env = argv + 7 + step.argc;
	step.envc = argc - 7 - step.argc;
	step.audit_fd = -1;
	if (grace_cache_lookup(&ctx, &step, mode, sizeof(mode))) {
		printf("hit %s\n", mode);
		return 0;
	}
	printf("miss\n");
	return 1;
}
"""


@pytest.fixture(scope="module")
def lookup(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The driver, built from the plugin's grace_cache.c and grace_contract.c."""
    out = tmp_path_factory.mktemp("cache-lookup")
    subprocess.run([sys.executable, str(REPO / "spank/gen_contract.py"),
                    str(out / "grace_contract.h")], check=True, timeout=120)
    (out / "driver.c").write_text(DRIVER)
    subprocess.run(["gcc", "-std=gnu11", "-Wall", "-Wextra", "-Werror",
                    f'-DGRACE_VERSION="{__version__}"', f"-I{out}", f"-I{REPO / 'spank'}",
                    "-o", str(out / "lookup"), str(out / "driver.c"),
                    str(REPO / "spank/grace_cache.c"), str(REPO / "spank/grace_contract.c")],
                   check=True, timeout=120)
    return out / "lookup"


A = NodeGpus(gpus=(Gpu(index=0, minor=0, capability=(9, 0)),), driver_cuda=(13, 5))
B = NodeGpus(gpus=(Gpu(index=0, minor=0, capability=(10, 0)),), driver_cuda=(13, 5))


@pytest.fixture
def node_answer() -> Iterator[None]:
    try:
        yield
    finally:
        nodegpus.set_for_tests(None)


class Node:
    """One node's cache directory, a config, and the step run on it."""

    def __init__(self, tmp: Path, lookup: Path, prog: Path, env: dict[str, str]) -> None:
        self.cache = tmp / "cache"
        self.cache.mkdir(mode=0o700)
        self.config = tmp / "grace-policy.toml"
        self.config.write_text('mode = "enforce"\n')
        self.lookup, self.prog, self.env = lookup, prog, env

    def judge(self) -> str | None:
        """The bridge's verdict on the step; its entry stored as C stores it."""
        out = slurm_bridge.run_step(slurm_bridge.StepInput(
            config=str(self.config), on_error="deny", partition=None, cwd="/",
            user_mode=None, node="n1", argv=(str(self.prog),), env=self.env, job_id=1,
            step_id=0, uid=os.geteuid(), batch=False, code="test|-"))
        assert out.action == "allow" and not out.user, out
        if out.cache:
            name = "node" if "\nO scope node\n" in out.cache else str(os.getuid())
            fd = os.open(self.cache / f"{name}.v{__version__}",
                         os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            os.write(fd, out.cache.encode())
            os.close(fd)
        return out.cache

    def replayed(self) -> bool:
        """Does the plugin's C lookup replay the step now?"""
        env = [f"{k}={v}" for k, v in self.env.items()]
        proc = subprocess.run([str(self.lookup), str(self.cache), str(self.config), "test|-",
                               "n1", "/", "1", str(self.prog), *env],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode in (0, 1), proc.stderr
        return proc.stdout == "hit enforce\n"

    @property
    def facts(self) -> Path:
        return self.cache / f"gpus.v{__version__}"


@pytest.fixture
def node(tmp_path: Path, lookup: Path, progs: dict[str, Path],  # noqa: F811
         cudart13: Path, node_answer: None) -> Node:  # noqa: F811
    return Node(tmp_path, lookup, progs["sm80_sm90"], _env(cudart13, SLURM_STEP_GPUS="0"))


def test_a_verdict_on_published_facts_replays_until_they_change(node: Node) -> None:
    """sm80+sm90 kernels, judged clean on NVML's sm_90 that the checker
    published: the entry replays in C. The checker restarting with the same
    GPUs writes a new file with the same text: still a hit; another GPU
    (sm_100: the library would be refused) is a miss; the facts gone (no
    checker) are a miss."""
    nodegpus.set_for_tests(A)
    assert nodegpus.publish(str(node.cache)) == "0:sm_90 cuda 13.5"
    st = node.facts.stat()
    assert (st.st_uid, st.st_mode & 0o777) == (0, 0o600)
    entry = node.judge()
    assert entry is not None and "\nI gpus =0:sm_90%20cuda%2013.5\n" in entry, entry
    assert "I env:SLURM_STEP_GPUS =0" in entry  # the step's own devices
    assert node.replayed()

    assert nodegpus.publish(str(node.cache)) is not None  # a restart, same GPUs
    assert node.facts.stat().st_ino != st.st_ino
    assert node.replayed()

    nodegpus.set_for_tests(B)  # a GPU swap, read at the checker's next start
    nodegpus.publish(str(node.cache))
    assert node.facts.read_text() == "0:sm_100 cuda 13.5"
    assert not node.replayed()

    nodegpus.set_for_tests(A)
    nodegpus.publish(str(node.cache))
    assert node.replayed()  # keyed by the facts, not by the file's identity
    nodegpus.unpublish(str(node.cache))
    assert not node.facts.exists() and not node.replayed()


def test_facts_nobody_published_write_no_entry(node: Node) -> None:
    """A process that did not publish its answer (checker=step's helper):
    no entry, even with a file of the same facts in the cache directory."""
    nodegpus.set_for_tests(A)
    nodegpus.publish(str(node.cache))
    nodegpus.set_for_tests(A, published=None)
    assert node.judge() is None


@pytest.mark.parametrize("forgery", ["owner", "mode", "link", "symlink"])
def test_a_facts_file_only_root_could_write_is_trusted(node: Node, forgery: str) -> None:
    """The same text in a file a user could have written: C ignores it."""
    nodegpus.set_for_tests(A)
    nodegpus.publish(str(node.cache))
    assert node.judge() is not None and node.replayed()
    if forgery == "owner":
        os.chown(node.facts, 65534, 65534)
    elif forgery == "mode":
        node.facts.chmod(0o622)
    elif forgery == "link":
        os.link(node.facts, node.cache / "second-name")
    else:
        real = node.cache / "elsewhere"
        node.facts.rename(real)
        node.facts.symlink_to(real)
    assert not node.replayed()


def _server(tmp: Path, cache: Path, major: str) -> tuple[subprocess.Popen[bytes], int]:
    """The node checker's server as grace_node.c starts it, with NVML's
    stand-in on its library path; the write end of its life pipe."""
    lib = tmp / "nvml"
    if not (lib / "libnvidia-ml.so.1").exists():
        lib.mkdir(exist_ok=True)
        (lib / "nvml.c").write_text(STANDIN)
        subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(lib / "libnvidia-ml.so.1"),
                        str(lib / "nvml.c")], check=True, timeout=120)
    r, w = os.pipe()
    proc = subprocess.Popen(
        [sys.executable, "-I", "-B", "-c", BOOT, str(REPO), "--socket",
         str(tmp / "checker" / "socket"), "--code", "x|-", "--life", str(r),
         "--cache-dir", str(cache)], pass_fds=(r,), cwd="/",
        env={"LD_LIBRARY_PATH": str(lib), "GRACE_NVML_MAJOR": major,
             "GRACE_NVML_DRIVER": "13050"})
    os.close(r)
    return proc, w


def _published(path: Path, proc: subprocess.Popen[bytes]) -> str:
    import time

    end = time.monotonic() + 60
    while not path.exists():
        assert proc.poll() is None, "the server ended"
        assert time.monotonic() < end, "no facts file"
        time.sleep(0.05)
    return path.read_text()


def _stop(proc: subprocess.Popen[bytes], life: int) -> None:
    os.close(life)  # slurmd ends
    assert proc.wait(timeout=60) == 0


def test_the_node_checker_publishes_what_nvml_answered(tmp_path: Path) -> None:
    """The server reads NVML once at its start and writes the facts, root's
    and mode 0600, in cache_dir; they go when it ends (no checker: nothing
    keyed on them replays). The next start with the same GPUs publishes the
    same text; with other GPUs, other text."""
    cache = tmp_path / "cache"
    facts = cache / f"gpus.v{__version__}"
    proc, life = _server(tmp_path, cache, "10")
    try:
        first = _published(facts, proc)
        st = facts.stat()
    finally:
        _stop(proc, life)
    assert first == "4:sm_100 5:sm_100 cuda 13.5"  # the stand-in's minors are 4 and 5
    assert (st.st_uid, st.st_mode & 0o777) == (0, 0o600)
    assert not facts.exists()
    proc, life = _server(tmp_path, cache, "10")
    try:
        assert _published(facts, proc) == first
    finally:
        _stop(proc, life)
    proc, life = _server(tmp_path, cache, "9")
    try:
        assert _published(facts, proc) == "4:sm_90 5:sm_90 cuda 13.5"
    finally:
        _stop(proc, life)


def test_an_old_checker_ending_late_leaves_the_new_ones_facts(node: Node) -> None:
    """slurmd restarted while its old checker still ran: the new one wrote
    the facts again; the old one, ending, removes only the file it wrote."""
    from grace_policy.atomicfile import replace

    nodegpus.set_for_tests(A)
    text = nodegpus.publish(str(node.cache))
    assert text is not None and node.judge() is not None
    replace(str(node.facts), text.encode(), mode=0o600)  # the new checker's file
    nodegpus.unpublish(str(node.cache))  # the old checker ends
    assert node.facts.read_text() == text and node.replayed()
    nodegpus.publish(str(node.cache))
    nodegpus.unpublish(str(node.cache))  # its own file: gone
    assert not node.facts.exists()
