"""Install order of pyxis and grace-policy (issue 15 item 7).

Slurm calls SPANK plugins in plugstack order and reads ``include
plugstack.conf.d/*.conf`` in collation order; pyxis starts its container in
its own task_init, so grace-policy must come after it. The packaged snippet's
name must sort after ``pyxis.conf``, and ``config check`` says which comes
first (real files, the real CLI; the live order is tested on Slurm in
tests/slurm/test_containers.py).
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SNIPPETS = REPO / "packaging" / "plugstack.conf.d"


def _snippet_name() -> str:
    [snippet] = SNIPPETS.glob("*.conf.in")
    return snippet.name.removesuffix(".in")


def _tree(tmp: Path, ours: str, pyxis_kind: str = "required") -> tuple[Path, Path]:
    conf_d = tmp / "plugstack.conf.d"
    conf_d.mkdir()
    (conf_d / "pyxis.conf").write_text(f"{pyxis_kind} /usr/lib/slurm/spank_pyxis.so\n")
    (conf_d / ours).write_text("required /usr/lib/slurm/spank_grace_policy.so "
                               f"config={tmp / 'gp.toml'} audit={tmp / 'audit.log'}\n")
    main = tmp / "plugstack.conf"
    main.write_text(f"include {conf_d}/*.conf\n")
    cfg = tmp / "gp.toml"
    cfg.write_text('mode = "enforce"\n')
    return main, cfg


def _check(main: Path, cfg: Path) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "grace_policy", "config", "check", "--plugstack", str(main),
         str(cfg)], capture_output=True, text=True, cwd=REPO, check=False,
        env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_packaged_snippet_sorts_after_pyxis() -> None:
    name = _snippet_name()
    # The order Slurm's glob() gives in the C locale, and Python's.
    assert sorted([name, "pyxis.conf"]) == ["pyxis.conf", name]
    plugin_mk = (REPO / "packaging" / "plugin.mk").read_text()
    assert f"plugstack.conf.d/{name}" in plugin_mk
    for pkg in ("packaging/debian/rules", "packaging/rpm/grace-policy.spec"):
        assert f"plugstack.conf.d/{name}" in (REPO / pkg).read_text(), pkg


def test_config_check_says_pyxis_comes_first(tmp_path: Path) -> None:
    main, cfg = _tree(tmp_path, _snippet_name())
    assert [Path(p).name for p in sorted(glob.glob(f"{tmp_path}/plugstack.conf.d/*.conf"))] \
        == ["pyxis.conf", _snippet_name()]
    out = _check(main, cfg)
    assert f"pyxis ({tmp_path}/plugstack.conf.d/pyxis.conf:1) comes first: container steps " \
           "are judged in their image" in out
    assert "comes after grace-policy" not in out


def test_config_check_warns_when_grace_policy_sorts_first(tmp_path: Path) -> None:
    # The old name: grace-policy.conf < pyxis.conf.
    main, cfg = _tree(tmp_path, "grace-policy.conf", pyxis_kind="optional")
    out = _check(main, cfg)
    assert f"pyxis ({tmp_path}/plugstack.conf.d/pyxis.conf:1) comes after grace-policy: a " \
           "container step whose container fails to start is not caught" in out
    assert "pyxis is optional: when its container does not start Slurm runs the step on " \
           "the host; grace-policy refuses such a step only when listed after pyxis" in out


def test_no_pyxis_no_word_about_it(tmp_path: Path) -> None:
    main, cfg = _tree(tmp_path, _snippet_name())
    (tmp_path / "plugstack.conf.d" / "pyxis.conf").unlink()
    assert "pyxis (" not in _check(main, cfg)


def test_config_check_says_who_checks_cold_steps(tmp_path: Path) -> None:
    """The default is the node checker, which exists only after a slurmd
    restart with the line: config check says so; checker=step is named."""
    main, cfg = _tree(tmp_path, _snippet_name())
    out = _check(main, cfg)
    assert ("  cold steps: checked by the node checker slurmd starts (checker=node, socket "
            "/run/grace-policy/checker/socket); restart slurmd after changing this line or "
            "the install, until then steps use checker=step") in out
    snippet = tmp_path / "plugstack.conf.d" / _snippet_name()
    snippet.write_text(snippet.read_text().rstrip("\n") + " checker=step\n")
    out = _check(main, cfg)
    assert "  cold steps: checked by a helper of slurmstepd (checker=step)" in out
    assert "node checker" not in out
