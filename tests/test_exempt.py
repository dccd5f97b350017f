"""Exemptions: config validation (key and line), the compiled round trip,
matching (globs, users, groups, expiry), what a user cannot do to exempt
themselves, and that an exempted verdict is never a verdict-cache entry."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from fixtures.build import ElfBuilder, src

from grace_policy import audit, verdict_cache
from grace_policy.compiled import compile_config, load_policy
from grace_policy.config import load_config
from grace_policy.decide import StepRequest, decide
from grace_policy.exempt import Who, glob_match, today_utc, user_controlled
from grace_policy.node import detect
from grace_policy.policy import ConfigError, Policy

HOST = detect()
NOBODY = Who(uid=65534, gids=(65534,))


@pytest.mark.parametrize(("pattern", "path", "expected"), [
    ("/opt/vendor/bin/tool", "/opt/vendor/bin/tool", True),
    ("/opt/vendor/bin/*", "/opt/vendor/bin/tool", True),
    ("/opt/vendor/bin/*", "/opt/vendor/bin/sub/tool", False),  # * stays in one component
    ("/opt/vendor/**", "/opt/vendor/bin/sub/tool", True),
    ("/opt/vendor/**/tool", "/opt/vendor/tool", True),  # ** may be zero components
    ("/opt/vendor/**/tool", "/opt/vendor/a/b/tool", True),
    ("/opt/vendor/**/tool", "/opt/vendor/a/b/tool2", False),
    ("/opt/v?ndor/t*l", "/opt/vendor/tool", True),
    ("/opt/v?ndor/t*l", "/opt/vndor/tool", False),
    ("/opt/*/tool", "/opt//tool", True),
    ("/opt/x", "/opt/x/", False),
    ("/a/*b*c", "/a/xxbyycz", False),
    ("/a/*b*c", "/a/xxbyyc", True),
])
def test_glob(pattern: str, path: str, expected: bool) -> None:
    assert glob_match(pattern, path) is expected


def test_glob_within_a_component_agrees_with_fnmatch() -> None:
    """fnmatch (which has no '/' rule) is the oracle for one component."""
    import fnmatch
    import random

    rng = random.Random(12)
    for _ in range(3000):
        pattern = "".join(rng.choice("ab*?") for _ in range(rng.randint(0, 6)))
        word = "".join(rng.choice("ab") for _ in range(rng.randint(0, 7)))
        assert glob_match("/" + pattern, "/" + word) is fnmatch.fnmatchcase(word, pattern), (
            pattern, word)


def _write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "gp.toml"
    path.write_text(text)
    return str(path)


def test_exemptions_load_compile_and_round_trip(tmp_path: Path) -> None:
    path = _write(tmp_path, """\
mode = "enforce"
[[rules.exe-arch-mismatch.exempt]]
paths = ["/opt/vendor/**"]
until = 2030-01-31
reason = "vendor tool misjudged, ticket 123"
[[rules.exe-arch-mismatch.exempt]]
users = ["ana"]
groups = ["gpu-admins"]
until = 2029-06-01
reason = "porting work"
[[rules.page-congruence.exempt]]
groups = ["legacy"]
until = 2028-01-01
reason = "old build, rebuilt next month"
""")
    policy = load_config(path)
    got = [(e.rule, e.paths, e.users, e.groups, e.until, e.reason, e.where)
           for e in policy.exemptions]
    assert got == [
        ("exe-arch-mismatch", ("/opt/vendor/**",), (), (), "2030-01-31",
         "vendor tool misjudged, ticket 123", "rules.exe-arch-mismatch.exempt[0]"),
        ("exe-arch-mismatch", (), ("ana",), ("gpu-admins",), "2029-06-01", "porting work",
         "rules.exe-arch-mismatch.exempt[1]"),
        ("page-congruence", (), (), ("legacy",), "2028-01-01",
         "old build, rebuilt next month", "rules.page-congruence.exempt[0]"),
    ]
    compile_config(path)
    assert load_policy(path) == policy  # the fast path reads the same exemptions
    assert Policy.from_json(policy.to_json()).exemptions == policy.exemptions


@pytest.mark.parametrize(("body", "line", "key", "words"), [
    ('paths = ["/x"]\nuntil = 2030-01-01\nreason = "r"\naccounts = ["phys"]\n', 5,
     "rules.exe-arch-mismatch.exempt[0].accounts", "SLURM_JOB_ACCOUNT"),
    ('until = 2030-01-01\nreason = "r"\n', 1, "rules.exe-arch-mismatch.exempt[0]",
     "at least one of paths, users, groups"),
    ('paths = ["bin/tool"]\nuntil = 2030-01-01\nreason = "r"\n', 2,
     "rules.exe-arch-mismatch.exempt[0].paths[0]", "absolute"),
    ('paths = ["/x/[ab]"]\nuntil = 2030-01-01\nreason = "r"\n', 2,
     "rules.exe-arch-mismatch.exempt[0].paths[0]", "not supported"),
    ('paths = ["/x"]\nuntil = "2030-01-01"\nreason = "r"\n', 3,
     "rules.exe-arch-mismatch.exempt[0].until", "date"),
    ('paths = ["/x"]\nreason = "r"\n', 1, "rules.exe-arch-mismatch.exempt[0].until",
     "required"),
    ('paths = ["/x"]\nuntil = 2030-01-01\nreason = "two\\nlines"\n', 4,
     "rules.exe-arch-mismatch.exempt[0].reason", "one printable line"),
    ('paths = ["/x"]\nuntil = 2030-01-01\n', 1, "rules.exe-arch-mismatch.exempt[0].reason",
     "required"),
    ('users = [""]\nuntil = 2030-01-01\nreason = "r"\n', 2,
     "rules.exe-arch-mismatch.exempt[0].users[0]", "not a user or group name"),
])
def test_bad_exemptions_name_key_and_line(tmp_path: Path, body: str, line: int, key: str,
                                          words: str) -> None:
    path = _write(tmp_path, "[[rules.exe-arch-mismatch.exempt]]\n" + body)
    with pytest.raises(ConfigError) as exc:
        load_config(path)
    [problem] = exc.value.problems
    assert problem.startswith(f"{path}:{line}: {key}: "), problem
    assert words in problem


def test_check_limit_cannot_be_exempted(tmp_path: Path) -> None:
    path = _write(tmp_path, '[[rules.check-limit.exempt]]\nusers = ["a"]\n'
                            'until = 2030-01-01\nreason = "r"\n')
    with pytest.raises(ConfigError) as exc:
        load_config(path)
    assert f"{path}:1: rules.check-limit.exempt: check-limit cannot be exempted" in str(exc.value)


# -- the decision -------------------------------------------------------------


@pytest.fixture
def vendor(elf_builder: ElfBuilder, have_cross: str, tmp_path: Path) -> Path:
    """A foreign program in a root-owned tree nobody else can write."""
    exe = elf_builder.compile(src("hello.c"), "vendor/bin/tool", arch="aarch64")
    exe.chmod(0o755)
    for p in (exe.parent, exe.parent.parent):
        p.chmod(0o755)
    return exe


def _policy(tmp_path: Path, selectors: str, until: str) -> Policy:
    return load_config(_write(tmp_path, f"""\
[[rules.exe-arch-mismatch.exempt]]
{selectors}
until = {until}
reason = "misjudged: ticket 42"
"""))


def _judge(policy: Policy, exe: Path | str, who: Who | None, today: str | None = None,
           **kw: object) -> object:
    return decide(policy, StepRequest(partition=None, argv=[str(exe)],
                                      env={"PATH": "/usr/bin:/bin"}, cwd="/", node=HOST, who=who,
                                      today=today, **kw))  # type: ignore[arg-type]


def test_exempted_path_is_let_through_and_recorded(vendor: Path, tmp_path: Path) -> None:
    policy = _policy(tmp_path, f'paths = ["{vendor.parent}/*"]', "2030-01-31")
    v = _judge(policy, vendor, NOBODY, today="2030-01-31")  # the last day still counts
    assert (v.action, v.findings) == ("allow", ())
    [ex] = v.exempted
    assert (ex.rule, ex.path, ex.reason, ex.until, ex.where) == (
        "exe-arch-mismatch", str(vendor), "misjudged: ticket 42", "2030-01-31",
        "rules.exe-arch-mismatch.exempt[0]")
    # Never replayed from the verdict cache, and the audit line carries the reason.
    assert not verdict_cache.cacheable(v)
    fields = audit.record_fields(v, {"uid": 65534, "node": "n", "program": str(vendor)})
    assert fields["exempt"] == [ex.to_json()]
    assert (fields["action"], fields["enforce_action"], fields["rules"]) == ("allow", "allow", [])
    # The next day it is over.
    v = _judge(policy, vendor, NOBODY, today="2030-02-01")
    assert (v.action, v.rule_ids, v.exempted) == ("reject", ("exe-arch-mismatch",), ())


def test_default_today_is_the_real_date(vendor: Path, tmp_path: Path) -> None:
    assert today_utc(0) == "1970-01-01"
    past = _policy(tmp_path, f'paths = ["{vendor}"]', "2000-01-01")
    assert _judge(past, vendor, NOBODY).action == "reject"
    future = _policy(tmp_path, f'paths = ["{vendor}"]', "2999-01-01")
    assert _judge(future, vendor, NOBODY).action == "allow"


def test_only_the_exempted_program_and_rule(vendor: Path, tmp_path: Path,
                                            elf_builder: ElfBuilder) -> None:
    other = elf_builder.compile(src("hello.c"), "vendor/bin/other", arch="aarch64")
    other.chmod(0o755)
    policy = _policy(tmp_path, f'paths = ["{vendor}"]', "2999-01-01")
    assert _judge(policy, vendor, NOBODY).action == "allow"
    assert _judge(policy, other, NOBODY).action == "reject"
    # Another rule on the same path is not released: a missing interpreter.
    script = vendor.parent / "tool.sh"
    script.write_text("#!/nonexistent/interp\n")
    script.chmod(0o755)
    policy = _policy(tmp_path, f'paths = ["{vendor.parent}/*"]', "2999-01-01")
    v = _judge(policy, script, NOBODY)
    assert v.action == "reject" and "exe-arch-mismatch" not in v.rule_ids


def test_nothing_is_released_without_knowing_the_user(vendor: Path, tmp_path: Path) -> None:
    policy = _policy(tmp_path, f'paths = ["{vendor}"]', "2999-01-01")
    assert _judge(policy, vendor, None).action == "reject"


def test_users_and_groups_from_the_credentials(vendor: Path, tmp_path: Path) -> None:
    policy = _policy(tmp_path, 'users = ["nobody"]', "2999-01-01")
    assert _judge(policy, vendor, NOBODY).action == "allow"
    assert _judge(policy, vendor, Who(uid=0, gids=(0,))).action == "reject"
    by_uid = _policy(tmp_path, 'users = ["65534"]', "2999-01-01")
    assert _judge(by_uid, vendor, NOBODY).action == "allow"
    group = _policy(tmp_path, 'groups = ["nogroup"]', "2999-01-01")
    assert _judge(group, vendor, NOBODY).action == "allow"
    assert _judge(group, vendor, Who(uid=65534, gids=(0,))).action == "reject"
    # Every selector given must match.
    both = _policy(tmp_path, f'paths = ["{vendor}"]\nusers = ["root"]', "2999-01-01")
    assert _judge(both, vendor, NOBODY).action == "reject"
    assert _judge(both, vendor, Who(uid=0, gids=(0,))).action == "allow"


def test_environment_cannot_name_the_user(vendor: Path, tmp_path: Path) -> None:
    policy = _policy(tmp_path, 'users = ["root"]', "2999-01-01")
    v = decide(policy, StepRequest(partition=None, argv=[str(vendor)],
                                   env={"PATH": "/usr/bin", "USER": "root", "LOGNAME": "root",
                    "SLURM_JOB_USER": "root", "SLURM_JOB_UID": "0"}, cwd="/", node=HOST,
                                   who=NOBODY))
    assert v.action == "reject"


def test_a_user_cannot_exempt_their_own_file(vendor: Path, tmp_path: Path) -> None:
    """A copy at an exempted path, a symlink to it, or an exempted path in a
    tree the user can write: none is released."""
    policy = _policy(tmp_path, f'paths = ["{vendor.parent}/**"]', "2999-01-01")
    # The user owns the file (they could have written it there).
    own = vendor.parent / "mine"
    shutil.copy2(vendor, own)
    os.chown(own, 65534, 65534)
    assert _judge(policy, own, NOBODY).action == "reject"
    assert _judge(policy, own, Who(uid=1234, gids=(1234,))).action == "allow"
    # A group-writable directory of one of the user's groups.
    sub = vendor.parent / "shared"
    sub.mkdir()
    shutil.copy2(vendor, sub / "tool")
    sub.chmod(0o775)
    os.chown(sub, 0, 4242)
    assert _judge(policy, sub / "tool", Who(uid=1234, gids=(1234, 4242))).action == "reject"
    assert _judge(policy, sub / "tool", Who(uid=1234, gids=(1234,))).action == "allow"
    # The user's symlink at an exempted path, pointing at their own build.
    home = tmp_path / "home"
    home.mkdir()
    build = home / "build"
    shutil.copy2(vendor, build)
    os.chown(build, 65534, 65534)
    link = vendor.parent / "link"
    link.symlink_to(build)
    assert _judge(policy, link, NOBODY).action == "reject"
    # A world-writable sticky directory: entries the user does not own are safe.
    assert user_controlled(str(vendor), NOBODY) is False
    sticky = vendor.parent / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)
    shutil.copy2(vendor, sticky / "root-owned")
    assert user_controlled(str(sticky / "root-owned"), NOBODY) is False
    shutil.copy2(vendor, sticky / "theirs")
    os.chown(sticky / "theirs", 65534, 65534)
    assert user_controlled(str(sticky / "theirs"), NOBODY) is True
    assert user_controlled("relative/path", NOBODY) is True
    assert user_controlled(str(tmp_path / "missing"), NOBODY) is True


def test_check_cli_shows_what_the_exemption_released(vendor: Path, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    from grace_policy.cli.main import main

    cfg = _write(tmp_path, f"""\
[[rules.exe-arch-mismatch.exempt]]
paths = ["{vendor}"]
until = 2999-01-01
reason = "ticket 5"
""")
    assert main(["check", "--config", cfg, "--json", "--", str(vendor)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["exempted"] == [{"rule": "exe-arch-mismatch", "path": str(vendor),
                                "reason": "ticket 5", "until": "2999-01-01",
                                "where": "rules.exe-arch-mismatch.exempt[0]"}]
    assert main(["check", "--config", cfg, "--", str(vendor)]) == 0
    assert (f"grace-policy: exempted: exe-arch-mismatch for {vendor} until 2999-01-01 "
            "(rules.exe-arch-mismatch.exempt[0]: ticket 5)") in capsys.readouterr().out
