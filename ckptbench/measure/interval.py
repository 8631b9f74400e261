"""The interval of a median step time: order statistics whose coverage is exact at every sample size.

For n independent step times from any continuous distribution, how many fall below the true median is
Binomial(n, ½), so the interval from the k-th smallest to the k-th largest time, [x(k), x(n+1-k)], covers
the median with probability 1 − 2·P(B ≤ k − 1) whatever the distribution, at every n, not only
asymptotically.  The interval used is the narrowest whose coverage is at least LEVEL (95 %): from n = 6 on
it is a real 95 % interval (n = 6: [min, max], 96.9 %; n = 10: x(2)..x(9), 97.85 %).  Below 6 no pair of
order statistics reaches 95 %, and the interval is [min, max] with the coverage it really has: 75 % at
n = 3, 87.5 % at 4, 93.75 % at 5.  Every interval carries that coverage, and every label shows it.
Tied times (a coarse clock) only make the closed interval cover more often.

A percentile bootstrap of the median, what was used before, covers far less than it says at the sizes a
sweep has (about 73 % for a nominal 95 % at n = 3): ``docs/timing.md`` has the simulation, and
``tests/unit/test_timing_coverage.py`` holds the interval here to its stated coverage.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

LEVEL = 0.95
METHOD = "order-statistic"  # what a record's step_time_ci_method says
MIN_SAMPLES = 3  # below this there is no interval to speak of ([min, max] of two covers half the time)


@functools.lru_cache(maxsize=4096)
def ranks(n: int, level: float = LEVEL) -> tuple[int, float]:
    """(k, coverage): the interval [x(k), x(n+1-k)] of n sorted samples, the narrowest (largest k) whose
    coverage 1 − 2·P(Binomial(n, ½) ≤ k − 1) is at least `level`; k = 1 ([min, max]) when none is.

    The binomial sums are exact integers (``comb(n, j)`` over ``2**n``), so the coverage is exact for
    any n a sweep has."""
    if n < 1:
        raise ValueError(f"an interval needs at least one sample, got n={n}")
    total = 2 ** n
    below = 0  # sum of comb(n, j) for j < k: the count of ways at most k − 1 samples fall below the median
    term = 1  # comb(n, k - 1)
    best = (1, 1 - 2 / total)
    for k in range(1, (n + 1) // 2 + 1):
        below += term  # now sum over j <= k - 1
        coverage = 1 - 2 * below / total
        if coverage < level:
            break
        best = (k, coverage)
        term = term * (n - (k - 1)) // k  # comb(n, k)
    return best


@functools.lru_cache(maxsize=8)
def fewest(level: float = LEVEL) -> int:
    """The fewest samples whose interval reaches `level` (6 for 95 %): a precision is never met sooner."""
    n = 1
    while ranks(n, level)[1] < level:
        n += 1
    return n


def coverage(n: int, level: float = LEVEL) -> float:
    """The coverage the interval over n samples really has (:func:`ranks`)."""
    return ranks(n, level)[1]


@dataclass(frozen=True)
class MedianInterval:
    """[low, high] around the median of n samples, the k-th smallest and k-th largest, covering the true
    median with probability `coverage` (exactly, for independent draws of a continuous distribution)."""

    low: float
    high: float
    coverage: float
    n: int
    k: int

    def __iter__(self):  # low, high = interval
        return iter((self.low, self.high))

    def relative_half_width(self, median: float) -> float:
        """How far the interval reaches from `median`, the larger side, as a fraction of it (0.02: ±2 %)."""
        if not median > 0:
            return float("inf")
        return max(median - self.low, self.high - median) / median

    def fields(self) -> dict:
        """The record's fields for this interval (:func:`record_fields`)."""
        return record_fields(self)


def record_fields(interval: MedianInterval | None) -> dict:
    """What a record says of its median's interval: the bounds (``step_time_ci95_s``, named when every
    interval was meant to be 95 %; None with too few samples), the coverage it really has, the method,
    how many samples it is over and which order statistics bound it."""
    if interval is None:
        return {"step_time_ci95_s": None, "step_time_ci_coverage": None, "step_time_ci_method": METHOD}
    return {"step_time_ci95_s": [interval.low, interval.high], "step_time_ci_coverage": interval.coverage,
            "step_time_ci_method": METHOD, "step_time_ci_n": interval.n,
            "step_time_ci_ranks": [interval.k, interval.n + 1 - interval.k]}


def median_interval(samples, level: float = LEVEL) -> MedianInterval | None:
    """The order-statistic interval of the median of `samples` (None with fewer than MIN_SAMPLES)."""
    return median_intervals([samples], level)[0]


def median_intervals(many: list, level: float = LEVEL) -> list[MedianInterval | None]:
    """:func:`median_interval` of each sample list, samples of one size sorted together in one array (a
    run of 20,000 records takes a few array operations per size, not a sort per record)."""
    out: list[MedianInterval | None] = [None] * len(many)
    by_size: dict[int, list[int]] = {}
    for i, samples in enumerate(many):
        if len(samples) >= MIN_SAMPLES:
            by_size.setdefault(len(samples), []).append(i)
    for n, members in by_size.items():
        k, cov = ranks(n, level)
        rows = np.sort(np.asarray([many[i] for i in members], dtype=float), axis=1)
        for i, low, high in zip(members, rows[:, k - 1].tolist(), rows[:, n - k].tolist()):
            out[i] = MedianInterval(low, high, cov, n, k)
    return out


def coverage_label(value: float | None) -> str:
    """A coverage as a page shows it: "97.85 %", "75 %", "93.75 %" (the digits it needs, at most two decimals)."""
    if value is None:
        return "?"
    text = f"{value * 100:.2f}".rstrip("0").rstrip(".")
    return f"{text} %"
