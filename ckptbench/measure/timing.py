"""Step timers and their statistics.

CPU steps are timed with ``perf_counter``.  CUDA steps are timed with events recorded on the stream and
read after a synchronise, so the timer adds no host stall inside a step: the stopping rule reads them
every few steps (:mod:`.stopping`), and once more at the end of the measured window.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass


def nearest_rank(ordered: list[float], q: float) -> float:
    """The q-quantile of sorted values by the nearest-rank method: with few steps, p90 is the slowest of
    the fastest 90%, always a value that was observed."""
    return ordered[max(1, math.ceil(q * len(ordered))) - 1]


@dataclass(frozen=True)
class StepStats:
    """Summary of per-step times in seconds; cv is the coefficient of variation (stdev / mean)."""

    times_s: tuple[float, ...]
    median_s: float
    p90_s: float
    mean_s: float
    cv: float

    @classmethod
    def of(cls, times: list[float]) -> StepStats:
        if not times:
            nan = float("nan")
            return cls((), nan, nan, nan, nan)
        ordered = sorted(times)
        mean = statistics.fmean(ordered)
        stdev = statistics.pstdev(ordered) if len(ordered) > 1 else 0.0
        return cls(tuple(times), statistics.median(ordered), nearest_rank(ordered, 0.9), mean,
                   stdev / mean if mean > 0 else 0.0)


class CpuTimer:
    """Wall time per step, and beside it the CPU time of the thread that ran it (with one torch thread, all
    of the step's work: a shared machine's other processes make the wall time longer, not this one)."""

    kind = "perf_counter"

    def __init__(self) -> None:
        self._starts: list[float] = []
        self._ends: list[float] = []
        self._cpu: list[list[float]] = []

    def start(self) -> None:
        self._cpu.append([time.thread_time()])
        self._starts.append(time.perf_counter())

    def stop(self) -> None:
        self._ends.append(time.perf_counter())
        self._cpu[-1].append(time.thread_time())

    def times(self) -> list[float]:
        return [e - s for s, e in zip(self._starts, self._ends)]

    def cpu_times(self) -> list[float]:
        return [pair[1] - pair[0] for pair in self._cpu if len(pair) == 2]


class CudaTimer:
    kind = "cuda-events"

    def __init__(self) -> None:
        import torch

        self._torch = torch
        self._pairs: list = []

    def start(self) -> None:
        ev = self._torch.cuda.Event(enable_timing=True)
        ev.record()
        self._pairs.append([ev, None])

    def stop(self) -> None:
        ev = self._torch.cuda.Event(enable_timing=True)
        ev.record()
        self._pairs[-1][1] = ev

    def times(self) -> list[float]:
        self._torch.cuda.synchronize()
        return [s.elapsed_time(e) / 1000.0 for s, e in self._pairs]

    def cpu_times(self) -> list[float]:
        return []  # the step's work is the GPU's


def timer_for(device_type: str):
    """The step timer for a device: the only place that chooses between CPU and CUDA timing."""
    return CudaTimer() if device_type == "cuda" else CpuTimer()


class BoundaryClock:
    """Host time at a boundary of a step loop, read once the device has finished what was queued.

    The local-SGD loop times its steps, averagings and tokens/s as differences of readings taken at
    boundaries it needs anyway (before the step, after the optimizer, around the averaging).  On CUDA a
    bare ``perf_counter`` there would time the host's enqueue, not the work, so each reading first runs
    `wait` (``torch.cuda.synchronize``); on CPU the work is done when the call returns.
    """

    def __init__(self, wait=None, kind: str = "perf_counter"):
        self._wait = wait
        self.kind = kind

    def now(self) -> float:
        if self._wait is not None:
            self._wait()
        return time.perf_counter()


def boundary_clock(device) -> BoundaryClock:
    """The loop's clock for a torch device: synchronising on CUDA, plain on CPU."""
    if device.type == "cuda":
        import torch

        return BoundaryClock(lambda: torch.cuda.synchronize(device), "cuda-synchronize")
    return BoundaryClock()
