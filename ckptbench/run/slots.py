"""Where points run side by side on one machine: slots of CPU cores or CUDA devices.

A slot is a share of the machine that one single-process point owns while it runs: on CPU
(``--parallel N``) a set of cores as large as the suite's ``threads`` setting, to which the worker pins
itself (``os.sched_setaffinity``); on CUDA (``--devices 0,1``) one GPU, given to the worker as
``CUDA_VISIBLE_DEVICES``.  A multi-rank point takes as many slots as its world size (one GPU per rank;
on CPU at most every slot, as a serial sweep gives it the whole machine).  Without either flag there is
one slot that pins nothing: the serial sweep, exactly as it always ran.

Pure and torch-free: the sweep's parent plans with it, and it is unit-tested without a GPU.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ..base.errors import UsageError
from ..point.case import Case


@dataclass(frozen=True)
class Slot:
    index: int  # 0-based; shown 1-based
    cores: tuple[int, ...] = ()  # () pins nothing
    device: str | None = None  # the CUDA_VISIBLE_DEVICES entry this slot owns


@dataclass(frozen=True)
class Placement:
    """What one point was given: its slots, the cores it is pinned to, the devices it sees."""

    slots: tuple[int, ...]
    of: int  # slots in the sweep
    cores: tuple[int, ...] = ()
    devices: tuple[str, ...] = ()

    def env(self) -> dict[str, str]:
        """Variables the point's processes start with."""
        return {"CUDA_VISIBLE_DEVICES": ",".join(self.devices)} if self.devices else {}

    def label(self) -> str:
        where = []
        if self.cores:
            where.append(f"cores {core_list(self.cores)}")
        if self.devices:
            where.append(f"cuda {','.join(self.devices)}")
        return " ".join(where) or "unpinned"

    def to_dict(self) -> dict:
        return {"slots": [s + 1 for s in self.slots], "of": self.of, "cores": list(self.cores),
                "cuda_visible_devices": ",".join(self.devices) or None}


def core_list(cores: Iterable[int]) -> str:
    """``0-3,8`` for cores 0, 1, 2, 3 and 8 (the notation of taskset and /proc)."""
    cores = sorted(cores)
    runs: list[list[int]] = []
    for c in cores:
        if runs and c == runs[-1][-1] + 1:
            runs[-1].append(c)
        else:
            runs.append([c])
    return ",".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)


def cpu_slots(parallel: int, threads: int, available: Sequence[int]) -> tuple[Slot, ...]:
    """`parallel` slots of `threads` cores each, cut in order from the cores this process may use."""
    cores = sorted(available)
    if parallel * threads > len(cores):
        raise UsageError(f"--parallel {parallel} with {threads} thread{'s' * (threads > 1)} per point needs "
                         f"{parallel * threads} cores; this process may use {len(cores)} ({core_list(cores)})")
    return tuple(Slot(k, tuple(cores[k * threads:(k + 1) * threads])) for k in range(parallel))


def cuda_slots(devices: Sequence[int], visible: str | None) -> tuple[Slot, ...]:
    """One slot per device index; the indices count the devices this process sees.

    Inside a Slurm job (or any ``CUDA_VISIBLE_DEVICES=2,3``) index 0 is the first visible device, so
    the worker gets ``CUDA_VISIBLE_DEVICES=2``, the physical GPU the index names here.
    """
    if len(set(devices)) != len(devices):
        raise UsageError(f"--devices names a device twice: {','.join(map(str, devices))}")
    entries = [e.strip() for e in visible.split(",") if e.strip()] if visible else None
    slots = []
    for k, d in enumerate(devices):
        if entries is not None and d >= len(entries):
            raise UsageError(f"--devices {d}: this process sees {len(entries)} CUDA device"
                             f"{'s' * (len(entries) != 1)} (CUDA_VISIBLE_DEVICES={visible})")
        slots.append(Slot(k, device=entries[d] if entries is not None else str(d)))
    return tuple(slots)


def sweep_slots(cases: Sequence[Case], parallel: int | None, devices: Sequence[int] | None,
                available: Sequence[int] | None = None, visible: str | None = None) -> tuple[Slot, ...]:
    """The slots a sweep of `cases` runs on, or a UsageError naming what does not fit."""
    if parallel and devices:
        raise UsageError("--parallel is for CPU points, --devices for CUDA points: give one of them")
    on_cuda = any(c.device == "cuda" for c in cases)
    if devices:
        if not on_cuda:
            raise UsageError("--devices is for CUDA suites; CPU points run side by side with --parallel N")
        slots = cuda_slots(devices, visible)
        widest = max(c.world_size for c in cases)
        if widest > len(slots):
            raise UsageError(f"a point of world size {widest} needs {widest} devices; --devices gives {len(slots)}")
        return slots
    if parallel:
        if on_cuda:
            raise UsageError("CUDA points run side by side one per GPU: use --devices 0,1,... instead of --parallel")
        threads = max(c.train.threads for c in cases) if cases else 1
        return cpu_slots(parallel, threads, sorted(os.sched_getaffinity(0)) if available is None else available)
    return (Slot(0),)


def place(case: Case, slots: Sequence[Slot], free: set[int]) -> Placement | None:
    """The lowest free slots `case` needs, or None while too few are free (it waits for them)."""
    need = case.world_size if slots[0].device is not None else min(case.world_size, len(slots))
    chosen = sorted(free)[:need]
    if len(chosen) < need:
        return None
    taken = [slots[k] for k in chosen]
    return Placement(tuple(chosen), len(slots), tuple(c for s in taken for c in s.cores),
                     tuple(s.device for s in taken if s.device is not None))
