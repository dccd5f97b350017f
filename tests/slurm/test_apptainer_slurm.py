"""``srun apptainer exec IMG.sif CMD`` and batch scripts that run it, on a
real Slurm (issue 15, Apptainer): the command is judged inside the SIF
before Apptainer starts.

Where Apptainer is installed (the 26.05 root: Debian sid's package, which
the release matrix installs; test_matrix.py) the SIFs are built by that
``apptainer build`` and the step's program is its ``/usr/bin/apptainer``.
On the host (Debian 12 has no Apptainer) both come from the pinned sid
root of tests/image/sif_root.py; that binary needs sid's glibc (GLIBC_2.38),
so on the host it cannot start at all and the plugin refuses it on its own
(lib-version-missing) before reading the image. Running a SIF fails in this sandbox either way
(field notes §9): what the tests pin is what the plugin decides before
Apptainer runs, and what then really happens.

"Before Apptainer starts" is proved with a stand-in too: a program that
writes the file its last argument names, linked for 64 KiB pages so the
simulated 64 KiB partition accepts it, installed as ``apptainer``: a
refused step leaves no file behind, an allowed one does. The x86_64
Apptainer is a Go program linked for 4 KiB pages: as the node's own
``/usr/bin/apptainer`` (the 26.05 root) that only warns on a simulated
64 KiB node and the image's 4 KiB program is refused; the host's copy in a
test directory is refused on its own layout first.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
from corpus import _give_up

from .harness import SIDE_EFFECT_C, SlurmEnv

pytestmark = pytest.mark.slurm

PREFIX = "grace-policy: "

#: The stand-in ``apptainer``: leaves its last argument behind as a file.
STANDIN_C = r"""
#include <stdio.h>
int main(int argc, char **argv) {
    FILE *f = argc > 1 ? fopen(argv[argc - 1], "a") : NULL;
    if (f) { fputs("executed\n", f); fclose(f); }
    return 0;
}
"""


@dataclass
class Sifs:
    slurm: SlurmEnv
    apptainer: Path   # the real one (installed, or the sid root's copy)
    installed: bool   # Apptainer is this system's own (the 26.05 root)
    standin: Path     # the side-effect program, 64 KiB-linked, named apptainer
    images: dict[str, Path]

    def srun(self, args: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
        return self.slurm.cluster.srun(args, env={"PWD": str(self.slurm.cluster.shared)},
                                       timeout=180, **kw)  # type: ignore[arg-type]

    def records(self, before: int) -> list[dict[str, object]]:
        return [json.loads(line) for line in self.slurm.audit_lines()[before:]]


def _build_sif(tree: Path, out: Path, installed: bool) -> Path:
    if not installed:
        from image.sif_root import build_sif

        return build_sif(tree, out)
    # This system's apptainer (the pivoted release root: / is a mount point,
    # which `apptainer build` needs).
    done = subprocess.run(["apptainer", "-s", "build", "--force", str(out), str(tree)],
                          capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"apptainer build failed: {done.stderr.strip()[-800:]}")
    return out


@pytest.fixture(scope="module")
def sifs(slurm: SlurmEnv) -> Sifs:
    from corpus import CorpusUnavailable
    from image.roots import make_root

    work = slurm.cluster.root.parent / "apptainer-slurm"
    bindir = work / "bin"
    bindir.mkdir(parents=True, exist_ok=True)
    for d in (work, bindir):
        d.chmod(0o755)
    installed = shutil.which("apptainer") is not None
    try:
        if installed:
            real = Path(shutil.which("apptainer") or "")
        else:
            if shutil.which("mmdebstrap") is None:
                _give_up("no apptainer installed and no mmdebstrap to make its sid root")
            from image.sif_root import apptainer_root

            # srun runs it as given; a copy outside root's cache, readable by all.
            real = bindir / "apptainer"
            shutil.copy2(apptainer_root() / "usr/bin/apptainer", real)
        src = work / "side_effect.c"
        src.write_text(SIDE_EFFECT_C)
        (work / "standin.c").write_text(STANDIN_C)
        standin_dir = work / "standin"
        standin_dir.mkdir(exist_ok=True)
        standin_dir.chmod(0o755)
        standin = standin_dir / "apptainer"
        subprocess.run(["gcc", "-O1", "-o", str(standin), str(work / "standin.c"),
                        "-Wl,-z,max-page-size=65536", "-Wl,-z,common-page-size=65536"],
                       check=True, capture_output=True)
        images: dict[str, Path] = {}
        for arch in ("x86_64", "aarch64"):
            tree = work / f"tree-{arch}"
            if tree.exists():
                shutil.rmtree(tree)
            root = make_root(tree, arch)
            (root / "usr/bin/up").unlink()  # apptainer refuses links out of the tree
            if arch == "x86_64":
                shutil.copy2(root / "usr/bin/hello", root / "opt/app/tool4k")
                subprocess.run(["gcc", "-O1", "-o", str(root / "opt/app/tool64k"), str(src),
                                "-Wl,-z,max-page-size=65536",
                                "-Wl,-z,common-page-size=65536"],
                               check=True, capture_output=True)
            out = _build_sif(root, slurm.cluster.shared / f"app-{arch}.sif", installed)
            out.chmod(0o644)
            images[arch] = out
    except CorpusUnavailable as exc:
        _give_up(f"no Apptainer: {exc}")
    return Sifs(slurm=slurm, apptainer=real, installed=installed, standin=standin,
                images=images)


def _theirs(stderr: str) -> str:
    """The lines of stderr that are not the plugin's."""
    return "\n".join(line for line in stderr.splitlines() if PREFIX not in line)


def _foreign() -> str:
    return "aarch64" if os.uname().machine == "x86_64" else "x86_64"


def test_sif_of_the_other_architecture_is_refused_before_apptainer_starts(sifs: Sifs) -> None:
    sifs.slurm.use("base")
    sif = sifs.images[_foreign()]
    before = len(sifs.slurm.audit_lines())
    res = sifs.srun([str(sifs.apptainer), "exec", f"./{sif.name}", "/opt/app/tool"])
    assert res.returncode != 0
    mine = (f"{PREFIX}ERROR image-arch-mismatch: {sif}" if sifs.installed
            else f"{PREFIX}ERROR lib-version-missing: {sifs.apptainer}")
    assert mine in res.stderr, res.stderr
    assert "task_init() failed" in res.stderr, res.stderr  # refused in task_init
    # Neither the loader's nor Apptainer's own words: it never ran (our
    # message quotes the error Apptainer would print; that line is ours).
    theirs = _theirs(res.stderr)
    assert "GLIBC_" not in theirs and "FATAL" not in theirs, res.stderr
    [rec] = sifs.records(before)
    if sifs.installed:
        assert (rec["action"], rec["rules"], rec["image"]) == (
            "reject", ["image-arch-mismatch"], str(sif))
    else:
        # sid's binary on Debian 12 needs GLIBC_2.38: refused on its own
        # first (the stand-in below shows the image's refusal).
        assert (rec["action"], rec["rules"]) == ("reject", ["lib-version-missing"])
    out = sifs.slurm.side_file("apptainer-foreign.out")
    res = sifs.srun([str(sifs.standin), "exec", f"./{sif.name}", "/opt/app/tool", str(out)])
    assert res.returncode != 0 and f"{PREFIX}ERROR image-arch-mismatch" in res.stderr
    assert not out.exists(), "the step's program ran although the step was refused"


def test_clean_sif_is_allowed_in_silence_and_judged_inside(sifs: Sifs) -> None:
    """``hello`` exists only in the image (found with the image's PATH):
    no host exe-not-found, and the audit line names the SIF."""
    sifs.slurm.use("base")
    native = "x86_64" if _foreign() == "aarch64" else "aarch64"
    sif = sifs.images[native]
    before = len(sifs.slurm.audit_lines())
    res = sifs.srun([str(sifs.apptainer), "exec", f"./{sif.name}", "hello"])
    [rec] = sifs.records(before)
    assert res.returncode != 0
    if sifs.installed:
        assert PREFIX not in res.stderr, res.stderr
        assert (rec["action"], rec["rules"], rec["skipped"]) == ("allow", [], None)
        assert (rec["image"], rec["program"]) == (str(sif), str(sifs.apptainer))
        # What then really happens is Apptainer's, not ours (field notes §9):
        # it started and could not set up the container in this sandbox
        # (the bounding set lacks CAP_SYS_RESOURCE, bit 24).
        assert "Requesting capability set" in res.stderr, res.stderr
    else:
        # sid's binary on Debian 12: its loader would refuse it before
        # main(); the plugin refuses the step first, quoting the loader.
        assert (rec["action"], rec["rules"]) == ("reject", ["lib-version-missing"])
        assert "version `GLIBC_2.38' not found" in res.stderr, res.stderr
    out = sifs.slurm.side_file("apptainer-clean.out")
    res = sifs.srun([str(sifs.standin), "exec", f"./{sif.name}", "hello", str(out)])
    assert res.returncode == 0, res.stderr
    assert out.read_text() == "executed\n"


def test_4k_program_in_the_sif_on_the_64k_partition(sifs: Sifs) -> None:
    if os.uname().machine != "x86_64":
        pytest.skip("the x86_64 SIF's 4 KiB program is judged on an x86_64 host")
    sifs.slurm.use("grace64k")
    sif = sifs.images["x86_64"]
    try:
        out = sifs.slurm.side_file("apptainer-4k.out")
        res = sifs.srun(["-p", "gb200sim", str(sifs.standin), "exec", f"./{sif.name}",
                         "/opt/app/tool4k", str(out)])
        assert res.returncode != 0
        assert f"{PREFIX}ERROR page-congruence: {sif}:/opt/app/tool4k" in res.stderr, \
            res.stderr
        assert not out.exists(), "the step's program ran although the step was refused"
        # A program linked for 64 KiB pages in the same image: allowed, and
        # run (the image's own glibc is this host's, 4 KiB-linked: warnings
        # that name it inside the SIF, never a refusal).
        res = sifs.srun(["-p", "gb200sim", str(sifs.standin), "exec", f"./{sif.name}",
                         "/opt/app/tool64k", str(out)])
        assert res.returncode == 0 and f"{PREFIX}ERROR" not in res.stderr, res.stderr
        assert f"{PREFIX}WARNING page-overlap: {sif}:/lib64/ld-linux-x86-64.so.2" in res.stderr
        assert out.read_text() == "executed\n"
        # The real Apptainer with the 4 KiB program: refused before it starts.
        res = sifs.srun(["-p", "gb200sim", str(sifs.apptainer), "exec", f"./{sif.name}",
                         "/opt/app/tool4k"])
        assert res.returncode != 0
        assert "Requesting capability set" not in _theirs(res.stderr), res.stderr
        if sifs.installed:
            # /usr/bin/apptainer is the node's own (its 4 KiB layout only
            # warns on a simulated node): the image's program decides.
            assert f"{PREFIX}ERROR page-congruence: {sif}:/opt/app/tool4k" in res.stderr, \
                res.stderr
        else:
            # A copy outside the system image, itself 4 KiB-linked (Go's
            # linker): refused on its own layout, before the image is read.
            assert f"{PREFIX}ERROR page-congruence: {sifs.apptainer}" in res.stderr, \
                res.stderr
    finally:
        sifs.slurm.use("base")


def _batch(sifs: Sifs, name: str, body: str) -> tuple[str, str, Path]:
    out = sifs.slurm.cluster.shared / f"{name}.out"
    if out.exists():
        out.unlink()
    side = sifs.slurm.side_file(f"{name}.side")
    # PWD: as a shell exports it (the plugin takes the job's cwd from it).
    job = sifs.slurm.cluster.sbatch(f"#!/bin/sh\ntouch {side}\n{body}", ["-o", str(out)],
                                    env={"PWD": str(sifs.slurm.cluster.shared)})
    state = sifs.slurm.cluster.wait_job(job, timeout=180)
    return state, out.read_text() if out.exists() else "", side


def test_batch_script_running_apptainer_exec(sifs: Sifs) -> None:
    """The batch reader judges a line's ``apptainer exec IMG CMD`` in IMG, as
    the plugin judges such an srun step: on the main path, the foreign SIF
    fails the job before its first line runs."""
    sifs.slurm.use("base")
    sif = sifs.images[_foreign()]
    state, text, side = _batch(sifs, "app-batch-foreign",
                               f"{sifs.apptainer} exec ./{sif.name} /opt/app/tool\n")
    assert state == "FAILED", text
    if sifs.installed:
        assert f"{PREFIX}ERROR image-arch-mismatch: line 3: " in text, text
        assert str(sif) in text, text
    else:  # sid's binary on Debian 12: refused on its own (GLIBC_2.38)
        assert f"{PREFIX}ERROR lib-version-missing: line 3: " in text, text
    assert f"{PREFIX}step not started" in text, text
    assert not side.exists(), "line 2 ran although the job was refused"
    native = "x86_64" if _foreign() == "aarch64" else "aarch64"
    state, text, side = _batch(sifs, "app-batch-clean",
                               f"{sifs.apptainer} exec ./{sifs.images[native].name} hello "
                               "|| true\n")
    if not sifs.installed:
        # sid's binary on Debian 12 (needs GLIBC_2.38): refused before line 1.
        assert state == "FAILED", text
        assert f"{PREFIX}ERROR lib-version-missing: line 3: " in text, text
        assert not side.exists()
        return
    assert state == "COMPLETED", text
    assert PREFIX not in text, text
    assert side.exists()
