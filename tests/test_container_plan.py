"""grace_policy.container: a container step as it will run (no Slurm).

The C side names the runtime and the image; this is what the core then
judges. Real images: squashfs made with mksquashfs, an OCI config.json as
slurmstepd 22.05 writes it (container.c ``_modify_config``).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import squash
from roomy import ROOMY

from grace_policy.container import ContainerStep
from grace_policy.container.plan import plan


def _root(tmp: Path) -> Path:
    root = tmp / "root"
    (root / "opt/app/bin").mkdir(parents=True)
    (root / "etc").mkdir()
    (root / "work").mkdir()
    shutil.copy2("/bin/true", root / "opt/app/bin/tool")
    (root / "etc/environment").write_text("PATH=/opt/app/bin:/bin\nIMAGE_VAR=1\n")
    return root


def _sqsh(tmp: Path) -> Path:
    if shutil.which("mksquashfs") is None:
        pytest.skip("mksquashfs not installed (bash packaging/install-deps.sh)")
    out = tmp / "img.sqsh"
    return squash.mksquashfs(_root(tmp), out, "-comp", "gzip", "-all-root")


def test_pyxis_local_image_env_and_cwd(tmp_path: Path) -> None:
    image = _sqsh(tmp_path)
    job = {"PATH": "/host/bin", "LD_PRELOAD": "/host/lib.so", "HOME": "/home/u", "A": "b"}
    todo = plan(ContainerStep("pyxis", str(image), True, "pyxis container step", ["tool"], job,
                              "/work"))
    assert todo.skipped is None and todo.image is not None
    assert todo.image.kind == "squashfs"
    # The image's /etc/environment over the job's; pyxis withholds PATH and
    # LD_PRELOAD from enroot, so the host's never reach the container.
    assert todo.env["PATH"] == "/opt/app/bin:/bin"
    assert "LD_PRELOAD" not in todo.env
    assert (todo.env["IMAGE_VAR"], todo.env["A"]) == ("1", "b")
    assert todo.cwd == "/work"  # exists in the image
    assert plan(ContainerStep("pyxis", str(image), True, "r", ["tool"], job, "/nowhere")).cwd == "/"


def test_pyxis_registry_image_planned_and_bad_images_are_skips(tmp_path: Path) -> None:
    todo = plan(ContainerStep("pyxis", "nvcr.io#nvidia/pytorch:25.01-py3", False, "pyxis step (x)",
                              ["python"], {}, "/"))
    # Issue 25: a registry image is judged from its manifest by the core.
    assert todo.image is None and todo.skipped is None and todo.registry is not None
    assert todo.registry.reference.shown() == "nvcr.io#nvidia/pytorch:25.01-py3"
    todo = plan(ContainerStep("pyxis", "dockerd://local", False, "pyxis step (x)", ["python"], {},
                              "/"))
    assert todo.registry is None and "not a registry reference" in str(todo.skipped)
    broken = tmp_path / "broken.sqsh"
    broken.write_bytes(b"hsqs" + b"\0" * 60)
    todo = plan(ContainerStep("pyxis", str(broken), True, "pyxis step", ["tool"], {}, "/"))
    assert todo.image is None and "corrupt squashfs" in str(todo.skipped)
    missing = plan(ContainerStep("pyxis", str(tmp_path / "nope.sqsh"), True, "pyxis step", ["t"],
                                 {}, "/"))
    assert missing.image is None and "not judged" in str(missing.skipped)


def _spool_config(tmp: Path, root_path: str, args: list[str]) -> Path:
    spool = tmp / "spool" / "oci-job00007-00000"
    spool.mkdir(parents=True)
    config = {"ociVersion": "1.0.2", "root": {"path": root_path},
              "process": {"args": args, "cwd": "/work", "terminal": False,
                          "env": ["PATH=/usr/bin", "PATH=/opt/app/bin:/bin", "X=1"]}}
    (spool / "config.json").write_text(json.dumps(config))
    return spool / "config.json"


def test_slurm_oci_takes_argv_env_and_cwd_from_slurmstepd_copy(tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    shutil.move(str(_root(tmp_path)), bundle / "rootfs")
    (bundle / "config.json").write_text(json.dumps({"root": {"path": "rootfs"},
                                                    "process": {"args": ["/bin/sh"]}}))
    conf = _spool_config(tmp_path, str(bundle / "rootfs"), ["tool", "--flag"])
    todo = plan(ContainerStep("oci", str(conf), True, "oci step", ["/bin/sh"], {"PATH": "/host"},
                              "/"))
    assert todo.skipped is None and todo.image is not None
    assert todo.argv == ("tool", "--flag")
    assert todo.env == {"PATH": "/opt/app/bin:/bin", "X": "1"}  # runc: the last one wins
    assert (todo.cwd, todo.image.path, todo.image.kind) == ("/work", str(bundle), "oci")


@pytest.mark.parametrize("text", ["not json", "[]", '{"root": {"path": "rel"}}',
                                  '{"root": {"path": "/nonexistent"}, "process": {"args": ["x"]}}',
                                  '{"root": {"path": "/"}, "process": {"args": []}}'])
def test_slurm_oci_bad_configs_are_skips(tmp_path: Path, text: str) -> None:
    conf = tmp_path / "config.json"
    conf.write_text(text)
    todo = plan(ContainerStep("oci", str(conf), True, "oci step", ["/bin/sh"], {}, "/"))
    assert todo.image is None and "not judged" in str(todo.skipped)


def test_slurm_oci_bundle_as_newer_slurm_runs_it(tmp_path: Path) -> None:
    """26.05: the bundle's own config.json, the step's argv, the job's
    variables over process.env by name (container.c _merge_step_config_env)."""
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    shutil.move(str(_root(tmp_path)), bundle / "rootfs")
    (bundle / "config.json").write_text(json.dumps({
        "root": {"path": "rootfs"},
        "process": {"args": ["/bin/sh"], "cwd": "/work", "env": ["PATH=/opt/app/bin", "B=1"]}}))
    todo = plan(ContainerStep("oci-bundle", str(bundle), True, "oci step", ["tool"],
                              {"B": "2", "C": "3"}, "/"))
    assert todo.skipped is None and todo.image is not None
    assert todo.argv == ("tool",) and todo.cwd == "/work"
    assert todo.env == {"PATH": "/opt/app/bin", "B": "2", "C": "3"}
    outside = plan(ContainerStep("oci-bundle", str(tmp_path / "nope"), True, "oci step", ["tool"],
                                 {}, "/"))
    assert outside.image is None and "not judged" in str(outside.skipped)


def test_pyxis_batch_step_runs_slurmds_script_inside_the_image(tmp_path: Path) -> None:
    """``sbatch --container-image``: pyxis bind-mounts slurmd's copy of the
    script at its own path, so the script is found in the container and its
    ``#!`` interpreter is the image's (not the host's)."""
    from grace_policy.decide import StepRequest, decide
    from grace_policy.node import detect

    if shutil.which("mksquashfs") is None:
        pytest.skip("mksquashfs not installed (bash packaging/install-deps.sh)")
    root = _root(tmp_path)
    src = tmp_path / "main.c"
    src.write_text("int main(void) { return 0; }\n")
    subprocess.run(["gcc", "-static", "-O1", "-o", str(root / "opt/app/bin/sh"), str(src)],
                   check=True, capture_output=True)
    image = tmp_path / "batch.sqsh"
    squash.mksquashfs(root, image, "-comp", "gzip", "-all-root")
    script = tmp_path / "spool" / "job00012" / "slurm_script"
    script.parent.mkdir(parents=True)
    script.write_text("#!/opt/app/bin/sh\n")  # the image's: the host has no /opt/app
    script.chmod(0o700)

    def judged(batch: bool) -> list[tuple[str, str]]:
        todo = plan(ContainerStep("pyxis", str(image), True, "pyxis step", [str(script)], {}, "/",
                                  batch=batch))
        verdict = decide(ROOMY, StepRequest(partition=None, argv=list(todo.argv), env=todo.env,
                                            cwd=todo.cwd, node=detect(), image=todo.image))
        return [(f.rule, f.path) for f in verdict.findings]

    assert judged(batch=True) == []
    # Without the script's mount the image has no such file (what an srun
    # step naming that path would meet).
    assert judged(batch=False) == [("exe-not-found", f"{image}:{script}")]
    script.write_text("#!/usr/bin/python3\n")  # the host has one; the image does not
    assert judged(batch=True) == [("interp-missing", f"{image}:{script}")]


def test_an_option_c_could_not_carry_skips_named_steps_too(tmp_path: Path) -> None:
    """C marks a --container-name step not local; "uncarried" (an option too
    long to pass whole) must still make it a skip, never a judgement on a
    guess without its mounts (review of the named/stalekeys merge)."""
    args = "uncarried=1\nname=foo\njob=1\nslurm_conf=\n"
    for local in (True, False):
        got = plan(ContainerStep("pyxis", str(tmp_path / "x.sqsh"), local, "pyxis step", ["tool"],
                                 {}, "/", args=args))
        assert got.image is None and got.skipped and "too long" in got.skipped


def test_a_relative_image_without_a_known_cwd_is_a_skip() -> None:
    """getcwd failed in slurmstepd: C leaves ./x.sqsh relative, and the
    checker's own directory would be a guess."""
    got = plan(ContainerStep("pyxis", "./x.sqsh", True, "pyxis step", ["tool"], {}, "/"))
    assert got.image is None and "relative image" in (got.skipped or "")
