"""Heap page faults in the step-time model: the step's allocations replayed for their faults, a fault's
price, the ops' own faults left out, and the sum priced beside the ops."""

from __future__ import annotations

import pytest

from ckptbench.measure.heapfaults import PAGE, fault_price, minor_faults, replay_priced
from ckptbench.run.steptime import heap_faults
from ckptbench.theory.steptime import Rates, step_cost

BIG = 384 * 2**20  # beyond glibc's largest mmap threshold (32 MiB) and any block this process freed before


def _entry(key: str, counts: dict) -> dict:
    return {"key": key, "op": f"aten.{key}.default", "kind": "memory", "flops": 0, "bytes": 0,
            "counts": {"forward": 0, "backward": 0, "recompute": 0, "optimizer": 0, **counts}}


def test_a_replayed_block_mapped_afresh_faults_once_per_page_and_a_freed_block_of_its_size_is_reused():
    """Two big blocks live together are two fresh mappings: a fault on every page of each; a block made
    after one of its size was freed by the replay is mapped again (glibc unmaps blocks that big), while a
    free of a size the replay never made (a tensor from before the step) is skipped, not an error."""
    pages = BIG // PAGE
    together = replay_priced([BIG, BIG, -BIG, -BIG])[0]
    assert 2 * pages <= together <= 2 * pages + 64
    in_turn = replay_priced([-12345, BIG, -BIG, BIG, -BIG])[0]
    assert 2 * pages <= in_turn <= 2 * pages + 64
    before = minor_faults()
    assert replay_priced([])[0] == 0 and minor_faults() - before < 64
    small = replay_priced([4096, -4096] * 100)[0]  # the heap's own reused chunk: a handful at most
    assert small < 100


def test_the_replay_times_only_the_blocks_that_faulted_made_and_freed_by_the_clock_it_is_asked_for():
    """A big block faults on every page: its making and its freeing are timed (one tick each by a clock
    that ticks once a reading); a free of a size never made is skipped, untimed; blocks small enough to come
    back from glibc's heap take no fault and add no time."""
    ticks = []

    def clock():
        ticks.append(1)
        return float(len(ticks))

    faults, seconds = replay_priced([-12345, BIG, -BIG], clock)
    assert BIG // PAGE <= faults <= BIG // PAGE + 64 and seconds == 2.0
    replay_priced([4096, -4096])  # the heap's chunk for that size, mapped once
    faults, seconds = replay_priced([4096, -4096] * 50, clock)
    assert faults < 10 and seconds <= 2 * faults  # a stray fault of the interpreter's own, at most
    faults, seconds = replay_priced([BIG, -BIG])
    assert 0 < seconds / faults < 1e-3  # by time.perf_counter: microseconds a fault, never a millisecond


def test_a_fault_costs_a_positive_time_by_the_clock_it_is_asked_for():
    calls = []

    def clock():
        calls.append(1)
        return float(len(calls))  # one "second" between readings: the price is 1 / faults

    price = fault_price(clock)
    assert len(calls) == 2 and price == pytest.approx(1 / (64 * 2**20 // PAGE), rel=0.01)
    import time

    assert 0 < fault_price(time.thread_time) < 1e-3  # a page zeroed: microseconds, never a millisecond


def test_the_step_pays_only_the_faults_its_ops_did_not_take_when_timed():
    entries = [_entry("mul", {"forward": 2, "backward": 1}), _entry("add", {"optimizer": 4}),
               {**_entry("alias", {"forward": 9}), "kind": "view"}]
    rounds = {"heap_faults": 10_000, "faults_per_call": {"mul": 1_000.0, "add": 0.5, "alias": 99.0}}
    assert heap_faults(entries, rounds) == pytest.approx(10_000 - 3 * 1_000 - 4 * 0.5)  # a view never timed
    assert heap_faults(entries, {**rounds, "heap_faults": 2_000}) == 0.0  # never fewer than none
    assert heap_faults(entries, {"faults_per_call": rounds["faults_per_call"]}) == 0.0  # no replay, no faults


def test_faults_are_priced_beside_the_ops_on_a_cpu_and_not_on_a_gpu_whose_host_runs_ahead():
    entries = [_entry("mul", {"forward": 2})]
    cpu = Rates("cpu", "a fixed table", per_call_s={"mul": 1e-3}, framework_s_per_op=1e-5, fault_s=2e-6)
    cost = step_cost(entries, cpu, heap_faults=500)
    assert cost.fault_s == pytest.approx(1e-3) and cost.heap_faults == 500
    assert cost.seconds == pytest.approx(2e-3 + 2e-5 + 1e-3)
    assert step_cost(entries, cpu).seconds == pytest.approx(2e-3 + 2e-5)
    gpu = Rates("cuda", "a fixed table", per_call_s={"mul": 1e-3}, framework_s_per_op=1e-5, fault_s=2e-6,
                host_bound=True)
    assert step_cost(entries, gpu, heap_faults=500).seconds == pytest.approx(2e-3)


def test_an_op_whose_output_is_mapped_afresh_each_call_faults_every_call_when_timed():
    """The faults `measure_entries` reports per call: a big output (unmapped when freed) every page, every
    call; a small one's memory comes back from glibc already mapped."""
    import torch

    from ckptbench.measure.oprates import measure_entries
    from ckptbench.measure.optrace import OpRecorder

    recorder = OpRecorder()
    with recorder:
        torch.ones(BIG // 4) * 2.0
        torch.ones(256) * 2.0
    entries = [e for e in recorder.trace() if e["op"] == "aten.mul.Tensor"]
    faults: dict = {}
    timed = measure_entries(entries, "cpu", trials=1, faults=faults)
    assert set(faults) == set(timed) == {e["key"] for e in entries}
    big, small = sorted(faults.values(), reverse=True)
    assert BIG // PAGE <= big <= BIG // PAGE + 64 and small < 1


def test_each_rounds_op_times_lose_their_own_faults_at_that_rounds_price_and_the_replay_is_priced_whole():
    """Every round: an op's time less the faults it took in that round's timing, at the price that round
    measured (a round whose price was not had: the median price); the median over rounds.  Then the step's
    replayed faults are all priced, none taken off for the ops'.  Without any price the ops keep their
    times and only the faults beyond theirs are priced."""
    from ckptbench.run.raterounds import RateRounds

    rounds = RateRounds("cpu")
    rounds.per_key = {"mul": [(5e-3, 1_000.0, 0), (2e-3, 0.0, 1), (6e-3, 2_000.0, 2)],
                      "add": [(1e-3, 0.0, 0), (1e-3, 0.0, 1), (1e-3, 0.0, 2)]}
    rounds.prices = [2e-6, None, 1e-6]  # the middle round's price: the median of the others, 1.5 us
    rounds.replays, rounds.rounds = [(9_000, 0.045), (8_000, 0.032), (10_000, 0.06)], 3
    # each round's replay at its end: the price's (one took no fault, and counts for nothing)
    rounds.repriced = [(12_000, 0.06), (0, 0.001), (11_000, 0.044)]
    result = rounds.result()
    # the first replays' median count; the last replays' seconds over their faults, all rounds together
    assert result["heap_faults"] == 9_000 and result["heap_fault_s"] == pytest.approx(0.104 / 23_000)
    assert result["heap_faults_rounds"] == [9_000, 8_000, 10_000]
    assert result["heap_fault_prices"] == [pytest.approx(5e-6), None, pytest.approx(4e-6)]
    # mul: 5 ms - 1000 x 2 us = 3 ms; 2 ms; 6 ms - 2000 x 1 us = 4 ms: median 3 ms
    assert result["per_call_s"]["mul"] == pytest.approx(3e-3) and result["per_call_s"]["add"] == pytest.approx(1e-3)
    assert result["faults_apart"] and result["fault_s"] == pytest.approx(1.5e-6)
    assert result["faults_per_call"] == {"mul": 1_000.0, "add": 0.0}
    entries = [{"key": "mul", "kind": "memory", "counts": {"forward": 3}}]
    assert heap_faults(entries, result) == 9_000  # all of the replay: the ops' times hold none of it
    rounds.prices = [None, None, None]
    unpriced = rounds.result()
    assert not unpriced["faults_apart"] and unpriced["per_call_s"]["mul"] == pytest.approx(5e-3)
    assert heap_faults(entries, unpriced) == 9_000 - 3 * 1_000  # the ops' own faults are in their times
