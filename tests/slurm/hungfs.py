"""A FUSE file system whose daemon never answers (field notes §10).

Run as root: ``python3 -m tests.slurm.hungfs MOUNTPOINT`` (or this file). The
root directory answers; every other path's ``getattr`` sleeps forever, so a
``stat()`` below the mount point waits in the kernel for an answer that never
comes - the way a hard-mounted NFS server that went away behaves. Only
``kill -9`` of the daemon followed by ``umount -l`` frees the callers (they
get ENOTCONN).

libfuse2 (Debian) and fusepy 3.0.1 (PyPI, pinned in packaging/install-deps.sh)
do the protocol; ``allow_other`` lets the job's user reach the mount.
"""

from __future__ import annotations

import errno
import os
import stat
import sys
import threading
import time


def main(argv: list[str]) -> int:
    from fuse import FUSE, FuseOSError, Operations  # fusepy

    class Hung(Operations):  # type: ignore[misc]
        def getattr(self, path: str, fh: object = None) -> dict[str, int]:
            if path == "/":
                now = int(time.time())
                return {"st_mode": stat.S_IFDIR | 0o755, "st_nlink": 2, "st_uid": 0,
                        "st_gid": 0, "st_atime": now, "st_mtime": now, "st_ctime": now}
            threading.Event().wait()  # never answers
            raise FuseOSError(errno.EIO)  # not reached

        def readdir(self, path: str, fh: object) -> list[str]:
            return [".", ".."]

    mountpoint = argv[0]
    print(f"hungfs: pid {os.getpid()} serving {mountpoint}", flush=True)
    FUSE(Hung(), mountpoint, foreground=True, allow_other=True, nothreads=False,
         nonempty=True, fsname="grace-hungfs")  # nonempty: also over a used directory
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
