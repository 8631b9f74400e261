"""Statistics behind every time comparison, on synthetic samples whose truth is known."""

from __future__ import annotations

import numpy as np
import pytest

from ckptbench.store.compare import Thresholds, compare_runs
from ckptbench.store.stats import median_ci, ratio_ci, slower_p_value, summary


def _times(n: int, median: float, cv: float = 0.05, seed: int = 0) -> list[float]:
    """Step times with a log-normal spread (a right tail, as step times have)."""
    rng = np.random.default_rng(seed)
    return list(median * np.exp(rng.normal(0, cv, n)))


def _record(case_id: str, times: list[float]) -> dict:
    s = summary(times)
    return {"case_id": case_id, "strategy": "full", "status": "ok",
            "case": {"model": {"name": "llama-tiny"}, "batch_size": 2, "seq_len": 64},
            "measurement": {**s, "step_times_s": times, "tokens_per_s": 128 / s["step_time_median_s"],
                            "peak_bytes": 1000}}


def test_the_median_interval_covers_the_true_median_at_least_95_percent_of_the_time():
    intervals = [median_ci(_times(30, 0.1, seed=k)) for k in range(200)]
    covered = sum(low <= 0.1 <= high for low, high in intervals)
    assert 180 <= covered <= 200  # 95.7 % exactly at n = 30 (x(10) .. x(21))
    assert all(ci.coverage == pytest.approx(0.9572260547429323) for ci in intervals)


def test_a_constant_sample_has_a_point_interval_and_too_few_samples_none():
    ci = median_ci([0.1, 0.1, 0.1])
    assert tuple(ci) == (0.1, 0.1) and ci.coverage == 0.75  # [min, max] of 3: 75 %, and says so
    assert median_ci([0.1, 0.2]) is None


def test_summary_states_the_interval_its_method_and_its_coverage():
    s = summary([0.3, 0.1, 0.2, 0.5, 0.4, 0.6, 0.7, 0.8, 0.9, 1.0])
    assert s["step_time_ci95_s"] == [0.2, 0.9]  # x(2) .. x(9) of 10
    assert s["step_time_ci_coverage"] == pytest.approx(1 - 2 * 11 / 1024)
    assert (s["step_time_ci_method"], s["step_time_ci_n"], s["step_time_ci_ranks"]) == ("order-statistic", 10, [2, 9])


def test_a_twenty_percent_slowdown_is_significant_and_no_change_is_not():
    old = _times(20, 0.1, seed=1)
    assert slower_p_value(old, _times(20, 0.12, seed=2)) < 0.001
    same = [slower_p_value(_times(20, 0.1, seed=10 + k), _times(20, 0.1, seed=100 + k)) for k in range(100)]
    assert sum(p < 0.05 for p in same) <= 10  # about 5 false alarms in 100 at alpha 0.05


def test_ratio_interval_contains_the_true_ratio_and_states_its_coverage():
    ci = ratio_ci(_times(30, 0.12, seed=3), _times(30, 0.1, seed=4))
    low, high = ci
    assert low < 1.2 < high and low > 1.0
    assert 0.95 <= ci.coverage < 1  # each median at √95 %: both cover, so the ratio does, at least this often


def test_compare_calls_a_regression_only_when_beyond_threshold_and_significant():
    old = [_record("shifted", _times(20, 0.1, seed=1)), _record("same", _times(20, 0.1, seed=2)),
           _record("few", _times(3, 0.1, cv=0.3, seed=3))]
    new = [_record("shifted", _times(20, 0.125, seed=4)), _record("same", _times(20, 0.1, seed=5)),
           _record("few", _times(3, 0.125, cv=0.3, seed=6))]
    comparison = compare_runs(old, new, Thresholds(time=0.10, drift=False))  # the test alone, raw changes
    verdicts = {p.key: next(d for d in p.deltas if d.quantity == "step_time_median_s") for p in comparison.points}
    assert verdicts["shifted"].verdict == "regression" and verdicts["shifted"].p_value < 0.001
    assert verdicts["same"].verdict == "no change" and not verdicts["same"].regressed
    assert verdicts["few"].verdict in ("noisy", "no change") and not verdicts["few"].regressed
    assert [p.key for p in comparison.regressions] == ["shifted"]
    tokens = next(d for d in comparison.points[0].deltas if d.quantity == "tokens_per_s")
    assert tokens.verdict == "regression"  # fewer tokens/s is the same slowdown


@pytest.mark.parametrize("shift", [0.8, 1.25])
def test_the_json_carries_p_values_and_intervals(shift):
    comparison = compare_runs([_record("a", _times(12, 0.1, seed=7))], [_record("a", _times(12, 0.1 * shift, seed=8))])
    d = comparison.to_dict()["points"][0]["deltas"]
    step = next(x for x in d if x["quantity"] == "step_time_median_s")
    assert step["p_value"] < 0.01 and len(step["old_ci"]) == 2 and len(step["new_ci"]) == 2
    assert step["verdict"] == ("improvement" if shift < 1 else "regression")


def _kernel(ms: float, seed: int) -> list[dict]:
    """Calibration readings (2 at the start, 2 at the end, 5 repetitions each) around `ms` milliseconds."""
    rng = np.random.default_rng(seed)
    return [{"kernel": "fp32 matmul", "device": "cpu", "dtype": "fp32", "threads": 1, "torch": "2",
             "times_s": list(ms / 1e3 * np.exp(rng.normal(0, 0.01) + rng.normal(0, 0.005, 5)))} for _ in range(4)]


def test_a_machine_slowdown_the_kernel_measured_is_divided_out_and_the_shared_move_only_stated():
    keys = ["a", "b", "c", "d", "e"]
    old = [_record(k, _times(12, 0.1, cv=0.02, seed=20 + i)) for i, k in enumerate(keys)]
    # the whole machine 15 % slower (the calibration kernel too), and point "e" 25 % slower on top of that
    new = [_record(k, _times(12, 0.1 * 1.15 * (1.25 if k == "e" else 1), cv=0.02, seed=40 + i))
           for i, k in enumerate(keys)]
    kernel = (_kernel(30.0, seed=1), _kernel(30.0 * 1.15, seed=2))
    comparison = compare_runs(old, new, Thresholds(time=0.10), *kernel)
    assert comparison.machine_speed.state == "corrected"
    assert comparison.machine_speed.factor == pytest.approx(1.15, rel=0.02)
    assert [p.key for p in comparison.regressions] == ["e"]
    assert comparison.median_change == pytest.approx(0.15, abs=0.02)  # stated, not what was divided out
    raw = compare_runs(old, new, Thresholds(time=0.10, drift=False), *kernel)
    assert raw.machine_speed.state == "not corrected" and sorted(p.key for p in raw.regressions) == keys
    unmeasured = compare_runs(old, new, Thresholds(time=0.10))  # no readings: raw changes, every point
    assert unmeasured.machine_speed.state == "unknown" and sorted(p.key for p in unmeasured.regressions) == keys
    from ckptbench.report.compare import summary_lines

    lines = summary_lines(comparison)
    assert any(line.startswith("machine speed: the calibration kernel") and "divided by 1.1" in line for line in lines)


def test_without_scipy_a_time_change_is_judged_on_the_threshold_and_says_untested(monkeypatch):
    import sys

    for name in ("scipy", "scipy.stats", "scipy.special"):  # as on a GPU image without scipy: imports fail
        monkeypatch.setitem(sys.modules, name, None)
    comparison = compare_runs([_record("a", _times(12, 0.1, seed=1))], [_record("a", _times(12, 0.125, seed=2))],
                              Thresholds(time=0.10))
    step = next(d for d in comparison.points[0].deltas if d.quantity == "step_time_median_s")
    assert step.verdict == "untested" and step.p_value is None and step.regressed
    assert step.old_ci is not None  # intervals need numpy only
    kernel = (_kernel(30.0, seed=1), _kernel(36.0, seed=2))
    comparison = compare_runs([_record("a", _times(12, 0.1, seed=1))], [_record("a", _times(12, 0.125, seed=2))],
                              Thresholds(time=0.10), *kernel)
    assert comparison.machine_speed.state == "unknown" and "scipy" in comparison.machine_speed.why
