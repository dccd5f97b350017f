"""Registry images on a real Slurm (issue 25): pyxis 0.24.0 + enroot 4.1.2
pulling from Debian's ``docker-registry`` 2.8.2 on 127.0.0.1.

The images are the Debian roots of test_containers (a native and a foreign
``tool`` compiled here), packed as one layer each and pushed with ``skopeo``
(tests/registry/local_registry.py): an arm64-only image, an amd64 image and
a two-platform manifest list. enroot reaches the registry over http because
its ``enroot.conf.d`` says ``ENROOT_ALLOW_HTTP`` (pyxis drops the variable
from the job's environment).

What each scenario would show without the change: the arm64 image pulled
whole (its layer GET in the registry's log), then enroot's ``Exec format
error``; and the login node's ``check --image`` could not answer at all.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from .test_containers import PREFIX, Pyxis, pyxis  # noqa: F401  (the fixture)

_REG = Path(__file__).resolve().parent.parent / "registry"
if str(_REG) not in sys.path:
    sys.path.insert(0, str(_REG))

from local_registry import LocalRegistry, need_tools, oci_image  # noqa: E402

pytestmark = pytest.mark.slurm
REPO = Path(__file__).resolve().parents[2]
ENROOT_EXEC_ERROR = "enroot-switchroot: failed to execute: /bin/sh: Exec format error"


@dataclass
class Pulls:
    pyxis: Pyxis
    registry: LocalRegistry
    #: tag -> architecture -> the digest of its layer
    layers: dict[str, dict[str, str]]

    def ref(self, tag: str) -> str:
        return f"{self.registry.address}#lab/img:{tag}"


@pytest.fixture(scope="module")
def pulls(pyxis: Pyxis) -> Iterator[Pulls]:  # noqa: F811
    need_tools()
    work = pyxis.work / "registry"
    layout = work / "layout"
    reg = LocalRegistry(work / "reg")
    conf_d = None
    try:
        roots = {"amd64": pyxis.work / "root-clean", "arm64": pyxis.work / "root-arm64"}
        env = ["PATH=/opt/app/bin:/usr/bin:/bin"]
        # A file naming the tag: every tag's layers differ, so enroot's layer
        # cache never hides a pull from the registry's log.
        layers = {
            tag: oci_image(layout, tag, arches, env=env,
                           files={"etc/image-tag": tag.encode()})
            for tag, arches in (
                ("arm", {"aarch64": roots["arm64"]}), ("amd", {"x86_64": roots["amd64"]}),
                ("both", {"x86_64": roots["amd64"], "aarch64": roots["arm64"]}))
        }
        for tag in layers:
            reg.push(layout, tag, "lab/img", multi=tag == "both")
        # enroot's own settings: pyxis withholds ENROOT_ALLOW_HTTP from the job.
        script = (pyxis.slurm.cluster.bin_dir / "enroot").read_text()
        conf = next(line.split('"')[1] for line in script.splitlines()
                    if line.startswith("config::init "))
        conf_d = Path(conf + ".d")
        conf_d.mkdir(exist_ok=True)
        (conf_d / "50-registry-tests.conf").write_text("ENROOT_ALLOW_HTTP yes\n")
        yield Pulls(pyxis, reg, layers)
    finally:
        if conf_d is not None:
            (conf_d / "50-registry-tests.conf").unlink(missing_ok=True)
        reg.stop()


def _predict(pulls: Pulls, tag: str, config: Path) -> tuple[int, dict]:
    """The login node's answer (as root, with enroot's http switch set the
    way a user's own `enroot import` would need it)."""
    import os

    done = subprocess.run(
        [sys.executable, "-m", "grace_policy", "check", "--config", str(config),
         "--image", f"docker://{pulls.registry.address}/lab/img:{tag}", "--json", "--", "tool"],
        capture_output=True, text=True, timeout=120, cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), "ENROOT_ALLOW_HTTP": "y"})
    return done.returncode, json.loads(done.stdout)


def test_arm64_image_refused_before_the_pull(pulls: Pulls) -> None:
    px = pulls.pyxis
    px.use()
    mark = pulls.registry.mark()
    before = len(px.slurm.audit_lines())
    res = px.srun([f"--container-image={pulls.ref('arm')}", "tool"])
    assert res.returncode != 0
    assert f"{PREFIX}ERROR image-arch-mismatch: {pulls.ref('arm')}" in res.stderr, res.stderr
    assert "has linux/arm64 only; these nodes are linux/amd64" in " ".join(
        line.removeprefix(PREFIX).strip() for line in res.stderr.splitlines())
    assert "Traceback" not in res.stderr
    gets = " ".join(pulls.registry.blob_gets(mark))
    assert gets, "the check read the image's config from the registry"
    assert pulls.layers["arm"]["aarch64"].split(":")[1] not in gets, "the layer was pulled"
    [rec] = px.records(before)
    assert rec["action"] == "reject" and rec["rules"] == ["image-arch-mismatch"]
    code, out = _predict(pulls, "arm", px.slurm.configs["base"])
    assert (code, out["action"]) == (2, "reject")
    assert out["registry"]["platforms"] == ["linux/arm64"]


@pytest.mark.parametrize("tag", ["amd", "both"])
def test_amd64_image_and_list_run(pulls: Pulls, tag: str) -> None:
    px = pulls.pyxis
    px.use()
    mark = pulls.registry.mark()
    before = len(px.slurm.audit_lines())
    res = px.srun([f"--container-image={pulls.ref(tag)}", "tool"])
    assert res.returncode == 0, res.stderr
    assert "side-effect program ran" in res.stdout
    assert PREFIX not in res.stderr
    # Two judgements: the manifest before the pull, the root pyxis made
    # from it before the task ran (test_after_pull).
    rec, after = px.records(before)
    assert rec["action"] == "allow" and "judged after the pull" in str(rec["skipped"])
    assert after["action"] == "allow" and "/pyxis_" in str(after["image"])
    # Marked as one step's two judgements: grace-policy report counts one.
    assert (rec.get("phase"), after.get("phase")) == ("before_pull", "after_pull")
    # enroot then pulled the amd64 layer itself (never the arm64 one).
    gets = " ".join(pulls.registry.blob_gets(mark))
    assert pulls.layers[tag]["x86_64"].split(":")[1] in gets
    if tag == "both":
        assert pulls.layers[tag]["aarch64"].split(":")[1] not in gets
    code, out = _predict(pulls, tag, px.slurm.configs["base"])
    assert (code, out["action"]) == (0, "allow")
    assert out["registry"]["architecture"] == "amd64"


def test_warn_mode_shows_the_real_failure(pulls: Pulls) -> None:
    """In warn mode the step goes on: enroot pulls the arm64 image and fails
    as the finding said."""
    px = pulls.pyxis
    px.use()
    res = px.srun(["-p", "warnp", f"--container-image={pulls.ref('arm')}", "tool"])
    assert res.returncode != 0
    assert f"{PREFIX}ERROR image-arch-mismatch: {pulls.ref('arm')}" in res.stderr
    assert ENROOT_EXEC_ERROR in res.stderr, res.stderr


def test_unreachable_registry_follows_on_error(pulls: Pulls) -> None:
    """Nobody listens: the check ends, on_error (allow in base) lets pyxis
    report its own pull error; no traceback, the audit says why."""
    from local_registry import free_port

    px = pulls.pyxis
    px.use()
    before = len(px.slurm.audit_lines())
    res = px.srun([f"--container-image=127.0.0.1:{free_port()}#lab/img:arm", "tool"])
    assert res.returncode != 0 and "Traceback" not in res.stderr
    [rec] = px.records(before)
    assert rec["action"] == "allow" and "cannot connect" in json.dumps(rec)


def test_batch_step_of_an_arm64_image(pulls: Pulls) -> None:
    """sbatch --container-image: pyxis runs the batch script in the image;
    the batch step is judged the same way, before the pull."""
    px = pulls.pyxis
    px.use()
    out = px.slurm.cluster.shared / "registry-batch.out"
    out.unlink(missing_ok=True)
    mark = pulls.registry.mark()
    job = px.slurm.cluster.sbatch("#!/bin/sh\ntool\n", [
        "-o", str(out), f"--container-image={pulls.ref('arm')}"], env=px.env())
    state = px.slurm.cluster.wait_job(job, timeout=180)
    text = out.read_text() if out.exists() else ""
    assert state == "FAILED", text
    assert f"{PREFIX}ERROR image-arch-mismatch: {pulls.ref('arm')}" in text, text
    gets = " ".join(pulls.registry.blob_gets(mark))
    assert pulls.layers["arm"]["aarch64"].split(":")[1] not in gets


# -- a registry with htpasswd basic auth and enroot's .credentials ---------

PASSWORD = "Ab3-registry-secret"


@pytest.fixture(scope="module")
def private(pulls: Pulls) -> Iterator[LocalRegistry]:
    """Registry 2.8.2 with one user; the images are the same roots."""
    work = pulls.pyxis.work / "registry-private"
    reg = LocalRegistry(work / "reg", users={"alice": PASSWORD})
    try:
        roots = {"amd64": pulls.pyxis.work / "root-clean",
                 "arm64": pulls.pyxis.work / "root-arm64"}
        env = ["PATH=/opt/app/bin:/usr/bin:/bin"]
        for tag, arches in (("arm", {"aarch64": roots["arm64"]}),
                            ("amd", {"x86_64": roots["amd64"]})):
            oci_image(work / "layout", tag, arches, env=env,
                      files={"etc/image-tag": f"private-{tag}".encode()})
            reg.push(work / "layout", tag, "team/img")
        yield reg
    finally:
        reg.stop()


def _credentials(pulls: Pulls, text: str) -> Path:
    """root's ``$ENROOT_CONFIG_PATH/.credentials`` for the steps (enroot's
    default: ``$HOME/.config/enroot``; pyxis passes HOME on)."""
    config = Path(pulls.pyxis.env()["HOME"]) / ".config" / "enroot"
    config.mkdir(parents=True, exist_ok=True)
    path = config / ".credentials"
    path.write_text(text)
    path.chmod(0o600)
    return path


def test_private_registry_with_credentials(pulls: Pulls, private: LocalRegistry) -> None:
    """No USER@ in the reference: enroot 4.1.2 takes the login from the
    first .credentials line for the registry's host (docker::_parse_uri),
    and so does the check. A wrong password: pyxis' pull fails, the check
    follows on_error; no password or Basic token shows anywhere."""
    import base64

    px = pulls.pyxis
    px.use()
    creds = _credentials(pulls, "machine 127.0.0.1 login alice password $GRACE_REG_PW\n")
    env = {**px.env(), "GRACE_REG_PW": PASSWORD}  # evalnetrc: from enroot's environment
    try:
        ref = f"{private.address}#team/img"
        before = len(px.slurm.audit_lines())
        res = px.slurm.cluster.srun([f"--container-image={ref}:arm", "tool"], env=env,
                                    timeout=180)
        assert f"{PREFIX}ERROR image-arch-mismatch: {ref}:arm" in res.stderr, res.stderr
        res = px.slurm.cluster.srun([f"--container-image={ref}:amd", "tool"], env=env,
                                    timeout=180)
        assert res.returncode == 0, res.stderr  # enroot pulled it with the same login
        assert "side-effect program ran" in res.stdout and PREFIX not in res.stderr
        creds.write_text("machine 127.0.0.1 login alice password wrong-Pw-7\n")
        res = px.slurm.cluster.srun([f"--container-image={ref}:amd", "tool"], env=env,
                                    timeout=180)
        assert res.returncode != 0 and "pyxis:" in res.stderr
        assert f"{PREFIX}WARNING check-limit" in res.stderr and "HTTP 401" in res.stderr
        records = px.records(before)
        # reject; allow, then the root enroot pulled with that login (after
        # the pull); the failed pull: no container, nothing more to judge.
        assert [r["action"] for r in records] == ["reject", "allow", "allow", "allow"]
    finally:
        creds.unlink()
    seen = res.stderr + json.dumps(records) + "\n".join(px.slurm.audit_lines())
    seen += private.log.read_text(errors="replace")
    for secret in (PASSWORD, "wrong-Pw-7",
                   base64.b64encode(f"alice:{PASSWORD}".encode()).decode()):
        assert secret not in seen
