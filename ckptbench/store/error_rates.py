"""What ``compare``'s time rule costs and what it finds: false alarms and power, simulated (seeded).

The noise model, in log step time, for one point of one run:

    log t = log mu + log(1 + slowdown) + A + W + E

- ``A``, the machine's state during the run: normal, ``run_sd`` (3-5 %), shared by every point of the
  run and, unless ``kernel_sees_run`` is off, by the calibration kernel;
- ``W``, a worker's own conditions (its core, its neighbours then): normal, ``worker_sd``, one per repeat;
- ``E``, a step: Student t with 3 degrees of freedom scaled by ``step_scale``, plus, for a share
  ``outlier_rate`` of steps, a slowdown drawn uniformly from ``outlier_range`` (a page fault, a burst
  next door).  The defaults reproduce the spread of 3 timed steps in the committed reference run
  (``results/reference-cpu``: the standard deviation of log step times is 1.0 / 1.7 / 2.8 / 6.9 / 15.3 %
  at its 10th / 25th / 50th / 75th / 90th percentiles; the model's are 1.1 / 1.8 / 3.1 / 6.0 / 16.3 %).

Each run also has its calibration readings, as a sweep takes them (:mod:`ckptbench.run.speed_reading`):
2 moments (start, end) × 2 readings × 5 repetitions, ``log k = A + R + r`` with a reading's own
``reading_sd`` and a repetition's ``repetition_sd``.

Every decision goes through the code ``compare`` runs: :func:`~.machine_speed.speed_test` for the
kernel, :func:`~.significance.welch` and :func:`~.significance.upper_p` for the test,
:func:`~.significance.verdict` for the verdict; the samples are one median per repeat from
:data:`~.repeats.MIN_REPEATS_AS_UNIT` repeats on, every step below, as :func:`~.repeats.time_samples`
gives them.  A unit test compares this with ``compare_runs`` on records built from the same draws.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .machine_speed import speed_test
from .repeats import MIN_REPEATS_AS_UNIT
from .significance import ALPHA, upper_p, verdict, welch

MOMENTS, READINGS_PER_MOMENT, REPETITIONS = 2, 2, 5  # the sweep's readings (start and end)


@dataclass(frozen=True)
class NoiseModel:
    run_sd: float = 0.05
    worker_sd: float = 0.02
    step_scale: float = 0.025
    outlier_rate: float = 0.06
    outlier_range: tuple[float, float] = (0.10, 0.60)
    reading_sd: float = 0.01
    repetition_sd: float = 0.005
    kernel_sees_run: bool = True


@dataclass
class Draw:
    """Simulated run pairs: step times (trials, points, repeats, steps) and kernel times (trials, readings,
    repetitions) of each side, in seconds."""

    old_steps: np.ndarray
    new_steps: np.ndarray
    old_kernel: np.ndarray
    new_kernel: np.ndarray


def _side(rng: np.random.Generator, trials: int, points: int, repeats: int, steps: int, slowdown: float,
          model: NoiseModel) -> tuple[np.ndarray, np.ndarray]:
    run = rng.normal(0.0, model.run_sd, (trials, 1, 1, 1))
    worker = rng.normal(0.0, model.worker_sd, (trials, points, repeats, 1))
    shape = (trials, points, repeats, steps)
    step = model.step_scale * rng.standard_t(3, shape)
    step += (rng.random(shape) < model.outlier_rate) * np.log1p(rng.uniform(*model.outlier_range, shape))
    times = 0.1 * np.exp(np.log1p(slowdown) + run + worker + step)
    kernel_run = run[:, :, 0, 0] if model.kernel_sees_run else rng.normal(0.0, model.run_sd, (trials, 1))
    readings = MOMENTS * READINGS_PER_MOMENT
    kernel = 0.03 * np.exp(kernel_run[:, :, None] + rng.normal(0.0, model.reading_sd, (trials, readings, 1))
                           + rng.normal(0.0, model.repetition_sd, (trials, readings, REPETITIONS)))
    return times, kernel


def draw(repeats: int, steps: int, slowdown: float, model: NoiseModel = NoiseModel(), trials: int = 20_000,
         points: int = 1, seed: int = 0) -> Draw:
    """`trials` pairs of runs of `points` points, the new run's every point `slowdown` slower (0.2 = 20 %)."""
    rng = np.random.default_rng(seed)
    old_steps, old_kernel = _side(rng, trials, points, repeats, steps, 0.0, model)
    new_steps, new_kernel = _side(rng, trials, points, repeats, steps, slowdown, model)
    return Draw(old_steps, new_steps, old_kernel, new_kernel)


def tested_samples(times: np.ndarray) -> np.ndarray:
    """What compare tests: one median per repeat from MIN_REPEATS_AS_UNIT repeats on, else every step."""
    if times.shape[2] >= MIN_REPEATS_AS_UNIT:
        return np.median(times, axis=3)
    return times.reshape(*times.shape[:2], -1)


def judge(d: Draw, threshold: float = 0.10, calibrated: bool = True) -> np.ndarray:
    """The step-time verdict of every point of every run pair, (trials, points), as compare gives it."""
    trials, points = d.old_steps.shape[:2]
    log_ratio, var, df, p_speed = speed_test(np.log(np.median(d.old_kernel, axis=2)),
                                             np.log(np.median(d.new_kernel, axis=2)))
    corrected = calibrated & (p_speed < ALPHA)
    shift = np.where(corrected, log_ratio, 0.0)
    extra_var, extra_df = np.where(corrected, var, 0.0), np.where(corrected, df, np.inf)
    old_median = np.median(d.old_steps.reshape(trials, points, -1), axis=2)
    new_median = np.median(d.new_steps.reshape(trials, points, -1), axis=2)
    worse = new_median / np.exp(shift)[:, None] / old_median - 1
    old_logs = np.log(tested_samples(d.old_steps)).reshape(trials * points, -1)
    new_logs = np.log(tested_samples(d.new_steps)).reshape(trials * points, -1)
    t, t_df = welch(old_logs, new_logs, np.repeat(shift, points), np.repeat(extra_var, points),
                    np.repeat(extra_df, points))
    worse = worse.reshape(-1)
    p = upper_p(np.where(worse > 0, t, -t), t_df)
    return np.asarray([verdict(w, q, threshold) for w, q in zip(worse, p)]).reshape(trials, points)


@dataclass
class Rates:
    regression: float  # share of points called a regression
    improvement: float
    noisy: float
    any_regression: float  # share of run pairs with at least one point called a regression


def rates(repeats: int, steps: int, slowdown: float, model: NoiseModel = NoiseModel(), calibrated: bool = True,
          trials: int = 20_000, points: int = 1, seed: int = 0, threshold: float = 0.10) -> Rates:
    verdicts = judge(draw(repeats, steps, slowdown, model, trials, points, seed), threshold, calibrated)
    return Rates(float(np.mean(verdicts == "regression")), float(np.mean(verdicts == "improvement")),
                 float(np.mean(verdicts == "noisy")), float(np.mean((verdicts == "regression").any(axis=1))))
