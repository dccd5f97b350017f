"""The C <-> Python contract (grace_policy/contract.py) held from both ends.

Every path a step or a result takes between the languages is run through
the plugin's own C (spank/grace_wire.c, spank/grace_contract.c, compiled
into tests/fixtures/src/contract_driver.c against a header spank/gen_contract.py
writes from the table) and the plugin's own Python (checker/wire.py,
slurm_bridge.read_step through cffi): C encodes and Python decodes, Python
encodes and C decodes, odd bytes included. Fields cross by name, so an
encoder or decoder edited by hand (a field moved, dropped or read as
another) fails here, and so does a table changed on one side only.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from grace_policy import contract, slurm_bridge
from grace_policy.checker import wire

REPO = Path(__file__).resolve().parent.parent
SPANK = REPO / "spank"
DRIVER_SRC = REPO / "tests" / "fixtures" / "src" / "contract_driver.c"
sys.path.insert(0, str(SPANK))
import gen_contract  # noqa: E402  (spank/, not a package)

sys.path.remove(str(SPANK))


def _build(out: Path, header: str) -> Path:
    """The driver, compiled from the plugin's sources against ``header``."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "grace_contract.h").write_text(header)
    exe = out / "contract_driver"
    cc = shutil.which("cc") or shutil.which("gcc")
    assert cc, "a C compiler is needed (packaging/install-deps.sh installs gcc)"
    subprocess.run([cc, "-std=gnu11", "-Wall", "-Wextra", "-Werror", "-O1", f"-I{out}",
                    f"-I{SPANK}", "-o", str(exe), str(DRIVER_SRC), str(SPANK / "grace_wire.c"),
                    str(SPANK / "grace_contract.c")], check=True, timeout=120)
    return exe


@pytest.fixture(scope="module")
def driver(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _build(tmp_path_factory.mktemp("contract"), gen_contract.header())


def _run(exe: Path, *args: str, data: bytes = b"", check: bool = True) -> bytes:
    done = subprocess.run([str(exe), *args], input=data, capture_output=True, timeout=60)
    if check:
        assert done.returncode == 0, (done.returncode, done.stderr)
    return done.stdout


def _lines(raw: dict[str, Any], table: Any = contract) -> bytes:
    """A step's fields as the driver's name-keyed lines."""
    out = []
    for f in reversed(table.FRAME):  # by name, in no particular order
        value = raw[f.name]
        if f.kind == table.TEXT:
            out.append(f"{f.name} {'-' if value is None else value.hex()}")
        elif f.kind in table.LISTS:
            out.append(f"{f.name} {len(value)}")
            out += [item.hex() for item in value]
        else:
            out.append(f"{f.name} {value & 0xFFFFFFFF}")
    return ("\n".join(out) + "\n").encode()


def _parse(text: bytes, table: Any = contract) -> dict[str, Any]:
    kinds = {f.name: f.kind for f in table.FRAME}
    lines = iter(text.decode().splitlines())
    raw: dict[str, Any] = {}
    for line in lines:
        name, value = line.split(" ", 1)
        kind = kinds[name]
        if kind == table.TEXT:
            raw[name] = None if value == "-" else bytes.fromhex(value)
        elif kind in table.LISTS:
            raw[name] = [bytes.fromhex(next(lines)) for _ in range(int(value))]
        else:
            raw[name] = int(value)
    return raw


def _step(**over: Any) -> dict[str, Any]:
    """Every field set, each to a value no other field has."""
    raw: dict[str, Any] = {}
    for i, f in enumerate(contract.FRAME):
        if f.kind == contract.TEXT:
            raw[f.name] = f"{f.name}-\xe9".encode() + bytes([0x80 + i])  # not UTF-8
        elif f.kind in contract.LISTS:
            raw[f.name] = [f"{f.name}{j}=\u00e9".encode() for j in range(3)]
        elif f.kind == contract.FLAG:
            raw[f.name] = 1
        else:
            raw[f.name] = 1000 + i
    raw.update(over)
    return raw


ODD = {
    "all set": {},
    "nulls": {f.name: None for f in contract.FRAME if f.kind == contract.TEXT},
    "empty argv and env": {"argv": [], "env": []},
    "empty strings": {"config": b"", "argv": [b""], "env": [b"A="]},
    "bytes that are not UTF-8": {"argv": [b"/bin/\xff\xfeodd", b"\x80"], "cwd": b"/h/\xc3("},
    "no audit fd": {"audit_fd": -1, "batch": 0, "container_local": 0},
    "10k env entries": {"env": [f"V{i}={'x' * (i % 50)}".encode() for i in range(10_000)]},
}


@pytest.mark.parametrize("case", list(ODD))
def test_c_encodes_python_decodes(driver: Path, case: str) -> None:
    raw = _step(**ODD[case])
    frame = _run(driver, "encode", data=_lines(raw))
    got = wire.decode_step(frame)
    want = {k: (v & 0xFFFFFFFF if isinstance(v, int) else v) for k, v in raw.items()}
    assert got == want
    # ... and as the bridge takes it: texts decoded with surrogateescape
    # (the bytes come back whole), NULL texts as the table's defaults.
    step = wire.parse_step(frame)
    assert os.fsencode(step.argv[0]) == raw["argv"][0] if raw["argv"] else step.argv == ()
    assert step.audit_fd == raw["audit_fd"]
    assert step.on_error == ("allow" if raw["on_error"] is None else os.fsdecode(raw["on_error"]))


@pytest.mark.parametrize("case", list(ODD))
def test_python_encodes_c_decodes(driver: Path, case: str) -> None:
    raw = _step(**ODD[case])
    frame = wire.encode_step(raw)
    got = _parse(_run(driver, "decode", data=frame))
    assert got == {k: (v & 0xFFFFFFFF if isinstance(v, int) else v) for k, v in raw.items()}
    # The plugin's encoder writes the same bytes for the same step.
    assert _run(driver, "encode", data=_lines(raw)) == frame


@pytest.mark.parametrize("how", ["cut short", "one byte more", "NUL inside a text",
                                 "count past the end", "NULL in argv"])
def test_both_decoders_refuse_the_same_bad_frames(driver: Path, how: str) -> None:
    frame = wire.encode_step(_step())
    if how == "cut short":
        frame = frame[:-3]
    elif how == "one byte more":
        frame += b"\0"
    elif how == "NUL inside a text":
        frame = wire.encode_step(_step(config=b"/etc/a\0b.toml"))
    elif how == "count past the end":
        at = frame.index(b"argv0=")
        frame = frame[:at - 8] + (1 << 20).to_bytes(4, sys.byteorder) + frame[at - 4:]
    else:  # argv's one item a NULL (length 0), which would end argv early in C
        one = wire.encode_step(_step(argv=[b"Q"]))
        item = (1).to_bytes(4, sys.byteorder) + (2).to_bytes(4, sys.byteorder) + b"Q\0"
        assert one.count(item) == 1
        frame = one.replace(item, (1).to_bytes(4, sys.byteorder) + (0).to_bytes(4, sys.byteorder))
    with pytest.raises(ValueError):
        wire.decode_step(frame)
    assert _run(driver, "decode", data=frame, check=False) == b"refused\n"


def test_the_cffi_reader_sees_the_struct_c_lays_out(driver: Path) -> None:
    """slurm_bridge.read_step walks the struct cffi was given (the header's
    own text): the C compiler and cffi place every member alike, and the
    reader returns what was put in, by name."""
    import cffi

    ffi = cffi.FFI()
    ffi.cdef(gen_contract.cdef())
    laid = dict(line.split() for line in _run(driver, "layout").decode().splitlines())
    assert int(laid.pop("sizeof")) == ffi.sizeof("struct grace_step")
    assert {k: int(v) for k, v in laid.items()} == {
        k: ffi.offsetof("struct grace_step", k) for k in laid}
    raw = _step(argv=[b"/bin/\xffodd", b"-c"], env=[b"A=1", b"A=2", b"NOEQ", b"B="],
                partition=None, audit_fd=-1)
    keep = []
    c_step = ffi.new("struct grace_step *")
    for f in contract.FRAME:
        value = raw[f.name]
        if f.kind == contract.TEXT:
            keep.append(ffi.new("char[]", value) if value is not None else ffi.NULL)
            setattr(c_step, f.name, keep[-1])
        elif f.kind in contract.LISTS:
            items = [ffi.new("char[]", v) for v in value]
            keep += items
            keep.append(ffi.new("char *[]", [*items, ffi.NULL]))
            setattr(c_step, f.name, keep[-1])
            setattr(c_step, f.count, len(value))
        else:
            setattr(c_step, f.name, value)
    step = slurm_bridge.read_step(ffi, c_step)
    assert step == wire.parse_step(wire.encode_step(raw))
    assert step.argv == ("/bin/\udcffodd", "-c")  # odd bytes survive (surrogateescape)
    assert step.env == {"A": "1", "B": ""}  # getenv(): the first wins; no '=' is dropped
    assert step.partition is None and step.audit_fd == -1 and step.batch is True


def test_python_records_are_read_by_c(driver: Path) -> None:
    out = slurm_bridge.Outcome(action="warn", user=["grace-policy: u\xe9"], unset=["V"],
                               set=[("K", "v=w")], log=["l\0x"], cache="entry\n.")
    got = _run(driver, "records", data=wire.outcome_records(out)).decode().splitlines()
    assert got == ["ended 1", "rc 2", "done 1", "oom 0", "hit 0", "miss 0", "failure -",
                   "pull 0", "user " + "grace-policy: u\xe9".encode().hex(),
                   "unset " + b"V".hex(), "set " + b"K=v=w".hex(), "log " + b"l\\0x".hex(),
                   "cache " + b"entry\n.".hex(), "err -"]


@pytest.mark.parametrize("pull", [False, True])
def test_a_registry_manifest_verdict_says_so_to_c(driver: Path, pull: bool) -> None:
    """The outcome's ``pull`` (pyxis pulls the image after this check, so
    C has its root judged in task_init) reaches C as its own record;
    without it a verdict was on the files themselves."""
    out = slurm_bridge.Outcome(action="allow", pull=pull)
    got = _run(driver, "records", data=wire.outcome_records(out)).decode().splitlines()
    assert f"pull {int(pull)}" in got and "done 1" in got


@pytest.mark.parametrize("failure", contract.PYTHON_FAILURES)
def test_a_failure_reaches_c_as_its_kind_not_its_words(driver: Path, failure: str) -> None:
    """The reason's words say nothing to C: a config failure whose text
    reads like a Python one is still a config failure, and the reverse."""
    other = "cannot load grace_policy" if failure != contract.FAIL_PYTHON else "config x: y"
    out = slurm_bridge.Outcome.failed(other, failure)
    got = _run(driver, "records", data=wire.outcome_records(out)).decode().splitlines()
    assert f"failure {failure}" in got and "rc 4" in got and "done 1" in got


def test_a_kind_c_does_not_know_is_not_taken() -> None:
    """Only the kinds the table lets Python name count (C decides the others)."""
    assert set(contract.PYTHON_FAILURES) <= {name for _m, name, _d in contract.FAILURES}
    assert contract.FAIL_TIMEOUT not in contract.PYTHON_FAILURES


def test_the_request_frame_is_read_as_c_writes_it(driver: Path) -> None:
    frame = _run(driver, "request", "1234", "/p/lib/slurm|-", "/usr/bin:/bin")
    req = wire.Request(frame)
    assert req.ids == dict(zip(contract.CREDS_IDS, (*os.getresuid(), *os.getresgid())))
    assert sorted(req.groups) == sorted(os.getgroups())
    assert (req.left_ms, req.code, req.path) == (1234, "/p/lib/slurm|-", "/usr/bin:/bin")
    with pytest.raises(ValueError):
        wire.Request(frame + b"x")


@pytest.mark.parametrize("args", [("/usr/lib/slurm",), ("/usr/lib/slurm", "/opt/a:/opt/b"),
                                  ("/p", ""), ("/p/\u00e9|x", "-")])
def test_code_is_one_string(driver: Path, args: tuple[str, ...]) -> None:
    want = contract.code(args[0], args[1] if len(args) > 1 else None)
    assert _run(driver, "code", *args).decode() == want


@pytest.mark.parametrize("ids", [(1000,), (1000, 5, 3, 5, 1000), (0, 4294967294, 0, 7),
                                 (7, *range(200, 0, -1))])
def test_credentials_are_one_string(driver: Path, ids: tuple[int, ...]) -> None:
    egid, *groups = ids
    want = contract.format_credentials(egid, groups)
    assert _run(driver, "creds", *map(str, ids)).decode() == want
    if len(ids) == 1:
        assert want == f"{egid}:"


def test_this_process_s_credentials_are_as_c_formats_them(driver: Path) -> None:
    assert slurm_bridge.credentials() == _run(
        driver, "creds", str(os.getegid()), *map(str, os.getgroups())).decode()


@pytest.mark.parametrize("argv0", ["apptainer", "/usr/bin/singularity", "./apptainer",
                                   "apptainer.sh", "/opt/apptainer/bin/run", "", "/"])
def test_the_image_wrapper_name_test_is_one_rule(driver: Path, argv0: str) -> None:
    assert _run(driver, "wraps", argv0) == (b"1" if contract.wraps_an_image(argv0) else b"0")
    from grace_policy.container import apptainer

    assert apptainer.is_apptainer(argv0) == contract.wraps_an_image(argv0)


def test_the_constants_are_the_tables(driver: Path) -> None:
    got = _run(driver, "constants").decode().splitlines()
    want = [f"rc {n} {c}" for n, c in contract.RC]
    want += [f"emit {n} {c}" for n, c, _d in contract.EMIT]
    want.append(f"audit {ord(contract.AUDIT_MARK)}")
    assert got == want


# -- a table changed on one side only ----------------------------------------

def _with_field(name: str) -> types.ModuleType:
    fake = types.ModuleType("contract_plus")
    fake.__dict__.update({k: v for k, v in vars(contract).items() if not k.startswith("__")})
    fake.STEP = (*contract.STEP, contract.Field(name, contract.TEXT, "a new field"))
    fake.FRAME = tuple(f for f in fake.STEP if f.kind != contract.OPAQUE)
    return fake


def test_a_field_the_bridge_lacks_stops_the_build() -> None:
    with pytest.raises(SystemExit, match="only in the table \\['gpus'\\]"):
        gen_contract.check_python_side(_with_field("gpus"))
    gen_contract.check_python_side()  # today's table and StepInput agree


def test_a_new_field_is_carried_with_no_reader_edited(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The C side rebuilt from a table with one more field carries it, and
    the Python codec reads it from the same table; a Python side still on
    the old table refuses the frame instead of reading it wrong."""
    plus = _with_field("gpus")
    exe = _build(tmp_path / "plus", gen_contract.header(plus))
    raw = {**_step(), "gpus": b"sm_90"}
    frame = _run(exe, "encode", data=_lines(raw, plus))
    with pytest.raises(ValueError):
        wire.decode_step(frame)  # the old table: one text left over
    monkeypatch.setattr(wire, "contract", plus)
    got = wire.decode_step(frame)
    assert got["gpus"] == b"sm_90" and got["config"] == raw["config"]
    assert _parse(_run(exe, "decode", data=wire.encode_step(raw)), plus)["gpus"] == b"sm_90"


# -- nobody spells the contract by hand again --------------------------------

def test_no_record_letter_or_code_is_written_by_hand() -> None:
    import re

    for name in ("grace_helper.c", "grace_wire.c", "grace_stepd.c", "grace_python.c",
                 "grace_node.c"):
        code = re.sub(r"/\*.*?\*/", "", (SPANK / name).read_text(), flags=re.S)
        assert not re.findall(r"'[A-Z]'", code), name
        assert '"%s|%s"' not in code, name
        assert "strncmp(reason" not in code and "strncmp(out->err" not in code, name
    for path in (REPO / "grace_policy").rglob("*.py"):
        if path.name == "contract.py":
            continue
        text = path.read_text()
        assert '"apptainer", "singularity"' not in text, path
        assert not re.search(r'record\("[A-Z]"', text), path


def test_the_bridge_refuses_glue_of_another_contract() -> None:
    """register() compares the struct and codes cffi was built with to the
    table (a plugin and a Python tree from two installs): it raises, which
    the init code reports as failure python, instead of reading fields wrong."""
    import cffi

    good = cffi.FFI()
    good.cdef(gen_contract.cdef())
    lib = good.dlopen(None)
    slurm_bridge._built_from_this_contract(good, lib)
    plus = cffi.FFI()
    plus.cdef(gen_contract.cdef(_with_field("gpus")))
    with pytest.raises(RuntimeError, match=r"another grace_policy/contract\.py"):
        slurm_bridge._built_from_this_contract(plus, plus.dlopen(None))
    moved = cffi.FFI()
    moved.cdef(gen_contract.cdef().replace("#define GRACE_RC_ERROR 4", "#define GRACE_RC_ERROR 5"))
    with pytest.raises(RuntimeError):
        slurm_bridge._built_from_this_contract(moved, moved.dlopen(None))
