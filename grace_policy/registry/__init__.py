"""Registry images judged before pyxis pulls them (issue 25).

A pyxis step with ``--container-image=REGISTRY#IMAGE:TAG`` has no image on
the node when the check runs: pyxis' first task imports it with ``enroot
import`` after the check. What enroot will pick is already known to the
registry, though: the manifest list entry for the node's architecture, or
the single manifest, and its config's ``architecture``. Reading those two
small documents (never a layer) tells whether the image can start here.

Modules, one job each:

* :mod:`.reference`: the reference as enroot 4.1.2 parses it;
* :mod:`.settings`: enroot's settings and ``.credentials`` as enroot, run
  by pyxis (or by the user on a login node), would read them;
* :mod:`.http`: a stdlib HTTP(S) client bounded by the check's
  :class:`~grace_policy.budget.Budget` (every socket operation, every body);
* :mod:`.auth`: the ``WWW-Authenticate`` Bearer/Basic exchange enroot does;
* :mod:`.manifest`: the choice enroot makes, and what it chose;
* :mod:`.step`: the step's verdict (``image-arch-mismatch`` or nothing).

Nothing here is imported by a host step or a local-image step. No
credential is ever put in an exception, a log line or a message: errors
name the registry, the image and the HTTP status only.
"""

from __future__ import annotations


class RegistryError(Exception):
    """The registry could not be read (refused, timed out, 5xx, refused the
    credentials, sent something too big or malformed). The check follows the
    admin's ``on_error``; pyxis reports its own pull error."""
