"""Test-only faults a sweep can inject into a worker, to prove that failures become results.

Kept apart from ``worker.py`` so that the sweep's parent process, which passes them along, never
imports torch (importing it costs seconds; the workers' fork server has it loaded already).
"""

from __future__ import annotations

from dataclasses import dataclass

FAULT_KINDS = ("raise", "segfault", "hang", "exit", "slow", "slower", "hog", "hog-kill", "disk-full", "alloc")


@dataclass(frozen=True)
class Fault:
    """What to do inside the worker: raise, segfault, hang, exit(3), fail a write with ENOSPC (``disk-full``),
    sleep ``seconds`` per timed step, make each timed step ``fraction`` longer than it was (``slower``: 0.2 is
    a 20 % slowdown), or grow its resident memory to ``nbytes`` of shared memory and hold it (``hog``) or then
    SIGKILL itself (``hog-kill``: a kill with no memory mechanism behind it), or allocate a tensor of
    ``nbytes`` through torch's CPU allocator (``alloc``)."""

    kind: str
    seconds: float = 0.0
    nbytes: int = 0
    fraction: float = 0.0
