"""When a point has timed enough steps: its median known to a stated precision, or a cap reached.

A point times at least ``[train] steps`` steps, then keeps going until the 95 % interval of its median
step time (:mod:`.interval`) lies within ±``time_precision`` of the median, or ``max_steps`` timed steps
or ``max_time_s`` seconds of timed steps are reached; the record says which (``timing_stopped_by``).
A 95 % interval needs 6 steps at least (below that [min, max] is all there is, at 75-94 %), so the
precision can stop a point from its sixth timed step on, whatever ``steps`` says.

The rule only reads the times; :class:`~ckptbench.run.worker.StepSchedule` asks it after the steps
where :meth:`StopRule.due` says so.  On a CPU that is every step (``perf_counter`` is read as the step
ends).  On CUDA reading the times means a synchronise, so it is every ``CUDA_CHECK_EVERY`` steps: the
events of a chunk are recorded on the stream as usual and read after one synchronise at its end, and
the time cap is looked at there too (so it can be passed by up to a chunk's steps).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from .interval import LEVEL, MedianInterval, median_interval

CUDA_CHECK_EVERY = 4  # timed steps between synchronising reads on CUDA
STOPPED_BY = ("precision", "max_steps", "max_time")


@dataclass(frozen=True)
class StopRule:
    """When to stop timing (see the module's text); pure: feed it times, it answers."""

    min_steps: int
    precision: float  # relative half-width of the median's 95 % interval: 0.02 = ±2 %
    max_steps: int
    max_time_s: float
    check_every: int = 1

    @classmethod
    def of(cls, train, device_type: str, time_left_s: float | None = None) -> StopRule:
        """The rule of a Case's TrainSpec on a device.  A worker with `time_left_s` before its timeout gives
        its timed steps at most half of that, so that timing longer never turns a point into a timeout."""
        t = train.timing
        max_time = t.max_time_s if time_left_s is None else min(t.max_time_s, max(time_left_s, 0.0) / 2)
        return cls(train.steps, t.precision, max(t.max_steps, train.steps), max_time,
                   CUDA_CHECK_EVERY if device_type == "cuda" else 1)

    def due(self, n: int) -> bool:
        """Whether to read the times after timed step `n` (1-based): once the minimum is timed, every
        `check_every` steps, and at the step cap."""
        return n >= self.max_steps or (n >= self.min_steps and (n - self.min_steps) % self.check_every == 0)

    def verdict(self, times: list[float], elapsed_s: float) -> str | None:
        """"precision", "max_steps", "max_time", or None to keep timing, after `times` (every timed step
        so far) took `elapsed_s` seconds."""
        n = len(times)
        if n < self.min_steps:
            return None
        if self.precise(times):
            return "precision"
        if n >= self.max_steps:
            return "max_steps"
        if elapsed_s >= self.max_time_s:
            return "max_time"
        return None

    def expected_steps(self, step_s: float) -> int:
        """The timed steps a point whose steps take `step_s` seconds each runs unless its precision stops it
        sooner: as many as ``max_time_s`` holds, no fewer than the minimum, no more than the cap."""
        fit = math.ceil(self.max_time_s / step_s) if step_s > 0 else self.max_steps
        return max(1, min(self.max_steps, max(self.min_steps, fit)))

    def precise(self, times: list[float]) -> bool:
        """Whether a real 95 % interval of the median lies within ±precision of it."""
        interval = median_interval(times)
        return reached(interval, statistics.median(times) if times else float("nan"), self.precision)

    def to_dict(self) -> dict:
        """What the record keeps of the rule (``timing_target``)."""
        return {"precision": self.precision, "min_steps": self.min_steps, "max_steps": self.max_steps,
                "max_time_s": self.max_time_s, "check_every": self.check_every, "level": LEVEL}


def reached(interval: MedianInterval | None, median: float, precision: float) -> bool:
    """Whether `interval` is a 95 % interval (its coverage at least LEVEL) within ±precision of `median`."""
    return (interval is not None and interval.coverage >= LEVEL
            and interval.relative_half_width(median) <= precision)
