"""The step-time model's arithmetic: a trace priced at a rate table, carried to depth, and judged as a prediction."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from ckptbench.spec import Case, TrainSpec, preset
from ckptbench.theory.checks import Check, step_time_check, verdict
from ckptbench.theory.plantime import DatasheetTimer, depth_extrapolated, variants
from ckptbench.theory.steptime import Rates, datasheet_rates, entry_seconds, memory_floor, step_cost


def _entry(key: str, kind: str, counts: dict, flops: int = 0, nbytes: int = 0) -> dict:
    return {"key": key, "op": f"aten.{key}.default", "kind": kind, "flops": flops, "bytes": nbytes,
            "counts": {"forward": 0, "backward": 0, "recompute": 0, "optimizer": 0, **counts}}


ENTRIES = [
    _entry("mm", "matmul", {"forward": 3, "backward": 2}, flops=10**9, nbytes=10**6),  # timed: 2 ms a call
    _entry("view", "view", {"forward": 10}),  # an alias: the dispatcher's 1 us
    _entry("add", "memory", {"backward": 4}, nbytes=2 * 10**6),  # not timed: 2 MB at 1 GB/s + 1 us
    _entry("copy", "copy", {"forward": 1}, nbytes=10**6),  # on a CPU nothing moves
    _entry("mul", "memory", {"forward": 2}, nbytes=3 * 10**6),  # timed hot at 0.1 ms; from memory 3 ms
]
FIXED = Rates("cpu", "a fixed table", per_call_s={"mm": 2e-3, "mul": 1e-4}, dispatch_s=1e-6,
              framework_s_per_op=5e-6, bandwidth_bytes_per_s=1e9)


def test_a_trace_priced_at_a_fixed_rate_table_sums_by_hand():
    cost = step_cost(ENTRIES, FIXED)
    kernel = 5 * 2e-3 + 10 * 1e-6 + 4 * (2e6 / 1e9 + 1e-6) + 0.0 + 2 * 3e6 / 1e9
    framework = (5 + 10 + 4 + 2) * 5e-6  # every dispatched op; the copy is not one
    assert cost.kernel_s == pytest.approx(kernel) and cost.framework_s == pytest.approx(framework)
    assert cost.seconds == pytest.approx(0.024119)
    assert (cost.ops, cost.distinct, cost.modelled) == (21, 5, 1)
    assert cost.by_kind["matmul"] == pytest.approx(10e-3) and cost.by_kind["copy"] == 0.0
    assert cost.by_phase["backward"] == pytest.approx(2 * 2e-3 + 4 * (2.001e-3) + 6 * 5e-6)


def test_a_memory_bound_entry_pays_its_bytes_at_the_in_place_rate_and_its_fresh_bytes_at_the_copies_extra():
    rates = replace(FIXED, inplace_bytes_per_s=2e9)  # a copy spans 1 GB/s, an in-place op 2 GB/s
    lerp = {**_entry("mul", "memory", {"optimizer": 1}, nbytes=3 * 10**6), "fresh_bytes": 0}  # in place
    div = {**_entry("mul", "memory", {"optimizer": 1}, nbytes=3 * 10**6), "fresh_bytes": 10**6}  # out of place
    assert memory_floor(lerp, rates) == pytest.approx(3e6 / 2e9)
    assert memory_floor(div, rates) == pytest.approx(3e6 / 2e9 + 1e6 * (2 / 1e9 - 2 / 2e9))
    # a copy of n bytes (2n spanned, n of them fresh) is its own measurement: 2n over the copy bandwidth
    copy = {**_entry("copy_", "memory", {}, nbytes=2 * 10**6), "fresh_bytes": 10**6}
    assert memory_floor(copy, rates) == pytest.approx(2e6 / 1e9)
    # without the in-place rate, or with a trace that did not file fresh bytes: the bytes over the copy's
    assert memory_floor(div, FIXED) == memory_floor(ENTRIES[4], rates) == pytest.approx(3e6 / 1e9)
    # the floor binds only above the op's timed time: 0.1 ms timed, floors of 1.5 and 2.5 ms
    assert entry_seconds(lerp, rates) == (pytest.approx(1.5e-3), False)
    assert entry_seconds(div, rates) == (pytest.approx(2.5e-3), False)


def test_a_gpu_step_is_the_longer_of_its_kernels_and_its_host_and_copies_cross_the_link():
    gpu = replace(FIXED, device="cuda", host_bound=True, link_bytes_per_s=1e9, launch_s=4e-6)
    assert entry_seconds(ENTRIES[3], gpu) == (pytest.approx(1e-3), True)
    cost = step_cost(ENTRIES, gpu)
    assert cost.seconds == pytest.approx(max(cost.kernel_s, cost.framework_s)) == pytest.approx(0.025004)
    # a view launches no kernel: its host time is the framework's (the H200 had priced 14.8 ms of views on
    # the kernels' side of a 96.6 ms step); on a CPU it is the dispatcher's, beside the kernels
    assert entry_seconds(ENTRIES[1], gpu) == (0.0, False) and entry_seconds(ENTRIES[1], FIXED) == (1e-6, False)
    assert cost.by_kind["view"] == 0.0 and cost.ops == step_cost(ENTRIES, FIXED).ops
    tiny = _entry("relu", "memory", {"forward": 1}, nbytes=8)
    assert entry_seconds(tiny, gpu)[0] == pytest.approx(4e-6 + 1e-6)  # never under a launch


def test_datasheet_rates_name_the_card_and_say_they_are_a_bound():
    rates = datasheet_rates("NVIDIA H100 80GB HBM3", "bf16")
    assert rates.matmul_flops_per_s == 989e12 and rates.bandwidth_bytes_per_s == 3.35e12
    assert rates.source.startswith("datasheet rates of the NVIDIA H100") and "lower bound" in rates.source
    calibrated = datasheet_rates("NVIDIA H100 80GB HBM3", "bf16", matmul_flops_per_s=600e12)
    assert "calibrated matmul rate" in calibrated.source
    assert datasheet_rates("a card nobody knows", "bf16") is None
    mm = _entry("mm", "matmul", {}, flops=989 * 10**9, nbytes=10**6)
    assert entry_seconds(mm, rates)[0] == pytest.approx(1e-3)  # FLOPs at the peak outlast the bytes


def test_depth_is_carried_from_one_and_two_layers_exactly_for_an_affine_price():
    deep = Case(model=preset("llama-8b"), train=TrainSpec(), batch_size=2, seq_len=128, every_n_layers=3)
    layers, checkpointed = 32, len(deep.checkpointed_layers)
    assert checkpointed == 11 and sum(w for _, w in variants(deep)) == 1

    def price(c: Case) -> float:
        return 7.0 + 3.0 * c.model.layers + 0.5 * len(c.checkpointed_layers)

    assert depth_extrapolated(deep, price) == pytest.approx(price(deep))
    shallow = replace(deep, model=preset("llama-tiny", layers=2))
    assert variants(shallow) == [(shallow, 1)] and depth_extrapolated(shallow, price) == price(shallow)
    assert layers == deep.model.layers


def test_datasheet_tokens_per_second_grow_with_the_batch():
    """A launch floor and per-step work (the optimizer) are paid once a step: tokens/s depends on the batch."""
    timer = DatasheetTimer("NVIDIA H100 80GB HBM3")
    spec = preset("llama-tiny", dtype="bf16", attn="sdpa")
    rates = [b * 256 / timer(Case(model=spec, train=TrainSpec(), batch_size=b, seq_len=256, device="cuda"))
             for b in (1, 4, 16)]
    assert rates[0] < rates[1] < rates[2]
    assert "datasheet rates of the NVIDIA H100" in timer.source


@pytest.mark.parametrize("measured, predicted, expected", [(1.05, 1.0, "agrees"), (0.91, 1.0, "agrees"),
                                                           (1.2, 1.0, "off"), (0.8, 1.0, "off"),
                                                           (None, 1.0, "skip"), (1.0, None, "skip")])
def test_the_step_time_is_a_prediction_never_a_verdict(measured, predicted, expected):
    m = {"step_time_median_s": measured, "step_time_model": {"predicted_s": predicted, "source": "a table"}}
    check = step_time_check(m)
    assert check.verdict == expected and check.tolerance == 0.10
    passed = Check("peak_bytes", 1, 1, 1.0, 0.05, "pass")
    assert verdict([passed, check], {}) == "pass"  # off or agrees, the record's verdict is the checks'
    assert verdict([check], {}) == "unchecked"


def test_the_step_check_names_faults_the_replay_did_not_make_without_pricing_them():
    # gpt2-tiny full 16 x 128 on an AMD EPYC (results/reference-step-time-accuracy/run-39): its timed
    # steps faulted 0 to 13,731 times, the replay of its allocations not at all
    model = {"predicted_s": 0.1, "source": "op rates", "fault_price_s": 2.2e-6, "heap_faults_replayed": 0.0}
    m = {"step_time_median_s": 0.125, "step_time_model": model, "step_minor_faults": [0, 6000, 6354, 13731, 9000]}
    check = step_time_check(m)
    assert check.estimated == 0.1 and check.verdict == "off"  # the prediction is untouched
    assert ("a median of 6,354 page faults, 6,354 beyond the replay of their allocations: 0.140 of the "
            "prediction at 2.20 us a fault") in check.difference
    replayed = {**m, "step_time_model": {**model, "heap_faults_replayed": 6000.0}}  # 354 left: 0.8 %
    assert "page faults" not in step_time_check(replayed).difference
    for missing in ("fault_price_s", "heap_faults_replayed"):  # a GPU record, or one without rounds
        bare = {**m, "step_time_model": {k: v for k, v in model.items() if k != missing}}
        assert "page faults" not in step_time_check(bare).difference
    for key, bad in (("fault_price_s", "2.2e-6"), ("fault_price_s", float("nan")), ("heap_faults_replayed", True),
                     ("heap_faults_replayed", float("inf"))):  # what no round measures: no note, no traceback
        odd = {**m, "step_time_model": {**model, key: bad}}
        assert "page faults" not in step_time_check(odd).difference
    nan_counts = {**m, "step_minor_faults": [float("nan"), 6354, True, "7000"]}
    assert "a median of 6,354 page faults" in step_time_check(nan_counts).difference


def test_the_rate_cache_merges_what_parallel_workers_measured(tmp_path):
    from ckptbench.run.ratecache import RateCache

    machine = {"device": "cpu", "device_name": "test", "torch": "0", "threads": 1}
    one, two = RateCache(str(tmp_path), machine), RateCache(str(tmp_path), machine)
    one.add({"a": 1.0})
    two.add({"b": 2.0}, framework={"arch": {"per_op_s": 3e-6}}, figures={"dispatch_s": 1e-6})
    again = RateCache(str(tmp_path), machine)
    assert (again.entry("a"), again.entry("b"), again.figure("dispatch_s")) == (1.0, 2.0, 1e-6)
    assert again.framework("arch")["per_op_s"] == 3e-6 and again.measured_at(["a", "b"], "arch")
    other = RateCache(str(tmp_path), {**machine, "threads": 2})  # another thread count: another file
    assert other.entry("a") is None and other.path != again.path
    assert json.loads(open(again.path).read())["machine"] == machine


def test_a_damaged_or_hostile_rate_file_prices_nothing_it_holds_badly(tmp_path, capsys):
    """A rate file is read as any file in a results folder: a negative, NaN or textual figure (which priced
    a plan at -562 tokens/s, or raised a traceback) is left out, said once, measured again, and the next
    write leaves the file clean; what is well-formed beside it is kept."""
    from ckptbench.run.ratecache import RateCache, cache_path

    machine = {"device": "cpu", "device_name": "test", "torch": "0", "threads": 1}
    path = cache_path(str(tmp_path), machine)
    with open(path, "w") as fh:  # NaN is what json writes for float("nan")
        fh.write(json.dumps({"format": 1, "machine": machine,
                             "entries": {"good": [2e-6, "t"], "neg": [-1.0, "t"], "nan": [float("nan"), "t"],
                                         "text": "x", "bool": [True, "t"], "short": [1e-6]},
                             "figures": {"dispatch_s": [1e-6, "t"], "bandwidth_bytes_per_s": [0, "t"],
                                         "inplace_bytes_per_s": ["fast", "t"]},
                             "framework": {"ok": {"per_op_s": 3e-6, "at": "t", "rounds_per_op_s": [-1e-7, 4e-6]},
                                           "neg": {"per_op_s": -1e-3, "at": "t"}, "text": {"per_op_s": "x"},
                                           "rounds": {"per_op_s": 3e-6, "at": "t", "rounds_per_op_s": "abc"}}}))
    cache = RateCache(str(tmp_path), machine)
    assert cache.data["entries"] == {"good": [2e-6, "t"]}
    assert cache.figure("dispatch_s") == 1e-6 and cache.figure("bandwidth_bytes_per_s") is None
    assert cache.figure("inplace_bytes_per_s") is None and set(cache.data["framework"]) == {"ok"}
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and path in err and "5 of entries" in err and "2 of figures" in err
    assert "3 of framework" in err and "measured again" in err
    RateCache(str(tmp_path), machine)  # read again in the same process: said once
    assert capsys.readouterr().err == ""
    cache.add({"new": 1e-6})
    on_disk = json.loads(open(path).read())
    assert set(on_disk["entries"]) == {"good", "new"} and set(on_disk["figures"]) == {"dispatch_s"}
    with open(path, "w") as fh:
        fh.write(json.dumps({"format": 1, "machine": machine, "entries": [], "figures": 3}))
    broken = RateCache(str(tmp_path), machine)  # parts that are not mappings: nothing from them, no traceback
    assert broken.entry("good") is None and broken.figure("dispatch_s") is None


def test_an_op_is_timed_from_its_signature_and_an_unreplayable_one_says_why():
    import torch

    from ckptbench.measure.oprates import time_entry
    from ckptbench.measure.optrace import OpRecorder

    recorder = OpRecorder()
    with recorder:
        torch.ones(64, 32) @ torch.ones(32, 16)
    mm = next(e for e in recorder.trace() if e["op"] == "aten.mm.default")
    assert mm["flops"] == 2 * 64 * 32 * 16 and time_entry(mm) > 0
    odd = {**mm, "key": json.dumps(["aten.mm.default", [["object", "Thing"], ["object", "Thing"]], {}])}
    assert time_entry(odd) is None and "NotReplayable" in odd["replay_error"]


def test_a_plan_where_nothing_fits_says_no_step_was_priced_and_an_unknown_card_is_named(capsys):
    """Llama-8B's full AdamW step does not fit an H100 at 8k tokens: no step is priced, and the plan says so
    rather than blaming the card's datasheet; a card the tables lack is named as such."""
    from ckptbench.cli import main

    assert DatasheetTimer("NVIDIA H100 80GB HBM3").source == ""
    unknown = DatasheetTimer("Imaginary Card 1")
    spec = preset("llama-tiny", dtype="bf16", attn="sdpa")
    assert unknown(Case(model=spec, train=TrainSpec(), batch_size=1, seq_len=64, device="cuda")) is None
    assert unknown.source == "unknown: the card is not in the datasheet tables"
    assert main(["plan", "--model", "llama-8b", "--device", "h100", "--seq", "8192", "--dtype", "bf16",
                 "--attn", "sdpa"]) == 0
    out = capsys.readouterr().out
    assert "recommended: nothing fits" in out and "step time: none predicted (no setting fits)" in out


def test_rate_rounds_time_every_replayable_op_between_steps_within_their_share():
    """A round times each non-view entry once; the first comes after the first timed step, the next only
    while the rounds have cost less than their share of the steps' time; no trace, no rounds."""
    import torch

    from ckptbench.measure.optrace import OpRecorder
    from ckptbench.run.raterounds import SHARE, RateRounds

    recorder = OpRecorder()
    with recorder:
        a = torch.ones(64, 32)
        (a @ torch.ones(32, 16)).t().sum()
    trace = recorder.trace()
    timed = {e["key"] for e in trace if e["kind"] != "view"}
    assert any(e["kind"] == "view" for e in trace) and len(timed) >= 3  # ones, mm, sum; the transpose a view
    odd = {"key": json.dumps(["aten.mm.default", [["object", "Thing"]], {}]), "op": "aten.mm.default",
           "kind": "matmul", "flops": 0, "bytes": 0, "counts": {}}  # not replayable: never in the medians

    rounds = RateRounds("cpu")
    rounds.offer(steps_s=1.0)
    assert rounds.rounds == 0  # before the memory step recorded its ops there is nothing to time
    rounds.use(trace + [odd])
    rounds.offer(steps_s=0.0)  # the first round comes whatever the steps cost
    assert rounds.rounds == 1 and set(rounds.result()["per_call_s"]) == timed
    rounds.spent_s = SHARE * 2.0
    rounds.offer(steps_s=2.0)  # the rounds have had their share: no round
    assert rounds.rounds == 1
    rounds.offer(steps_s=2.0 + 1e-3)
    assert rounds.rounds == 2 and all(len(v) == 2 for v in rounds.per_key.values())
    result = rounds.result()
    assert result["rounds"] == 2 and all(v > 0 for v in result["per_call_s"].values())

    empty = RateRounds("cpu")
    empty.use(None)
    empty.offer(steps_s=0.0)
    assert empty.result() == {"per_call_s": {}, "faults_per_call": {}, "faults_apart": False,
                              "heap_faults": None, "heap_fault_s": None, "fault_s": None,
                              "rounds": 0, "seconds": 0.0, "probe": None, "probe_error": None,
                              "bandwidths": [], "heap_faults_rounds": [], "heap_fault_prices": [], "heap_replay": None,
                              "figures": {"bandwidth_bytes_per_s": None, "inplace_bytes_per_s": None}}
    assert empty._buffers is None  # no trace, no rounds: no copy's buffers made either


def test_a_prediction_takes_the_rates_timed_between_the_steps_over_the_cache(tmp_path):
    """An entry the rounds timed is priced at the rounds' median, not at what the cache held; the cache
    keeps the rounds' figure for the next point; an entry no round timed comes from the cache."""
    import torch

    from ckptbench.measure.optrace import OpRecorder
    from ckptbench.run.ratecache import RateCache, machine_facts
    from ckptbench.run.steptime import _timed

    recorder = OpRecorder()
    with recorder:
        torch.ones(64, 32) @ torch.ones(32, 16)
    trace = recorder.trace()
    mm = next(e["key"] for e in trace if e["op"] == "aten.mm.default")
    other = [e["key"] for e in trace if e["kind"] != "view" and e["key"] != mm]
    cache = RateCache(str(tmp_path), machine_facts("cpu", 1))
    cache.add({k: 7.0 for k in [mm, *other]})
    found, now = _timed(trace, cache, "cpu", fresh={mm: 3e-6})
    assert found[mm] == 3e-6 and all(found[k] == 7.0 for k in other) and now == 1
    assert RateCache(str(tmp_path), machine_facts("cpu", 1)).entry(mm) == 3e-6


def test_rate_rounds_never_run_on_cuda_where_the_allocator_reserve_is_measured():
    from ckptbench.run.raterounds import RateRounds

    rounds = RateRounds("cuda")
    rounds.use([_entry("mm", "matmul", {"forward": 1})])
    rounds.offer(steps_s=0.0)
    assert rounds.entries is None and rounds.rounds == 0


def test_a_prediction_prices_the_step_s_faults_at_the_replay_s_price_and_a_fresh_mapping_s_without_one(tmp_path):
    """The rounds' replay gives the step's faults and what one cost in its pattern of allocations: the
    prediction prices them there, keeps the fresh mapping's price beside it, and falls back to that price
    only where no replay priced a fault."""
    from ckptbench.run.steptime import predict

    case = Case(model=preset("llama-tiny", layers=1, attn="sdpa"), train=TrainSpec(threads=1), batch_size=1,
                seq_len=8)
    rounds = {"heap_faults": 1_000, "heap_fault_s": 5e-6, "fault_s": 2e-6, "faults_apart": True}
    replayed = predict(case, str(tmp_path), rounds=rounds)
    assert replayed["heap_faults"] == 1_000 and replayed["fault_s"] == pytest.approx(5e-3)
    assert replayed["heap_fault_price_s"] == 5e-6 and replayed["fault_price_s"] == 2e-6
    assert replayed["predicted_s"] == pytest.approx(replayed["kernel_s"] + replayed["framework_s"] + 5e-3)
    fresh = predict(case, str(tmp_path), rounds={**rounds, "heap_fault_s": None})
    assert fresh["fault_s"] == pytest.approx(2e-3) and fresh["heap_fault_price_s"] == 2e-6
    assert predict(case, str(tmp_path), rounds={})["heap_fault_price_s"] is None  # no replay, no price


def test_with_a_malloc_log_the_rounds_count_and_price_the_step_faults_from_its_replay_alone():
    """Where the worker has the malloc log, the first timed step (and only it) is logged; each round's count
    is that log's replay and its price the replay's page-sized faulting blocks, never the tensor replay's
    (a handful of tensor-replay faults once priced thousands of malloc-replay faults at 86 µs each)."""
    import torch

    from ckptbench.measure.optrace import OpRecorder
    from ckptbench.run.raterounds import RateRounds

    class Log:  # the preloaded library's interface, its replay's figures fixed
        events, dropped, started = 0, 0, 0

        def start(self):
            self.started += 1

        def stop(self):
            self.events = 11_459

        def replay(self, clock=None):
            return 6_000, 4_000, 4_000 * 2e-6

    recorder = OpRecorder()
    with recorder:
        torch.ones(64, 32).sum()
    rounds = RateRounds("cpu")
    rounds.use(recorder.trace(), [2**30, -(2**30)])  # the tensor replay: a GiB block, a fault a page
    rounds.malloc_log = log = Log()
    rounds.before_step()
    rounds.after_step()
    rounds.offer(steps_s=0.0)
    rounds.before_step()
    rounds.after_step()
    assert log.started == 1 and rounds.rounds == 1
    result = rounds.result()
    assert result["heap_faults"] == 6_000 and result["heap_faults_rounds"] == [6_000]
    assert result["heap_fault_s"] == pytest.approx(2e-6) and result["heap_fault_prices"] == [pytest.approx(2e-6)]
    assert result["heap_replay"] == "every malloc and free of the first timed step (11,459 calls)"
