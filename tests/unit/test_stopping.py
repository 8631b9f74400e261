"""When a point stops timing: fed step times, the rule and the worker's schedule stop at the precision or
at a cap, and say which.  Deterministic: the times are given, nothing is timed."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from ckptbench.measure.interval import fewest
from ckptbench.measure.stopping import CUDA_CHECK_EVERY, StopRule
from ckptbench.point.case import Case, preset
from ckptbench.point.training import Timing, TrainSpec
from ckptbench.run.worker import StepSchedule

STEADY = [0.100, 0.101, 0.099, 0.100, 0.1015, 0.0985, 0.100, 0.101, 0.099, 0.100] * 10  # within ±1.5 %
NOISY = [0.10, 0.14, 0.08, 0.12, 0.09, 0.15, 0.07, 0.13, 0.11, 0.16] * 10  # ±40 %: never ±2 %


def _rule(min_steps=3, precision=0.02, max_steps=50, max_time_s=30.0, check_every=1) -> StopRule:
    return StopRule(min_steps, precision, max_steps, max_time_s, check_every)


def _stop(rule: StopRule, times: list[float], step_s: float | None = None) -> tuple[int, str]:
    """Feed `times` one step at a time (elapsed: their sum, or `step_s` per step); where and why it stopped."""
    for n in range(1, len(times) + 1):
        if rule.due(n):
            elapsed = sum(times[:n]) if step_s is None else step_s * n
            why = rule.verdict(times[:n], elapsed)
            if why:
                return n, why
    raise AssertionError("never stopped")


def test_steady_steps_stop_at_the_precision_once_a_95_percent_interval_exists():
    assert fewest() == 6  # [min, max] of 5 covers 93.75 %: no 95 % interval before the sixth step
    assert _stop(_rule(), STEADY) == (6, "precision")
    assert _stop(_rule(min_steps=9), STEADY) == (9, "precision")  # never before `steps`


def test_noisy_steps_stop_at_the_step_cap_or_the_time_cap_and_say_which():
    assert _stop(_rule(max_steps=20), NOISY) == (20, "max_steps")
    assert _stop(_rule(max_steps=50, max_time_s=1.0), NOISY) == (10, "max_time")  # nine steps: 0.99 s
    # the minimum is timed whatever the time cap says
    assert _stop(_rule(min_steps=4, max_time_s=0.01), NOISY) == (4, "max_time")


def test_the_precision_wins_when_it_is_reached_at_a_cap():
    assert _stop(_rule(max_steps=6), STEADY) == (6, "precision")
    assert _stop(_rule(max_steps=5), STEADY) == (5, "max_steps")  # 5 steps: only a 93.75 % interval


def test_a_loose_precision_stops_a_noisy_point_sooner():
    n, why = _stop(_rule(precision=0.5), NOISY)
    assert why == "precision" and n == 6


def test_on_cuda_the_times_are_read_every_few_steps_and_at_the_cap():
    rule = _rule(min_steps=3, max_steps=13, check_every=CUDA_CHECK_EVERY)
    assert [n for n in range(1, 14) if rule.due(n)] == [3, 7, 11, 13]
    assert _stop(rule, STEADY) == (7, "precision")  # 6 would do, but the sixth step is not a read
    train = TrainSpec(steps=3, timing=Timing(max_steps=13))
    assert StopRule.of(train, "cuda").check_every == CUDA_CHECK_EVERY and StopRule.of(train, "cpu").check_every == 1
    assert StopRule.of(TrainSpec(steps=80), "cpu").max_steps == 80  # the cap is never below `steps`
    # a worker with 10 s left before its timeout gives its timed steps 5 s at most
    assert StopRule.of(TrainSpec(), "cpu", time_left_s=10.0).max_time_s == 5.0
    assert StopRule.of(TrainSpec(), "cpu", time_left_s=1000.0).max_time_s == Timing().max_time_s


class FakeTimer:
    """The step timer with given times; counts how often its times are read (a synchronise on CUDA)."""

    kind = "fake"

    def __init__(self, times: list[float]):
        self.feed, self.done, self.reads = iter(times), [], 0

    def start(self) -> None:
        pass

    def stop(self) -> None:
        self.done.append(next(self.feed))

    def times(self) -> list[float]:
        self.reads += 1
        return list(self.done)


def _schedule(times: list[float], timing: Timing, steps: int = 3, check_every: int = 1) -> StepSchedule:
    case = Case(model=preset("llama-tiny"), train=TrainSpec(warmup_steps=1, memory_steps=1, steps=steps,
                                                             timing=timing), batch_size=1, seq_len=8)
    schedule = StepSchedule(case, torch.device("cpu"), [], None)
    schedule.timer = FakeTimer(times)
    # the memory step's probes, left out: no op trace, no allocations to replay
    schedule.marks = SimpleNamespace(result=lambda: {"peak_bytes": 1}, allocations=lambda: None)
    schedule.rule = StopRule.of(case.train, "cpu") if check_every == 1 else \
        StopRule(steps, timing.precision, timing.max_steps, timing.max_time_s, check_every)
    kinds = []
    for k in schedule:  # the loops' `for k in schedule`, with the step itself left out
        kinds.append(schedule.kind(k))
        schedule.begin(k)
        schedule.end(k, 0.0)
    schedule.finish()
    schedule.kinds = kinds
    return schedule


@pytest.mark.parametrize("times,timing,timed,why", [
    (STEADY, Timing(), 6, "precision"),
    (NOISY, Timing(max_steps=12), 12, "max_steps"),
    (NOISY, Timing(max_steps=3), 3, "max_steps"),
])
def test_the_schedule_runs_warm_up_memory_then_timed_steps_until_the_rule_stops_it(times, timing, timed, why):
    s = _schedule(times, timing)
    assert s.kinds == ["warmup", "memory"] + ["timed"] * timed
    record = s.timing()
    assert (record["timed_steps"], record["timing_stopped_by"]) == (timed, why)
    assert list(s.stats.times_s) == times[:timed]
    assert record["timing_target"]["precision"] == timing.precision
    if timed >= 3:
        assert record["step_time_ci_method"] == "order-statistic" and record["step_time_ci_n"] == timed
    if why == "precision":
        lo, hi = record["step_time_ci95_s"]
        median = s.stats.median_s
        assert record["step_time_ci_coverage"] >= 0.95 and max(median - lo, hi - median) <= 0.02 * median


def test_the_schedule_stops_at_the_time_cap_with_the_minimum_timed():
    # the cap is on the host's clock (the fake times are not slept): any step passes a cap of 1 ns
    s = _schedule(NOISY, Timing(max_time_s=1e-9), steps=4)
    assert s.timing()["timed_steps"] == 4 and s.stopped_by == "max_time"
    assert s.timing()["timing_window_s"] > 1e-9
    # reaching the precision and the time cap at one read: the precision is what it says
    s = _schedule([0.1] * 20, Timing(max_time_s=1e-9), steps=6)
    assert s.timing()["timed_steps"] == 6 and s.stopped_by == "precision"


def test_chunked_reads_read_the_times_once_a_chunk():
    s = _schedule(STEADY, Timing(max_steps=40), check_every=4)
    assert s.stopped_by == "precision" and s.timing()["timed_steps"] == 7  # read after steps 3 and 7
    assert s.timer.reads == 2 + 1  # the two reads of the rule, and the window's last one
