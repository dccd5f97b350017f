"""enroot's settings and ``.credentials`` as the registry check reads them.

The enroot script here has the two lines enroot 4.1.2's installed script
carries (``config::init``, ``config::export ENROOT_SYSCONF_PATH``), which is
all :mod:`grace_policy.container.enroot` reads of it.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from grace_policy.registry.settings import (
    for_pyxis,
    for_user,
    parse_logins,
    password_for,
    read_logins,
    user_for,
)


def _enroot(tmp: Path, conf: str) -> str:
    bindir, etc = tmp / "bin", tmp / "etc/enroot"
    bindir.mkdir(parents=True)
    (etc / "enroot.conf.d").mkdir(parents=True)
    (etc / "enroot.conf").write_text(conf)
    script = bindir / "enroot"
    script.write_text(f'#!/bin/bash\nconfig::init "{etc}/enroot.conf"\n'
                      f'config::export ENROOT_SYSCONF_PATH "{etc}"\n')
    script.chmod(0o755)
    return str(bindir)


def test_allow_http_comes_from_enroot_conf_not_the_job(tmp_path: Path) -> None:
    path = _enroot(tmp_path, "ENROOT_CONFIG_PATH /site/${USER}\n")
    job = {"ENROOT_ALLOW_HTTP": "y", "USER": "alice", "HOME": "/home/alice"}
    got = for_pyxis(job, search=path)
    # pyxis drops ENROOT_ALLOW_HTTP from the job's environment.
    assert not got.allow_http
    assert got.credentials_path == "/site/alice/.credentials"
    (tmp_path / "etc/enroot/enroot.conf.d/50-http.conf").write_text("ENROOT_ALLOW_HTTP yes\n")
    assert for_pyxis(job, search=path).allow_http
    # The user's own `enroot import` on a login node keeps it.
    assert for_user({**job, "ENROOT_ALLOW_HTTP": "y"}, search=path).allow_http


def test_config_path_defaults_to_xdg(tmp_path: Path) -> None:
    path = _enroot(tmp_path, "")
    got = for_pyxis({"HOME": "/home/bob"}, search=path)
    assert got.credentials_path == "/home/bob/.config/enroot/.credentials"
    got = for_pyxis({"HOME": "/home/bob", "ENROOT_CONFIG_PATH": "/cfg"}, search=path)
    assert got.credentials_path == "/cfg/.credentials"  # pyxis lets it through


def test_netrc_lines_variables_and_user_inference() -> None:
    text = ("machine nvcr.io login $oauthtoken password $NGC_KEY\n"
            "machine 127.0.0.1 login alice password s3cret\n"
            "machine 127.0.0.1 login bob password ${BOB_PW}\n"
            "garbage line\n")
    logins = parse_logins(text, {"NGC_KEY": "nvapi-x", "BOB_PW": "pw2"})
    assert [(lg.machine, lg.login, lg.password) for lg in logins] == [
        ("nvcr.io", "$oauthtoken", "nvapi-x"), ("127.0.0.1", "alice", "s3cret"),
        ("127.0.0.1", "bob", "pw2")]
    # enroot 4.1.2 takes the first login for the host when USER@ is not given.
    assert user_for("127.0.0.1", "", logins) == "alice"
    assert user_for("127.0.0.1", "bob", logins) == "bob"
    assert user_for("ghcr.io", "", logins) == ""
    assert password_for("127.0.0.1", "bob", logins) == "pw2"
    assert password_for("127.0.0.1", "carol", logins) is None
    assert "s3cret" not in repr(logins) and "nvapi-x" not in repr(logins)


def test_credentials_fifo_and_directory_are_no_credentials(tmp_path: Path) -> None:
    fifo = tmp_path / ".credentials"
    os.mkfifo(fifo)
    done: list[object] = []
    worker = threading.Thread(target=lambda: done.append(read_logins(str(fifo), {})),
                              daemon=True)
    started = time.monotonic()
    worker.start()
    worker.join(10)
    assert done == [[]], "reading a FIFO .credentials must not block"
    assert time.monotonic() - started < 10
    assert read_logins(str(tmp_path), {}) == []
    assert read_logins(str(tmp_path / "missing"), {}) == []
