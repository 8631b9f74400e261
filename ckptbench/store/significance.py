"""Whether a step-time change is real, and what a median interval really covers.

A time change counts when it is beyond the threshold *and* a one-sided Welch t-test on the logarithms
of the two runs' time samples gives p < ALPHA.  The samples are one median per repeat from 3 repeats
on (a worker's steps share its conditions), else every timed step.  Logarithms, because step times
are right-skewed and a slowdown multiplies them; Welch, because the two runs need not be equally
noisy.  Unlike a rank test it can reach significance with the samples a default run has: Mann–Whitney
over 3 steps against 3 (or 3 repeat medians against 3) can never give p below 0.05, so a step time
that doubled read as "noisy".  What this rule costs in false alarms, and what it finds, was simulated
(:mod:`.error_rates`, ``docs/compare-statistics.md``).

When ``compare`` divides out a measured change of the machine's speed (:mod:`.machine_speed`), the
test's variance includes that ratio's own, with its degrees of freedom (Welch–Satterthwaite over the
three parts).
"""

from __future__ import annotations

import math

import numpy as np

ALPHA = 0.05  # a change is significant when its one-sided p-value is below this
VERDICTS = ("regression", "improvement", "no change", "noisy", "untested")


def verdict(worse: float, p_value: float | None, limit: float) -> str:
    """The time verdict: `worse` is the judged relative change, positive when slower."""
    if p_value is None:
        return "untested"  # no per-step times, or no scipy to test them: the threshold alone decides
    if abs(worse) <= limit:
        return "no change"
    if p_value >= ALPHA:
        return "noisy"
    return "regression" if worse > 0 else "improvement"


def log_moments(logs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each row's mean, the variance of that mean, and its degrees of freedom: rows (k, n), n >= 2."""
    n = logs.shape[1]
    return logs.mean(axis=1), logs.var(axis=1, ddof=1) / n, np.full(logs.shape[0], n - 1.0)


def upper_p(t: np.ndarray, df: np.ndarray) -> np.ndarray:
    """P(T >= t) for Student's t with `df` (inf: the normal); raises ImportError without scipy."""
    from scipy.special import stdtr

    return stdtr(df, -t)


def welch(old_logs: np.ndarray, new_logs: np.ndarray, shift=0.0, extra_var=0.0,
          extra_df=np.inf) -> tuple[np.ndarray, np.ndarray]:
    """(t, df) of new minus old, row by row: log samples (k, m) and (k, n), the new ones lowered by
    `shift` (a log ratio divided out), whose variance `extra_var` and its df `extra_df` join the test's.

    A difference with no variance at all is certain (t is +-inf) unless there is no difference (t 0)."""
    mo, vo, do = log_moments(old_logs)
    mn, vn, dn = log_moments(new_logs)
    extra_var = np.broadcast_to(np.asarray(extra_var, dtype=float), mo.shape)
    extra_df = np.broadcast_to(np.asarray(extra_df, dtype=float), mo.shape)
    diff = mn - shift - mo
    var = vo + vn + extra_var
    with np.errstate(divide="ignore", invalid="ignore"):
        den = vo**2 / do + vn**2 / dn + np.where(extra_var > 0, extra_var**2 / extra_df, 0.0)
        df = np.where(den > 0, var**2 / den, np.inf)
        t = np.where(var > 0, diff / np.sqrt(var), np.where(diff == 0, 0.0, np.copysign(np.inf, diff)))
    return t, df


def p_values(rows: list[tuple[list, list, str]], shifts: list[float] | None = None,
             extras: list[tuple[float, float]] | None = None) -> list[float | None]:
    """One-sided Welch p-value on log times of each (old, new, "slower" | "faster") row, tested together:
    rows of one pair of sizes in one array operation.  `shifts`: the log ratio divided out of each row's
    new times; `extras`: its (variance, df).  None for a row with fewer than 2 positive times on a side,
    and for every row without scipy."""
    out: list[float | None] = [None] * len(rows)
    try:
        import scipy.special  # noqa: F401 - the t distribution's tail
    except ImportError:
        return out
    groups: dict[tuple[int, int], list[int]] = {}
    for i, (old, new, _) in enumerate(rows):
        if len(old) >= 2 and len(new) >= 2 and min(old) > 0 and min(new) > 0:
            groups.setdefault((len(old), len(new)), []).append(i)
    for members in groups.values():
        old = np.log(np.asarray([rows[i][0] for i in members], dtype=float))
        new = np.log(np.asarray([rows[i][1] for i in members], dtype=float))
        shift = np.asarray([shifts[i] if shifts else 0.0 for i in members])
        extra = np.asarray([extras[i] if extras else (0.0, math.inf) for i in members], dtype=float)
        t, df = welch(old, new, shift, extra[:, 0], extra[:, 1])
        slower = np.asarray([rows[i][2] == "slower" for i in members])
        p = upper_p(np.where(slower, t, -t), df)
        for i, value in zip(members, p):
            out[i] = float(value)
    return out


# ------------------------------------------------------------------------------------ interval coverage

def median_ci_coverage(n: int) -> float | None:
    """How often the interval compare draws for samples of `n` (:func:`~.stats.median_cis`, the
    order-statistic interval) covers the true median: exact for continuous samples
    (:func:`ckptbench.measure.interval.coverage`; ``tests/unit/test_timing_coverage.py`` draws it).  With
    3 samples the interval is their range, which covers the median 75 % of the time (1 - 2/2^3)."""
    from ..measure.interval import coverage

    return coverage(n) if n >= 3 else None
