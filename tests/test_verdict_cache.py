"""The verdict cache's promise: an entry matches only while every input and
every recorded filesystem answer is unchanged, so a hit means the full check
would have given the same clean verdict.

These tests use the Python twin of the C lookup (``verdict_cache.lookup``);
tests/slurm checks the C side in slurmstepd against the same entries.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from fixtures.build import ElfBuilder, src

from grace_policy import fsprobe, verdict_cache
from grace_policy.decide import decide
from grace_policy.policy import Policy

ENV_NAMES = ("PATH", "LD_LIBRARY_PATH", "VIRTUAL_ENV", "CONDA_PREFIX")


def _entry(argv0: str, env: dict[str, str], cwd: str = "/") -> tuple[str, list]:
    probes: list[tuple[str, str, str]] = []
    verdict = decide(Policy(), partition="p", argv=[argv0], env=env, cwd=cwd, probes=probes)
    assert verdict_cache.cacheable(verdict), verdict
    ins = verdict_cache.inputs(argv0=argv0, cwd=cwd, partition="p", user_mode=None, env=env,
                               env_names=ENV_NAMES)
    text = verdict_cache.entry(ins, verdict.mode, probes)
    assert text is not None
    return text, ins


def test_same_step_hits(tmp_path: Path) -> None:
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin"}
    text, ins = _entry("true", env)
    assert verdict_cache.lookup(text, ins) == "enforce"


def test_new_file_earlier_in_path_misses(tmp_path: Path) -> None:
    """The search passed over tmp_path/true (absent): a file appearing there
    changes what runs, so the entry must stop matching."""
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin"}
    text, ins = _entry("true", env)
    shutil.copy("/usr/bin/true", tmp_path / "true")
    assert verdict_cache.lookup(text, ins) is None


def test_other_inputs_miss(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin"}
    text, _ins = _entry("true", env)
    for changed in (
        verdict_cache.inputs(argv0="false", cwd="/", partition="p", user_mode=None, env=env,
                             env_names=ENV_NAMES),
        verdict_cache.inputs(argv0="true", cwd="/", partition="q", user_mode=None, env=env,
                             env_names=ENV_NAMES),
        verdict_cache.inputs(argv0="true", cwd="/", partition="p", user_mode=None,
                             env={**env, "VIRTUAL_ENV": "/x"}, env_names=ENV_NAMES),
        verdict_cache.inputs(argv0="true", cwd="/", partition="p", user_mode=None,
                             env={**env, "LD_LIBRARY_PATH": str(tmp_path)},
                             env_names=ENV_NAMES),
    ):
        assert verdict_cache.lookup(text, changed) is None


def test_rewritten_library_misses(elf_builder: ElfBuilder, tmp_path: Path) -> None:
    lib = elf_builder.library("lib/libgreet.so.1")
    exe = elf_builder.compile(src("use_greet.c"), "bin/app", needed_libs=("greet",),
                              lib_dirs=(lib.parent,), runpath="$ORIGIN/../lib")
    env = {"PATH": "/usr/bin:/bin"}
    text, ins = _entry(str(exe), env)
    assert verdict_cache.lookup(text, ins) == "enforce"
    data = lib.read_bytes()
    lib.unlink()
    lib.write_bytes(data)  # same bytes, new inode: the loader may see another file
    assert verdict_cache.lookup(text, ins) is None


def test_torn_and_foreign_blocks_are_skipped(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin"}
    text, ins = _entry("true", env)
    torn = text[: len(text) // 2]
    assert verdict_cache.lookup(torn, ins) is None
    junk = "GPC1\nX nonsense\n.\n"
    assert verdict_cache.lookup(junk + torn + text, ins) == "enforce"


def test_odd_bytes_round_trip(tmp_path: Path) -> None:
    odd = tmp_path / "a b\nc%\udcff"
    os.mkdir(odd)
    shutil.copy("/usr/bin/true", odd / "prog")
    text, ins = _entry(str(odd / "prog"), {"PATH": "/usr/bin"})
    assert all(line.count(" ") <= 3 for line in text.splitlines())
    assert verdict_cache.lookup(text, ins) == "enforce"


def test_relative_probe_is_not_cached() -> None:
    assert verdict_cache.entry([], "enforce", [("s", "rel/path", "n")]) is None


def test_signature_follows_content_and_mode(tmp_path: Path) -> None:
    f = tmp_path / "f"
    f.write_bytes(b"x")
    first = fsprobe.answer("s", str(f))
    os.chmod(f, 0o700)
    assert fsprobe.answer("s", str(f)) != first
    assert fsprobe.answer("s", str(tmp_path / "missing")) == "n"
    assert fsprobe.answer("s", str(f / "below")) == "n"  # ENOTDIR counts as absent
    assert fsprobe.answer("s", str(tmp_path)) == "d"


def test_variables_read_by_env_split_string_are_inputs(tmp_path: Path) -> None:
    """``#!/usr/bin/env -S ${TOOL}`` runs whatever TOOL names: an entry made
    with TOOL=true must not match a step where TOOL names something else."""
    script = tmp_path / "s"
    script.write_text("#!/usr/bin/env -S ${TOOL}\n")
    script.chmod(0o755)
    env = {"PATH": "/usr/bin:/bin", "TOOL": "true"}
    text, ins = _entry(str(script), env)
    assert "I env:TOOL =true" in text
    assert verdict_cache.lookup(text, ins, env) == "enforce"
    assert verdict_cache.lookup(text, ins, {**env, "TOOL": "false"}) is None


def test_a_file_swapped_between_stat_and_open_is_never_cached(tmp_path: Path,
                                                              monkeypatch) -> None:
    """The record keeps the stat() answer; if another file is read after
    it (a swap won in the race), no replay may ever match that record."""
    target = tmp_path / "prog"
    shutil.copy("/usr/bin/true", target)
    other = tmp_path / "other"
    shutil.copy("/usr/bin/false", other)
    real_stat = fsprobe.stat

    def stat_then_swap(path: str):
        st = real_stat(path)
        if path == str(target) and other.exists():
            os.replace(other, target)  # the file the open will see
        return st

    monkeypatch.setattr(fsprobe, "stat", stat_then_swap)
    fsprobe.start()
    try:
        from grace_policy.elf import read_elf

        read_elf(str(target))
    finally:
        records = fsprobe.stop()
    assert ("s", str(target), fsprobe.CHANGED) in records
    assert not fsprobe.still_true(records)


def test_a_listed_directory_is_replayed_by_identity_and_times(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Python steps list site-packages: an entry added, removed or renamed
    # after the verdict must make the recorded answer false (op "D").
    from grace_policy import fsprobe

    site = tmp_path / "site-packages"
    site.mkdir()
    (site / "a.py").write_text("")
    fsprobe.start()
    names = fsprobe.listdir(str(site))
    entries = fsprobe.scandir(str(site))
    with pytest.raises(OSError):
        fsprobe.listdir(str(tmp_path / "missing"))
    records = fsprobe.stop()
    assert names == ["a.py"] and [e.name for e in entries] == ["a.py"]
    assert [op for op, _p, _a in records] == ["D", "D"]
    assert fsprobe.still_true(records)
    (site / "b.py").write_text("")  # pip installing a package
    assert not fsprobe.still_true(records)
    fresh = [("D", str(site), fsprobe.answer("D", str(site)))]
    (site / "b.py").rename(site / "c.py")
    assert not fsprobe.still_true(fresh)
    assert fsprobe.answer("D", str(tmp_path / "missing")) == "n"


def test_a_python_step_records_its_own_arguments_as_c_reads_them(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # C compares "argv:N" with the step's S_JOB_ARGV. A console script's
    # interpreter sees other arguments (its #! line adds the script path):
    # the entry must name the step's, or it could never be replayed.
    venv = tmp_path / "venv"
    import subprocess
    import sys

    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    tool = venv / "bin" / "tool"
    tool.write_text(f"#!{venv}/bin/python\nimport json\n")
    tool.chmod(0o755)
    fsprobe.start()
    verdict = decide(Policy(), partition=None, argv=[str(tool), "--epochs", "3"],
                     env={"PATH": "/usr/bin", "HOME": str(tmp_path)}, cwd=str(tmp_path),
                     node=None)
    records = fsprobe.stop()
    assert verdict.action == "allow", verdict.findings
    inputs = [(name, value) for op, name, value in records if op == "i"]
    assert inputs == [("argc", "=3"), ("argv:1", "=--epochs"), ("argv:2", "=3")]


def test_a_shell_step_records_no_arguments(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # 'srun bash -c ...' loops: what bash's environment holds does not depend
    # on the command string, so one cache entry serves them all.
    fsprobe.start()
    verdict = decide(Policy(), partition=None, argv=["/bin/bash", "-c", "echo 1"],
                     env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}, cwd=str(tmp_path),
                     node=None)
    records = fsprobe.stop()
    assert verdict.action == "allow", verdict.findings
    assert not [r for r in records if r[0] == "i"], records
    assert ("v", "PYTHONPATH", "-") in records  # but the variables its python would read
