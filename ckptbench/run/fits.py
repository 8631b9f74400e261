"""Does a point fit before it starts: its estimated peak against the memory it would run in.

A point far too large for the machine does not fail cleanly on CPU: it pages, or the kernel's OOM killer
takes the worker (or something else) down.  So a point whose estimated peak exceeds what is available is
recorded ``skipped`` with both figures, unless the user asks for it anyway (``--force``).  "Available" is
read when the point is about to start: on CPU the memory the machine (or its container) can still give,
capped by ``--memory``; on CUDA the device's memory, as NVML reports it without touching CUDA.

The estimate counts tensor bytes; the ``--memory`` cap is held against the worker's whole resident memory,
which starts with what the fork server imported (the interpreter, torch, transformers: the worker shares
those pages).  So against the cap a CPU point needs its estimated peak plus that baseline: the largest a
worker of this sweep reported (``baseline_rss_bytes``), and before any has, :data:`WORKER_BASELINE_BYTES`.
Against the RAM available the baseline is already spent (the fork server holds it), so nothing is added.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..point.case import Case
from ..theory.memory.estimate import estimate_case
from .hostmem import HostMemory, human_bytes, read_host_memory

# The resident memory of a process that imported the fork server's preload (ckptbench.run.worker and
# .preload: torch 2.13 CPU, transformers 5.23, Python 3.12), measured with /proc/self/status VmRSS: 466.6 MB.
# Only until a worker of the sweep has reported its own.
WORKER_BASELINE_BYTES = 466_550_784


@dataclass(frozen=True)
class Room:
    """The memory a point would run in, and where that figure comes from."""

    nbytes: int
    source: str  # "available RAM", "--memory cap", "device memory"


def estimated_peak(case: Case) -> int | None:
    """The memory the whole point needs on one machine: the estimate's peak, once per rank on CPU (every
    rank of a CPU group runs on this host); None where there is no estimate."""
    if not case.analytic:
        return None  # no analytic estimate; the simulation runs in the worker, after the point started
    try:
        peak = estimate_case(case).peak_bytes
    except (KeyError, ValueError, NotImplementedError):
        return None
    return peak * case.world_size if case.device == "cpu" else peak


def room_for(case: Case, host: HostMemory, cap: int | None, device_bytes: Callable[[], int | None]) -> Room | None:
    """Where `case` would run, or None when this machine cannot tell (no /proc, no NVML)."""
    if case.device == "cuda":
        total = device_bytes()
        return Room(total, "device memory") if total else None
    usable = host.usable
    if cap is not None and (usable is None or cap < usable):
        return Room(cap, "--memory cap")
    return Room(usable, "available RAM") if usable is not None else None


def too_big(case: Case, cap: int | None = None, host: HostMemory | None = None,
            device_bytes: Callable[[], int | None] = lambda: None,
            baseline: int = WORKER_BASELINE_BYTES) -> str | None:
    """Why `case` should not start ("estimated X GiB > available Y GiB ..."), or None when it fits or
    nothing can be said.  Against a ``--memory`` cap a CPU point also needs `baseline`, each worker's
    resident memory before its step (see the module's note)."""
    need = estimated_peak(case)
    room = room_for(case, host or read_host_memory(), cap, device_bytes)
    if need is None or room is None:
        return None
    base = baseline * case.world_size if case.device == "cpu" and room.source == "--memory cap" else 0
    if need + base <= room.nbytes:
        return None
    ranks = f" ({case.world_size} ranks on this host)" if case.device == "cpu" and case.world_size > 1 else ""
    plus = f" + {human_bytes(base)} worker baseline (interpreter, torch, transformers)" if base else ""
    return (f"estimated {human_bytes(need)}{ranks}{plus} > available {human_bytes(room.nbytes)} "
            f"({room.source}); --force runs it anyway")
