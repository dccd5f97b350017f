"""A pyxis step whose image comes from a registry: its verdict before the
pull.

The step carries the parsed reference and enroot's settings
(:class:`RegistryStep`, made by :func:`grace_policy.container.pyxis.plan_pyxis`
or the CLI); :func:`grace_policy.decide.decide` calls :meth:`RegistryStep.judge`
with the check's budget and node. The only verdict drawn here is the
architecture: what pyxis unpacks is not on the node yet.
"""

from __future__ import annotations

from .._record import dataclass, field
from ..budget import Budget
from ..findings import Issue
from .manifest import Resolved, resolve
from .reference import Reference
from .settings import Settings

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ..node import NodeProfile

#: What the node does with an image of another architecture (field notes §12:
#: enroot imports it with a warning, then its shell cannot start).
_STARTS_FOREIGN = "enroot-switchroot: failed to execute: /bin/sh: Exec format error"
#: ... and when the tag's list has nothing for the node.
_NO_ENTRY = ("pyxis: failed to import docker image (the registry has no manifest for this "
             "node), or enroot-switchroot: failed to execute: /bin/sh: Exec format error")


@dataclass(frozen=True)
class RegistryStep:
    """The image a pyxis step will import, as enroot will ask for it."""

    reference: Reference
    settings: Settings
    #: The image string the user gave (for the audit line).
    given: str
    #: What the last :meth:`judge` read ("found": :class:`Resolved`), for the
    #: CLI's report; not part of the step's identity.
    seen: dict[str, Resolved] = field(default_factory=dict, compare=False)

    def judge(self, node: NodeProfile, budget: Budget) -> tuple[Issue | None, Resolved]:
        """(``image-arch-mismatch`` or None, what was judged). Raises
        RegistryError or BudgetExceeded."""
        found = resolve(self.reference, node.machine, self.settings, budget)
        self.seen["found"] = found
        return arch_issue(found, node), found

    def judged(self, found: Resolved) -> str:
        """The audit line's note for an image that may start here."""
        return (f"pyxis registry image {self.reference.shown()}: manifest {found.digest} is "
                f"{found.os or 'linux'}/{found.arch}; its files are judged after the pull, "
                "not here")


def platform_of(machine: str) -> str:
    from ..image.step import PLATFORMS

    return PLATFORMS.get(machine, f"linux/{machine}")


#: The most platforms a message names (a list may have up to MAX_ENTRIES).
MAX_SHOWN = 8


def shown_platforms(platforms: tuple[str, ...]) -> str:
    """The platforms for a message: each once, in the list's order, at most
    :data:`MAX_SHOWN` (the registry's words: the messages escape them)."""
    seen: list[str] = []
    for name in platforms:
        if name not in seen:
            seen.append(name)
    if not seen:
        return "no platform"
    more = len(seen) - MAX_SHOWN
    return ", ".join(seen[:MAX_SHOWN]) + (f" and {more} more" if more > 0 else "")


def arch_issue(found: Resolved, node: NodeProfile) -> Issue | None:
    from ..node import normalize_arch

    node_platform = platform_of(node.machine)
    has = shown_platforms(found.image_platforms())
    image = found.reference.shown()
    if found.digest:
        if not found.arch:
            return None  # the config does not say: the pull will show
        arch = normalize_arch(found.arch)
        if arch == node.machine or (arch == "i386" and node.machine == "x86_64"):
            return None
        error, detail = _STARTS_FOREIGN, f"manifest {found.digest} is {found.os or 'linux'}/" \
                                         f"{found.arch}"
    else:
        arch = has
        error, detail = _NO_ENTRY, f"the tag's manifest list has {has}"
    return Issue(
        "image-arch-mismatch", image, error,
        causes=("registry",),
        facts=(("image", image), ("image_arch", arch), ("file_arch", arch),
               ("platforms", has), ("node_platform", node_platform),
               ("digest", found.digest or found.list_digest),
               ("inner", "the registry's manifest"), ("detail", detail)),
    )
