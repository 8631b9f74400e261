"""Does a point fit before it starts: its estimated peak against the memory it would run in.

A point far too large for the machine does not fail cleanly on CPU: it pages, or the kernel's OOM killer
takes the worker (or something else) down.  So a point whose estimated peak exceeds what is available is
recorded ``skipped`` with both figures, unless the user asks for it anyway (``--force``).  "Available" is
read when the point is about to start: on CPU the memory the machine (or its container) can still give,
capped by ``--memory``; on CUDA the device's memory, as NVML reports it without touching CUDA.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..spec import Case
from ..theory.estimate import estimate_case
from .hostmem import HostMemory, human_bytes, read_host_memory


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
            device_bytes: Callable[[], int | None] = lambda: None) -> str | None:
    """Why `case` should not start ("estimated X GiB > available Y GiB ..."), or None when it fits or
    nothing can be said."""
    need = estimated_peak(case)
    room = room_for(case, host or read_host_memory(), cap, device_bytes)
    if need is None or room is None or need <= room.nbytes:
        return None
    ranks = f" ({case.world_size} ranks on this host)" if case.device == "cpu" and case.world_size > 1 else ""
    return (f"estimated {human_bytes(need)}{ranks} > available {human_bytes(room.nbytes)} ({room.source}); "
            "--force runs it anyway")
