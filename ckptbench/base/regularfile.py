"""Opening a file a run reads, refusing anything that is not a regular file.

Standard library only and below every stage, so the suite reader, the model-config reader, the
simulation and the stores all open what they read the same way.
"""

from __future__ import annotations

import errno
import os
import stat


def open_regular(path: str, mode: str = "rb", **kwargs):
    """``open(path, mode)`` for reading, refusing anything but a regular file (symlinks followed) with an
    ``OSError`` that names `path`: a directory, a FIFO (whose open would wait for a writer) or a device
    such as ``/dev/zero`` (endless) planted where a file of a run is read.  The FIFO is opened without
    blocking, so the refusal never waits."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        kind = os.fstat(fd).st_mode
        if not stat.S_ISREG(kind):
            what = ("a directory" if stat.S_ISDIR(kind) else "a FIFO" if stat.S_ISFIFO(kind)
                    else "a device" if stat.S_ISCHR(kind) or stat.S_ISBLK(kind) else "a socket or other special file")
            raise OSError(errno.EISDIR if stat.S_ISDIR(kind) else errno.EINVAL, f"not a regular file ({what})", path)
        os.set_blocking(fd, True)
        return open(fd, mode, **kwargs)
    except BaseException:
        os.close(fd)
        raise
