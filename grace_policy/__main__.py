"""``python3 -m grace_policy``: the same command as the ``grace-policy`` script,
for hosts where only the package is on the path (no console script installed)."""

import sys

from .cli.main import main

if __name__ == "__main__":
    sys.exit(main())
