"""``grace-policy env``: a user asks from the login node which packages of an
environment would fail on a Grace partition (issue 8, item 7)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fixtures.build import ElfBuilder

from grace_policy.cli.main import main
from python import envs
from python.wheels import wheel_site

pytestmark = pytest.mark.cross

NODE = ["--arch", "aarch64", "--page-size", "65536", "--glibc", "2.36"]


@pytest.mark.network
def test_env_names_the_broken_package_and_why(elf_builder: ElfBuilder, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    base = envs.base_python(elf_builder, "base", "3.8")
    py = envs.make_venv(base, tmp_path / "venv")
    envs.copy_site(wheel_site("numpy-1.19.0-aarch64"), envs.site_packages(tmp_path / "venv"))
    env_file = tmp_path / "env"
    env_file.write_text(f"HOME={tmp_path}\nPATH=/usr/bin\n")
    code = main(["env", *NODE, "--env-file", str(env_file), str(tmp_path / "venv")])
    out = capsys.readouterr().out
    assert code == 1
    assert "grace-policy: numpy 1.19.0: would fail to import" in out
    assert "page-congruence" in out and "_multiarray_umath" in out
    assert "1 of 2 package group(s) load there; 1 would fail" in out
    code = main(["env", *NODE, "--env-file", str(env_file), "--json", str(py)])
    data = json.loads(capsys.readouterr().out)
    assert code == 1
    (numpy,) = [p for p in data["packages"] if p["name"] == "numpy 1.19.0"]
    assert not numpy["ok"] and not numpy["imported"]
    assert {f["rule"] for f in numpy["findings"]} == {"page-congruence"}
    # On a 4 KiB-page aarch64 node the same environment loads.
    code = main(["env", "--arch", "aarch64", "--page-size", "4096", "--glibc", "2.36",
                 "--env-file", str(env_file), str(py)])
    assert code == 0, capsys.readouterr().out


def test_env_of_a_foreign_interpreter_and_bad_arguments(
        elf_builder: ElfBuilder, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = envs.base_python(elf_builder, "base", "3.8", arch="aarch64")
    # From an x86_64 node's point of view the aarch64 interpreter cannot start.
    code = main(["env", "--arch", "x86_64", "--page-size", "4096", str(base)])
    out = capsys.readouterr().out
    assert code == 2 and "exe-arch-mismatch" in out
    assert main(["env", str(tmp_path / "missing")]) == 64
    assert "no such file" in capsys.readouterr().err
