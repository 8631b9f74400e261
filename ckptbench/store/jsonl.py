"""One JSON object appended as one line to a file several processes share (``records.jsonl``,
``timelines.jsonl``).

Appends are atomic in the sense that matters: each object is one ``write`` of a whole line to a file
opened with ``O_APPEND``, under an exclusive ``flock`` (so sweeps sharded over one output never
interleave), followed by ``fsync``.  A process killed at any moment loses at most the line in flight; a
torn last line (a crash mid-write on a filesystem that allows it) is ended by the next append, so the
next line starts whole, and its reader reports the fragment and never parses it as data.  Objects are
written with sorted keys, so the layout of a line is stable (a reader may look for a key's bytes
before parsing the line).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os

from ..base.errors import StorageError


def append_line(path: str, obj: dict) -> None:
    """Append `obj` as one line; on any failure (a full disk) the file is cut back to the lines before it.

    Raises :class:`~ckptbench.base.errors.StorageError` naming `path` and the reason.
    """
    data = (json.dumps(obj, sort_keys=True, default=_jsonable) + "\n").encode()
    try:
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    except OSError as exc:
        raise StorageError(path, exc) from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        size = os.fstat(fd).st_size
        try:
            _repair_torn_tail(fd)
            written = os.write(fd, data)
            if written != len(data):
                raise OSError(errno.ENOSPC, f"short write: {written} of {len(data)} bytes")
            os.fsync(fd)
        except OSError as exc:
            _cut_back(fd, size)
            raise StorageError(path, exc) from exc
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _cut_back(fd: int, size: int) -> None:
    """Remove what a failed append wrote past `size` (under the lock, so only this append's bytes): the
    lines before it stay whole and the next append starts on a clean line."""
    try:
        os.ftruncate(fd, size)
    except OSError:
        pass  # what stays is a torn last line, which the reader skips and the next append ends


def _repair_torn_tail(fd: int) -> None:
    """If a crash left a last line without its newline, end it so the next line starts on its own.

    The torn fragment stays in the file (nothing already written is ever rewritten) and is reported and
    skipped on load.
    """
    size = os.fstat(fd).st_size
    if size == 0:
        return
    if os.pread(fd, 1, size - 1) != b"\n":
        os.write(fd, b"\n")


def _jsonable(obj):
    if isinstance(obj, set):
        return sorted(obj)
    return str(obj)
