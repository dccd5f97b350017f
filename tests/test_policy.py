"""The compiled policy: modes per partition, node overrides, and a compiled form
that only the admin (or the config's owner) can make the plugin believe."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from grace_policy import atomicfile
from grace_policy.compiled import compile_config, compiled_path_for, load_policy
from grace_policy.node import detect
from grace_policy.policy import (
    DEFAULT_POLICY,
    ConfigError,
    NodeOverrides,
    PartitionPolicy,
    Policy,
)

ROOT = Path(__file__).resolve().parent.parent

CONFIG = """
mode = "enforce"
[partitions.gb200]
page_size = 65536
arch = "aarch64"
[partitions.debug]
mode = "warn"
allow_user_lower = true
[audit]
path = "/tmp/audit.jsonl"
"""

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to other users needs root")


@pytest.fixture
def config(tmp_path: Path) -> str:
    path = tmp_path / "gp.toml"
    path.write_text(CONFIG)
    return str(path)


def test_no_config_means_enforce_and_allow_on_error() -> None:
    policy = load_policy(None)
    assert policy is DEFAULT_POLICY
    assert policy.mode_for("anything") == "enforce"
    assert policy.on_error == "allow"
    assert policy.audit_path is None


def test_missing_config_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="No such file"):
        load_policy(str(tmp_path / "absent.toml"))


def test_mode_for_partitions_and_user_requests() -> None:
    policy = Policy(
        mode="enforce",
        partitions=(
            PartitionPolicy("debug", mode="warn", allow_user_lower=True),
            PartitionPolicy("gb200", allow_user_lower=False),
            PartitionPolicy("open", mode="off"),
        ),
    )
    assert policy.mode_for("gb200") == "enforce"  # listed without mode: top-level mode
    assert policy.mode_for("debug") == "warn"
    assert policy.mode_for("open") == "off"
    assert policy.mode_for("unlisted") == "enforce"
    assert policy.mode_for(None) == "enforce"
    # lowering only where allowed, raising never through this door
    assert policy.mode_for("debug", requested="off") == "off"
    assert policy.mode_for("gb200", requested="off") == "enforce"
    assert policy.mode_for("unlisted", requested="warn") == "enforce"
    assert policy.mode_for("debug", requested="enforce") == "warn"
    assert policy.mode_for("debug", requested="OFF; rm -rf") == "warn"
    lax = Policy(mode="enforce", allow_user_lower=True)
    assert lax.mode_for("unlisted", requested="warn") == "warn"


def test_node_overrides_layer_partition_over_node() -> None:
    policy = Policy(
        node=NodeOverrides(page_size=16384, glibc=(2, 28), root="/img"),
        partitions=(PartitionPolicy("gb200", node=NodeOverrides(arch="aarch64", page_size=65536)),),
    )
    merged = policy.node_overrides_for("gb200")
    assert merged == NodeOverrides(arch="aarch64", page_size=65536, glibc=(2, 28), root="/img")
    assert policy.node_overrides_for("other") == policy.node
    profile = merged.apply(detect())
    assert (profile.machine, profile.page_size, profile.glibc, profile.root) == (
        "aarch64",
        65536,
        (2, 28),
        "/img",
    )


def test_loading_never_writes_next_to_the_config(config: str) -> None:
    """load_policy runs in every step (as root for root's steps): it
    validates but never writes the admin's directory (issue 20 item 4)."""
    before = sorted(os.listdir(os.path.dirname(config)))
    policy = load_policy(config)
    assert policy.mode_for("debug") == "warn"
    assert sorted(os.listdir(os.path.dirname(config))) == before
    assert not os.path.exists(compiled_path_for(config))


def test_compile_config_leaves_a_compiled_form(config: str) -> None:
    cache = compiled_path_for(config)
    policy = compile_config(config)
    assert os.path.exists(cache)
    st = os.stat(cache)
    assert st.st_mode & 0o777 == 0o644
    assert load_policy(config) == policy


def run_isolated(code: str) -> str:
    """Run ``code`` in a fresh interpreter as the plugin starts it: no site,
    no environment, explicit paths (here: this interpreter's)."""
    paths = [str(ROOT), *(p for p in sys.path if p)]
    prog = f"import sys; sys.path[:0] = {paths!r}\n{code}"
    out = subprocess.run(
        [sys.executable, "-I", "-S", "-c", prog], capture_output=True, text=True, check=True
    )
    return out.stdout.strip()


HEAVY = "pydantic structlog elftools tomllib tomli typing".split()


def test_compiled_form_loads_without_heavy_imports(config: str) -> None:
    compile_config(config)
    out = run_isolated(
        f"from grace_policy.compiled import load_policy\n"
        f"p = load_policy({config!r})\n"
        f"heavy = sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r})\n"
        f"print(p.mode_for('debug'), heavy)"
    )
    assert out == "warn []"


def test_without_compiled_form_it_validates(config: str) -> None:
    out = run_isolated(
        f"from grace_policy.compiled import load_policy\n"
        f"p = load_policy({config!r}, cache_dir='/nonexistent-dir')\n"
        f"print(p.mode_for('debug'), 'pydantic' in sys.modules)"
    )
    # no cache can be written there, and that is not an error
    assert out == "warn True"


def poison(config: str, cache: str | None = None, **changes: object) -> str:
    """Rewrite the compiled form of ``config`` to say something laxer, keeping
    its recorded stat identity so only the trust checks can reject it."""
    compile_config(config)
    cache = cache or compiled_path_for(config)
    with open(compiled_path_for(config)) as f:
        doc = json.load(f)
    doc["policy"].update(changes)
    atomicfile.replace(cache, json.dumps(doc).encode(), mode=0o644)
    return cache


def test_a_well_formed_trusted_cache_is_believed(config: str) -> None:
    # The control for the poisoning tests below: with the right owner and
    # mode, an edited compiled form *is* used, so those tests can fail.
    poison(config, mode="off")
    assert load_policy(config).mode_for("unlisted") == "off"


def test_cache_writable_by_others_is_ignored(config: str) -> None:
    for mode in (0o666, 0o646, 0o664):
        cache = poison(config, mode="off")
        os.chmod(cache, mode)
        assert load_policy(config).mode_for("unlisted") == "enforce", oct(mode)


@needs_root
def test_cache_owned_by_another_user_is_ignored(config: str) -> None:
    cache = poison(config, mode="off")
    os.chown(cache, 4242, 4242)
    assert load_policy(config).mode_for("unlisted") == "enforce"


@needs_root
def test_cache_owned_by_the_configs_owner_is_trusted_but_not_by_others(config: str) -> None:
    os.chown(config, 4242, 4242)
    cache = poison(config, mode="off")  # poison() recompiles: identity now includes the chown
    os.chown(cache, 4242, 4242)
    assert load_policy(config).mode_for("unlisted") == "off"
    os.chown(cache, 4343, 4343)
    assert load_policy(config).mode_for("unlisted") == "enforce"


def test_symlinked_cache_is_ignored(config: str, tmp_path: Path) -> None:
    cache = compiled_path_for(config)
    elsewhere = str(tmp_path / "elsewhere.json")
    poison(config, cache=elsewhere, mode="off")
    os.unlink(cache)
    os.symlink(elsewhere, cache)
    assert load_policy(config).mode_for("unlisted") == "enforce"


def test_stale_cache_is_not_believed(config: str) -> None:
    compile_config(config)
    with open(config, "a") as f:
        f.write('[partitions.new]\nmode = "off"\n')
    policy = load_policy(config)
    assert policy.mode_for("new") == "off"
    with open(compiled_path_for(config)) as f:  # left as it was: the admin recompiles
        assert "new" not in json.load(f)["policy"]["partitions"]


def test_same_size_edit_within_the_same_second_is_noticed(config: str) -> None:
    compile_config(config)
    st = os.stat(config)
    text = Path(config).read_text().replace('mode = "warn"', 'mode = "off "')
    Path(config).write_text(text)
    os.utime(config, ns=(st.st_atime_ns, st.st_mtime_ns))  # same size, same mtime
    assert os.stat(config).st_size == st.st_size
    with pytest.raises(ConfigError, match="off "):  # ctime changed: revalidated
        load_policy(config)


@pytest.mark.parametrize(
    "damage",
    [
        b"",
        b"{",
        b"[]",
        b'{"format": 1}',
        b'{"format": 99, "policy": {}}',
    ],
)
def test_damaged_cache_falls_back_to_the_toml(config: str, damage: bytes) -> None:
    cache = compiled_path_for(config)
    with open(cache, "wb") as f:
        f.write(damage)
    os.chmod(cache, 0o644)
    assert load_policy(config).mode_for("debug") == "warn"


def test_cache_with_bad_values_falls_back(config: str) -> None:
    poison(config, mode="lenient")
    assert load_policy(config).mode_for("unlisted") == "enforce"
    poison(config, partitions={"x": {"mode": "nah"}})
    assert load_policy(config).mode_for("x") == "enforce"


def test_cache_dir_names_by_config_path(config: str, tmp_path: Path) -> None:
    cache_dir = tmp_path / "cache"
    cache_dir.mkdir()
    a = compiled_path_for(config, str(cache_dir))
    b = compiled_path_for(config + "x", str(cache_dir))
    assert a != b and os.path.dirname(a) == str(cache_dir)
    compile_config(config, a)
    assert load_policy(config, cache_dir=str(cache_dir)) == load_policy(config)
    assert not os.path.exists(compiled_path_for(config))


def test_compile_config_writes_or_raises(config: str, tmp_path: Path) -> None:
    out = str(tmp_path / "out.json")
    policy = compile_config(config, out)
    with open(out) as f:
        doc = json.load(f)
    assert Policy.from_json(doc["policy"]) == policy
    bad = tmp_path / "bad.toml"
    bad.write_text('mode = "loud"\n')
    with pytest.raises(ConfigError, match=r"bad.toml:1: mode"):
        compile_config(str(bad), str(tmp_path / "bad.json"))
    assert not os.path.exists(tmp_path / "bad.json")
    with pytest.raises(ConfigError, match="cannot write"):
        compile_config(config, str(tmp_path / "no" / "such" / "dir.json"))


def test_json_round_trip_keeps_everything() -> None:
    from grace_policy.config import load_config

    policy = load_config(str(ROOT / "packaging" / "grace-policy.example.toml"))
    again = Policy.from_json(json.loads(json.dumps(policy.to_json())))
    assert again == policy


def test_compiled_glibc_is_read_by_the_nodes_parser() -> None:
    # One parser for glibc versions (node.parse_glibc); a damaged compiled
    # value fails loudly, so load_policy validates the TOML again instead
    # of silently dropping the admin's override.
    assert NodeOverrides.from_json({"glibc": "2.36"}).glibc == (2, 36)
    assert NodeOverrides.from_json({"glibc": None}).glibc is None
    with pytest.raises(ValueError):
        NodeOverrides.from_json({"glibc": "two.36"})
