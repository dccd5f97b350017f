"""An image reference as enroot 4.1.2 parses it (``docker::_parse_uri``).

Forms (pyxis prefixes ``docker://`` when the string has no scheme):

* ``docker://[USER@]REGISTRY#IMAGE[:TAG][@DIGEST]``: enroot's own form;
* ``docker://[USER@]REGISTRY/IMAGE[:TAG][@DIGEST]``: the Docker form, where
  the first component is a registry only when it has a ``.`` or a ``:``
  (else it is a Docker Hub namespace);
* ``docker://[USER@]IMAGE[:TAG][@DIGEST]``: Docker Hub's ``library/IMAGE``.

No registry: ``registry-1.docker.io``; no tag: ``latest``; a digest wins
over a tag. Anything else is "Invalid image reference" for enroot: None.
"""

from __future__ import annotations

import re

from .._record import dataclass

DEFAULT_REGISTRY = "registry-1.docker.io"

# enroot's character classes, as POSIX bracket expressions in bash's =~.
_USER = r"[A-Za-z0-9_.!~*'()%;:&=+$,@-]+"
_IMAGE = r"[a-z0-9/._-]+"
_TAG = r"[A-Za-z0-9._:-]+"
_DIGEST = r"sha256:[A-Za-z0-9]+"
_WHO = rf"^docker://(({_USER})@)?"

#: (pattern, groups of user/registry/image/tag, kind) in enroot's order.
_FORMS: tuple[tuple[str, str], ...] = (
    (rf"{_WHO}(?P<r>[^/#]+)/(?P<i>{_IMAGE}):{_TAG}@(?P<t>{_DIGEST})$", "docker"),
    (rf"{_WHO}(?P<r>[^/#]+)/(?P<i>{_IMAGE})@(?P<t>{_DIGEST})$", "docker"),
    (rf"{_WHO}(?P<r>[^/#]+)/(?P<i>{_IMAGE})(:(?P<t>{_TAG}))?$", "docker"),
    (rf"{_WHO}(?P<i>[^/@#:]+):{_TAG}@(?P<t>{_DIGEST})$", "hub"),
    (rf"{_WHO}(?P<i>[^/@#:]+)@(?P<t>{_DIGEST})$", "hub"),
    (rf"{_WHO}(?P<i>[^/@#:]+)(:(?P<t>{_TAG}))?$", "hub"),
    (rf"{_WHO}(?P<r>[^#/@]+)#(?P<i>{_IMAGE}):{_TAG}@(?P<t>{_DIGEST})$", "enroot"),
    (rf"{_WHO}(?P<r>[^#/@]+)#(?P<i>{_IMAGE})@(?P<t>{_DIGEST})$", "enroot"),
    (rf"{_WHO}(?P<r>[^#/@]+)#(?P<i>{_IMAGE})(:(?P<t>{_TAG}))?$", "enroot"),
)


@dataclass(frozen=True)
class Reference:
    """What enroot asks the registry for."""

    #: ``USER@`` of the reference ("" when none; :mod:`.settings` may infer
    #: one from ``.credentials`` as enroot does).
    user: str
    #: ``HOST[:PORT]``.
    registry: str
    image: str
    #: A tag, or ``sha256:...`` (a digest, which enroot asks for as a tag).
    tag: str

    @property
    def host(self) -> str:
        """The registry without its port: what ``.credentials`` is matched on
        (enroot's ``${registry%:*}``)."""
        return self.registry.rsplit(":", 1)[0] if ":" in self.registry else self.registry

    def shown(self) -> str:
        """The reference for messages: never the user name (it is the key to
        a credential line)."""
        sep = "@" if self.tag.startswith("sha256:") else ":"
        return f"{self.registry}#{self.image}{sep}{self.tag}"


def parse(text: str) -> Reference | None:
    """The reference pyxis hands enroot for ``--container-image=TEXT``, or
    None when enroot would refuse it (or it is not a registry image:
    ``dockerd://``, a local path)."""
    if not text or text.startswith(("/", ".", "dockerd://")) or len(text) > 4096:
        return None
    uri = text if text.startswith("docker://") else "docker://" + text
    for pattern, kind in _FORMS:
        m = re.match(pattern, uri)
        if m is None:
            continue
        user, image, tag = m.group(2) or "", m.group("i"), m.group("t") or "latest"
        if kind == "hub":
            return Reference(user, DEFAULT_REGISTRY, "library/" + image, tag)
        registry = m.group("r")
        if kind == "docker" and "." not in registry and ":" not in registry:
            return Reference(user, DEFAULT_REGISTRY, f"{registry}/{image}", tag)
        return Reference(user, registry, image, tag)
    return None
