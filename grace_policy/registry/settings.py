"""enroot's registry settings and credentials, as the enroot that will pull
the image reads them.

On a compute node that enroot is the one pyxis runs, with the job's
environment minus what pyxis withholds (``ENROOT_ALLOW_HTTP`` among them:
it comes from ``enroot.conf`` only); :mod:`grace_policy.container.enroot`
models that. On a login node (``grace-policy check --image``) it is the
user's own ``enroot import``: the same files, with the user's environment
as is.

Credentials (enroot 4.1.2 ``docker.sh``): ``$ENROOT_CONFIG_PATH/.credentials``
in netrc form, ``machine HOST login USER password PASS``, HOST without the
registry's port. A reference without ``USER@`` takes the login of the first
line for that host (``docker::_parse_uri``); a password starting with ``$``
is the rest of the line expanded (``common::evalnetrc``: ``$VAR`` from
enroot's environment). The file is read through the project's file gateway
(regular files only, non-blocking open, capped), never logged.
"""

from __future__ import annotations

from collections.abc import Mapping

from .._record import dataclass, field
from ..fsprobe import HOST, Files

#: The most of ``.credentials`` read (a netrc is a few lines).
MAX_CREDENTIALS = 256 * 1024
_NAME = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")


@dataclass(frozen=True)
class Login:
    """One ``machine``/``login``/``password`` entry. ``repr`` hides the
    password so that no traceback or debug line can show it."""

    machine: str
    login: str
    password: str

    def __repr__(self) -> str:
        return f"Login({self.machine!r}, {self.login!r}, password=<hidden>)"


@dataclass(frozen=True)
class Settings:
    """What enroot's requests depend on."""

    allow_http: bool = False
    #: ``ENROOT_CONFIG_PATH`` ("" when enroot has none).
    config_path: str = ""
    #: The environment enroot (and its curl) runs with: proxies, ``$VAR``
    #: of ``.credentials``.
    env: dict[str, str] = field(default_factory=dict)

    def __repr__(self) -> str:
        return f"Settings(allow_http={self.allow_http}, config_path={self.config_path!r})"

    @property
    def credentials_path(self) -> str:
        return f"{self.config_path}/.credentials" if self.config_path.startswith("/") else ""


def for_pyxis(job_env: Mapping[str, str], *, search: str | None = None,
              files: Files = HOST) -> Settings:
    """The settings of the enroot pyxis runs for this step (slurmstepd's
    PATH finds it; ``search`` overrides that PATH for tests)."""
    from ..container.enroot import PYXIS_DENIED, _settings

    found = _settings(job_env, None, None, search, files.host())
    if found is None:  # no enroot: pyxis cannot pull either; enroot's defaults
        env = {k: v for k, v in job_env.items() if k not in PYXIS_DENIED}
        return _from(env, env)
    settings, full = found
    return _from(settings, full)


def for_user(env: Mapping[str, str], *, search: str | None = None) -> Settings:
    """The settings of ``enroot import`` run by this user here: the user's
    environment keeps every ``ENROOT_*`` it sets."""
    from ..container.enroot import _settings

    found = _settings(env, None, None, search if search is not None else env.get("PATH"), HOST)
    if found is None:
        return _from(dict(env), dict(env))
    # _settings drops what pyxis withholds; a user's own enroot sees it all.
    settings, full = found
    own = {k: v for k, v in env.items() if k.startswith("ENROOT_")}
    return _from({**settings, **own}, {**full, **own})


def _from(settings: Mapping[str, str], full: Mapping[str, str]) -> Settings:
    config = settings.get("ENROOT_CONFIG_PATH", "")
    if not config:
        home = full.get("HOME", "")
        xdg = full.get("XDG_CONFIG_HOME") or (f"{home}/.config" if home else "")
        config = f"{xdg}/enroot" if xdg else ""
    allow = settings.get("ENROOT_ALLOW_HTTP", "")
    return Settings(allow_http=bool(allow) and allow not in _FALSE, config_path=config,
                    env=dict(full))


_FALSE = frozenset({"n", "no", "N", "No", "NO", "f", "false", "F", "False", "FALSE"})


def read_logins(path: str, env: Mapping[str, str], files: Files = HOST) -> list[Login]:
    """The entries of a ``.credentials`` file (in ``files``, this host's);
    [] when there is none or it is not a regular file. ``$VAR``/``${VAR}``
    passwords from ``env``."""
    if not path:
        return []
    try:
        data = files.read_file(path, MAX_CREDENTIALS)
    except OSError:
        return []
    return parse_logins(data.decode("utf-8", "replace"), env)


def parse_logins(text: str, env: Mapping[str, str]) -> list[Login]:
    out: list[Login] = []
    for line in text.splitlines():
        words = line.split()
        if len(words) < 6 or words[0] != "machine" or words[2] != "login" \
                or words[4] != "password":
            continue
        password = words[5]
        if password.startswith("$"):
            # evalnetrc echoes the rest of the line through the shell.
            password = _expand(" ".join(words[5:]), env)
        out.append(Login(words[1], words[3], password))
    return out


def _expand(text: str, env: Mapping[str, str]) -> str:
    """``echo TEXT``'s ``$VAR`` and ``${VAR}`` (unset: empty)."""
    out: list[str] = []
    i = 0
    while i < len(text):
        if text[i] == "$":
            if text.startswith("{", i + 1) and "}" in text[i + 2:]:
                end = text.index("}", i + 2)
                out.append(env.get(text[i + 2:end], ""))
                i = end + 1
                continue
            j = i + 1
            while j < len(text) and text[j] in _NAME:
                j += 1
            if j > i + 1:
                out.append(env.get(text[i + 1:j], ""))
                i = j
                continue
        out.append(text[i])
        i += 1
    return "".join(out)


def user_for(registry_host: str, given: str, logins: list[Login]) -> str:
    """The login enroot authenticates as: the reference's ``USER@``, else
    the first ``.credentials`` line for the registry's host."""
    if given:
        return given
    return next((lg.login for lg in logins if lg.machine == registry_host), "")


def password_for(host: str, user: str, logins: list[Login]) -> str | None:
    """What curl's ``--netrc-file`` sends to ``host`` for ``user``: enroot
    hands the file to curl only when a line names the registry and the user;
    curl then takes the line for the host it is asking."""
    for lg in logins:
        if lg.machine == host and lg.login == user:
            return lg.password
    return None
