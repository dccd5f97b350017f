"""Hostile input: every case ends in a Verdict (never an exception, never a
hang), and the deadline and caps end in ``check-limit`` following on_error.

A hang would hang the test run, so each test that could block runs under
:func:`no_hang` (SIGALRM): a guard against blocking, not a timing assert.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from elfpatch import replace_string
from fixtures.build import ElfBuilder, loader_list, src
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grace_policy.check import check_step
from grace_policy.decide import StepRequest, decide
from grace_policy.findings import ACTIONS, Verdict
from grace_policy.node import detect
from grace_policy.policy import Limits, Policy

HOST = detect()
GENEROUS = Limits(deadline_ms=60_000, max_files=100_000, max_bytes=1 << 30)


@contextmanager
def no_hang(seconds: int = 30) -> Iterator[None]:
    def fire(signum: int, frame: object) -> None:
        raise AssertionError(f"blocked for {seconds} s")

    old = signal.signal(signal.SIGALRM, fire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def verdict(argv: list[str], env: dict[str, str] | None = None, cwd: str = "/",
            policy: Policy | None = None) -> Verdict:
    with no_hang():
        v = decide(policy or Policy(limits=GENEROUS),
                   StepRequest(partition=None, argv=argv,
                               env={"PATH": "/usr/bin:/bin"} if env is None else env, cwd=cwd,
                               node=HOST))
    assert isinstance(v, Verdict) and v.action in ACTIONS
    return v


def no_internal_error(v: Verdict) -> None:
    assert not (v.error or "").startswith("internal error"), v.error


def executable(path: Path, data: bytes | str, mode: int = 0o755) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(os.fsencode(data) if isinstance(data, str) else data)
    path.chmod(mode)
    return path


# --------------------------------------------------------------------------
# Odd files


def test_fifo_as_argv0_script_target_and_library(tmp_path: Path,
                                                 elf_builder: ElfBuilder) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    no_internal_error(verdict([str(fifo)]))
    s = executable(tmp_path / "s", f"#!{fifo}\n")
    no_internal_error(verdict([str(s)]))
    # As a library: glibc itself would block opening it; we must not.
    libdir = tmp_path / "libs"
    libdir.mkdir()
    os.mkfifo(libdir / "libgreet.so.1")
    real = elf_builder.library("real/libgreet.so.1")
    exe = elf_builder.compile(src("use_greet.c"), "bin/app", needed_libs=("greet",),
                              lib_dirs=(real.parent,))
    v = verdict([str(exe)], {"LD_LIBRARY_PATH": str(libdir)})
    no_internal_error(v)
    assert "elf-invalid" in v.rule_ids  # glibc stops on a non-regular candidate


@pytest.mark.parametrize("name", ["/dev/zero", "/dev/null", "/tmp", "/proc/self/environ",
                                  "/proc/self/mem", "/proc/self/exe", "/proc/self/fd/0"])
def test_special_files_as_argv0(name: str) -> None:
    no_internal_error(verdict([name]))


def test_empty_file_and_garbage(tmp_path: Path) -> None:
    assert verdict([str(executable(tmp_path / "empty", b""))]).rule_ids == ("exe-format",)
    garbage = executable(tmp_path / "garbage", b"\x7fELF" + b"\xff" * 60)
    no_internal_error(verdict([str(garbage)]))


def test_special_files_as_libraries(elf_builder: ElfBuilder, tmp_path: Path) -> None:
    real = elf_builder.library("real/libgreet.so.1")
    exe = elf_builder.compile(src("use_greet.c"), "bin/app", needed_libs=("greet",),
                              lib_dirs=(real.parent,))
    for i, target in enumerate(["/dev/zero", "/proc/self/mem", "/tmp", "/proc/self/environ"]):
        d = tmp_path / f"d{i}"
        d.mkdir()
        (d / "libgreet.so.1").symlink_to(target)
        no_internal_error(verdict([str(exe)], {"LD_LIBRARY_PATH": str(d)}))


def _as_nobody(fn: Callable[..., str], *args: str) -> str:
    """Run ``decide`` in a forked child that dropped to uid 65534: root reads
    everything, so permissions only bite for another user."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            out = fn(*args)
            os.write(w, out.encode("utf-8", "surrogateescape"))
        except BaseException as exc:
            os.write(w, f"RAISED {exc!r}".encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as fh:
        data = fh.read().decode("utf-8", "surrogateescape")
    os.waitpid(pid, 0)
    return data


def _nobody_decide(argv0: str, llp: str) -> str:
    env = {"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": llp}
    v = decide(Policy(limits=GENEROUS), StepRequest(partition=None, argv=[argv0], env=env,
                                                    cwd="/", node=HOST))
    return f"{v.action} {','.join(v.rule_ids)} {v.error or ''}"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to drop to uid 65534 in a child")
def test_unreadable_files_as_another_user(elf_builder: ElfBuilder) -> None:
    top = Path(tempfile.mkdtemp(prefix="gp-nobody-"))
    try:
        top.chmod(0o755)
        real = elf_builder.library("real/libgreet.so.1")
        exe = elf_builder.compile(src("use_greet.c"), "bin/app", needed_libs=("greet",),
                                  lib_dirs=(real.parent,))
        shutil.copy(exe, top / "app")
        (top / "app").chmod(0o755)
        shutil.copy(exe, top / "exec-only")
        (top / "exec-only").chmod(0o711)
        shutil.copy(exe, top / "none")
        (top / "none").chmod(0o000)
        (top / "lib0").mkdir(mode=0o755)
        shutil.copy(real, top / "lib0" / "libgreet.so.1")
        (top / "lib0" / "libgreet.so.1").chmod(0o000)
        (top / "lib1").mkdir(mode=0o755)
        shutil.copy(real, top / "lib1" / "libgreet.so.1")
        (top / "lib1" / "libgreet.so.1").chmod(0o644)
        llp = f"{top}/lib0:{top}/lib1"
        for name in ("exec-only", "none"):
            out = _as_nobody(_nobody_decide, str(top / name), llp)
            assert out.startswith("allow exe-unreadable"), out
        # An unreadable library is passed over like glibc does (EACCES).
        out = _as_nobody(_nobody_decide, str(top / "app"), llp)
        assert out.startswith("allow"), out
        assert "RAISED" not in out and "internal error" not in out
    finally:
        shutil.rmtree(top)


# --------------------------------------------------------------------------
# Odd paths


def test_symlink_loops(tmp_path: Path, elf_builder: ElfBuilder) -> None:
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    no_internal_error(verdict([str(tmp_path / "a")]))
    no_internal_error(verdict(["a"], {"PATH": str(tmp_path)}))
    exe = elf_builder.compile(src("use_greet.c"), "bin/app",
                              needed_libs=("greet",),
                              lib_dirs=(elf_builder.library("r/libgreet.so.1").parent,))
    (tmp_path / "libgreet.so.1").symlink_to(tmp_path / "libgreet.so.1")
    no_internal_error(verdict([str(exe)], {"LD_LIBRARY_PATH": str(tmp_path)}))


def test_very_long_paths_and_shebangs(tmp_path: Path) -> None:
    long_name = "/" + "/".join(["x" * 255] * 40)  # > PATH_MAX, components at NAME_MAX
    no_internal_error(verdict([long_name]))
    no_internal_error(verdict(["prog"], {"PATH": long_name + ":" + "y" * 10000}))
    no_internal_error(verdict(["/bin/true"], {"PATH": "/usr/bin",
                                              "LD_LIBRARY_PATH": long_name}))
    s = executable(tmp_path / "s", b"#!" + b"/" + b"a" * 5000 + b"\n")
    assert verdict([str(s)]).rule_ids == ("exe-format",)


def test_shebang_loop(tmp_path: Path) -> None:
    s = executable(tmp_path / "self", f"#!{tmp_path}/self\n")
    assert verdict([str(s)]).rule_ids == ("exe-format",)


def test_empty_argv_and_empty_name() -> None:
    assert verdict([]).rule_ids == ("exe-not-found",)
    assert verdict([""]).rule_ids == ("exe-not-found",)


def test_path_entries_that_are_files(tmp_path: Path) -> None:
    f = executable(tmp_path / "file", "x")
    v = verdict(["true"], {"PATH": f"{f}:{f}:/usr/bin:/bin"})
    assert v.action == "allow" and v.findings == ()


def test_non_utf8_and_nul_in_names_and_env(tmp_path: Path) -> None:
    odd = os.fsdecode(b"/tmp/\xff\xfe-prog")
    for v in (
        verdict([odd]),
        verdict(["true"], {"PATH": os.fsdecode(b"/\xff:/usr/bin")}),
        verdict(["/bin/true"], {"LD_LIBRARY_PATH": "/a\0b:\ud800", "PATH": "/usr/bin"}),
        verdict(["/bin/true"], {"VIRTUAL_ENV": "/v\ud800", "CONDA_PREFIX": "\0"}),
        verdict(["/bin/tr\0ue"]),
        verdict(["./x"], cwd="/\udcff\0"),
    ):
        no_internal_error(v)


def test_huge_environment() -> None:
    env = {f"V{i}": "x" * 64 for i in range(100_000)}
    env["PATH"] = "/usr/bin:/bin"
    v = verdict(["/bin/true"], env)
    assert v.action == "allow" and v.findings == ()


def test_origin_tricks(elf_builder: ElfBuilder) -> None:
    """$ORIGIN climbing above / and $ORIGIN in a DT_NEEDED with a '/': the
    model must agree with the real loader, and nothing may escape."""
    lib = elf_builder.library("deep/a/b/lib/libgreet.so.1")
    exe = elf_builder.compile(src("use_greet.c"), "deep/a/b/bin/app", needed_libs=("greet",),
                              lib_dirs=(lib.parent,),
                              runpath="$ORIGIN/../../../../../../../../../..:$ORIGIN/../lib")
    report = check_step([str(exe)], {}, "/", HOST)
    assert report.issues == ()
    listing = loader_list(exe)
    assert os.path.normpath(listing.libs["libgreet.so.1"] or "") == str(lib)

    odd = elf_builder.library("o/lib/libodd.so.1", soname="$ORIGIN/../lib/libodd.so.1")
    app = elf_builder.compile(src("hello.c"), "o/bin/app",
                              extra_flags=("-Wl,--no-as-needed", str(odd)))
    report = check_step([str(app)], {}, "/", HOST)
    assert report.issues == ()
    assert any(os.path.normpath(o.path) == str(odd) for o in report.tree.objects)  # type: ignore[union-attr]


# --------------------------------------------------------------------------
# Thousands of files, DT_NEEDED cycles, deadline and caps


def build_tree(builder: ElfBuilder, root: Path, count: int) -> Path:
    """``count`` distinct real libraries libt00000.so..., each needing two
    others (a binary tree whose leaves need libt00000.so again: cycles),
    made from one compiled template by patching same-length dynamic strings.
    Returns the executable that needs libt00000.so."""
    stubs = root / "stubs"
    for n in ("libn00000.so", "libn00001.so"):
        builder.compile(src("freestanding.c"), stubs / n, shared=True, soname=n)
    template = builder.compile(
        src("libgreet.c"), root / "template" / "libt00000.so", shared=True,
        soname="libt00000.so",
        extra_flags=("-Wl,--no-as-needed", str(stubs / "libn00000.so"),
                     str(stubs / "libn00001.so")))
    libs = root / "libs"
    libs.mkdir()
    for i in range(count):
        out = libs / f"libt{i:05d}.so"
        shutil.copyfile(template, out)
        kids = [c if c < count else 0 for c in (2 * i + 1, 2 * i + 2)]
        replace_string(out, b"libt00000.so", f"libt{i:05d}.so".encode())
        replace_string(out, b"libn00000.so", f"libt{kids[0]:05d}.so".encode())
        replace_string(out, b"libn00001.so", f"libt{kids[1]:05d}.so".encode())
    return builder.compile(src("use_greet.c"), root / "bin" / "app",
                           extra_flags=(str(libs / "libt00000.so"),
                                        "-Wl,--allow-shlib-undefined"))


def test_patched_tree_is_what_the_loader_loads(elf_builder: ElfBuilder, tmp_path: Path) -> None:
    exe = build_tree(elf_builder, tmp_path, 7)
    libs = tmp_path / "libs"
    listing = loader_list(exe, library_path=[libs])
    report = check_step([str(exe)], {"LD_LIBRARY_PATH": str(libs)}, "/", HOST)
    assert report.issues == () and report.tree is not None
    ours = {k: v for k, v in report.tree.resolved().items() if k.startswith("libt")}
    theirs = {k: v for k, v in listing.libs.items() if k.startswith("libt")}
    assert ours == theirs and len(ours) == 7


@pytest.fixture(scope="module")
def big_tree(tmp_path_factory: pytest.TempPathFactory, compile_cache) -> tuple[Path, Path]:  # type: ignore[no-untyped-def]
    root = tmp_path_factory.mktemp("big-tree")
    exe = build_tree(ElfBuilder(root, compile_cache), root, 3000)
    return exe, root / "libs"


def test_thousands_of_files_resolve_with_generous_caps(big_tree: tuple[Path, Path]) -> None:
    exe, libs = big_tree
    v = verdict([str(exe)], {"LD_LIBRARY_PATH": str(libs)})
    assert v.action == "allow" and v.error is None


@pytest.mark.parametrize("on_error", ["allow", "deny"])
@pytest.mark.parametrize(("limits", "why"), [
    (Limits(deadline_ms=60_000, max_files=500, max_bytes=1 << 30), "500 files"),
    (Limits(deadline_ms=60_000, max_files=100_000, max_bytes=200_000), "200000 bytes"),
    (Limits(deadline_ms=0, max_files=100_000, max_bytes=1 << 30), "deadline"),
])
def test_caps_and_deadline_end_in_check_limit(big_tree: tuple[Path, Path], limits: Limits,
                                              why: str, on_error: str) -> None:
    exe, libs = big_tree
    policy = Policy(on_error=on_error, limits=limits)
    v = verdict([str(exe)], {"LD_LIBRARY_PATH": str(libs)}, policy=policy)
    assert "check-limit" in v.rule_ids and why in (v.error or "")
    assert v.action == ("reject" if on_error == "deny" else "allow")


def test_byte_cap_bounds_what_is_read(big_tree: tuple[Path, Path]) -> None:
    from grace_policy.budget import Budget

    exe, libs = big_tree
    budget = Budget(deadline_ms=60_000, max_files=100_000, max_bytes=50_000)
    report = check_step([str(exe)], {"LD_LIBRARY_PATH": str(libs)}, "/", HOST, budget=budget)
    assert report.limit is not None and "bytes" in report.limit
    assert budget.bytes_read <= 50_000


def test_deadline_is_looked_at_inside_a_huge_path() -> None:
    env = {"PATH": ":".join(f"/nonexistent/{i}" for i in range(50_000))}
    v = verdict(["prog"], env, policy=Policy(limits=Limits(deadline_ms=0)))
    assert v.rule_ids == ("check-limit",) and "deadline" in (v.error or "")


# --------------------------------------------------------------------------
# Fuzz: random trees of files, links and scripts; random env and argv


KINDS = ("elf", "foreign", "lib", "script", "env-script", "empty", "text", "fifo", "dir",
         "link", "dangling", "noexec")


@pytest.fixture(scope="module")
def fuzz_parts(tmp_path_factory: pytest.TempPathFactory, compile_cache) -> dict[str, Path]:  # type: ignore[no-untyped-def]
    b = ElfBuilder(tmp_path_factory.mktemp("fuzz-parts"), compile_cache)
    parts = {"elf": b.compile(src("use_greet.c"), "app", needed_libs=("greet",),
                              lib_dirs=(b.library("l/libgreet.so.1").parent,)),
             "lib": b.library("l2/libgreet.so.1", page_size=4096)}
    from fixtures.build import compiler_for

    if compiler_for("aarch64"):
        parts["foreign"] = b.library("l3/libgreet.so.1", arch="aarch64")
    else:
        parts["foreign"] = parts["lib"]
    return parts


names = st.sampled_from(["a", "b", "c", "libgreet.so.1", "python3", "env", "x y", "\udcff"])


#: ``make fuzz`` (GRACE_FUZZ_EXAMPLES) runs the resolver fuzz long too.
_RESOLVER_EXAMPLES = int(os.environ.get("GRACE_FUZZ_EXAMPLES", "0") or 0) // 50 or 60


@settings(max_examples=_RESOLVER_EXAMPLES, deadline=None,
          suppress_health_check=list(HealthCheck))
@given(
    entries=st.lists(st.tuples(st.sampled_from(["", "d1", "d2", "d1/d3"]), names,
                               st.sampled_from(KINDS), names), max_size=12),
    path=st.lists(st.sampled_from(["", "d1", "d2", "d1/d3", "/usr/bin", "nonexistent", "a"]),
                  max_size=5),
    llp=st.lists(st.sampled_from(["", "d1", "d2", "$ORIGIN", "/lib"]), max_size=4),
    argv0=st.one_of(names, st.sampled_from(["./a", "d1/a", "/", "", ".", ".."])),
    leak=st.sampled_from([None, "d1", "d2", "nonexistent"]),
    on_error=st.sampled_from(["allow", "deny"]),
    deadline=st.sampled_from([0, 2000]),
)
def test_fuzz_decide_always_returns_a_verdict(fuzz_parts: dict[str, Path], entries: list,
                                              path: list[str], llp: list[str], argv0: str,
                                              leak: str | None, on_error: str,
                                              deadline: int) -> None:
    with tempfile.TemporaryDirectory(prefix="gp-fuzz-") as tmp:
        root = Path(tmp)
        for sub in ("d1", "d2", "d1/d3"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        for where, name, kind, target in entries:
            p = root / where / name
            if os.path.lexists(p):
                continue
            tgt = root / "d1" / target
            if kind in ("elf", "foreign", "lib"):
                shutil.copyfile(fuzz_parts[kind], p)
                p.chmod(0o755)
            elif kind == "script":
                executable(p, f"#!{tgt}\n")
            elif kind == "env-script":
                executable(p, f"#!/usr/bin/env {target}\n")
            elif kind in ("empty", "text"):
                executable(p, "" if kind == "empty" else "hello\n")
            elif kind == "noexec":
                executable(p, "#!/bin/sh\n", mode=0o644)
            elif kind == "fifo":
                os.mkfifo(p)
            elif kind == "dir":
                p.mkdir()
            elif kind == "link":
                p.symlink_to(tgt)
            else:
                p.symlink_to(root / "nowhere" / target)
        env = {"PATH": ":".join(str(root / e) if e and not e.startswith("/") else e
                                for e in path),
               "LD_LIBRARY_PATH": ":".join(str(root / e) if e and e[0] not in "/$" else e
                                           for e in llp)}
        if leak:
            env["VIRTUAL_ENV"] = str(root / leak)
        policy = Policy(on_error=on_error, limits=Limits(deadline_ms=deadline))
        with no_hang():
            v = decide(policy, StepRequest(partition=None, argv=[argv0], env=env, cwd=str(root),
                                           node=HOST))
        assert isinstance(v, Verdict) and v.action in ACTIONS
        no_internal_error(v)
        if v.error:  # only budget stops: they follow on_error (or a known error)
            assert "check-limit" in v.rule_ids
            if on_error == "deny":
                assert v.action == "reject"
