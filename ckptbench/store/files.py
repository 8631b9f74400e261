"""Small file operations every part of a run relies on: whole-file atomic writes and log tails.

Torch-free, so the sweep's parent, the torchrun launcher and the workers all use the same two.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from typing import TextIO

from ..base.errors import StorageError


@contextlib.contextmanager
def atomic_writer(path: str, newline: str | None = None) -> Iterator[TextIO]:
    """A text file to write `path` through: a temporary file beside it, flushed, fsync'd and renamed over
    `path` when the block ends.

    A reader sees the old file or the whole new one, never a torn one; the temporary name carries the
    pid, so two processes writing the same file (shards started together) never share it.  When any
    step fails (a full disk, a read-only folder) the temporary file is removed, so a failure leaves no
    space taken and `path` as it was, and :class:`~ckptbench.base.errors.StorageError` names `path` and why.
    """
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8", newline=newline) as fh:
        yield fh
        fh.flush()
        os.fsync(fh.fileno())


@contextlib.contextmanager
def atomic_path(path: str) -> Iterator[str]:
    """A temporary path beside `path` for a writer that opens files itself (pandas, pyarrow): renamed over
    `path` when the block ends, removed when it fails, with :class:`~ckptbench.base.errors.StorageError`."""
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        yield tmp
        os.replace(tmp, path)
    except OSError as exc:
        remove_quietly(tmp)
        raise StorageError(path, exc) from exc


def write_text_atomic(path: str, text: str) -> None:
    """Write `text` to `path` atomically (:func:`atomic_writer`)."""
    with atomic_writer(path) as fh:
        fh.write(text)


def remove_quietly(path: str) -> None:
    """Remove a file if it is there; a failure to remove it is not worth a second error."""
    try:
        os.remove(path)
    except OSError:
        pass


def write_json_atomic(path: str, data: dict) -> None:
    write_text_atomic(path, json.dumps(data, indent=1, sort_keys=True))


def tail(path: str, chars: int) -> str:
    """The last `chars` bytes of a log as text ("" when it cannot be read): a failure's stderr tail."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - chars))
            return fh.read().decode("utf-8", "replace")
    except OSError:
        return ""
