"""The verdict cache in slurmstepd (spank/grace_cache.c), on a real Slurm 22.05.

A clean step's second launch is judged in C from a root-owned file of
entries, without loading Python; anything the check depended on that changed
(the executable, a file earlier in PATH, an env variable) is a miss and the
full check runs again. Each test uses its own cache directory so earlier
tests cannot make it pass.

How "Python did not run" is shown: after the first step the plugin's Python
part (grace_policy_py.so) is moved away under on_error=deny. A step that
needs Python is then refused; the identical step still runs from the cache.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from grace_policy import __version__, verdict_cache

from .harness import SlurmEnv

pytestmark = pytest.mark.slurm

PREFIX = "grace-policy: "
NOBODY = 65534
VERSION = __version__


@pytest.fixture
def cached(slurm: SlurmEnv) -> Iterator[SlurmEnv]:
    yield slurm
    slurm.use("base")
    assert slurm.cluster.settled_node_state() in ("idle", "mixed", "allocated")


def _cache_dir(env: SlurmEnv, name: str) -> Path:
    path = env.cluster.root.parent / f"cache-{name}"
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()
    return path


def _step(env: SlurmEnv, argv: list[str], *, user: str = "nobody",
          extra_env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess[str],
                                                            list[dict[str, object]]]:
    """One srun; its result and the audit records it added."""
    before = len(env.audit_lines())
    res = env.cluster.srun(argv, user=user, env=extra_env)
    records = [json.loads(line) for line in env.audit_lines()[before:]]
    return res, records


def _hit(records: list[dict[str, object]]) -> bool:
    [record] = records
    return record.get("cache") == "hit"


def _program(env: SlurmEnv, name: str) -> Path:
    """A native program of the user's (nobody's directory: its entries are
    the user's, not node-wide), in a directory of its own."""
    d = env.cluster.shared / f"cache-progs-{name}"
    if d.exists():
        shutil.rmtree(d)
    d.mkdir()
    d.chmod(0o755)
    prog = d / "prog"
    shutil.copy2(env.files / "native", prog)
    prog.chmod(0o755)
    os.chown(d, NOBODY, NOBODY)
    return prog


def test_second_identical_step_is_a_hit_without_python(cached: SlurmEnv) -> None:
    tree = cached.copy_prefix("prefix-cache-hit")
    stub = tree / "lib" / "slurm" / "spank_grace_policy.so"
    pylib = tree / "lib" / "grace-policy" / "grace_policy_py.so"
    cache = _cache_dir(cached, "hit")
    cached.set_plugin_line(stub, f"config={cached.configs['base']}",
                           f"audit={cached.audit_log}", f"cache_dir={cache}", "on_error=deny")
    prog = _program(cached, "hit")
    out = cached.side_file("cache-hit.out")

    res, first = _step(cached, [str(prog), str(out)])
    assert res.returncode == 0, res.stderr
    assert not _hit(first) and first[0]["action"] == "allow"
    # The directory and the file: root's, nobody else's.
    assert (cache.stat().st_uid, cache.stat().st_mode & 0o777) == (0, 0o700)
    store = cache / f"{NOBODY}.v{VERSION}"
    assert (store.stat().st_uid, store.stat().st_mode & 0o777) == (0, 0o600)
    [entry] = verdict_cache.parse(store.read_text())
    assert ("argv0", "=" + str(prog)) in entry[0] and entry[1] == "enforce"

    res, second = _step(cached, [str(prog), str(out)])
    assert res.returncode == 0, res.stderr
    assert _hit(second)
    # The C line has the Python line's keys (and "cache"), and its values.
    assert set(second[0]) == set(first[0]) | {"cache"}
    for key in ("action", "mode", "partition", "uid", "node", "rules", "paths", "env_set",
                "env_unset", "error", "skipped", "event", "step_id", "program", "enforce_action",
                "exempt"):
        assert second[0][key] == first[0][key], key
    assert isinstance(second[0]["elapsed_ms"], float)

    # Python cannot be loaded any more, and on_error is deny.
    pylib.rename(pylib.with_name("moved-away.so"))
    out.unlink()
    res, third = _step(cached, [str(prog), str(out)])
    assert res.returncode == 0, res.stderr
    assert "side-effect program ran" in res.stdout and out.exists()
    assert _hit(third) and PREFIX not in res.stderr
    # A step the cache does not know needs Python: refused per on_error.
    res, fourth = _step(cached, ["/bin/true"])
    assert res.returncode != 0
    assert f"{PREFIX}this step was refused: the site's launch check could not run" in res.stderr
    # C's own line: what on_error did, and why.
    assert [(r["action"], r["failure"], r["mode"]) for r in fourth] == [
        ("reject", "python", None)], fourth
    assert "cannot load the Python part" in str(fourth[0]["error"])
    log = cached.cluster.slurmd_log_text()
    assert "cannot load the Python part" in log and "moved-away" not in log


def test_changed_executable_is_a_miss(cached: SlurmEnv) -> None:
    cached.use("base", f"cache_dir={_cache_dir(cached, 'changed')}")
    prog = _program(cached, "changed")
    for _ in range(2):
        res, records = _step(cached, [str(prog)])
        assert res.returncode == 0, res.stderr
    assert _hit(records)
    # touch: new mtime (same inode)
    os.utime(prog, ns=(prog.stat().st_atime_ns, prog.stat().st_mtime_ns + 1_000_000_000))
    res, records = _step(cached, [str(prog)])
    assert res.returncode == 0 and not _hit(records)
    res, records = _step(cached, [str(prog)])
    assert _hit(records)
    # replaced: same bytes, new inode
    data = prog.read_bytes()
    prog.unlink()
    prog.write_bytes(data)
    prog.chmod(0o755)
    res, records = _step(cached, [str(prog)])
    assert res.returncode == 0 and not _hit(records)
    # replaced by a foreign program under the same name: the check runs and refuses
    shutil.copy(cached.files / "foreign", prog)
    res, records = _step(cached, [str(prog)])
    assert res.returncode != 0 and f"{PREFIX}ERROR exe-arch-mismatch" in res.stderr
    assert not _hit(records)


def test_new_file_earlier_in_path_is_a_miss(cached: SlurmEnv) -> None:
    cached.use("base", f"cache_dir={_cache_dir(cached, 'path')}")
    prog = _program(cached, "path-late")
    early = cached.cluster.shared / "cache-progs-path-early"
    if early.exists():
        shutil.rmtree(early)
    early.mkdir()
    early.chmod(0o755)
    env = {"PATH": f"{early}:{prog.parent}:/usr/bin:/bin"}
    for _ in range(2):
        res, records = _step(cached, ["prog"], extra_env=env)
        assert res.returncode == 0, res.stderr
        assert "side-effect program ran" in res.stdout
    assert _hit(records)
    shutil.copy(cached.files / "foreign", early / "prog")
    (early / "prog").chmod(0o755)
    res, records = _step(cached, ["prog"], extra_env=env)
    assert res.returncode != 0 and f"{PREFIX}ERROR exe-arch-mismatch: {early / 'prog'}" \
        in res.stderr
    assert not _hit(records)


def test_other_environment_is_a_miss(cached: SlurmEnv) -> None:
    cached.use("base", f"cache_dir={_cache_dir(cached, 'env')}")
    prog = _program(cached, "env")
    for _ in range(2):
        res, records = _step(cached, [str(prog)])
    assert _hit(records)
    venv = {"VIRTUAL_ENV": str(cached.files / "venv-foreign")}
    res, records = _step(cached, [str(prog)], extra_env=venv)
    assert not _hit(records)
    assert f"{PREFIX}" in res.stderr  # the leaked venv is reported (Python ran)
    path = {"PATH": f"{cached.cluster.shared}:/usr/local/bin:/usr/bin:/bin"}
    res, records = _step(cached, [str(prog)], extra_env=path)
    assert res.returncode == 0 and not _hit(records)
    res, records = _step(cached, [str(prog)], extra_env=path)
    assert _hit(records)


def test_foreign_step_is_never_cached(cached: SlurmEnv) -> None:
    cache = _cache_dir(cached, "foreign")
    cached.use("base", f"cache_dir={cache}")
    foreign = str(cached.files / "foreign")
    for _ in range(2):
        res, records = _step(cached, [foreign])
        assert res.returncode != 0 and f"{PREFIX}ERROR exe-arch-mismatch" in res.stderr
        assert not _hit(records) and records[0]["action"] == "reject"
    store = cache / f"{NOBODY}.v{VERSION}"
    assert store.exists() and verdict_cache.parse(store.read_text()) == []


def _runs_twice_uncached(env: SlurmEnv, prog: Path) -> list[str]:
    for _ in range(2):
        res, records = _step(env, [str(prog)])
        assert res.returncode == 0, res.stderr
        assert PREFIX not in res.stderr and not _hit(records)
    job_lines = [line for line in env.cluster.slurmd_log_text().splitlines()
                 if "verdict cache off" in line]
    return job_lines


def test_unsafe_cache_dir_is_ignored_and_logged(cached: SlurmEnv) -> None:
    cache = _cache_dir(cached, "unsafe-dir")
    cache.mkdir()
    cache.chmod(0o777)
    cached.use("base", f"cache_dir={cache}")
    prog = _program(cached, "unsafe-dir")
    lines = _runs_twice_uncached(cached, prog)
    assert any(f"{cache} must be a directory owned by root and not group/other-writable"
               in line and "mode 0777" in line for line in lines), lines
    assert list(cache.iterdir()) == []


def _store_with_an_entry(env: SlurmEnv, name: str) -> tuple[Path, Path]:
    """nobody's cache file in a fresh root 0700 dir, holding the entry of a
    clean step of a program of its own; returns (file, program)."""
    cache = _cache_dir(env, name)
    cache.mkdir(mode=0o700)
    store = cache / f"{NOBODY}.v{VERSION}"
    prog = _program(env, name)
    env.use("base", f"cache_dir={cache}")
    res, _ = _step(env, [str(prog)])
    assert res.returncode == 0 and verdict_cache.parse(store.read_text())
    return store, prog


def test_cache_file_not_owned_by_root_is_ignored_and_logged(cached: SlurmEnv) -> None:
    # A forged entry that would match if it were believed: nobody "wrote" it.
    store, prog = _store_with_an_entry(cached, "unsafe-file")
    text = store.read_text()
    store.unlink()
    store.write_text(text)
    os.chown(store, NOBODY, NOBODY)
    lines = _runs_twice_uncached(cached, prog)
    assert any(f"{store} must be a regular file owned by root" in line
               and f"uid {NOBODY}" in line for line in lines), lines
    # A symlink planted in its place is not followed either.
    store.unlink()
    target = cached.cluster.shared / "not-a-cache"
    target.write_text("")
    store.symlink_to(target)
    lines = _runs_twice_uncached(cached, prog)
    assert any(f"cannot open {store} as root" in line for line in lines), lines
    assert target.read_text() == ""


def test_writable_or_linked_cache_file_is_ignored(cached: SlurmEnv) -> None:
    """A root-owned entry file that others may write, or that has a second
    hard link, is not believed (each holds a matching entry here)."""
    store, prog = _store_with_an_entry(cached, "loose-file")
    store.chmod(0o666)
    lines = _runs_twice_uncached(cached, prog)
    assert any(f"{store} must be a regular file owned by root" in line and "mode 0666" in line
               for line in lines), lines
    store.chmod(0o600)
    twin = store.parent.parent / "cache-loose-twin"
    if twin.exists():
        twin.unlink()
    os.link(store, twin)
    seen = len([line for line in cached.cluster.slurmd_log_text().splitlines()
                if "verdict cache off" in line])
    lines = _runs_twice_uncached(cached, prog)[seen:]
    assert lines and all(f"{store} must be a regular file owned by root, with one link"
                         in line and "mode 0600" in line for line in lines), lines


def test_symlinked_cache_dir_is_ignored(cached: SlurmEnv) -> None:
    real = _cache_dir(cached, "real-dir")
    real.mkdir(mode=0o700)
    link = _cache_dir(cached, "link-dir")
    link.symlink_to(real)
    cached.use("base", f"cache_dir={link}")
    lines = _runs_twice_uncached(cached, _program(cached, "link-dir"))
    assert any(str(link) in line for line in lines), lines
    assert list(real.iterdir()) == []


def test_user_cannot_write_the_cache_file(cached: SlurmEnv) -> None:
    cache = _cache_dir(cached, "perm")
    cached.use("base", f"cache_dir={cache}")
    prog = _program(cached, "perm")
    res, _ = _step(cached, [str(prog)])
    assert res.returncode == 0
    store = cache / f"{NOBODY}.v{VERSION}"
    before = store.read_bytes()
    # Not from a login shell...
    tries = [f"echo forged >> {store}", f"ls {cache}", f"echo x > {cache}/new"]
    for cmd in tries:
        done = subprocess.run(["runuser", "-u", "nobody", "--", "sh", "-c", cmd],
                              capture_output=True, text=True, check=False)
        assert done.returncode != 0 and "Permission denied" in done.stderr, (cmd, done)
    # ...nor from a task of a step (slurmstepd holds the descriptor, O_CLOEXEC).
    res = cached.cluster.srun(["sh", "-c", f"ls -l /proc/$PPID/fd/ 2>&1; echo forged >> {store}"],
                              user="nobody")
    assert res.returncode != 0 and "Permission denied" in res.stderr
    assert store.read_bytes().startswith(before)
    assert b"forged" not in store.read_bytes()


def _readelf(path: Path, *flags: str) -> str:
    return subprocess.run(["readelf", *flags, str(path)], capture_output=True, text=True,
                          check=True).stdout


def test_stub_has_no_libpython(slurm: SlurmEnv) -> None:
    stub_needed = _readelf(slurm.plugin, "-d")
    assert "libpython" not in stub_needed
    assert "libpython" in _readelf(slurm.python_part, "-d")
    exported = subprocess.run(["nm", "-D", "--defined-only", str(slurm.plugin)],
                              capture_output=True, text=True, check=True).stdout
    names = {line.split()[-1] for line in exported.splitlines() if line.strip()}
    assert names and all(re.match(r"(plugin_|slurm_spank_|spank_plugin_version)", n)
                         for n in names), names
    assert not any(n.startswith("Py") for n in subprocess.run(
        ["nm", "-D", "--undefined-only", str(slurm.plugin)], capture_output=True, text=True,
        check=True).stdout.split())
    py_exported = subprocess.run(["nm", "-D", "--defined-only", str(slurm.python_part)],
                                 capture_output=True, text=True, check=True).stdout
    assert {line.split()[-1] for line in py_exported.splitlines()} == {"grace_python_check"}
    for lib in (slurm.plugin, slurm.python_part):
        dyn = _readelf(lib, "-d")
        assert "BIND_NOW" in dyn and "NODELETE" in dyn, lib
        assert "GNU_RELRO" in _readelf(lib, "-lW"), lib


def test_srun_never_maps_libpython(cached: SlurmEnv) -> None:
    """srun (local context) loads the stub only; slurmstepd never maps
    libpython either, hit or miss: Python runs in the check's helper process
    (grace_helper.c), which is gone before the tasks start."""
    cached.use("base", f"cache_dir={_cache_dir(cached, 'maps')}")
    # (as root: a user's task may not read the maps of its root slurmstepd)
    probe = ["sh", "-c", "grep -c libpython /proc/$PPID/maps || true"]
    res, first = _step(cached, probe, user="root")
    assert res.returncode == 0 and not _hit(first)
    assert int(res.stdout.split()[-1]) == 0  # Python ran, but in the helper
    res, second = _step(cached, probe, user="root")
    assert _hit(second) and int(res.stdout.split()[-1]) == 0
    # srun itself: the loader's trace shows the stub loaded, libpython never.
    res = cached.cluster.srun(["/bin/true"], user="nobody", env={"LD_DEBUG": "files"})
    assert res.returncode == 0, res.stderr[-2000:]
    assert "spank_grace_policy.so" in res.stderr
    assert "libpython" not in res.stderr
    # sbatch and salloc (allocator context) alike: the user's submission
    # commands never map an interpreter.
    for cmd in (["sbatch", "--wrap", "true"], ["salloc", "-N1", "/bin/true"]):
        res = cached.cluster.run(cmd, user="nobody", env={"LD_DEBUG": "files"})
        assert res.returncode == 0, res.stderr[-2000:]
        assert "spank_grace_policy.so" in res.stderr, cmd
        assert "libpython" not in res.stderr, cmd
        submitted = re.search(r"Submitted batch job (\d+)", res.stdout)
        if submitted:  # let it finish while the cluster is up: no stray slurmstepd
            cached.cluster.wait_job(int(submitted.group(1)))


def test_a_block_without_the_step_inputs_never_matches(cached: SlurmEnv) -> None:
    """A block of only a mode (no inputs, no questions) would match every
    step if the parser only compared the inputs a block has. Written here
    as root, as a torn or foreign file could hold it: the foreign program
    must still be refused."""
    cache = _cache_dir(cached, "hostile-block")
    cached.use("base", f"cache_dir={cache}")
    prog = _program(cached, "hostile")
    res, _records = _step(cached, [str(prog)])  # creates nobody's file
    assert res.returncode == 0, res.stderr
    store = cache / f"{NOBODY}.v{VERSION}"
    with open(store, "a") as fh:
        fh.write("\nGPC1\nO mode enforce\n.\n")
    res, records = _step(cached, [str(cached.files / "foreign")])
    assert res.returncode != 0 and f"{PREFIX}ERROR exe-arch-mismatch" in res.stderr
    assert not _hit(records)


def test_batch_steps_are_not_cached(cached: SlurmEnv) -> None:
    """A batch step's argv[0] is a script stored for that job only: an entry
    could never be used again and would push useful ones out."""
    cache = _cache_dir(cached, "batch")
    cached.use("base", f"cache_dir={cache}")
    job = cached.cluster.sbatch("#!/bin/sh\ntrue\n", user="nobody")
    cached.cluster.wait_job(job)
    store = cache / f"{NOBODY}.v{VERSION}"
    entries = verdict_cache.parse(store.read_text()) if store.exists() else []
    assert not [e for e in entries if any("slurm_script" in v for _k, v in e[0])], entries


def test_moved_symlink_to_the_same_file_is_a_miss(cached: SlurmEnv) -> None:
    """The executable's $ORIGIN is its real directory. A symlink moved to a
    hard link of the *same* file in another directory keeps every stat
    answer, but the libraries now come from there: the recorded realpath
    answer must catch it (here the other directory holds a foreign copy)."""
    cache = _cache_dir(cached, "realpath")
    cached.use("base", f"cache_dir={cache}")
    base = cached.cluster.shared / "cache-realpath"
    if base.exists():
        shutil.rmtree(base)
    good, bad = base / "good", base / "bad"
    good.mkdir(parents=True)
    bad.mkdir()
    for d in (base, good, bad):
        d.chmod(0o755)
    lib_src = base / "lib.c"
    lib_src.write_text("int greet(void) { return 0; }\n")
    main_src = base / "main.c"
    main_src.write_text("int greet(void);\nint main(void) { return greet(); }\n")
    for cc, where in (("gcc", good), ("aarch64-linux-gnu-gcc", bad)):
        subprocess.run([cc, "-shared", "-fPIC", "-o", str(where / "libgreet.so"),
                        str(lib_src)], check=True)
    subprocess.run(["gcc", "-o", str(good / "prog"), str(main_src), f"-L{good}", "-lgreet",
                    "-Wl,--enable-new-dtags,-rpath,$ORIGIN"], check=True)
    os.link(good / "prog", bad / "prog")  # the same inode in the other directory
    link = base / "run"
    link.symlink_to(good / "prog")
    for _ in range(2):
        res, records = _step(cached, [str(link)])
        assert res.returncode == 0, res.stderr
    assert _hit(records)  # the entry works as long as nothing moved
    link.unlink()
    link.symlink_to(bad / "prog")
    res, records = _step(cached, [str(link)])
    assert not _hit(records)
    assert res.returncode != 0 and f"{PREFIX}ERROR lib-not-found" in res.stderr


def test_forged_blocks_in_the_node_file_never_match(cached: SlurmEnv) -> None:
    """The node-wide file takes only complete entries marked for it: a bare
    mode, or an unmarked entry (the user's kind, with creds), never serves."""
    cache = _cache_dir(cached, "hostile-node")
    cached.use("base", f"cache_dir={cache}")
    res, _records = _step(cached, ["/bin/true"])
    assert res.returncode == 0, res.stderr
    node_file = cache / f"node.v{VERSION}"
    assert (node_file.stat().st_uid, node_file.stat().st_mode & 0o777) == (0, 0o600)
    [(ins, mode, _probes, scope)] = verdict_cache.parse_blocks(node_file.read_text())
    assert scope == "node" and mode == "enforce" and "creds" not in dict(ins)
    with open(node_file, "a") as fh:
        fh.write("\nGPC1\nO mode enforce\nO scope node\n.\n")
    res, records = _step(cached, [str(cached.files / "foreign")])
    assert res.returncode != 0 and f"{PREFIX}ERROR exe-arch-mismatch" in res.stderr
    assert not _hit(records)
    # /bin/true's own entry without its mark: not taken from the node file
    text = node_file.read_text().replace("\nO scope node\n", "\n")
    node_file.write_text(text)
    res, records = _step(cached, ["/bin/true"])
    assert res.returncode == 0 and not _hit(records)


# --------------------------------------------------------------------------
# Python steps: a sweep over the script's arguments is one entry (issue 18).

def _sweep_world(env: SlurmEnv) -> tuple[Path, Path, Path]:
    """A venv of the system python and a train.py, in a directory of the
    user's (nobody's); returns (python, train.py, the directory)."""
    d = env.cluster.shared / "cache-sweep"
    if d.exists():
        shutil.rmtree(d)
    d.mkdir()
    venv = d / "venv"
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next((venv / "lib").glob("python3*/site-packages"))
    (site / "mylib.py").write_text("")
    (site / "otherlib.py").write_text("")
    train = d / "train.py"
    train.write_text("import sys\nimport mylib\nprint('seed', sys.argv[1:])\n")
    # Byte-compiled now: a step started with -I (which ignores the
    # PYTHONDONTWRITEBYTECODE this test run may pass on) would otherwise
    # write site-packages/__pycache__ after its check, and the next step
    # would rightly miss (a listed directory changed).
    subprocess.run(["/usr/bin/python3", "-m", "compileall", "-q", str(site)], check=True)
    subprocess.run(["chown", "-R", f"{NOBODY}:{NOBODY}", str(d)], check=True)
    return venv / "bin" / "python", train, d


def test_a_python_sweep_is_one_miss_and_every_import_input_still_misses(cached: SlurmEnv
                                                                         ) -> None:
    cache = _cache_dir(cached, "sweep")
    cached.use("base", f"cache_dir={cache}")
    python, train, d = _sweep_world(cached)
    env = {"HOME": str(d), "PATH": "/usr/bin:/bin"}

    def hit(*args: str, extra: dict[str, str] | None = None) -> bool:
        res, records = _step(cached, [str(python), *args], extra_env={**env, **(extra or {})})
        assert res.returncode == 0 and PREFIX not in res.stderr, res.stderr
        return _hit(records)

    assert not hit(str(train), "--seed", "1")
    assert [hit(str(train), "--seed", str(s)) for s in range(2, 6)] == [True] * 4
    assert hit(str(train)) and hit(str(train), "--lr", "0.1", "-c", "x")
    # the entry holds the words up to the script, and "at least that many"
    store = cache / f"{NOBODY}.v{VERSION}"
    [(ins, _mode, _probes, scope)] = [b for b in verdict_cache.parse_blocks(store.read_text())
                                      if ("argv0", "=" + str(python)) in b[0]]
    assert scope is None and ("argmin", "=2") in ins and ("argv:1", "=" + str(train)) in ins
    assert not [name for name, _v in ins if name in ("argc", "argv:2")], ins
    node_file = cache / f"node.v{VERSION}"
    assert str(d) not in node_file.read_text()  # the user's files: never node-wide

    # What changes the imports is a miss (then a hit of its own).
    for args, extra in (
        (("-I", str(train), "--seed", "1"), None),
        (("-E", str(train), "--seed", "1"), None),
        (("-s", str(train), "--seed", "1"), None),
        ((str(train), "--seed", "1"), {"PYTHONPATH": str(d)}),
        ((str(train), "--seed", "1"), {"PYTHONNOUSERSITE": "1"}),
        # the rest of what 3.11's getpath and site read
        (("-P", str(train), "--seed", "1"), None),
        ((str(train), "--seed", "1"), {"PYTHONSAFEPATH": "1"}),
        ((str(train), "--seed", "1"), {"PYTHONUSERBASE": str(d / "userbase")}),
        ((str(train), "--seed", "1"), {"PYTHONPLATLIBDIR": "lib"}),
        (("-c", "import mylib", "1"), None),
        (("-m", "mylib", "1"), None),
    ):
        assert not hit(*args, extra=extra), (args, extra)
        again = (*args[:-1], "2")
        assert hit(*again, extra=extra), (again, extra)
    # HOME is not an input here: a venv has no user site (site.py's
    # ENABLE_USER_SITE is off under a pyvenv.cfg without system packages).
    assert hit(str(train), "--seed", "3", extra={"HOME": str(d / "otherhome")})
    assert not hit("-c", "import otherlib", "1")
    assert not hit("-m", "otherlib", "1")
    # the script's content: a new import is judged again
    train.write_text(train.read_text() + "import otherlib\n")
    assert not hit(str(train), "--seed", "7")
    assert hit(str(train), "--seed", "8")
    # a foreign extension the script now imports is found, not replayed
    site = next((python.parent.parent / "lib").glob("python3*/site-packages"))
    suffix = subprocess.run(["/usr/bin/python3", "-c", "import sysconfig; print(sysconfig."
                             "get_config_var('EXT_SUFFIX'))"], capture_output=True, text=True,
                            check=True).stdout.strip()
    (site / "otherlib.py").unlink()
    shutil.copy(cached.files / "foreign", site / f"otherlib{suffix}")
    res, records = _step(cached, [str(python), str(train), "--seed", "9"], extra_env=env)
    assert res.returncode != 0 and not _hit(records), res.stderr
    assert f"otherlib{suffix}" in res.stderr


# --------------------------------------------------------------------------
# Node-wide entries: two real unprivileged accounts (issue 18 item 2).

USERS = ("gpcache1", "gpcache2")


@pytest.fixture
def two_users(cached: SlurmEnv) -> Iterator[dict[str, Path]]:
    """Two real accounts with homes of their own (0755, like Debian's
    default), removed again at the end."""
    homes: dict[str, Path] = {}
    made: list[str] = []
    try:
        for name in USERS:
            home = cached.cluster.root.parent / f"home-{name}"
            if subprocess.run(["id", "-u", name], capture_output=True,
                              check=False).returncode != 0:
                subprocess.run(["useradd", "--no-create-home", "--home-dir", str(home),
                                "--shell", "/bin/sh", "--user-group", name], check=True)
                made.append(name)
            if home.exists():
                shutil.rmtree(home)
            home.mkdir(mode=0o755)
            shutil.chown(home, name, name)
            homes[name] = home
        yield homes
    finally:
        for name in made:
            subprocess.run(["userdel", name], check=False)


def _as(env: SlurmEnv, user: str, home: Path, argv: list[str], path: str = "/usr/bin:/bin"
        ) -> tuple[subprocess.CompletedProcess[str], list[dict[str, object]]]:
    before = len(env.audit_lines())
    res = env.cluster.srun(argv, user=user, env={"HOME": str(home), "PATH": path},
                           cwd=str(home))
    return res, [json.loads(line) for line in env.audit_lines()[before:]]


def test_a_second_users_node_program_hits_the_node_wide_entry(
        cached: SlurmEnv, two_users: dict[str, Path]) -> None:
    cache = _cache_dir(cached, "node-wide")
    cached.use("base", f"cache_dir={cache}")
    (u1, home1), (u2, home2) = two_users.items()
    uid1, uid2 = (int(subprocess.run(["id", "-u", u], capture_output=True, text=True,
                                     check=True).stdout) for u in (u1, u2))
    res, first = _as(cached, u1, home1, ["hostname"])
    assert res.returncode == 0 and not _hit(first) and first[0]["uid"] == uid1, res.stderr
    res, second = _as(cached, u2, home2, ["hostname"])
    assert res.returncode == 0, res.stderr
    assert _hit(second) and second[0]["uid"] == uid2  # another user, cwd, HOME, groups
    node_file = cache / f"node.v{VERSION}"
    blocks = verdict_cache.parse_blocks(node_file.read_text())
    assert len(blocks) == 1 and blocks[0][3] == "node"
    names = {name for name, _v in blocks[0][0]}
    assert not names & {"creds", "cwd", "env:HOME"}, names
    for uid in (uid1, uid2):  # nothing of it in the users' own files
        assert verdict_cache.parse((cache / f"{uid}.v{VERSION}").read_text()) == []

    # A step that reads a user's file stays that user's: u1's PATH searches
    # ~/bin first (absent now, but u1 may put a program there).
    path = f"{home1}/bin:/usr/bin:/bin"
    res, records = _as(cached, u1, home1, ["hostname"], path=path)
    assert res.returncode == 0 and not _hit(records)
    res, records = _as(cached, u1, home1, ["hostname"], path=path)
    assert _hit(records)
    assert len(verdict_cache.parse_blocks(node_file.read_text())) == 1
    [mine] = verdict_cache.parse((cache / f"{uid1}.v{VERSION}").read_text())
    assert ("env:PATH", "=" + path) in mine[0]
    # u2 with the same PATH (u1's directory) gets no answer from u1's entry
    res, records = _as(cached, u2, home2, ["hostname"], path=path)
    assert res.returncode == 0 and not _hit(records)
    # and when u1 puts a foreign hostname there, it is judged, not replayed
    (home1 / "bin").mkdir()
    shutil.copy(cached.files / "foreign", home1 / "bin" / "hostname")
    subprocess.run(["chown", "-R", f"{u1}:{u1}", str(home1 / "bin")], check=True)
    res, records = _as(cached, u1, home1, ["hostname"], path=path)
    assert res.returncode != 0 and not _hit(records)
    assert f"{PREFIX}ERROR exe-arch-mismatch: {home1}/bin/hostname" in res.stderr
    # the node's hostname still serves both from the node-wide entry
    for user, home in two_users.items():
        res, records = _as(cached, user, home, ["hostname"])
        assert res.returncode == 0 and _hit(records), user


def test_users_cannot_read_or_write_the_node_file(cached: SlurmEnv) -> None:
    cache = _cache_dir(cached, "node-perm")
    cached.use("base", f"cache_dir={cache}")
    res, _ = _step(cached, ["/bin/true"])
    assert res.returncode == 0
    node_file = cache / f"node.v{VERSION}"
    before = node_file.read_bytes()
    assert verdict_cache.parse_blocks(before.decode())
    for cmd in (f"cat {node_file}", f"echo forged >> {node_file}"):
        done = subprocess.run(["runuser", "-u", "nobody", "--", "sh", "-c", cmd],
                              capture_output=True, text=True, check=False)
        assert done.returncode != 0 and "Permission denied" in done.stderr, (cmd, done)
    res = cached.cluster.srun(["sh", "-c", f"cat {node_file}; echo forged >> {node_file}"],
                              user="nobody")
    assert res.returncode != 0 and "Permission denied" in res.stderr
    # The step itself may add a node-wide entry of its own (root appends it:
    # `sh` is a node program, in roots with a merged /usr too): never a line
    # the user wrote.
    after = node_file.read_bytes()
    assert after.startswith(before) and b"forged" not in after
    blocks = verdict_cache.parse_blocks(after.decode())
    assert blocks and all(scope == "node" for *_rest, scope in blocks)


# --------------------------------------------------------------------------
# Entries name the node's profile (issue 20 item 2).

def test_an_entry_made_for_4k_pages_is_a_miss_when_the_node_is_64k(cached: SlurmEnv) -> None:
    """The same node, configured for 64 KiB pages (the config's [node]
    override, edited in place: same path), refuses what it allowed on 4 KiB;
    and an entry whose host profile says another page size (a node rebooted
    into another kernel) is never replayed."""
    cache = _cache_dir(cached, "profile")
    cfg = cached.cluster.root.parent / "etc-grace-profile" / "grace-policy.toml"
    cfg.parent.mkdir(exist_ok=True)
    cfg.parent.chmod(0o755)
    base = cached.configs["base"].read_text()
    cfg.write_text(base)
    cfg.chmod(0o644)

    def compile_config() -> None:
        done = subprocess.run([str(cached.prefix / "bin" / "grace-policy"), "config", "check",
                               "--compile", "--plugstack", "none", str(cfg)],
                              capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stdout + done.stderr

    compile_config()
    cached.use(cfg, f"cache_dir={cache}")
    prog = cached.files / "native-4k"
    for _ in range(2):
        res, records = _step(cached, [str(prog)])
        assert res.returncode == 0, res.stderr
    assert _hit(records)

    # the host profile: rewrite the stored entry as if made on 64 KiB pages
    store = next(f for f in (cache / f"{NOBODY}.v{VERSION}", cache / f"node.v{VERSION}")
                 if str(prog) in f.read_text())
    text = store.read_text()
    here = verdict_cache.fsprobe.encode(verdict_cache.host_profile())
    page = str(os.sysconf("SC_PAGE_SIZE"))
    assert f"I host ={here}\n" in text and f"%20{page}%20" in here
    store.write_text(text.replace(here, here.replace(f"%20{page}%20", "%2065536%20", 1)))
    res, records = _step(cached, [str(prog)])
    assert res.returncode == 0 and not _hit(records)
    res, records = _step(cached, [str(prog)])
    assert _hit(records)  # the entry made now, for this node's pages

    # the same config path, now saying 64 KiB: the step is judged again
    cfg.write_text(base.replace("{extra}", "").replace(
        'deadline_ms = 5000\n', 'deadline_ms = 5000\n[node]\npage_size = 65536\n', 1))
    compile_config()
    res, records = _step(cached, [str(prog)])
    assert res.returncode != 0 and not _hit(records)
    assert f"{PREFIX}ERROR page-" in res.stderr, res.stderr
