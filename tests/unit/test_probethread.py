"""The framework probe stepped between a point's own steps (run/probethread.py), the rounds that step it
(run/raterounds.py) and the framework's time priced from its rounds (run/steptime.py)."""

from __future__ import annotations

import json
import random
import statistics
import threading

import pytest
import torch

from ckptbench.measure.stopping import StopRule
from ckptbench.spec import Case, Setup, TrainSpec, preset


def _case(loop: str = "manual", every: int = 1, offload: bool = False) -> Case:
    model = preset("gpt2-tiny")
    return Case(model=model, train=TrainSpec(), batch_size=1, seq_len=8, every_n_layers=every, offload=offload,
                setup=Setup(loop=loop))


@pytest.fixture
def fresh_accelerate():
    """accelerate's process-wide state as a worker starts with it: none (a test before this one may have
    left an Accelerator of another precision, which a worker process, one point each, never has)."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    yield
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


@pytest.mark.parametrize("loop", ["manual", "accelerate", "trainer"])
def test_the_probe_takes_one_step_per_call_through_the_points_loop_in_a_thread_of_its_own(loop, fresh_accelerate):
    """Each call runs one timed probe step and one timing of its ops, then the probe waits: never a step
    more than asked for; its steps ran in another thread, at the point's thread count (one: CPU time);
    the point's random generators are as the point left them; closing ends the thread."""
    from ckptbench.run.probethread import ProbeThread

    torch.set_num_threads(1)
    torch.manual_seed(1234)
    random.seed(99)
    before = torch.random.get_rng_state(), random.getstate()
    probe = ProbeThread(_case(loop))
    for calls in (1, 2, 3):
        assert probe.step(), probe.error
        assert len(probe.schedule.steps) == len(probe.schedule.timed) == calls  # parked again after each
    assert torch.equal(torch.random.get_rng_state(), before[0]) and random.getstate() == before[1]
    assert probe.schedule.cpu  # the thread ran one torch thread: its steps are timed in its own CPU time
    assert probe._thread.is_alive() and probe._thread is not threading.current_thread()
    probe.close()
    assert not probe._thread.is_alive() and probe.error is None
    result = probe.result()
    replayable = {e["key"] for e in result["trace"] if e["kind"] != "view"}
    assert len(result["steps_s"]) == 3 and min(result["steps_s"]) > 0
    assert all(set(t) <= replayable and len(t) >= 0.9 * len(replayable) for t in result["timed"])
    assert result["label"].startswith("gpt2-") and "b=1 s=16" in result["label"]


def _can_pin() -> bool:
    import os

    from ckptbench.run.probethread import current_cpu

    return hasattr(os, "sched_setaffinity") and current_cpu() is not None


@pytest.mark.skipif(not _can_pin(), reason="this system cannot say or set which core a thread runs on")
def test_a_handover_holds_both_threads_on_the_points_core_and_gives_the_point_its_cores_back():
    """Inside a handover the point's thread and the probe's run on the one core the point was on; after
    it (an exception too) the point's thread has its own cores again."""
    import os

    from ckptbench.run.probethread import _one_core

    allowed = os.sched_getaffinity(0)
    done = threading.Event()  # the helper lives until the test is through with it, however slow the machine
    helper = threading.Thread(target=done.wait, daemon=True)
    helper.start()
    try:
        with _one_core(helper.native_id):
            inside, probe_cores = os.sched_getaffinity(0), os.sched_getaffinity(helper.native_id)
        assert len(inside) == 1 and inside == probe_cores and inside <= allowed
        assert os.sched_getaffinity(0) == allowed
        with pytest.raises(RuntimeError), _one_core(helper.native_id):
            raise RuntimeError("a failed handover")
        assert os.sched_getaffinity(0) == allowed
    finally:
        done.set()
        helper.join()
    # a thread that cannot be pinned (gone): the handover goes on unpinned.  Not an ended thread's id: on a
    # busy machine the kernel hands that id to a new thread within the test (pid_max 32768 here), which is
    # then pinned; none has an id beyond the kernel's limit on them (PID_MAX_LIMIT, 2**22 on 64 bits)
    with _one_core(2**22 + 1):
        assert os.sched_getaffinity(0) == allowed


@pytest.mark.skipif(not _can_pin(), reason="this system cannot say or set which core a thread runs on")
@pytest.mark.parametrize("threads", [1, 2])
def test_the_probe_steps_on_the_points_core_with_one_torch_thread_only(threads):
    """One torch thread: the probe's thread is left pinned to the core the point's thread ran its handover
    on, and the point's thread has its cores back; more threads (an OpenMP team would inherit one core):
    neither is pinned."""
    import os

    from ckptbench.run.probethread import ProbeThread

    allowed = os.sched_getaffinity(0)
    torch.set_num_threads(threads)
    try:
        probe = ProbeThread(_case())
        assert probe.step(), probe.error
        probe_cores = os.sched_getaffinity(probe._thread.native_id)
        assert os.sched_getaffinity(0) == allowed
        assert (len(probe_cores) == 1 and probe_cores <= allowed) if threads == 1 else probe_cores == allowed
        probe.close()
    finally:
        torch.set_num_threads(1)


def test_a_probe_that_cannot_run_says_why_and_never_leaves_the_point_waiting(monkeypatch):
    from ckptbench.run import probethread

    def broken(*args, **kwargs):
        raise RuntimeError("no such loop here")

    monkeypatch.setattr(probethread, "_probe", broken)
    probe = probethread.ProbeThread(_case())
    assert probe.step() is False and probe.error == "RuntimeError: no such loop here"
    probe.close()
    assert probe.result() is None


def test_the_probe_ends_inside_an_offloaded_points_context_as_it_found_it():
    """An offloaded point's probe enters the same offload context in its thread and leaves it before the
    point does: the patched name is the point's again once the probe has closed."""
    import transformers.modeling_utils as mu

    from ckptbench.run.probethread import ProbeThread
    from ckptbench.train.checkpointing import offload_for

    torch.set_num_threads(1)
    case = _case(offload=True)
    outside = mu.save_on_cpu
    with offload_for(case):
        inside = mu.save_on_cpu
        probe = ProbeThread(case)
        assert probe.step() and probe.step(), probe.error
        probe.close()
        assert mu.save_on_cpu is inside
    assert mu.save_on_cpu is outside


def test_min_rounds_are_spread_over_the_step_cap_beyond_the_share():
    """With the share spent, a point still gets MIN_ROUNDS rounds, one every cap/MIN_ROUNDS steps (the
    FIRST_ROUNDS spread over its expected steps falling among them); past them only the share adds rounds."""
    from ckptbench.measure.optrace import OpRecorder
    from ckptbench.run.raterounds import FIRST_ROUNDS, MIN_ROUNDS, RateRounds

    recorder = OpRecorder()
    with recorder:
        torch.ones(8, 4) @ torch.ones(4, 2)
    # steps of a millisecond: the share never admits a round, and 20 s of them would pass the cap of 50
    rounds = RateRounds("cpu", StopRule(3, 0.02, 5 * MIN_ROUNDS, 20.0))
    rounds.use(recorder.trace(), sequence=[1 << 20, -(1 << 20)])
    rounds.spent_s = 1.0  # the rounds dear: only the spreads admit one
    after = []
    for step in range(1, 5 * MIN_ROUNDS + 1):
        before = rounds.rounds
        rounds.offer(steps_s=step * 1e-3, step=step)
        if rounds.rounds > before:
            after.append(step)
    # FIRST_ROUNDS over the 50 steps expected (1, 17, 34) and MIN_ROUNDS over the cap (one every 5 steps)
    assert FIRST_ROUNDS == 3 and after == [1] + [5 * k for k in range(1, MIN_ROUNDS)]
    result = rounds.result()
    assert result["probe"] is None  # no Case: no framework probe
    # every round replays the allocations, counts each op's own faults and prices a fault
    assert result["heap_faults"] is not None and result["faults_per_call"] and len(rounds.replays) == MIN_ROUNDS
    assert all(len(v) == MIN_ROUNDS for v in rounds.per_key.values()) and len(rounds.prices) == MIN_ROUNDS
    # every round read the copy bandwidth beyond the caches on buffers kept between rounds, freed at the
    # end; the figure is the rounds' median, and the record keeps each round's, and each replay's faults
    assert len(rounds.bandwidths) == MIN_ROUNDS and result["bandwidths"] == rounds.bandwidths
    assert result["figures"]["bandwidth_bytes_per_s"] == statistics.median(rounds.bandwidths)
    assert result["heap_faults_rounds"] == [f for f, _ in rounds.replays]
    assert result["heap_faults"] == statistics.median(result["heap_faults_rounds"])
    assert len(result["heap_fault_prices"]) == MIN_ROUNDS
    # and one in-place pass over the copy's source, which it leaves as it found it
    assert len(rounds.inplace) == MIN_ROUNDS and result["figures"]["inplace_bytes_per_s"] > 0
    assert rounds._buffers is None


def test_a_round_counts_the_step_s_faults_first_and_prices_them_last(monkeypatch):
    """The replay that counts the step's faults meets glibc's heap as the step left it: it runs before
    anything else in the round allocates (the ops' timings).  The one that prices them runs after the ops'
    timings, the step's freed memory as long unused as the next step finds it.  The copy's buffers are made
    before the first timed step, so that the first round's copy does not meet them still in the cache."""
    from ckptbench.measure import heapfaults, oprates
    from ckptbench.measure.optrace import OpRecorder
    from ckptbench.run.raterounds import RateRounds

    recorder = OpRecorder()
    with recorder:
        torch.ones(8, 4) @ torch.ones(4, 2)
    calls = []

    def spy(name, real):
        def call(*args, **kwargs):
            calls.append(name)
            return real(*args, **kwargs)
        return call

    monkeypatch.setattr(heapfaults, "replay_priced", spy("replay", heapfaults.replay_priced))
    monkeypatch.setattr(heapfaults, "fault_price", spy("price", heapfaults.fault_price))
    monkeypatch.setattr(oprates, "copy_once", spy("copy", oprates.copy_once))
    monkeypatch.setattr(oprates, "measure_entries", spy("ops", oprates.measure_entries))
    rounds = RateRounds("cpu")
    rounds.use(recorder.trace(), sequence=[1 << 20, -(1 << 20)])
    assert rounds._buffers and calls == []  # the copy's buffers are made before the timed steps, not timed
    rounds.offer(steps_s=1.0, step=1)
    assert calls == ["replay", "copy", "ops", "replay", "price"] and rounds.rounds == 1
    assert len(rounds.bandwidths) == 1 and len(rounds.replays) == len(rounds.repriced) == 1


def test_the_first_rounds_are_spread_over_the_steps_a_point_is_expected_to_time_and_end_by_the_deadline():
    """Beyond the share, FIRST_ROUNDS rounds spread over the steps the point is expected to time: a step of
    10 s stops at its minimum of three (20 s cap on timed seconds) and gets a round after each; a step of
    1.5 s is expected to time 14 and gets them after steps 1, 5 and 10, not bunched after its first three.
    A round beyond the share that would end past the deadline (at the rounds' mean cost) does not start;
    the first does."""
    import time

    from ckptbench.measure.optrace import OpRecorder
    from ckptbench.run.raterounds import RateRounds

    recorder = OpRecorder()
    with recorder:
        torch.ones(8, 4) @ torch.ones(4, 2)
    rule = StopRule(3, 0.02, 200, 20.0)  # the spread over the cap, one round every 20 steps, not met here

    def rounds_after(step_s, deadline=None, steps=4):
        rounds = RateRounds("cpu", rule, deadline=deadline)
        rounds.use(recorder.trace(), sequence=[1 << 20, -(1 << 20)])
        after = []
        for step in range(1, steps + 1):
            before = rounds.rounds
            rounds.spent_s = max(rounds.spent_s, 1e3) if rounds.rounds else 0.0  # rounds dear: no share
            rounds.offer(steps_s=step * step_s, step=step)
            after += [step] * (rounds.rounds - before)
        return after, rounds

    assert rule.expected_steps(10.0) == 3 and rule.expected_steps(1.5) == 14 and rule.expected_steps(1e-3) == 200
    after, rounds = rounds_after(10.0)
    assert after == [1, 2, 3] and len(rounds.replays) == 3 and all(len(v) == 3 for v in rounds.per_key.values())
    assert rounds_after(1.5, steps=12)[0] == [1, 5, 10]
    assert rounds_after(10.0, time.perf_counter() + 3600)[0] == [1, 2, 3]
    # a round's mean cost is 1,000 s here: half a second before the deadline, only the first round starts
    assert rounds_after(10.0, time.perf_counter() + 0.5)[0] == [1]


def test_rounds_go_on_without_the_copy_where_its_buffers_cannot_be_had(monkeypatch):
    from ckptbench.measure import oprates
    from ckptbench.measure.optrace import OpRecorder
    from ckptbench.run.raterounds import RateRounds

    def refused(*args, **kwargs):
        raise MemoryError  # as a point near its --memory-gib cap would be refused 256 MiB

    monkeypatch.setattr(oprates, "copy_buffers", refused)
    recorder = OpRecorder()
    with recorder:
        torch.ones(8, 4) @ torch.ones(4, 2)
    rounds = RateRounds("cpu", StopRule(3, 0.02, 3, 20.0))
    rounds.use(recorder.trace())
    for step in (1, 2, 3):
        rounds.offer(steps_s=0.0, step=step)
    result = rounds.result()
    assert result["rounds"] == 3 and result["per_call_s"]
    assert result["figures"] == {"bandwidth_bytes_per_s": None, "inplace_bytes_per_s": None}


def test_the_framework_per_op_is_each_rounds_step_less_its_ops_as_that_round_timed_them():
    from ckptbench.run.steptime import framework_from_rounds

    def entry(key, kind, counts):
        return {"key": key, "op": f"aten.{key}.default", "kind": kind, "flops": 0, "bytes": 8,
                "counts": {"forward": 0, "backward": 0, "recompute": 0, "optimizer": 0, **counts}}

    trace = [entry("mm", "matmul", {"forward": 2, "backward": 2}), entry("view", "view", {"forward": 6})]
    figures = {"dispatch_s": 1e-6, "bandwidth_bytes_per_s": 1e9}
    probe = {"trace": trace, "steps_s": [1e-3, 2e-3, 4e-3], "label": "x",
             "timed": [{"mm": 1e-4}, {"mm": 2e-4}, {"mm": 1e-4}]}
    found = framework_from_rounds(probe, figures, "cpu")
    # 10 ops: 4 mm calls, 6 views at the dispatcher's 1 us
    by_hand = [(1e-3 - 4e-4 - 6e-6) / 10, (2e-3 - 8e-4 - 6e-6) / 10, (4e-3 - 4e-4 - 6e-6) / 10]
    assert found["rounds_per_op_s"] == pytest.approx(by_hand)
    assert found["per_op_s"] == pytest.approx(by_hand[1]) and found["step_s"] == 2e-3
    assert found["probe"] == "x, one step in each of the point's 3 rate rounds"
    json.dumps(found)  # the record keeps it


def test_a_prediction_takes_the_bandwidth_and_framework_measured_between_the_steps(tmp_path):
    """The rounds' copy bandwidth replaces the cache's figure, and the framework's time comes from the probe's
    rounds, not from the architecture's cached probe."""
    from ckptbench.measure.optrace import OpRecorder
    from ckptbench.run.ratecache import RateCache, machine_facts
    from ckptbench.run.steptime import architecture_key, measured_rates

    case = _case()
    cache = RateCache(str(tmp_path), machine_facts("cpu", 1))
    cache.add({}, figures={"dispatch_s": 1e-6, "bandwidth_bytes_per_s": 5e9, "inplace_bytes_per_s": 7e9})
    cache.add({}, framework={architecture_key(case): {"per_op_s": 9e-6, "probe": "cached"}})
    recorder = OpRecorder()
    with recorder:
        torch.ones(8, 4) @ torch.ones(4, 2)
    trace = recorder.trace()
    rates, how = measured_rates(case, trace, cache)
    assert rates.bandwidth_bytes_per_s == 5e9 and rates.framework_s_per_op == 9e-6 and how["framework"]["probe"] == "cached"
    assert rates.inplace_bytes_per_s == 7e9
    probe = {"trace": trace, "steps_s": [1e-3], "timed": [{}], "label": "p"}
    between = {"bandwidth_bytes_per_s": 2e10, "inplace_bytes_per_s": 3e10}
    rates, how = measured_rates(case, trace, cache, probe=probe, between=between)
    assert rates.bandwidth_bytes_per_s == 2e10 and how["framework"]["probe"].startswith("p, one step in each")
    assert rates.inplace_bytes_per_s == 3e10
    assert rates.framework_s_per_op == how["framework"]["per_op_s"] != 9e-6


def test_an_in_place_pass_puts_its_buffers_values_back():
    from ckptbench.measure.oprates import inplace_once

    buffer = torch.ones(1 << 16)
    rates = [inplace_once(buffer) for _ in range(200)]
    assert all(r > 0 for r in rates)
    # two passes a call, by 1/0.37 and by 0.37: the values stay at 1 (no denormals a slow path would meet)
    assert torch.allclose(buffer, torch.ones(1 << 16), rtol=1e-4)
