"""``srun apptainer exec IMG.sif CMD`` (issue 15 item 3): the host program is
Apptainer itself; the command is judged inside the SIF Apptainer built.

SIFs come from ``apptainer build`` in a Debian sid root (sif_root.py); the
host program is that root's real ``/usr/bin/apptainer`` (x86_64) where this
host's glibc can start it. On an older glibc (Debian 12) it needs versions
the host lacks and is refused on its own (lib-version-missing, checked
against the real loader below), so the image tests use a program built here
under that name. Running the SIFs fails in this sandbox (field notes §9), so
the oracle is Apptainer's own build and the files put in.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from corpus import CorpusUnavailable, _give_up

from grace_policy.container.apptainer import parse
from grace_policy.decide import StepRequest, decide
from grace_policy.node import NodeProfile, detect
from grace_policy.policy import PartitionPolicy, Policy

from .roots import make_root
from .sif_root import apptainer_root, build_sif

HOST = detect()
GRACE64 = NodeProfile(HOST.machine, 65536, HOST.glibc)


def test_parse_exec_argv() -> None:
    assert parse(["apptainer", "exec", "img.sif", "python", "train.py"]) == \
        ("img.sif", ("python", "train.py"), {})
    assert parse(["/usr/bin/apptainer", "-s", "exec", "--nv", "-B", "/data:/data",
                  "--env=A=1", "--pwd", "/work", "img.sif", "tool", "-x"]) == \
        ("img.sif", ("tool", "-x"), {"--nv": None, "-B": "/data:/data", "--env": "\0A=1",
                                     "--pwd": "/work"})
    # What this parser is not sure of is left to the host check alone.
    for argv in (["apptainer", "run", "img.sif"], ["apptainer", "exec", "--bogus", "img.sif",
                                                   "x"],
                 ["apptainer", "exec", "docker://ubuntu", "true"],
                 ["apptainer", "exec", "img.sif"], ["apptainer", "--weird", "exec", "i", "x"]):
        assert parse(argv) is None, argv


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, compile_cache: object
          ) -> dict[str, Path]:
    if os.geteuid() != 0 or shutil.which("mmdebstrap") is None:
        pytest.skip("building SIFs needs root and mmdebstrap (an Apptainer root of Debian sid)")
    if shutil.which("aarch64-linux-gnu-gcc") is None:
        pytest.skip("aarch64-linux-gnu-gcc not installed")
    base = tmp_path_factory.mktemp("apptainer")
    out: dict[str, Path] = {}
    try:
        out["sid-apptainer"] = apptainer_root() / "usr/bin/apptainer"
        out["apptainer"] = _runnable_apptainer(out["sid-apptainer"], base)
        for arch in ("x86_64", "aarch64"):
            root = make_root(base / f"{arch}-root", arch, cache=compile_cache)
            (root / "usr/bin/up").unlink()  # apptainer refuses links out of the tree
            if arch == "x86_64":
                shutil.copy2(root / "usr/bin/hello", root / "opt/app/tool4k")
            out[arch] = build_sif(root, base / f"{arch}.sif")
    except CorpusUnavailable as exc:
        _give_up(f"no Apptainer root: {exc}")
    return out


def _runnable_apptainer(sid: Path, base: Path) -> Path:
    """sid's apptainer if it starts on this host, else a program built here
    named ``apptainer`` (what is judged then is the image, as intended)."""
    if subprocess.run([str(sid), "version"], capture_output=True, timeout=60).returncode == 0:
        return sid
    src = base / "standin.c"
    src.write_text("int main(void) { return 0; }\n")
    (base / "bin").mkdir(exist_ok=True)
    standin = base / "bin" / "apptainer"
    subprocess.run(["gcc", "-O1", "-o", str(standin), str(src)], check=True)
    return standin


def test_sid_apptainer_on_an_older_glibc_is_refused(world: dict[str, Path]) -> None:
    """sid's apptainer 1.4.5 needs GLIBC_2.38: on Debian 12 (2.36) the
    loader refuses it before main(); the plugin says so first, with the
    loader's own text."""
    sid = world["sid-apptainer"]
    if world["apptainer"] == sid:
        pytest.skip("this host's glibc starts sid's apptainer")
    real = subprocess.run([str(sid), "version"], capture_output=True, text=True, timeout=60)
    native = "x86_64" if HOST.machine == "x86_64" else "aarch64"
    verdict = decide(_policy(), StepRequest(partition=None,
                                            argv=[str(sid), "exec", str(world[native]),
                                                      "hello"], env={"PATH": "/nowhere"}, cwd="/",
                                            node=HOST))
    assert verdict.action == "reject"
    assert [f.rule for f in verdict.findings] == ["lib-version-missing"]
    assert real.returncode != 0
    assert real.stderr == verdict.findings[0].predicted_error + "\n"
    assert "GLIBC_2.38" in verdict.findings[0].remediation


def _policy() -> Policy:
    return Policy(mode="enforce", partitions=(PartitionPolicy("warnp", mode="warn"),))


def test_sif_of_the_other_architecture_is_refused(world: dict[str, Path]) -> None:
    foreign = "x86_64" if HOST.machine == "aarch64" else "aarch64"
    argv = [str(world["apptainer"]), "exec", str(world[foreign]), "/opt/app/tool"]
    verdict = decide(_policy(), StepRequest(partition=None, argv=argv,
                                            env={"PATH": "/usr/bin:/bin"}, cwd="/", node=HOST))
    assert verdict.action == "reject"
    assert [f.rule for f in verdict.findings] == ["image-arch-mismatch"]
    assert verdict.findings[0].path == str(world[foreign])
    assert verdict.image == str(world[foreign])
    warned = decide(_policy(), StepRequest(partition="warnp", argv=argv, env={}, cwd="/",
                                           node=HOST))
    assert warned.action == "warn"


def test_clean_sif_is_judged_inside_and_allowed(world: dict[str, Path]) -> None:
    native = "x86_64" if HOST.machine == "x86_64" else "aarch64"
    argv = [str(world["apptainer"]), "exec", str(world[native]), "hello"]
    verdict = decide(_policy(), StepRequest(partition=None, argv=argv, env={"PATH": "/nowhere"},
                                            cwd="/", node=HOST))
    # hello exists only in the image, found with the image's PATH.
    assert (verdict.action, verdict.findings, verdict.skipped) == ("allow", (), None)
    assert verdict.image == str(world[native])
    argv = [str(world["apptainer"]), "exec", str(world[native]), "nothere"]
    missing = decide(_policy(), StepRequest(partition=None, argv=argv, env={}, cwd="/",
                                            node=HOST))
    assert [f.rule for f in missing.findings] == ["exe-not-found"]
    assert missing.findings[0].path.startswith(f"{world[native]}:")


def test_4k_program_in_the_sif_on_a_64k_node(world: dict[str, Path], tmp_path: Path) -> None:
    """On a 64 KiB node the host's apptainer is built for it (here: a static
    program linked for 64 KiB pages under that name, judged, never run);
    the image's 4 KiB-linked program is refused, naming the SIF."""
    if HOST.machine != "x86_64":
        pytest.skip("the x86_64 SIF's 4 KiB program is judged on an x86_64 host")
    host = tmp_path / "apptainer"
    src = tmp_path / "main.c"
    src.write_text("int main(void) { return 0; }\n")
    subprocess.run(["gcc", "-static", "-O1", "-Wl,-z,max-page-size=65536",
                    "-Wl,-z,common-page-size=65536", "-o", str(host), str(src)], check=True)
    clean = decide(_policy(), StepRequest(partition=None, argv=[str(host), "--version"], env={},
                                          cwd="/", node=GRACE64))
    assert clean.findings == ()  # the host program alone passes on this node
    argv = [str(host), "exec", str(world["x86_64"]), "/opt/app/tool4k"]
    verdict = decide(_policy(), StepRequest(partition=None, argv=argv, env={}, cwd="/",
                                            node=GRACE64))
    assert verdict.action == "reject"
    assert f"{world['x86_64']}:/opt/app/tool4k" in [f.path for f in verdict.findings]


def test_truncated_sif_is_a_skip_with_a_reason(world: dict[str, Path], tmp_path: Path) -> None:
    cut = tmp_path / "cut.sif"
    cut.write_bytes(world["x86_64"].read_bytes()[:300])
    argv = [str(world["apptainer"]), "exec", str(cut), "hello"]
    verdict = decide(_policy(), StepRequest(partition=None, argv=argv, env={}, cwd="/",
                                            node=HOST))
    assert verdict.action == "allow" and "not judged" in str(verdict.skipped)
