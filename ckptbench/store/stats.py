"""How sure a time figure is: a bootstrap interval for a median, and a rank test for a shift.

Step times on a shared machine drift and have outliers, so nothing here assumes normality: the median's
95 % interval is a percentile bootstrap over the step times (seeded, so a report renders the same
interval twice), and "B is slower than A" is a one-sided Mann–Whitney U test (``scipy.stats``) over the
two sets of step times.  Memory never goes through here: on CPU it is exact.
"""

from __future__ import annotations

import statistics

import numpy as np

CONFIDENCE = 0.95
RESAMPLES = 2000
SEED = 0
ALPHA = 0.05  # a slowdown is significant when the one-sided p-value is below this


def _resampled_medians(samples: list[float], rng: np.random.Generator) -> np.ndarray:
    """The medians of RESAMPLES resamples (with replacement) of `samples`."""
    data = np.asarray(samples, dtype=float)
    return np.median(rng.choice(data, size=(RESAMPLES, data.size)), axis=1)


def _percentile_interval(values: np.ndarray, confidence: float) -> tuple[float, float]:
    tail = (1 - confidence) / 2
    return float(np.quantile(values, tail)), float(np.quantile(values, 1 - tail))


def median_ci(samples: list[float], confidence: float = CONFIDENCE) -> tuple[float, float] | None:
    """Percentile-bootstrap interval of the median; None with fewer than 3 samples (no interval to speak of)."""
    if len(samples) < 3:
        return None
    # numpy, not scipy.stats.bootstrap: every report reads records through here, and the GPU machines'
    # images have numpy but not necessarily scipy (the rank test in compare is scipy's)
    return _percentile_interval(_resampled_medians(samples, np.random.default_rng(SEED)), confidence)


def ratio_ci(numerator: list[float], denominator: list[float],
             confidence: float = CONFIDENCE) -> tuple[float, float] | None:
    """Percentile-bootstrap interval of median(numerator) / median(denominator), each resampled on its own."""
    if len(numerator) < 3 or len(denominator) < 3:
        return None
    rng = np.random.default_rng(SEED)
    ratios = _resampled_medians(numerator, rng) / _resampled_medians(denominator, rng)
    return _percentile_interval(ratios, confidence)


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


def summary(samples: list[float], ci_over: list[float] | None = None) -> dict:
    """Median, its interval, p90 (nearest rank), mean and coefficient of variation of step times; the
    interval over `ci_over` when given (one median per repeat), else over the samples."""
    from ..measure.timing import nearest_rank

    if not samples:
        return {}
    mean = statistics.fmean(samples)
    cv = statistics.stdev(samples) / mean if len(samples) > 1 and mean > 0 else 0.0
    ci = median_ci(samples if ci_over is None else ci_over)
    return {"step_time_median_s": statistics.median(samples), "step_time_p90_s": nearest_rank(sorted(samples), 0.9),
            "step_time_mean_s": mean, "step_time_cv": cv, "step_time_ci95_s": list(ci) if ci else None}
