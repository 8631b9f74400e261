"""How sure a time figure is: a bootstrap interval for a median, and a rank test for a shift.

Step times on a shared machine drift and have outliers, so nothing here assumes normality: the median's
95 % interval is a percentile bootstrap over the step times (seeded, so a report renders the same
interval twice), and "B is slower than A" is a one-sided Mann–Whitney U test (``scipy.stats``) over the
two sets of step times.  Memory never goes through here: on CPU it is exact.
"""

from __future__ import annotations

import functools
import math
import statistics

import numpy as np

CONFIDENCE = 0.95
RESAMPLES = 2000
SEED = 0
ALPHA = 0.05  # a slowdown is significant when the one-sided p-value is below this


CHUNK = 4_000_000  # resampled values held at once when many intervals are drawn together


@functools.lru_cache(maxsize=64)
def _indices(sizes: tuple[int, ...]) -> tuple[np.ndarray, ...]:
    """The resample indices a fresh generator (seeded SEED) draws for samples of these sizes, in turn.

    ``rng.choice(data, (RESAMPLES, n))`` draws ``rng.integers(0, n, (RESAMPLES, n))`` and indexes with it,
    so the indices depend only on the sizes: every interval over samples of one size reuses one draw, and
    many intervals are taken at once, the same numbers as one at a time.
    """
    rng = np.random.default_rng(SEED)
    out = tuple(rng.integers(0, n, size=(RESAMPLES, n)) for n in sizes)
    for a in out:
        a.setflags(write=False)
    return out


def _medians(rows: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """Resampled medians of each row of `rows` (k, n) by the indices `idx` (RESAMPLES, n): (k, RESAMPLES).

    A sort and the middle (the mean of the two middle values for even n) is what ``np.median`` computes,
    bit for bit, at less than half its cost on short rows; rows holding NaN go through ``np.median``."""
    resampled = rows[:, idx]
    if np.isnan(rows).any():
        return np.median(resampled, axis=2)
    if idx.shape[1] == 3:  # three steps (the CPU suites): the middle of three, without a sort
        a, b, c = resampled[..., 0], resampled[..., 1], resampled[..., 2]
        return np.maximum(np.minimum(a, b), np.minimum(np.maximum(a, b), c))
    resampled.sort(axis=2)
    n = idx.shape[1]
    mid = n // 2
    return resampled[..., mid] if n % 2 else (resampled[..., mid - 1] + resampled[..., mid]) / 2


def _percentile_rows(values: np.ndarray, confidence: float) -> list[tuple[float, float]]:
    tail = (1 - confidence) / 2
    lo, hi = np.quantile(values, [tail, 1 - tail], axis=1)  # one partition for both ends
    return [(float(a), float(b)) for a, b in zip(lo, hi)]


def _chunks(members: list[int], width: int):
    step = max(1, CHUNK // (RESAMPLES * max(width, 1)))
    for start in range(0, len(members), step):
        yield members[start:start + step]


def median_cis(many: list, confidence: float = CONFIDENCE) -> list[tuple[float, float] | None]:
    """:func:`median_ci` of each sample list in `many`, drawn together (samples of one size share their
    resample indices): the same intervals, at the cost of a few array operations per size."""
    out: list[tuple[float, float] | None] = [None] * len(many)
    by_size: dict[int, list[int]] = {}
    for i, samples in enumerate(many):
        if len(samples) >= 3:
            by_size.setdefault(len(samples), []).append(i)
    for n, members in by_size.items():
        (idx,) = _indices((n,))
        for part in _chunks(members, n):
            rows = np.asarray([many[i] for i in part], dtype=float)
            for i, ci in zip(part, _percentile_rows(_medians(rows, idx), confidence)):
                out[i] = ci
    return out


def median_ci(samples: list[float], confidence: float = CONFIDENCE) -> tuple[float, float] | None:
    """Percentile-bootstrap interval of the median; None with fewer than 3 samples (no interval to speak of)."""
    # numpy, not scipy.stats.bootstrap: every report reads records through here, and the GPU machines'
    # images have numpy but not necessarily scipy (the rank test in compare is scipy's)
    return median_cis([samples], confidence)[0]


def ratio_cis(pairs: list[tuple[list[float], list[float]]],
              confidence: float = CONFIDENCE) -> list[tuple[float, float] | None]:
    """:func:`ratio_ci` of each (numerator, denominator) pair, drawn together by pair of sizes."""
    out: list[tuple[float, float] | None] = [None] * len(pairs)
    by_size: dict[tuple[int, int], list[int]] = {}
    for i, (num, den) in enumerate(pairs):
        if len(num) >= 3 and len(den) >= 3:
            by_size.setdefault((len(num), len(den)), []).append(i)
    for (n1, n2), members in by_size.items():
        idx1, idx2 = _indices((n1, n2))
        for part in _chunks(members, n1 + n2):
            num = np.asarray([pairs[i][0] for i in part], dtype=float)
            den = np.asarray([pairs[i][1] for i in part], dtype=float)
            ratios = _medians(num, idx1) / _medians(den, idx2)
            for i, ci in zip(part, _percentile_rows(ratios, confidence)):
                out[i] = ci
    return out


def ratio_ci(numerator: list[float], denominator: list[float],
             confidence: float = CONFIDENCE) -> tuple[float, float] | None:
    """Percentile-bootstrap interval of median(numerator) / median(denominator), each resampled on its own."""
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
    """Median, its interval, p90 (nearest rank), mean and coefficient of variation of step times; the
    interval over `ci_over` when given (one median per repeat), else over the samples; `ci` when the
    caller drew it already (:func:`median_cis`, many records at once)."""
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
            "step_time_mean_s": mean, "step_time_cv": cv, "step_time_ci95_s": list(ci) if ci else None}


def stdev(samples: list[float], mean: float) -> float:
    """Sample standard deviation in floats (``statistics.stdev`` sums exact fractions: the same figure to
    the last digit or so, at a twentieth of the cost, which counts once per record of a large run)."""
    return math.sqrt(math.fsum((x - mean) ** 2 for x in samples) / (len(samples) - 1))
