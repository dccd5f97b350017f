"""One check's allowance of time, files and bytes.

The check runs inside slurmstepd on user-controlled files: a dependency tree
of thousands of objects, a PATH of thousands of entries or a slow network
filesystem must end in a verdict that follows the admin's ``on_error``, not
in a hung step launch. Python cannot interrupt a blocked system call, so the
deadline is only as good as the places that look at it: every file opened,
every PATH or search-directory element and every read goes through
:meth:`Budget.tick`, :meth:`Budget.take_file` or :meth:`Budget.spend_bytes`.
"""

from __future__ import annotations

import os
import time


class BudgetExceeded(Exception):
    """Raised when a check has used its deadline or one of its caps."""


#: check-limit's words for a MemoryError: the process that judges has a data
#: limit (``max_memory=`` of plugstack.conf, set by checker/confine.py), and
#: an allocation past it is a cap reached like the others, not a crash.
OUT_OF_MEMORY = "the check needed more memory than max_memory= allows"


class Budget:
    def __init__(
        self,
        deadline_ms: float = 500.0,
        max_files: int = 2000,
        max_bytes: int = 64 * 1024 * 1024,
    ) -> None:
        self.euid = os.geteuid()
        self.started = time.monotonic()
        self.deadline = self.started + deadline_ms / 1000.0
        self.deadline_ms = deadline_ms
        self.files_left = max_files
        self.max_files = max_files
        self.bytes_left = max_bytes
        self.max_bytes = max_bytes

    def tick(self) -> None:
        """Raise :class:`BudgetExceeded` once the deadline has passed. Cheap
        (one monotonic clock read), so loops over user-sized input call it
        on every element."""
        if time.monotonic() > self.deadline:
            raise BudgetExceeded(
                f"the check took longer than its deadline of {self.deadline_ms:g} ms")
        if os.geteuid() != self.euid:
            # slurmstepd gave up waiting (the plugin's C timeout) and took its
            # root rights back for every thread: a check left behind must not
            # go on reading the user's files as root.
            raise BudgetExceeded("the process' rights changed under the check; stopped")

    def take_file(self, nbytes: int = 0) -> int:
        """Account for one more file; returns how many bytes may still be read."""
        self.tick()
        self.files_left -= 1
        if self.files_left < 0:
            raise BudgetExceeded(f"the check examined more than {self.max_files} files")
        if nbytes:
            self.spend_bytes(nbytes)
        if self.bytes_left <= 0:
            raise BudgetExceeded(f"the check read more than {self.max_bytes} bytes")
        return self.bytes_left

    def spend_bytes(self, nbytes: int) -> None:
        """Charge ``nbytes`` about to be read. Raises *before* the read that
        would go past the cap, so the cap bounds what is actually read."""
        self.tick()
        if nbytes > self.bytes_left:
            self.bytes_left = -1
            raise BudgetExceeded(f"the check read more than {self.max_bytes} bytes")
        self.bytes_left -= nbytes

    @property
    def bytes_read(self) -> int:
        return self.max_bytes - max(self.bytes_left, 0)

    @property
    def elapsed_ms(self) -> float:
        return (time.monotonic() - self.started) * 1000.0
