"""Keep the C++ side of a measurement off the user's terminal, at the file-descriptor level.

torch's profiler (the allocator meter's listener) writes ``USDT: ... profiler_start`` / ``profiler_stop``
lines and c10's CPU allocator a ``Memory block of unknown size was allocated before the profiling started``
warning straight to file descriptor 2, below Python's ``sys.stderr``.  While a measurement that starts them
runs, :class:`Quiet` points descriptors 1 and 2 at files of its own; when it ends it puts them back and
writes every line that is not one of those known lines (:data:`NOISE`) where it was going, in order: a
line the user's code printed meanwhile is delayed to the end of the measured step, never lost.  Nothing
here raises: a descriptor that cannot be diverted is left as it is.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import re
import sys
import tempfile
import warnings

RANK = rb"(?:\[rank\d+\]:)?"  # torch's prefix of a C++ warning under torchrun
NOISE = (re.compile(rb"^" + RANK + rb"USDT:.*\bprofiler_(start|stop)\s*$"),
         re.compile(rb"^" + RANK + rb"\[W\d+ [\d:.]+ CPUAllocator\.cpp:\d+\] Memory block of unknown size was "
                    rb"allocated before the profiling started"))
log = logging.getLogger("ckptbench")


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):
            pass
    try:
        ctypes.CDLL(None).fflush(None)  # C stdio's buffers, before the descriptors move
    except (OSError, AttributeError):
        pass


class Quiet:
    """Descriptors 1 and 2 diverted between :meth:`start` and :meth:`stop` (see the module)."""

    def __init__(self, fds: tuple[int, ...] = (1, 2)):
        self.fds = fds
        self._saved: dict[int, tuple[int, object]] = {}
        self.dropped = 0

    def start(self) -> None:
        if self._saved:
            return
        _flush()
        for fd in self.fds:
            try:
                saved = os.dup(fd)
            except OSError:  # not open: nothing to divert
                continue
            try:
                sink = tempfile.TemporaryFile()
                os.dup2(sink.fileno(), fd)
            except OSError:
                os.close(saved)
                continue
            self._saved[fd] = (saved, sink)

    def stop(self) -> None:
        if not self._saved:
            return
        _flush()
        saved, self._saved = self._saved, {}
        for fd, (original, sink) in saved.items():
            try:
                os.dup2(original, fd)
            finally:
                os.close(original)
            try:
                sink.seek(0)
                kept = []
                for line in sink.read().splitlines(keepends=True):
                    if any(p.match(line) for p in NOISE):
                        self.dropped += 1
                    else:
                        kept.append(line)
                sink.close()
                if kept:
                    os.write(fd, b"".join(kept))
            except OSError:
                pass
        if self.dropped:
            log.debug("kept %d line(s) of the profiler and allocator off the terminal", self.dropped)

    def __enter__(self) -> Quiet:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


@contextlib.contextmanager
def transformers_quiet():
    """While ckptbench builds models of its own (the estimate's, the simulation's) inside a user's run:
    transformers' log lines (a config's INFO dump, a warning about a setting of that copy) and Python
    warnings are the copy's, not the run's, so transformers' logger is raised to ERROR and warnings are
    ignored meanwhile; both are put back as they were."""
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:  # nothing of transformers to quiet
        hf_logging = None
    level = hf_logging.get_verbosity() if hf_logging else None
    if hf_logging:
        hf_logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        if hf_logging:
            hf_logging.set_verbosity(level)
