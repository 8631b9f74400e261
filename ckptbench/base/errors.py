"""Errors shared by the library and the command line.

:class:`UsageError` lives here, not in ``cli.py``, so library modules (``compare.py``, later the report)
can raise it without importing the CLI, which imports them: no import cycle, one exception the CLI turns
into a one-line message and exit status 2.
"""

from __future__ import annotations

import errno


class UsageError(Exception):
    """A user mistake the CLI reports in one line (exit 2)."""


# What an errno means to someone whose results folder could not be written.
_STORAGE_WORDS = {
    errno.ENOSPC: "disk full", errno.EDQUOT: "disk quota exceeded", errno.EROFS: "read-only file system",
    errno.EACCES: "permission denied", errno.EPERM: "operation not permitted",
}
# A place the user chose that cannot be written: bad input (exit 2), not a fault of the run.
UNWRITABLE = (errno.EROFS, errno.EACCES, errno.EPERM)
DISK_FULL = (errno.ENOSPC, errno.EDQUOT)
# A worker that could not write its result because the disk was full exits so (sysexits' EX_TEMPFAIL): the
# sweep records that, not a bare "exited with code 1".
WORKER_DISK_FULL_EXIT = 75


def storage_reason(code: int | None, strerror: str | None = None) -> str:
    """``disk full (ENOSPC)``: the words and the errno's name, for a message or a record's reason."""
    words = _STORAGE_WORDS.get(code) or (strerror or "I/O error").lower()
    return f"{words} ({errno.errorcode.get(code, 'errno ' + str(code))})"


def failure_reason(exc: BaseException) -> str:
    """A failed point's reason: ``disk full (ENOSPC) writing FILE`` for a full disk, else the exception."""
    if isinstance(exc, OSError) and exc.errno in DISK_FULL:
        return f"{storage_reason(exc.errno)} writing {exc.filename or 'a file'}"
    return f"{type(exc).__name__}: {exc}"


class StorageError(OSError):
    """A file could not be written (full disk, read-only folder, no permission): the CLI says so in one line,
    naming the file and the reason, and exits 2 when the place given cannot be written (``unwritable``) or
    4 when the disk filled under a run.  An ``OSError``, so code that tolerates I/O failures still does."""

    def __init__(self, path: str, cause: OSError, doing: str = "writing"):
        super().__init__(cause.errno, cause.strerror or str(cause), path)
        self.doing = doing

    @property
    def unwritable(self) -> bool:
        return self.errno in UNWRITABLE

    def __str__(self) -> str:
        return f"{storage_reason(self.errno, self.strerror)} {self.doing} {self.filename}"
