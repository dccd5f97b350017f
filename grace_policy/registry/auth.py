"""The authentication enroot does before it asks for a manifest
(enroot 4.1.2 ``docker::_authenticate``).

A ``401`` with ``WWW-Authenticate: Bearer realm=...,service=...,scope=...``:
a token from the realm, asked with the user's login and password when
``.credentials`` has a line for that host and user (curl's
``--netrc-file`` answers for the host it asks), anonymously otherwise; the
token is ``.token`` or ``.access_token`` of the realm's JSON answer.
``Basic``: the login and password themselves. enroot caches the result in
``$ENROOT_CACHE_PATH/.tokens.UID``; this check never writes it (the step's
own pull does) and never shows it.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping

from ..budget import Budget
from . import RegistryError
from .http import parse_url, request
from .settings import Login, password_for

#: The most of a token answer read.
MAX_TOKEN_ANSWER = 256 * 1024


def parse_challenge(value: str) -> tuple[str, dict[str, str]]:
    """(scheme, params) of one ``WWW-Authenticate`` value."""
    scheme, _, rest = value.strip().partition(" ")
    params: dict[str, str] = {}
    i = 0
    while i < len(rest):
        while i < len(rest) and rest[i] in " ,":
            i += 1
        eq = rest.find("=", i)
        if eq < 0:
            break
        key = rest[i:eq].strip().lower()
        i = eq + 1
        if i < len(rest) and rest[i] == '"':
            end = rest.find('"', i + 1)
            end = len(rest) if end < 0 else end
            params[key] = rest[i + 1:end]
            i = end + 1
        else:
            end = rest.find(",", i)
            end = len(rest) if end < 0 else end
            params[key] = rest[i:end].strip()
            i = end
    return scheme, params


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode("ascii")


def authorization(challenge: str, host: str, user: str, logins: list[Login], budget: Budget,
                  *, env: Mapping[str, str]) -> str | None:
    """The ``Authorization`` value to retry with, or None (anonymous).
    ``host``: the registry's host (port cut off)."""
    scheme, params = parse_challenge(challenge)
    kind = scheme.lower()
    if kind == "basic":
        if not user:
            return None
        # enroot only uses a password from .credentials (curl -u would prompt).
        password = password_for(host, user, logins)
        return _basic(user, password) if password is not None else None
    if kind != "bearer":
        raise RegistryError(f"the registry asks for {scheme[:40]!r} authentication, which "
                            "enroot does not support")
    realm = params.pop("realm", "")
    if not realm:
        raise RegistryError("the registry's Bearer challenge names no realm")
    from urllib.parse import urlencode

    url = realm + ("&" if "?" in realm else "?") + urlencode(params) if params else realm
    headers: dict[str, str] = {}
    if user:
        password = password_for(parse_url(realm).host, user, logins)
        if password is not None:
            headers["Authorization"] = _basic(user, password)
    got = request("GET", url, headers, budget, env=env, cap=MAX_TOKEN_ANSWER)
    if got.status != 200:
        raise RegistryError(f"the registry's token service refused the request "
                            f"(HTTP {got.status})")
    import json

    try:
        data = json.loads(got.body)
    except ValueError:
        raise RegistryError("the registry's token service did not answer JSON") from None
    token = data.get("token") or data.get("access_token") if isinstance(data, dict) else None
    if not isinstance(token, str) or not token:
        raise RegistryError("the registry's token service gave no token")
    return f"Bearer {token}"

