"""What the node checker says when it cannot start, and where.

Why the system log: slurmd starts the server with stderr on /dev/null, so
an admin who reads "node checker ... not reachable" in slurmd's log finds
the reason here (and on stderr, for a server started by hand).
"""

from __future__ import annotations

import sys


def say(text: str) -> None:
    print(text, file=sys.stderr)
    try:
        import syslog

        syslog.openlog("grace-policy", 0, syslog.LOG_DAEMON)
        syslog.syslog(syslog.LOG_ERR, text)
    except Exception:
        pass
