"""Config validation: every mistake reported at once, each naming file, line and key."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from grace_policy.config import dotted, key_lines, load_config, locate
from grace_policy.policy import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent


def write(tmp_path: Path, text: str, name: str = "gp.toml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def problems(path: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config(path)
    return info.value.problems


def test_full_config_maps_to_policy(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
mode = "warn"
on_error = "deny"
deadline_ms = 250
max_files = 10
max_bytes = 1048576
site_build_hint = "salloc -p {partition}"
contact = "help@site"
[node]
page_size = 65536
root = "/images/grace"
[partitions.gb200]
mode = "enforce"
arch = "arm64"
page_size = 65536
glibc = "2.34"
allow_user_lower = true
[env]
vars = ["VIRTUAL_ENV"]
strip = "always"
[rules.relro-tail]
severity = "off"
[rules.lib-not-found]
text = "find {name} for {node_arch}"
[audit]
path = "/var/log/gp.jsonl"
""",
    )
    policy = load_config(path)
    assert (policy.mode, policy.on_error) == ("warn", "deny")
    assert (policy.deadline_ms, policy.max_files, policy.max_bytes) == (250, 10, 1048576)
    assert policy.site_build_hint == "salloc -p {partition}"
    assert policy.contact == "help@site"
    assert policy.node.page_size == 65536 and policy.node.root == "/images/grace"
    part = policy.partition("gb200")
    assert part is not None
    assert part.node.arch == "aarch64"  # normalised from arm64
    assert part.node.glibc == (2, 34)
    assert part.allow_user_lower is True
    assert policy.env.vars == ("VIRTUAL_ENV",) and policy.env.strip == "always"
    assert policy.rule_override("relro-tail").severity == "off"  # type: ignore[union-attr]
    assert policy.rule_override("lib-not-found").text == "find {name} for {node_arch}"  # type: ignore[union-attr]
    assert policy.audit_path == "/var/log/gp.jsonl"
    assert policy.source == path


def test_empty_config_is_the_default(tmp_path: Path) -> None:
    policy = load_config(write(tmp_path, ""))
    assert policy.mode == "enforce" and policy.on_error == "allow"
    assert "CONDA_PREFIX" in policy.env.vars and policy.env.strip == "foreign"
    assert policy.audit_path is None


def test_shipped_example_is_valid() -> None:
    policy = load_config(str(ROOT / "packaging" / "grace-policy.example.toml"))
    assert policy.mode_for("gb200") == "enforce"
    assert policy.mode_for("x86") == "warn"


# (toml text, expected line, expected dotted key, a word of the message)
BAD = [
    ('mode = "enforce"\nmodee = "warn"\n', 2, "modee", "unknown key"),
    ('[partitions.gb200]\nmode = "enforce"\n\nmode2 = 1\n', 4, "partitions.gb200.mode2", "unknown"),
    ('[partitions."gpu.a"]\nmode = "strict"\n', 2, 'partitions."gpu.a".mode', "enforce"),
    ("partitions.gb200.page_size = 4097\n", 1, "partitions.gb200.page_size", "power of two"),
    ('[partitions.gb200]\n"page_size" = 2097152\n', 2, "partitions.gb200.page_size", "power"),
    ("node = { arch = 'x86_64', page_size = 3 }\n", 1, "node.page_size", "power of two"),
    ('[node]\narch = "vax"\n', 2, "node.arch", "unknown architecture"),
    ('[node]\nglibc = "2.34.1"\n', 2, "node.glibc", "2.34"),
    ('[node]\nglibc = 2.34\n', 2, "node.glibc", "string"),
    ('[env]\nvars = [\n  "A",\n  "B-C",\n]\n', 4, "env.vars[1]", "not a variable name"),
    ('[env]\nstrip = "sometimes"\n', 2, "env.strip", "foreign"),
    ('[rules.no-such-rule]\nseverity = "off"\n', 1, "rules.no-such-rule", "no such rule"),
    ('[rules.relro-tail]\nseverity = "fatal"\n', 2, "rules.relro-tail.severity", "error"),
    ('[rules.env-leak]\nseverity = "error"\n', 2, "rules.env-leak.severity", "at most"),
    ('[rules.page-align]\ntext = "see {pth}"\n', 2, "rules.page-align.text", "{pth}"),
    ('site_build_hint = "srun -p {partition} {nodes}"\n', 1, "site_build_hint", "{nodes}"),
    ("deadline_ms = 0\n", 1, "deadline_ms", "greater than"),
    ('max_files = "10"\n', 1, "max_files", "integer"),
    ("[partitions.a]\nallow_user_lower = 1\n", 2, "partitions.a.allow_user_lower", "boolean"),
    ('[audit]\npath = "audit.log"\n', 2, "audit.path", "absolute"),
    ('[audit]\nfile = "/x"\n', 2, "audit.file", "unknown key"),
    ('on_error = "ignore"\n', 1, "on_error", "allow"),
    # the bad key comes after a multi-line string holding things that look
    # like keys and tables: the locator must not count those
    (
        'site_build_hint = """\n[partitions.x]\nmode = 1\n"""\n[partitions.y]\nmode = "on"\n',
        6,
        "partitions.y.mode",
        "enforce",
    ),
    (
        "contact = '''\nfoo = 1\n'''\n[rules.'relro-tail']\nseverity = 'loud'\n",
        5,
        "rules.relro-tail.severity",
        "error",
    ),
]


@pytest.mark.parametrize(("text", "line", "key", "word"), BAD)
def test_bad_config_names_file_line_and_key(
    tmp_path: Path, text: str, line: int, key: str, word: str
) -> None:
    path = write(tmp_path, text)
    found = problems(path)
    assert len(found) == 1, found
    assert found[0].startswith(f"{path}:{line}: {key}: "), found[0]
    assert word in found[0]
    assert "\n" not in found[0]


def test_all_problems_reported_at_once_in_line_order(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "\n".join(
            [
                'mode = "enforced"',  # 1
                "bogus = 1",  # 2
                "[node]",  # 3
                "page_size = 65535",  # 4
                "[rules.nope]",  # 5
                'severity = "off"',  # 6
                "[audit]",  # 7
                'path = "rel"',  # 8
            ]
        ),
    )
    found = problems(path)
    assert [p.split(":")[1] for p in found] == ["1", "2", "4", "5", "8"]


def test_syntax_error_carries_its_line(tmp_path: Path) -> None:
    path = write(tmp_path, 'mode = "enforce"\n\n[partitions\nmode = 1\n')
    (problem,) = problems(path)
    assert problem.startswith(f"{path}:3: TOML syntax: ")


def test_not_utf8_and_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "latin1.toml"
    path.write_bytes(b'mode = "enforce"\ncontact = "caf\xe9"\n')
    assert problems(str(path)) == [f"{path}:2: not valid UTF-8"]
    missing = str(tmp_path / "nope.toml")
    (problem,) = problems(missing)
    assert problem.startswith(missing) and "No such file" in problem


def test_hostile_key_cannot_break_the_one_line_per_problem_rule(tmp_path: Path) -> None:
    path = write(tmp_path, '"evil\\nkey\\u001b[2J" = 1\n')
    (problem,) = problems(path)
    assert "\n" not in problem and "\x1b" not in problem
    assert problem.startswith(f"{path}:1: ")


TRICKY = (
    r"""
# comment with = and [brackets]
title = "a # not a comment"   # real comment
"quoted.key" = 1
'literal key' = 2
a.b . c = 3
"esc\"aped" = 4
arr = [
  1,   # one
  [2, 3],
  { x = 1, y = { z = "}" } },
]
ml = DQ3
[not.a.table]
x = 1
DQ3
ml2 = SQ3
also = "not a key"
SQ3
inline = { p = 1, q.r = [ "]" ] }

[t1]
k = 'v'

[t1.sub]
"k k" = true

[[arr_t]]
n = 1

[[arr_t]]
n = 2
m = 1979-05-27T07:32:00Z

[  "spaced" . 'table'  ]
last = -1
"""
).replace("DQ3", '"' * 3).replace("SQ3", "'" * 3)


def leaf_paths(value: object, prefix: tuple = ()) -> list[tuple]:
    if isinstance(value, dict):
        out: list[tuple] = []
        for key, sub in value.items():
            out += leaf_paths(sub, (*prefix, key))
        return out
    if isinstance(value, list):
        out = []
        for i, sub in enumerate(value):
            out += leaf_paths(sub, (*prefix, i))
        return out
    return [prefix]


def test_locator_finds_every_leaf_tomllib_sees_on_its_own_line() -> None:
    lines = key_lines(TRICKY)
    source = TRICKY.split("\n")
    for path in leaf_paths(tomllib.loads(TRICKY)):
        assert path in lines, path
        # a key's line really mentions that key (array items: their own line)
        last = path[-1]
        if isinstance(last, str) and last != 'esc"aped':
            assert last.split()[0] in source[lines[path] - 1], path
    assert lines[("arr", 1, 0)] == source.index("  [2, 3],") + 1
    assert lines[("arr", 2, "y", "z")] == source.index('  { x = 1, y = { z = "}" } },') + 1
    assert lines[("t1", "k")] == source.index("k = 'v'") + 1
    assert lines[("arr_t", 1, "n")] == source.index("n = 2") + 1
    assert lines[("spaced", "table", "last")] == source.index("last = -1") + 1
    assert ("not", "a", "table") not in lines
    assert ("also",) not in lines


def test_locate_falls_back_to_the_enclosing_table() -> None:
    lines = key_lines("[partitions.gb200]\nmode = 'warn'\n")
    assert locate(lines, ("partitions", "gb200", "arch")) == 1
    assert locate(lines, ("partitions", "gb200", "mode")) == 2
    assert locate(lines, ("elsewhere",)) is None


def test_dotted_quotes_what_needs_quoting() -> None:
    assert dotted(("partitions", "gb200", "mode")) == "partitions.gb200.mode"
    assert dotted(("partitions", "gpu.a", "mode")) == 'partitions."gpu.a".mode'
    assert dotted(("env", "vars", 3)) == "env.vars[3]"

