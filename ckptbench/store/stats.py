"""How sure a time figure is: an order-statistic interval for a median, and a rank test for a shift.

Step times on a shared machine drift and have outliers, so nothing here assumes normality: the median's
interval is the distribution-free order-statistic (binomial) interval of :mod:`ckptbench.measure.interval`,
whose coverage is exact at every sample size and is stated with it (a real 95 % from 6 samples on, 75 %
for [min, max] of 3); "B is slower than A" is a one-sided Mann–Whitney U test (``scipy.stats``) over the
two sets of step times.  Memory never goes through here: on CPU it is exact.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

import numpy as np

from ..measure.interval import LEVEL, MedianInterval, median_intervals, record_fields

CONFIDENCE = LEVEL
ALPHA = 0.05  # a slowdown is significant when the one-sided p-value is below this


def median_cis(many: list, confidence: float = CONFIDENCE) -> list[MedianInterval | None]:
    """:func:`median_ci` of each sample list in `many`, samples of one size sorted together."""
    return median_intervals(many, confidence)


def median_ci(samples: list[float], confidence: float = CONFIDENCE) -> MedianInterval | None:
    """The order-statistic interval of the median, with its coverage; None with fewer than 3 samples."""
    return median_cis([samples], confidence)[0]


@dataclass(frozen=True)
class RatioInterval:
    """[low, high] around median(numerator) / median(denominator), covering the true ratio with a
    probability of at least `coverage`: each median's interval covers its own with its coverage, the two
    samples are independent (two workers), and when both cover, the ratio lies between the bounds' ratios."""

    low: float
    high: float
    coverage: float

    def __iter__(self):  # low, high = interval
        return iter((self.low, self.high))


def ratio_cis(pairs: list[tuple[list[float], list[float]]],
              confidence: float = CONFIDENCE) -> list[RatioInterval | None]:
    """:func:`ratio_ci` of each (numerator, denominator) pair, the medians' intervals drawn together."""
    side = math.sqrt(confidence)  # each median's interval at √level, so that both cover with ≥ level
    nums = median_intervals([num for num, _ in pairs], side)
    dens = median_intervals([den for _, den in pairs], side)
    return [RatioInterval(a.low / b.high, a.high / b.low, a.coverage * b.coverage)
            if a is not None and b is not None and b.low > 0 else None for a, b in zip(nums, dens)]


def ratio_ci(numerator: list[float], denominator: list[float],
             confidence: float = CONFIDENCE) -> RatioInterval | None:
    """An interval of median(numerator) / median(denominator) from the two medians' order-statistic
    intervals (:class:`RatioInterval`); None when either side has fewer than 3 samples."""
    return ratio_cis([(numerator, denominator)], confidence)[0]


def slower_p_value(old: list[float], new: list[float]) -> float | None:
    """One-sided Mann–Whitney U: the probability of step times this much slower if nothing changed."""
    return _mann_whitney(old, new, "greater")


def faster_p_value(old: list[float], new: list[float]) -> float | None:
    """One-sided Mann–Whitney U the other way: step times this much faster if nothing changed."""
    return _mann_whitney(old, new, "less")


def _mann_whitney(old: list[float], new: list[float], alternative: str) -> float | None:
    """scipy's test; None (compare then judges on the threshold alone, "untested") without scipy."""
    if len(old) < 2 or len(new) < 2:
        return None
    try:
        from scipy.stats import mannwhitneyu
    except ImportError:
        return None
    return float(mannwhitneyu(new, old, alternative=alternative).pvalue)


def p_values(pairs: list[tuple[list[float], list[float], str]]) -> list[float | None]:
    """The one-sided Mann–Whitney p-value of each (old, new, "slower" | "faster") triple, tested together.

    scipy tests many samples of one shape in one call; it picks the exact or the asymptotic method once
    for the whole batch (asymptotic as soon as any row has a tie), so rows are grouped by their sizes, the
    direction and whether they hold ties, and each row gets the p-value a call of its own would give.
    """
    out: list[float | None] = [None] * len(pairs)
    try:
        from scipy.stats import mannwhitneyu
    except ImportError:
        return out
    groups: dict[tuple, list[int]] = {}
    for i, (old, new, direction) in enumerate(pairs):
        if len(old) < 2 or len(new) < 2:
            continue
        tied = len(set(old) | set(new)) < len(old) + len(new)
        groups.setdefault((len(old), len(new), direction, tied), []).append(i)
    for (_, _, direction, _), members in groups.items():
        old = np.asarray([pairs[i][0] for i in members], dtype=float)
        new = np.asarray([pairs[i][1] for i in members], dtype=float)
        alternative = "greater" if direction == "slower" else "less"
        result = np.atleast_1d(mannwhitneyu(new, old, alternative=alternative, axis=1).pvalue)
        for i, p in zip(members, result):
            out[i] = float(p)
    return out


_UNSET = object()


def summary(samples: list[float], ci_over: list[float] | None = None, ci=_UNSET) -> dict:
    """Median, its interval (with the coverage it has and its method), p90 (nearest rank), mean and
    coefficient of variation of step times; the interval over `ci_over` when given (one median per
    repeat), else over the samples; `ci` when the caller drew it already (:func:`median_cis`)."""
    from ..measure.timing import nearest_rank

    if not samples:
        return {}
    mean = statistics.fmean(samples)
    cv = stdev(samples, mean) / mean if len(samples) > 1 and mean > 0 else 0.0
    if ci is _UNSET:
        ci = median_ci(samples if ci_over is None else ci_over)
    ordered = sorted(samples)
    n = len(ordered)
    median = ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2  # statistics.median
    return {"step_time_median_s": median, "step_time_p90_s": nearest_rank(ordered, 0.9),
            "step_time_mean_s": mean, "step_time_cv": cv, **record_fields(ci)}


def stdev(samples: list[float], mean: float) -> float:
    """Sample standard deviation in floats (``statistics.stdev`` sums exact fractions: the same figure to
    the last digit or so, at a twentieth of the cost, which counts once per record of a large run)."""
    return math.sqrt(math.fsum((x - mean) ** 2 for x in samples) / (len(samples) - 1))
