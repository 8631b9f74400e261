"""Where a tracked run writes and says things: this rank's directory (checked writable before the run
starts) and its one-line notes on stderr through the ``ckptbench`` logger."""

from __future__ import annotations

import logging
import os
import sys

import torch

log = logging.getLogger("ckptbench")


class TrackSetupError(ValueError):
    """What the tracker can check before the run starts and found wrong: raised when it is made, never later."""


class _Stderr(logging.Handler):
    """The ``ckptbench`` logger's own lines on the stderr of the moment (a test's capture included), as
    written: ckptbench's one-line notes are the only lines a tracked run adds to the terminal."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(self.format(record) + "\n")
        except Exception:  # noqa: BLE001 (a closed stderr is not the run's end)
            pass


def notes_on_stderr() -> None:
    """Give the ``ckptbench`` logger a stderr handler at INFO unless the user configured it (or one was
    given already); ``logging.getLogger("ckptbench").setLevel(logging.WARNING)`` keeps only the warnings."""
    if not log.handlers:
        log.addHandler(_Stderr())
        log.propagate = False
    if log.level == logging.NOTSET:
        log.setLevel(logging.INFO)


def writable_out(out: str) -> None:
    """`out` (this rank's directory of it) exists or can be made, and a file can be written there; else
    :class:`TrackSetupError`, one line naming the directory and why."""
    where = rank_dir(out)
    try:
        os.makedirs(where, exist_ok=True)
        probe = os.path.join(where, f".ckptbench-write-{os.getpid()}")
        with open(probe, "w", encoding="utf-8"):
            pass
        os.unlink(probe)
    except OSError as exc:
        raise TrackSetupError(f"ckptbench.track: out={out!r}: cannot write in {where}: "
                              f"{exc.strerror or exc}") from None


def rank() -> int:
    dist = torch.distributed
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else int(os.environ.get("RANK", 0))


def rank_dir(out: str) -> str:
    """Where this process writes: `out` on rank 0 (or without ranks), ``out/rank-<r>`` on the others, so
    each rank's record is one of its own directory's."""
    r = rank()
    return out if r == 0 else os.path.join(out, f"rank-{r}")


