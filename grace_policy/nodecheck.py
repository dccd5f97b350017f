"""The node checker's entry: what spank/grace_node.c starts from slurmd.

Why a node checker: a cold step pays for an interpreter start and the
check's imports (15-35 ms) before the check itself. This process is started
once per node by slurmd (``checker=node``), imports what a check needs, and
serves every miss on the node from then on (grace_policy/checker/: the
server and its children, the wire, the credential switch, the staleness
test, the system log). Its module and function names are the contract's
(contract.CHECKER_MODULE, CHECKER_FUNCTION): grace_node.c's start line is
written from them.
"""

from __future__ import annotations

import os
import signal

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence


def main(argv: Sequence[str]) -> int:
    """``--socket PATH --code CODE --life FD [--cache-dir DIR] [--test hang]``
    (grace_node.c)."""
    opts = dict(zip(argv[::2], argv[1::2]))
    os.chdir("/")
    os.umask(0o077)
    from . import warm
    from .checker.server import Refused, Server
    from .checker.syslog import say

    warm.preload(containers=True)
    server = Server(opts["--socket"], opts["--code"], int(opts["--life"]), opts.get("--test"),
                    cache_dir=opts.get("--cache-dir"))

    def _stop(signum: int, frame: object) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, _stop)
    try:
        if not server.listen():
            return 0  # slurmd ended while we started: the socket is not ours
        return server.serve()
    except (Refused, OSError) as exc:
        # stderr is /dev/null (slurmd's start): the system log is where an
        # admin who reads "not reachable" in slurmd's log can find why.
        say(f"grace-policy: node checker on {server.path} not started: {exc}")
        return 1
    finally:
        server.close()
        if server.published and os.getpid() == server.pid:  # never a child's exit
            # No checker, no facts: entries keyed on them stop replaying.
            from .cuda.nodegpus import unpublish

            unpublish(server.cache_dir)
