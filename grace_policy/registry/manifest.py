"""The manifest and config enroot 4.1.2 will import (``docker::_download``),
read before any layer is fetched.

enroot asks the tag with ``Accept`` a manifest list or OCI index and takes
the *first* entry whose ``platform.architecture`` is the node's Debian name
(``common::debarch``: x86_64 -> amd64, aarch64 -> arm64; ``os`` and
``variant`` ignored). Without one it asks the tag again with ``Accept`` a
single manifest (Docker schema 2 or OCI), whatever the registry then sends
(Debian's registry 2.8.2 rewrites a Docker list to its linux/amd64 entry and
answers 404 when there is none). The manifest's ``config`` blob says the
image's ``architecture``; enroot only warns when it differs, then imports.

Where this check parts from enroot on purpose: a list with no entry for
the node is judged from the list itself (the image has no build for this
node whatever the registry answers next), and a registry answer enroot
would choke on is a :class:`~grace_policy.registry.RegistryError`.
"""

from __future__ import annotations

import json

from .._record import dataclass
from ..budget import Budget
from . import RegistryError
from .auth import authorization
from .http import Response, request
from .reference import Reference
from .settings import Settings, read_logins, user_for

LIST_ACCEPT = ("application/vnd.docker.distribution.manifest.list.v2+json, "
               "application/vnd.oci.image.index.v1+json")
MANIFEST_ACCEPT = ("application/vnd.docker.distribution.manifest.v2+json, "
                   "application/vnd.oci.image.manifest.v1+json")
#: The most of a manifest, an index or a config read (real ones are KiBs).
MAX_DOCUMENT = 4 * 1024 * 1024
#: The most entries of a manifest list judged (real ones have a handful).
MAX_ENTRIES = 1024

#: enroot's ``common::debarch``.
DEBARCH = {"x86_64": "amd64", "aarch64": "arm64", "ppc64le": "ppc64le", "ppc64": "ppc64le"}


@dataclass(frozen=True)
class Resolved:
    """What the registry says about the image enroot would import."""

    reference: Reference
    #: ``os/architecture[/variant]`` of every entry of the tag's list, in
    #: order; () when the tag is a single manifest.
    platforms: tuple[str, ...]
    #: The manifest judged (``sha256:...``), or "" when the list has no entry
    #: for the node (nothing enroot could import for it).
    digest: str
    #: The config's ``architecture`` and ``os`` ("" when no manifest was chosen).
    arch: str = ""
    os: str = ""
    env: tuple[str, ...] = ()
    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    #: The digest of the manifest list, when the tag is one.
    list_digest: str = ""
    #: The chosen manifest's config digest, its layers' digests in the
    #: manifest's order and the config's ``rootfs.diff_ids`` (the sha256 of
    #: each layer uncompressed): what says whether enroot's cache holds this
    #: image (:mod:`.cache`). Strings only; () when the manifest has none.
    config_digest: str = ""
    layers: tuple[str, ...] = ()
    diff_ids: tuple[str, ...] = ()

    def image_platforms(self) -> tuple[str, ...]:
        """The platforms the image has: its list's, or its config's."""
        if self.platforms:
            return self.platforms
        return (f"{self.os or 'linux'}/{self.arch}",) if self.arch else ()


class _Session:
    """Requests to one registry for one image, with enroot's authentication."""

    def __init__(self, ref: Reference, settings: Settings, budget: Budget) -> None:
        self.ref = ref
        self.settings = settings
        self.budget = budget
        self.scheme = "http" if settings.allow_http else "https"
        self.logins = read_logins(settings.credentials_path, settings.env)
        self.user = user_for(ref.host, ref.user, self.logins)
        self.auth: str | None = None
        self.tried_auth = False

    def url(self, kind: str, ref: str) -> str:
        return f"{self.scheme}://{self.ref.registry}/v2/{self.ref.image}/{kind}/{ref}"

    def get(self, url: str, accept: str | None) -> Response:
        headers = {"Accept": accept} if accept else {}
        got = self._get(url, headers)
        if got.status == 401 and not self.tried_auth:
            self.tried_auth = True
            challenge = got.headers.get("www-authenticate")
            if challenge:
                self.auth = authorization(challenge, self.ref.host, self.user, self.logins,
                                          self.budget, env=self.settings.env)
                if self.auth:
                    got = self._get(url, headers)
        return got

    def _get(self, url: str, headers: dict[str, str]) -> Response:
        if self.auth:
            headers = {**headers, "Authorization": self.auth}
        return request("GET", url, headers, self.budget, env=self.settings.env,
                       cap=MAX_DOCUMENT)


def _json(got: Response, what: str) -> dict[str, object]:
    try:
        data = json.loads(got.body)
    except ValueError:
        raise RegistryError(f"the {what} is not JSON") from None
    if not isinstance(data, dict):
        raise RegistryError(f"the {what} is not a JSON object")
    return data


def _failed(got: Response, what: str, ref: Reference) -> RegistryError:
    hint = {401: " (the registry wants credentials enroot does not have, or refused them)",
            403: " (access denied)", 404: " (no such image or tag)"}.get(got.status, "")
    return RegistryError(f"{ref.shown()}: the registry answered HTTP {got.status} for the "
                         f"{what}{hint}")


def _platform(entry: dict[str, object]) -> str:
    plat = entry.get("platform")
    if not isinstance(plat, dict):
        return "unknown"
    words = [str(plat.get("os") or "?"), str(plat.get("architecture") or "?")]
    if plat.get("variant"):
        words.append(str(plat["variant"]))
    return "/".join(words)[:64]


def resolve(ref: Reference, machine: str, settings: Settings, budget: Budget) -> Resolved:
    """What enroot would import for a node of ``machine``. Raises
    RegistryError or BudgetExceeded; fetches no layer."""
    import hashlib

    arch = DEBARCH.get(machine, machine)
    session = _Session(ref, settings, budget)
    got = session.get(session.url("manifests", ref.tag), LIST_ACCEPT)
    platforms: tuple[str, ...] = ()
    list_digest = ""
    target = ref.tag
    if got.status == 200:
        data = _json(got, "manifest list")
        entries = data.get("manifests")
        if isinstance(entries, list):
            if len(entries) > MAX_ENTRIES:
                raise RegistryError(f"{ref.shown()}: the manifest list has {len(entries)} "
                                    f"entries, more than the {MAX_ENTRIES} this check reads")
            list_digest = "sha256:" + hashlib.sha256(got.body).hexdigest()
            found = ""
            names = []
            for entry in entries:
                budget.tick()
                if not isinstance(entry, dict):
                    continue
                names.append(_platform(entry))
                plat = entry.get("platform")
                digest = entry.get("digest")
                if not found and isinstance(plat, dict) and plat.get("architecture") == arch \
                        and isinstance(digest, str) and digest.startswith("sha256:"):
                    found = digest
            platforms = tuple(names)
            if not found:
                return Resolved(ref, platforms, "", list_digest=list_digest)
            target = found
    elif got.status not in (401, 404):
        raise _failed(got, "manifest list", ref)
    got = session.get(session.url("manifests", target), MANIFEST_ACCEPT)
    if got.status != 200:
        raise _failed(got, "manifest", ref)
    manifest = _json(got, "manifest")
    digest = "sha256:" + hashlib.sha256(got.body).hexdigest()
    config = manifest.get("config")
    layers = manifest.get("layers")
    config_digest = config.get("digest") if isinstance(config, dict) else None
    if not isinstance(config_digest, str) or not config_digest.startswith("sha256:") \
            or not isinstance(layers, list) or not layers:
        raise RegistryError(f"{ref.shown()}: the manifest names no config and layers "
                            "(enroot cannot import it either)")
    got = session.get(session.url("blobs", config_digest), None)
    if got.status != 200:
        raise _failed(got, "image config", ref)
    if "sha256:" + hashlib.sha256(got.body).hexdigest() != config_digest:
        raise RegistryError(f"{ref.shown()}: the image config does not match its digest")
    conf = _json(got, "image config")
    inner = conf.get("config") if isinstance(conf.get("config"), dict) else {}
    return Resolved(
        ref, platforms, digest,
        arch=_word(conf.get("architecture") or conf.get("Architecture")),
        os=_word(conf.get("os")),
        env=_strings(inner.get("Env")),  # type: ignore[union-attr]
        entrypoint=_strings(inner.get("Entrypoint")),  # type: ignore[union-attr]
        cmd=_strings(inner.get("Cmd")),  # type: ignore[union-attr]
        list_digest=list_digest,
        config_digest=config_digest,
        layers=_layer_digests(layers),
        diff_ids=_diff_ids(conf.get("rootfs")),
    )


def _layer_digests(layers: list[object]) -> tuple[str, ...]:
    """Each layer's digest ("" for an entry without one); () for more layers
    than :data:`MAX_ENTRIES` (nothing then says the cache holds them all)."""
    if len(layers) > MAX_ENTRIES:
        return ()
    return tuple(str(entry["digest"]) if isinstance(entry, dict)
                 and isinstance(entry.get("digest"), str) else "" for entry in layers)


def _diff_ids(rootfs: object) -> tuple[str, ...]:
    if not isinstance(rootfs, dict):
        return ()
    return _strings(rootfs.get("diff_ids"), MAX_ENTRIES)


def _word(value: object) -> str:
    return value[:64] if isinstance(value, str) else ""


def _strings(value: object, most: int = 256) -> tuple[str, ...]:
    if not isinstance(value, list):
        return ()
    return tuple(v for v in value[:most] if isinstance(v, str))
