"""How often an interval of the median really covers it: a seeded simulation of step times whose median is
known, for the order-statistic interval a record carries (:mod:`ckptbench.measure.interval`) and, beside
it, the percentile bootstrap the records carried before.

Step times are positive and skewed to the right, with outliers, so three kinds of noise are drawn, each
with its true median known exactly:

- ``lognormal``: ``exp(N(0, 0.1²))``, a spread of about 10 %;
- ``pareto``: ``1 + 0.05 · Lomax(α = 1.5)``, a heavy right tail of infinite variance (a page fault, a
  neighbour's burst);
- ``bursts``: the lognormal, with one step in ten 1.5 times slower (a neighbour that comes and goes).

``scripts/timing_coverage.py`` prints the table of ``docs/timing.md`` from :func:`table`;
``tests/unit/test_timing_coverage.py`` holds the interval to its stated coverage with fewer draws.
"""

from __future__ import annotations

import math

import numpy as np

from ..measure.interval import LEVEL, ranks

NOISES = ("lognormal", "pareto", "bursts")
METHODS = ("order-statistic", "percentile bootstrap")
SIGMA = 0.1
ALPHA = 1.5  # Lomax shape: a tail heavy enough that the variance is infinite
BURST_P, BURST_X = 0.1, 1.5
RESAMPLES = 2000  # what the bootstrap drew per interval before


def _bursts_median() -> float:
    """The median of the mixture 0.9 · lognormal + 0.1 · 1.5 × lognormal, by bisection on its CDF."""
    def cdf(m: float) -> float:
        def phi(z: float) -> float:
            return 0.5 * (1 + math.erf(z / math.sqrt(2)))
        return (1 - BURST_P) * phi(math.log(m) / SIGMA) + BURST_P * phi(math.log(m / BURST_X) / SIGMA)

    lo, hi = 0.5, 3.0
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) < 0.5 else (lo, mid)
    return (lo + hi) / 2


TRUE_MEDIAN = {"lognormal": 1.0, "pareto": 1 + 0.05 * (2 ** (1 / ALPHA) - 1), "bursts": _bursts_median()}


def draw(noise: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Step times of one kind of noise (see the module's text)."""
    if noise == "lognormal":
        return np.exp(rng.normal(0.0, SIGMA, shape))
    if noise == "pareto":
        return 1 + 0.05 * (rng.uniform(size=shape) ** (-1 / ALPHA) - 1)
    if noise == "bursts":
        base = np.exp(rng.normal(0.0, SIGMA, shape))
        return np.where(rng.uniform(size=shape) < BURST_P, base * BURST_X, base)
    raise ValueError(f"unknown noise {noise!r}; known: {', '.join(NOISES)}")


def order_statistic_bounds(samples: np.ndarray, level: float = LEVEL) -> tuple[np.ndarray, np.ndarray]:
    """The order-statistic interval of each row (reps, n)."""
    n = samples.shape[1]
    k, _ = ranks(n, level)
    ordered = np.sort(samples, axis=1)
    return ordered[:, k - 1], ordered[:, n - k]


def bootstrap_bounds(samples: np.ndarray, rng: np.random.Generator, level: float = LEVEL,
                     resamples: int = RESAMPLES, chunk: int = 4_000_000) -> tuple[np.ndarray, np.ndarray]:
    """The percentile-bootstrap interval of each row's median: `resamples` medians of rows drawn with
    replacement, their (1 − level)/2 and (1 + level)/2 quantiles."""
    reps, n = samples.shape
    lows, highs = np.empty(reps), np.empty(reps)
    step = max(1, chunk // (resamples * n))
    tail = (1 - level) / 2
    for start in range(0, reps, step):
        rows = samples[start:start + step]
        idx = rng.integers(0, n, size=(len(rows), resamples, n))
        medians = np.median(np.take_along_axis(rows[:, None, :], idx, axis=2), axis=2)
        lo, hi = np.quantile(medians, [tail, 1 - tail], axis=1)
        lows[start:start + step], highs[start:start + step] = lo, hi
    return lows, highs


def simulate(method: str, noise: str, n: int, reps: int, seed: int = 0, resamples: int = RESAMPLES) -> float:
    """The fraction of `reps` samples of `n` step times whose interval holds the true median."""
    rng = np.random.default_rng([seed, n, NOISES.index(noise)])
    samples = draw(noise, (reps, n), rng)
    if method == "order-statistic":
        low, high = order_statistic_bounds(samples)
    elif method == "percentile bootstrap":
        low, high = bootstrap_bounds(samples, rng, resamples=resamples)
    else:
        raise ValueError(f"unknown method {method!r}; known: {', '.join(METHODS)}")
    truth = TRUE_MEDIAN[noise]
    return float(np.mean((low <= truth) & (truth <= high)))


def table(sizes=(3, 4, 5, 6, 10, 20), reps: int = 20000, bootstrap_reps: int = 4000, seed: int = 0) -> list[dict]:
    """One row per (n, noise): the order-statistic interval's stated and simulated coverage, and the
    bootstrap's simulated coverage (it states 95 % at every n)."""
    rows = []
    for n in sizes:
        stated = ranks(n)[1]
        for noise in NOISES:
            rows.append({"n": n, "noise": noise, "stated": stated,
                         "order_statistic": simulate("order-statistic", noise, n, reps, seed),
                         "bootstrap": simulate("percentile bootstrap", noise, n, bootstrap_reps, seed)})
    return rows


def markdown(rows: list[dict], reps: int, bootstrap_reps: int) -> str:
    """The table as docs/timing.md shows it."""
    def pct(value: float) -> str:
        return f"{value * 100:.1f} %"

    lines = ["| n | noise | order-statistic: stated | order-statistic: simulated | percentile bootstrap (states 95 %): simulated |",
             "|---:|---|---:|---:|---:|"]
    lines += [f"| {r['n']} | {r['noise']} | {pct(r['stated'])} | {pct(r['order_statistic'])} | {pct(r['bootstrap'])} |"
              for r in rows]
    lines.append(f"\n{reps:,} samples per cell for the order-statistic interval, {bootstrap_reps:,} for the bootstrap "
                 f"({RESAMPLES:,} resamples each); Monte Carlo error about ±{200 * math.sqrt(0.05 * 0.95 / reps):.1f} and "
                 f"±{200 * math.sqrt(0.05 * 0.95 / bootstrap_reps):.1f} percentage points (two standard errors "
                 "at 95 %).")
    return "\n".join(lines)


def sequential(noise: str, rule, reps: int, seed: int = 0) -> dict:
    """The stopping rule (:class:`~ckptbench.measure.stopping.StopRule`, its time cap left out) run on
    `reps` seeded sequences of step times: how often the interval a point ends with holds the true median,
    over every point and over the points the precision stopped (the rule looks after every step it is due,
    and a look that happens to be narrow stops it: those intervals cover less than their fixed-n level)."""
    from ..measure.interval import median_interval

    rng = np.random.default_rng([seed, rule.max_steps, NOISES.index(noise)])
    samples = draw(noise, (reps, rule.max_steps), rng)
    truth = TRUE_MEDIAN[noise]
    covered = by_precision = covered_precision = 0
    steps = 0
    for row in samples:
        times = row.tolist()
        verdict, n = None, rule.max_steps
        for k in range(1, rule.max_steps + 1):
            if rule.due(k):
                verdict = rule.verdict(times[:k], 0.0)
                if verdict:
                    n = k
                    break
        interval = median_interval(times[:n])
        hit = interval.low <= truth <= interval.high
        covered += hit
        steps += n
        if verdict == "precision":
            by_precision += 1
            covered_precision += hit
    return {"coverage": covered / reps, "stopped_by_precision": by_precision / reps,
            "coverage_when_precise": covered_precision / by_precision if by_precision else None,
            "mean_steps": steps / reps}


def sequential_table(rules: dict, reps: int = 4000, seed: int = 0) -> list[dict]:
    """One row per (rule, noise) of :func:`sequential`; `rules` maps a name to a StopRule."""
    return [{"rule": name, "noise": noise, **sequential(noise, rule, reps, seed)}
            for name, rule in rules.items() for noise in NOISES]


def sequential_markdown(rows: list[dict], reps: int) -> str:
    def pct(value) -> str:
        return "-" if value is None else f"{value * 100:.1f} %"

    lines = ["| rule | noise | stopped by precision | coverage, every point | coverage, points stopped by precision | mean timed steps |",
             "|---|---|---:|---:|---:|---:|"]
    lines += [f"| {r['rule']} | {r['noise']} | {pct(r['stopped_by_precision'])} | {pct(r['coverage'])} | "
              f"{pct(r['coverage_when_precise'])} | {r['mean_steps']:.1f} |" for r in rows]
    lines.append(f"\n{reps:,} seeded sequences per row.")
    return "\n".join(lines)
