"""The ``grace-policy`` command, end to end, on ELF files compiled in this run.

Most tests call :func:`grace_policy.cli.main.main` in-process (fast, output
through capsys); a few run ``python3 -m grace_policy`` as a subprocess, because
exit codes and "no traceback" are promises about the real process, not about
a function's return value.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fixtures.build import ElfBuilder, src

from grace_policy import __version__
from grace_policy.cli.main import main
from grace_policy.node import host_machine
from grace_policy.rules import Catalogue

REPO_ROOT = Path(__file__).resolve().parent.parent

#: The node options that describe a Grace node with an older glibc, where both
#: page rules apply (page-align only up to glibc 2.34).
GRACE_2_34 = ["--arch", "aarch64", "--page-size", "65536", "--glibc", "2.34"]

needs_x86_host = pytest.mark.skipif(
    host_machine() != "x86_64",
    reason="the foreign-binary cases assume an x86_64 host judging aarch64 files",
)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict]:
    code, out, err = run(capsys, *argv)
    assert out, f"no JSON on stdout (exit {code}); stderr: {err}"
    return code, json.loads(out)


def rules_of(doc: dict) -> set[str]:
    return {f["rule"] for f in doc["findings"]}


def write_env(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


# --------------------------------------------------------------------------
# Fixtures: real builds


@pytest.fixture
def env_file(tmp_path: Path) -> Path:
    """A minimal, deterministic job environment (not the caller's)."""
    return write_env(tmp_path / "job.env", ["PATH=/usr/bin:/bin", "HOME=/tmp"])


@pytest.fixture
def native_hello(elf_builder: ElfBuilder) -> Path:
    return elf_builder.compile(src("hello.c"), "native/hello")


def _aarch64_tree(builder: ElfBuilder, page_size: int) -> Path:
    """An aarch64 program and the library it finds through RUNPATH, both
    linked for ``page_size`` (so the library is judged by ld.so's rules and
    the program by the kernel's)."""
    lib = builder.library(f"a64-{page_size}/lib/libgreet.so.1", arch="aarch64",
                          page_size=page_size)
    return builder.compile(src("use_greet.c"), f"a64-{page_size}/bin/app", arch="aarch64",
                           page_size=page_size, needed_libs=("greet",),
                           lib_dirs=(lib.parent,), runpath="$ORIGIN/../lib")


@pytest.fixture(scope="session")
def app_4k(session_elf_builder: ElfBuilder, have_cross: str) -> Path:
    return _aarch64_tree(session_elf_builder, 4096)


@pytest.fixture(scope="session")
def app_64k(session_elf_builder: ElfBuilder, have_cross: str) -> Path:
    return _aarch64_tree(session_elf_builder, 65536)


@pytest.fixture
def grace_config(tmp_path: Path) -> Path:
    cfg = tmp_path / "grace-policy.toml"
    cfg.write_text(
        'mode = "enforce"\n'
        "\n"
        "[partitions.gb200]\n"
        'arch = "aarch64"\n'
        "page_size = 65536\n"
        'glibc = "2.34"\n'
        "\n"
        "[partitions.gb200-try]\n"
        'mode = "warn"\n'
        'arch = "aarch64"\n'
        "page_size = 65536\n"
        'glibc = "2.34"\n'
    )
    return cfg


# --------------------------------------------------------------------------
# check


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--version")
    assert code == 0
    assert out.strip() == f"grace-policy {__version__}"


def test_check_native_binary_allows(capsys: pytest.CaptureFixture[str], native_hello: Path,
                                    env_file: Path) -> None:
    code, out, err = run(capsys, "check", "--env-file", str(env_file), "--", str(native_hello))
    assert code == 0, out + err
    assert "allow" in out.splitlines()[-1]
    code, doc = run_json(capsys, "check", "--json", "--env-file", str(env_file), "--",
                         str(native_hello))
    assert code == 0
    assert doc["action"] == "allow"
    assert doc["findings"] == []
    assert doc["env"] == {"unset": [], "set": {}}


@needs_x86_host
def test_check_aarch64_binary_on_this_host_rejects(capsys: pytest.CaptureFixture[str],
                                                   app_64k: Path, env_file: Path) -> None:
    code, doc = run_json(capsys, "check", "--json", "--env-file", str(env_file), "--",
                         str(app_64k))
    assert code == 2
    assert doc["action"] == "reject"
    first = doc["findings"][0]
    assert first["rule"] == "exe-arch-mismatch"
    assert first["severity"] == "error"
    assert first["path"] == str(app_64k)
    assert "Exec format error" in first["predicted_error"]
    assert first["remediation"]


def test_check_4k_build_on_64k_grace_node_rejects(capsys: pytest.CaptureFixture[str],
                                                  app_4k: Path, env_file: Path) -> None:
    code, doc = run_json(capsys, "check", "--json", *GRACE_2_34, "--env-file", str(env_file),
                         "--", str(app_4k))
    assert code == 2
    assert doc["action"] == "reject"
    assert doc["node"]["machine"] == "aarch64"
    assert doc["node"]["page_size"] == 65536
    rules = rules_of(doc)
    assert {"page-congruence", "page-align"} <= rules
    # page-align is ld.so's rule: it is reported on the library, not the program.
    align = [f for f in doc["findings"] if f["rule"] == "page-align"]
    assert all(f["path"].endswith("libgreet.so.1") for f in align)
    severities = [f["severity"] for f in doc["findings"]]
    order = {"error": 0, "warning": 1, "info": 2}
    assert severities == sorted(severities, key=order.__getitem__), "most important first"


def test_check_64k_build_on_64k_grace_node_allows(capsys: pytest.CaptureFixture[str],
                                                  app_64k: Path, env_file: Path) -> None:
    code, doc = run_json(capsys, "check", "--json", *GRACE_2_34, "--env-file", str(env_file),
                         "--", str(app_64k))
    assert code == 0, doc
    assert doc["action"] == "allow"
    assert not [f for f in doc["findings"] if f["severity"] in ("error", "warning")]


def test_check_newer_glibc_drops_page_align_only(capsys: pytest.CaptureFixture[str],
                                                 app_4k: Path, env_file: Path) -> None:
    """glibc ≥ 2.35 no longer checks p_align, but congruence still fails."""
    code, doc = run_json(capsys, "check", "--json", "--arch", "aarch64", "--page-size", "64K",
                         "--glibc", "2.39", "--env-file", str(env_file), "--", str(app_4k))
    assert code == 2
    assert "page-congruence" in rules_of(doc)
    assert "page-align" not in rules_of(doc)


@pytest.mark.parametrize(("app", "expected"), [("app_4k", 2), ("app_64k", 0)])
def test_check_partition_from_config(capsys: pytest.CaptureFixture[str],
                                     request: pytest.FixtureRequest, grace_config: Path,
                                     env_file: Path, app: str, expected: int) -> None:
    path = request.getfixturevalue(app)
    code, doc = run_json(capsys, "check", "--json", "--config", str(grace_config),
                         "--partition", "gb200", "--env-file", str(env_file), "--", str(path))
    assert code == expected, doc
    assert doc["partition"] == "gb200"
    assert doc["node"] == {"machine": "aarch64", "page_size": 65536, "glibc": "2.34",
                           "root": "/"}
    if expected == 2:
        assert {"page-congruence", "page-align"} <= rules_of(doc)


def test_check_command_line_overrides_partition(capsys: pytest.CaptureFixture[str],
                                                grace_config: Path, app_4k: Path,
                                                env_file: Path) -> None:
    """Options are the top layer: a newer glibc than the partition's drops page-align."""
    code, doc = run_json(capsys, "check", "--json", "--config", str(grace_config),
                         "--partition", "gb200", "--glibc", "2.40", "--env-file",
                         str(env_file), "--", str(app_4k))
    assert code == 2
    assert doc["node"]["glibc"] == "2.40"
    assert "page-align" not in rules_of(doc)


def test_check_warn_mode_exits_1(capsys: pytest.CaptureFixture[str], grace_config: Path,
                                 app_4k: Path, env_file: Path) -> None:
    code, out, _ = run(capsys, "check", "--config", str(grace_config), "--partition",
                       "gb200-try", "--env-file", str(env_file), "--", str(app_4k))
    assert code == 1
    assert "ERROR page-congruence" in out
    assert "runs anyway" in out
    assert out.splitlines()[-1].startswith("grace-policy: warn:")


def test_check_top_level_warn_mode(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                   app_4k: Path, env_file: Path) -> None:
    cfg = tmp_path / "warn.toml"
    cfg.write_text('mode = "warn"\n')
    code, doc = run_json(capsys, "check", "--json", "--config", str(cfg), *GRACE_2_34,
                         "--env-file", str(env_file), "--", str(app_4k))
    assert code == 1
    assert doc["action"] == "warn"
    assert doc["mode"] == "warn"


def test_check_human_output_blocks(capsys: pytest.CaptureFixture[str], app_4k: Path,
                                   env_file: Path) -> None:
    code, out, _ = run(capsys, "check", *GRACE_2_34, "--env-file", str(env_file), "--",
                       str(app_4k))
    assert code == 2
    lines = out.splitlines()
    assert all(line.startswith("grace-policy: ") for line in lines)
    heads = [line for line in lines if line.startswith(("grace-policy: ERROR",
                                                          "grace-policy: WARNING",
                                                          "grace-policy: INFO"))]
    assert heads[0].startswith("grace-policy: ERROR"), "most important block first"
    assert any("what to do:" in line for line in lines)
    assert "reject" in lines[-1] and "64 KiB pages" in lines[-1]


# --------------------------------------------------------------------------
# check: the job's environment


@needs_x86_host
def test_check_env_file_leaked_foreign_venv(capsys: pytest.CaptureFixture[str],
                                            tmp_path: Path, app_64k: Path) -> None:
    """A venv made on an aarch64 machine, still active in the job's env on this
    x86_64 node: its variables go, its PATH entry goes, the step is warned."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\nversion = 3.11.7\n")
    (venv / "bin" / "python").write_bytes(app_64k.read_bytes())
    (venv / "bin" / "python").chmod(0o755)
    env = write_env(tmp_path / "leaky.env", [
        "# exported from the login shell",
        "",
        f"VIRTUAL_ENV={venv}",
        "VIRTUAL_ENV_PROMPT=(venv) ",
        f"PATH={venv}/bin:/usr/bin:/bin",
        "   # indented comment",
        "HOME=/tmp",
    ])
    code, doc = run_json(capsys, "check", "--json", "--env-file", str(env), "--", "true")
    assert code == 1, doc
    assert doc["action"] == "warn"
    assert set(doc["env"]["unset"]) == {"VIRTUAL_ENV", "VIRTUAL_ENV_PROMPT"}
    assert doc["env"]["set"]["PATH"] == "/usr/bin:/bin"
    leak = [f for f in doc["findings"] if f["rule"] == "env-leak"]
    assert leak and leak[0]["severity"] == "warning"
    assert str(venv) in leak[0]["remediation"]
    assert "{" not in leak[0]["remediation"], "every template field filled"

    code, out, _ = run(capsys, "check", "--env-file", str(env), "--", "true")
    assert code == 1
    assert "removed from the step's environment: VIRTUAL_ENV, VIRTUAL_ENV_PROMPT" in \
        " ".join(line.removeprefix("grace-policy: ").strip() for line in out.splitlines())


def test_check_env_file_bad_line_is_usage_error(capsys: pytest.CaptureFixture[str],
                                                tmp_path: Path) -> None:
    env = write_env(tmp_path / "bad.env", ["# fine", "", "PATH=/usr/bin", "not a pair"])
    code, out, err = run(capsys, "check", "--env-file", str(env), "--", "true")
    assert code == 64
    assert out == ""
    assert f"{env}:4" in err
    assert "not a pair" in err


def test_check_default_env_is_the_callers(capsys: pytest.CaptureFixture[str],
                                          monkeypatch: pytest.MonkeyPatch,
                                          native_hello: Path) -> None:
    """Without --env-file the PATH search uses this process's environment."""
    monkeypatch.setenv("PATH", f"{native_hello.parent}:/usr/bin:/bin")
    for var in ("VIRTUAL_ENV", "CONDA_PREFIX", "CONDA_EXE", "CONDA_PYTHON_EXE"):
        monkeypatch.delenv(var, raising=False)
    code, doc = run_json(capsys, "check", "--json", "--", native_hello.name)
    assert code == 0, doc
    code, doc = run_json(capsys, "check", "--json", "--", "no-such-program-here")
    assert code == 1
    assert rules_of(doc) == {"exe-not-found"}


def test_check_cwd_resolves_dot_paths(capsys: pytest.CaptureFixture[str], native_hello: Path,
                                      env_file: Path) -> None:
    code, doc = run_json(capsys, "check", "--json", "--env-file", str(env_file), "--cwd",
                         str(native_hello.parent), "--", "./hello")
    assert code == 0, doc


def test_check_escapes_user_text(capsys: pytest.CaptureFixture[str], env_file: Path) -> None:
    """A command name is user text: an escape sequence or newline in it must not
    reach the terminal raw (it could forge a 'grace-policy:' line)."""
    evil = "\x1b[2J\nPWNED\x07"
    code, out, _ = run(capsys, "check", "--env-file", str(env_file), "--", evil)
    assert code == 1
    assert "\x1b" not in out and "\x07" not in out
    assert not any(line.startswith("PWNED") for line in out.splitlines())
    assert "\\x1b" in out


def test_check_keeps_argv_after_double_dash(capsys: pytest.CaptureFixture[str],
                                            env_file: Path) -> None:
    code, doc = run_json(capsys, "check", "--json", "--env-file", str(env_file), "--",
                         "/bin/echo", "--json", "--", "-x")
    assert code == 0
    assert doc["command"] == ["/bin/echo", "--json", "--", "-x"]


# --------------------------------------------------------------------------
# config errors and usage errors


def test_check_bad_config_is_78_naming_key_and_line(capsys: pytest.CaptureFixture[str],
                                                    tmp_path: Path) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_text('mode = "enforce"\n\n[partitions.gb200]\narch = "aarch64"\n'
                   "page_size = 65535\n")
    code, out, err = run(capsys, "check", "--config", str(cfg), "--", "true")
    assert code == 78
    assert out == ""
    assert f"{cfg}:5: partitions.gb200.page_size" in err


def test_check_missing_config_is_78(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run(capsys, "check", "--config", str(tmp_path / "nope.toml"), "--", "true")
    assert code == 78
    assert "nope.toml" in err


@pytest.mark.parametrize("argv", [
    [],
    ["frobnicate"],
    ["check"],
    ["check", "--"],
    ["check", "--page-size", "3", "--", "true"],
    ["check", "--page-size", "big", "--", "true"],
    ["check", "--arch", "vax11", "--", "true"],
    ["check", "--glibc", "two", "--", "true"],
    ["check", "--root", "/no/such/dir", "--", "true"],
    ["check", "--cwd", "/no/such/dir", "--", "true"],
    ["check", "--env-file", "/no/such/file", "--", "true"],
    ["check", "true", "-l"],
    ["check", "true", "--", "-l"],
    ["check", "--no-such-option", "--", "true"],
    ["inspect"],
    ["inspect", "a", "--", "b"],
    ["explain"],
    ["config"],
    ["config", "check"],
    ["config", "check", "x.toml", "--output", "y.json"],
])
def test_usage_errors_exit_64(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    code, out, err = run(capsys, *argv)
    assert code == 64, (out, err)
    assert "Traceback" not in out + err
    assert err.strip()


def test_help_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["--help"], ["check", "--help"], ["inspect", "--help"],
                 ["config", "check", "--help"]):
        code, out, _ = run(capsys, *argv)
        assert code == 0
        assert "usage:" in out


def test_internal_error_is_70_without_traceback(capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The catch-all itself, provoked by breaking the catalogue on purpose."""

    def broken(self: Catalogue, rule_id: str) -> str:
        raise RuntimeError("catalogue exploded")

    monkeypatch.delenv("GRACE_POLICY_DEBUG", raising=False)
    monkeypatch.setattr(Catalogue, "explain", broken)
    code, out, err = run(capsys, "explain", "page-align")
    assert code == 70
    assert "grace-policy: internal error: RuntimeError: catalogue exploded" in err
    assert "Traceback" not in out + err


# --------------------------------------------------------------------------
# inspect


def _chain_tree(builder: ElfBuilder) -> tuple[Path, Path]:
    """app → libchain.so.1 (RUNPATH $ORIGIN/../lib) → libgreet.so.1, then
    libgreet deleted: the loader finds libchain and not libgreet."""
    greet = builder.library("tree/lib/libgreet.so.1")
    chain = builder.library("tree/lib/libchain.so.1", source=src("libchain.c"),
                            needed_libs=("greet",), lib_dirs=(greet.parent,),
                            runpath="$ORIGIN")
    app = builder.compile(src("use_chain.c"), "tree/bin/app", needed_libs=("chain",),
                          lib_dirs=(chain.parent,), runpath="$ORIGIN/../lib")
    greet.unlink()
    greet.with_name("libgreet.so").unlink()
    return app, chain


def test_inspect_json_runpath_tree_with_missing_lib(capsys: pytest.CaptureFixture[str],
                                                    elf_builder: ElfBuilder,
                                                    env_file: Path) -> None:
    app, chain = _chain_tree(elf_builder)
    code, doc = run_json(capsys, "inspect", "--json", "--env-file", str(env_file), str(app))
    assert code == 0
    assert doc["machine"] == host_machine()
    assert doc["runpath"] == "$ORIGIN/../lib"
    assert doc["min_load_align"] == min(s["align"] for s in doc["load_segments"])
    assert doc["load_segments"] and {"offset", "vaddr", "align"} <= set(doc["load_segments"][0])
    libs = {lib["name"]: lib for lib in doc["libraries"]}
    assert libs["libgreet.so.1"]["path"] is None
    assert libs["libgreet.so.1"]["needed_by"].endswith("libchain.so.1")
    assert os.path.realpath(libs["libchain.so.1"]["path"]) == str(chain.resolve())
    assert libs["libchain.so.1"]["found_via"] == "runpath"
    assert libs["libc.so.6"]["path"]
    assert "lib-not-found" in {i["rule"] for i in doc["issues"]}

    code, out, _ = run(capsys, "inspect", "--env-file", str(env_file), str(app))
    assert code == 0
    assert "libgreet.so.1 => not found" in out
    assert "libchain.so.1 =>" in out and "via runpath" in out


@needs_x86_host
def test_inspect_shows_skipped_foreign_candidate(capsys: pytest.CaptureFixture[str],
                                                 elf_builder: ElfBuilder, have_cross: str,
                                                 tmp_path: Path) -> None:
    """A wrong-arch library first on LD_LIBRARY_PATH is passed over with a
    reason, and the search goes on to the RUNPATH copy, as in glibc."""
    good = elf_builder.library("good/libgreet.so.1")
    foreign = elf_builder.library("foreign/libgreet.so.1", arch="aarch64")
    app = elf_builder.compile(src("use_greet.c"), "bin/app", needed_libs=("greet",),
                              lib_dirs=(good.parent,), runpath=str(good.parent))
    env = write_env(tmp_path / "llp.env", [f"LD_LIBRARY_PATH={foreign.parent}"])
    code, doc = run_json(capsys, "inspect", "--json", "--env-file", str(env), str(app))
    assert code == 0
    lib = next(x for x in doc["libraries"] if x["name"] == "libgreet.so.1")
    assert lib["path"] == str(good)
    assert lib["found_via"] == "runpath"
    assert [c["path"] for c in lib["skipped"]] == [str(foreign)]
    assert "wrong machine" in lib["skipped"][0]["reason"]
    code, out, _ = run(capsys, "inspect", "--env-file", str(env), str(app))
    assert f"skipped {foreign}: wrong machine" in out


def test_inspect_page_issues_per_file_on_grace(capsys: pytest.CaptureFixture[str],
                                               app_4k: Path, env_file: Path) -> None:
    code, doc = run_json(capsys, "inspect", "--json", *GRACE_2_34, "--env-file",
                         str(env_file), str(app_4k))
    assert code == 0
    assert doc["machine"] == "aarch64"
    assert doc["min_load_align"] == 4096
    lib = next(x for x in doc["libraries"] if x["name"] == "libgreet.so.1")
    assert lib["found_via"] == "runpath"
    assert {"page-align", "page-congruence"} <= set(lib["issues"])
    issues = {(i["rule"], os.path.basename(i["path"])) for i in doc["issues"]}
    assert ("page-congruence", "app") in issues
    assert ("page-align", "app") not in issues, "the kernel maps the program, not ld.so"


@needs_x86_host
def test_inspect_foreign_file_says_it_cannot_load(capsys: pytest.CaptureFixture[str],
                                                  app_64k: Path, env_file: Path) -> None:
    code, doc = run_json(capsys, "inspect", "--json", "--env-file", str(env_file),
                         str(app_64k))
    assert code == 0
    assert doc["runs_on_node"] is False
    assert doc["libraries"] == []
    assert [i["rule"] for i in doc["issues"]] == ["exe-arch-mismatch"]


@pytest.mark.parametrize("content", [b"just some text\n", b"#!/bin/sh\necho hi\n", b""])
def test_inspect_non_elf_exits_2_with_message(capsys: pytest.CaptureFixture[str],
                                              tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "notes.txt"
    path.write_bytes(content)
    code, out, err = run(capsys, "inspect", str(path))
    assert code == 2
    assert out == ""
    assert str(path) in err and "ELF" in err
    assert "Traceback" not in err


def test_inspect_unreadable_exits_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run(capsys, "inspect", str(tmp_path / "absent"))
    assert code == 2
    assert "cannot read" in err
    code, _, err = run(capsys, "inspect", str(tmp_path))
    assert code == 2
    assert "not a regular file" in err


# --------------------------------------------------------------------------
# explain and config check


@pytest.mark.parametrize("rule_id", Catalogue().ids())
def test_explain_every_rule(capsys: pytest.CaptureFixture[str], rule_id: str) -> None:
    code, out, _ = run(capsys, "explain", rule_id)
    assert code == 0
    assert out.startswith(f"{rule_id}: ")
    assert "severity:" in out


def test_explain_unknown_rule_lists_known(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "explain", "page-aling")
    assert code == 64
    assert out == ""
    assert "page-aling" in err
    for rule_id in Catalogue().ids():
        assert rule_id in err


def test_explain_shows_site_override(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    cfg = tmp_path / "site.toml"
    cfg.write_text('[rules.page-overlap]\nseverity = "error"\n')
    code, out, _ = run(capsys, "explain", "--config", str(cfg), "page-overlap")
    assert code == 0
    assert "severity: error (catalogue default: warning)" in out


def test_config_check_lists_every_problem(capsys: pytest.CaptureFixture[str],
                                          tmp_path: Path) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_text(
        'mode = "enforce"\n'
        "[partitions.gb200]\n"
        'mode = "enfroce"\n'
        'arch = "aarch64"\n'
        "page_size = 65535\n"
        "[rules.no-such-rule]\n"
        'severity = "off"\n'
    )
    code, out, err = run(capsys, "config", "check", str(cfg))
    assert code == 78
    assert out == ""
    assert f"{cfg}:3: partitions.gb200.mode" in err
    assert f"{cfg}:5: partitions.gb200.page_size" in err
    assert f"{cfg}:6: rules.no-such-rule" in err
    assert not list(tmp_path.glob("*.compiled.json"))


def test_config_check_ok_and_compile(capsys: pytest.CaptureFixture[str],
                                     grace_config: Path, tmp_path: Path) -> None:
    code, out, _ = run(capsys, "config", "check", str(grace_config))
    assert code == 0
    assert "OK" in out.splitlines()[0]
    assert "partition gb200" in out and "64 KiB pages" in out
    assert not list(tmp_path.glob("*.compiled.json")), "a plain check writes nothing"

    out_file = tmp_path / "compiled.json"
    code, out, _ = run(capsys, "config", "check", "--compile", "-o", str(out_file),
                       str(grace_config))
    assert code == 0
    doc = json.loads(out_file.read_text())
    assert [p for p in doc["policy"]["partitions"]] == ["gb200", "gb200-try"]


# --------------------------------------------------------------------------
# The real process


def _python_m(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    run_env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO_ROOT)}
    run_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "grace_policy", *argv], capture_output=True,
                          text=True, env=run_env, cwd=str(REPO_ROOT), timeout=120, check=False)


def test_subprocess_exit_codes(native_hello: Path, app_4k: Path, tmp_path: Path) -> None:
    proc = _python_m("check", "--", str(native_hello))
    assert proc.returncode == 0, proc.stderr
    proc = _python_m("check", *GRACE_2_34, "--json", "--", str(app_4k))
    assert proc.returncode == 2, proc.stderr
    assert "page-congruence" in rules_of(json.loads(proc.stdout))
    proc = _python_m("check", "--page-size", "12", "--", "true")
    assert proc.returncode == 64
    text = tmp_path / "readme.txt"
    text.write_text("hello\n")
    proc = _python_m("inspect", str(text))
    assert proc.returncode == 2
    assert "not an ELF file" in proc.stderr
    assert "Traceback" not in proc.stderr
    proc = _python_m("--version")
    assert proc.returncode == 0 and proc.stdout.strip() == f"grace-policy {__version__}"


@needs_x86_host
def test_subprocess_foreign_binary_rejects(app_64k: Path) -> None:
    proc = _python_m("check", "--json", "--", str(app_64k))
    assert proc.returncode == 2, proc.stderr
    assert "exe-arch-mismatch" in rules_of(json.loads(proc.stdout))


def test_import_stays_cheap() -> None:
    """`grace-policy --version` and the parser must not drag in pydantic or
    another subcommand's module: each is imported only when run."""
    code = ("import sys; from grace_policy.cli.main import main; main(['--version']); "
            "print(sorted(m for m in sys.modules if m.startswith(('pydantic', 'elftools', "
            "'structlog', 'grace_policy.cli.main_', 'grace_policy.check', "
            "'grace_policy.config'))))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO_ROOT)},
                          timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "[]"


def test_usage_errors_escape_the_users_argument(capsys) -> None:
    from grace_policy.cli.main import main as cli_main

    assert cli_main(["check", "--x\x1b[31mRED", "--", "/bin/true"]) == 64
    err_text = capsys.readouterr().err
    assert "\x1b" not in err_text and "RED" in err_text


def test_inspect_and_check_agree_on_a_big_endian_file(capsys, elf_builder, have_cross) -> None:
    """inspect used to repeat the check's issue logic and had drifted: it
    called a big-endian aarch64 file runnable on a little-endian Grace node."""
    from fixtures.build import src

    be = elf_builder.library("be/libbe.so.1", source=src("freestanding.c"), arch="aarch64",
                             extra_flags=("-mbig-endian", "-nostdlib"))
    be.chmod(0o755)
    node = ("--arch", "aarch64", "--page-size", "65536")
    _code, doc = run_json(capsys, "inspect", *node, "--json", str(be))
    assert doc["runs_on_node"] is False
    assert "exe-arch-mismatch" in {f["rule"] for f in doc["issues"]}
    code, verdict = run_json(capsys, "check", *node, "--json", "--", str(be))
    assert code == 2 and "exe-arch-mismatch" in rules_of(verdict)


@pytest.mark.parametrize("argv", [["check", "/bin/true"], ["check", "--json", "/bin/true"],
                                  ["check", "/nonexistent/prog"]])
def test_exit_codes_hold_when_the_reader_has_left(argv: list[str], tmp_path: Path) -> None:
    """``grace-policy check ... | head -c1``: the reader is gone before the
    output is written. The exit code is still the command's own (0/1/2, the
    same as with a reader) and nothing about a broken pipe is printed."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    cmd = [sys.executable, "-m", "grace_policy", *argv]
    with_reader = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    assert with_reader.returncode in (0, 1, 2), with_reader.stderr
    read_fd, write_fd = os.pipe()
    os.close(read_fd)  # the reader left before the first byte
    try:
        done = subprocess.run(cmd, stdout=write_fd, stderr=subprocess.PIPE, text=True,
                              env=env, check=False)
    finally:
        os.close(write_fd)
    assert done.returncode == with_reader.returncode, done.stderr
    assert "BrokenPipe" not in done.stderr and "Exception ignored" not in done.stderr
