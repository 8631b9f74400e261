"""The median's interval covers as often as it says, by a seeded simulation with known medians.

Monte Carlo: 4,000 samples per cell, so a coverage is known to about ±0.7 points (two standard errors);
the tolerance below is 1.5 points.  Seeded: the same draws every run, no flakiness.
"""

from __future__ import annotations

import pytest

from ckptbench.measure.interval import LEVEL, coverage_label, ranks
from ckptbench.store.coverage import NOISES, simulate

REPS = 4000
TOL = 0.015


@pytest.mark.parametrize("noise", NOISES)
@pytest.mark.parametrize("n", [6, 7, 10, 20, 30])
def test_from_six_steps_the_interval_covers_at_least_95_percent(n, noise):
    stated = ranks(n)[1]
    assert stated >= LEVEL
    assert simulate("order-statistic", noise, n, REPS) >= LEVEL - TOL


@pytest.mark.parametrize("noise", NOISES)
@pytest.mark.parametrize("n,stated", [(3, 0.75), (4, 0.875), (5, 0.9375), (10, 1 - 2 * 11 / 1024)])
def test_at_every_size_the_coverage_is_the_one_stated(n, stated, noise):
    assert ranks(n)[1] == stated
    assert abs(simulate("order-statistic", noise, n, REPS) - stated) <= TOL


def test_the_labels_say_the_coverage_not_a_flat_95():
    assert [coverage_label(ranks(n)[1]) for n in (3, 4, 5, 6, 10)] == ["75 %", "87.5 %", "93.75 %", "96.88 %",
                                                                     "97.85 %"]


@pytest.mark.parametrize("n", [3, 4])
def test_the_bootstrap_it_replaces_says_95_percent_and_covers_far_less(n):
    covered = simulate("percentile bootstrap", "lognormal", n, 1000, resamples=500)
    assert covered < 0.9  # about 75 % at n = 3, 87 % at n = 4 (docs/timing.md)


def test_under_the_stopping_rule_points_stopped_by_precision_cover_less_than_their_fixed_n_level():
    """The rule stops at the first narrow look: a seeded simulation of the rule itself (docs/timing.md, "Under
    the stopping rule") finds the intervals of the points it stopped by precision below 95 %, while over every
    point, capped ones included, the coverage stays near it."""
    from ckptbench.measure.stopping import StopRule
    from ckptbench.store.coverage import sequential

    result = sequential("lognormal", StopRule(3, 0.05, 30, 1e9, 1), 1000)
    assert 0.2 < result["stopped_by_precision"] < 0.8
    assert result["coverage_when_precise"] < LEVEL - 0.03
    assert result["coverage"] > LEVEL - 0.03
