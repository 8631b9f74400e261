"""The trace-based step-time model: a setting's step from other points' measured steps, transformed
(ckptbench/theory/time/steptime.py), and the layer clock that measures them in place (measure/layertime.py).
The model's arithmetic is checked on records made here from known figures, exactly; the clock on a real
tiny model, by what it must hold whatever the machine's speed (no time is asserted)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from ckptbench.point.case import Case, preset
from ckptbench.point.strategy import Recompute
from ckptbench.point.training import TrainSpec
from ckptbench.theory.time.steptime import Baseline, added_s, group_key, layer_bytes, predict

FORWARD = (0.010, 0.012, 0.011, 0.013)  # each layer's forward, seconds


def case(batch=2, seq=128, every=0, offload=False, device="cpu", kind="", **recompute) -> Case:
    return Case(preset("llama-small"), TrainSpec(), batch, seq, every_n_layers=every, offload=offload,
                device=device, recompute=Recompute(offload=kind, **recompute))


def record(c: Case, step_s: float, forward=FORWARD, status="ok") -> dict:
    return {"case_id": c.id, "case": c.to_dict(), "status": status,
            "measurement": {"step_time_median_s": step_s, "layer_times": {"forward_s": list(forward)}}}


def test_checkpointing_adds_the_recomputed_layers_measured_forward():
    none = record(case(), 0.200)
    assert predict(case(every=1), [none])["predicted_s"] == pytest.approx(0.200 + sum(FORWARD))
    # every-2 checkpoints layers 0 and 2 (i % n == 0)
    assert predict(case(every=2), [none])["predicted_s"] == pytest.approx(0.200 + FORWARD[0] + FORWARD[2])
    # and the other way: full's step less its recompute is the plain step
    full = record(case(every=1), 0.246)
    p = predict(case(), [full])
    assert p["predicted_s"] == pytest.approx(0.246 - sum(FORWARD))
    assert p["method"] == "transformed" and p["baseline_strategies"] == ["full"]


def test_a_layer_set_recomputes_exactly_its_layers():
    target = case(every=1, layers=(1, 3))
    assert target.checkpointed_layers == [1, 3]
    assert predict(target, [record(case(), 0.2)])["predicted_s"] == pytest.approx(0.2 + FORWARD[1] + FORWARD[3])


def test_baselines_that_checkpoint_fewer_and_more_layers_measure_the_recompute_whole():
    # steps of 0.2 s plus 0.016 s a checkpointed layer: more than the layers' forward (0.0115 s on average),
    # as checkpoint's own bookkeeping costs beside the recomputation
    recs = [record(case(), 0.200), record(case(every=2), 0.232), record(case(every=1, offload=True), 0.264)]
    p = predict(case(every=2, offload=True), [recs[0], recs[2]])  # on a CPU offload moves nothing
    mean = sum(FORWARD) / 4  # layers 0 and 2, each at the fitted rate in proportion to its forward
    assert p["predicted_s"] == pytest.approx(0.2 + 0.016 * (FORWARD[0] + FORWARD[2]) / mean)
    assert p["recompute"] == "recompute fitted to the steps" and len(p["baselines"]) == 2
    # each recomputed layer at the fitted rate, in proportion to its measured forward
    one_layer = predict(case(every=1, layers=(3,)), recs)["predicted_s"]
    assert one_layer == pytest.approx(0.2 + 0.016 * FORWARD[3] / (sum(FORWARD) / 4))


def test_beyond_the_baselines_counts_the_nearest_steps_add_the_measured_forward():
    recs = [record(case(), 0.200), record(case(every=2), 0.232)]
    p = predict(case(every=1), recs)  # layers 0 and 2 measured in the every-2 step, 1 and 3 added
    assert p["predicted_s"] == pytest.approx(0.232 + FORWARD[1] + FORWARD[3])
    assert p["recompute"] == "recompute = the layers' measured forward"


def test_baselines_of_one_count_fall_back_to_the_measured_forward():
    recs = [record(case(every=1), 0.25), record(case(every=1, offload=True), 0.26)]
    p = predict(case(), recs)
    assert p["predicted_s"] == pytest.approx(0.255 - sum(FORWARD))
    assert p["recompute"] == "recompute = the layers' measured forward"


def test_offload_costs_its_copies_on_cuda_and_nothing_on_a_cpu():
    link = 25e9
    gpu = case(every=1, offload=True, device="cuda")
    rec, off = added_s(gpu, FORWARD, link)
    assert rec == pytest.approx(sum(FORWARD))
    # each checkpointed layer's input out in forward and back in backward, on the compute stream
    assert off == pytest.approx(4 * 2 * layer_bytes(gpu) / link)
    assert layer_bytes(gpu) == 2 * 128 * 256 * 4
    assert added_s(case(every=1, offload=True), FORWARD, link)[1] == 0.0
    # streamed: what one layer's forward (out) and two (back) cannot hide
    slow_link = 1e8
    streamed = case(every=1, offload=True, device="cuda", kind="streamed")
    copy = layer_bytes(streamed) / slow_link
    mean = sum(FORWARD) / 4
    assert added_s(streamed, FORWARD, slow_link)[1] == pytest.approx(4 * (max(0, copy - mean) + max(0, copy - 2 * mean)))


def test_the_prediction_says_whether_its_link_was_measured():
    gpu_none = case(device="cuda")
    gpu = case(every=1, offload=True, device="cuda")
    assert predict(gpu, [record(gpu_none, 0.1)])["link"] == "assumed"
    measured = predict(gpu, [record(gpu_none, 0.1)], link_bytes_per_s=50e9)
    assert measured["link"] == "measured"
    assert measured["predicted_s"] == pytest.approx(0.1 + sum(FORWARD) + 4 * 2 * layer_bytes(gpu) / 50e9)


def test_other_shapes_are_fitted_in_tokens_and_attentions_square():
    a, c1, c2 = 0.01, 2e-6, 3e-9

    def truth(b, s):
        return a + c1 * b * s + c2 * b * s * s

    def layer(b, s):
        return (truth(b, s) - a) / 10

    recs = [record(case(batch=b, seq=s), truth(b, s), [layer(b, s)] * 4) for b, s in ((1, 128), (4, 512), (2, 2048))]
    p = predict(case(batch=2, seq=1024), recs)
    assert p["method"] == "fitted"
    assert p["predicted_s"] == pytest.approx(truth(2, 1024), rel=1e-6)
    full = predict(case(batch=2, seq=1024, every=1), recs)
    assert full["predicted_s"] == pytest.approx(truth(2, 1024) + 4 * layer(2, 1024), rel=1e-6)
    # a checkpointed baseline is brought back to no checkpointing before it is fitted
    recs[1] = record(case(batch=4, seq=512, every=1), truth(4, 512) + 4 * layer(4, 512), [layer(4, 512)] * 4)
    assert predict(case(batch=2, seq=1024), recs)["predicted_s"] == pytest.approx(truth(2, 1024), rel=1e-6)
    # never beyond the measured shapes: more tokens than any, or a longer sequence
    assert "error" in predict(case(batch=16, seq=1024), recs)
    assert "error" in predict(case(batch=1, seq=4096), recs)


def test_two_shapes_are_too_few_to_fit():
    recs = [record(case(batch=1, seq=128), 0.1, [0.01] * 4), record(case(batch=4, seq=128), 0.3, [0.03] * 4)]
    assert "3 others around it" in predict(case(batch=2, seq=128), recs)["error"]


def test_the_point_itself_and_other_setups_are_never_baselines():
    target = case(every=1)
    assert "error" in predict(target, [record(target, 0.3)])
    other_model = replace(case(), model=replace(case().model, hidden=512))
    assert group_key(other_model) != group_key(case())
    assert "error" in predict(target, [record(other_model, 0.2)])
    # a different timing target or seed is still the same workload
    retimed = replace(case(), train=replace(case().train, seed=3, steps=9))
    assert group_key(retimed) == group_key(case())
    assert predict(target, [record(retimed, 0.2)])["predicted_s"] == pytest.approx(0.2 + sum(FORWARD))


def test_a_sac_point_is_predicted_only_from_its_own_policy():
    sac = case(every=1, sac="save-matmuls")
    assert "SAC" in predict(sac, [record(case(), 0.2)])["error"]
    recs = [record(case(batch=b, seq=s, every=1, sac="save-matmuls"), 0.1 * b * s / 128)
            for b, s in ((1, 128), (4, 128), (1, 512))]
    assert predict(replace(sac, batch_size=2), recs)["method"] == "fitted"


@pytest.mark.parametrize("bad", [
    {"status": "crash"}, {"forward": [0.01, float("nan"), 0.01, 0.01]}, {"forward": [0.01] * 3},
    {"forward": ["x"] * 4}, {"step": -1.0}, {"step": "fast"}, {"forward": [True] * 4},
])
def test_hostile_records_are_never_baselines(bad):
    rec = record(case(), bad.get("step", 0.2), bad.get("forward", FORWARD), bad.get("status", "ok"))
    assert Baseline.of(rec) is None
    assert "error" in predict(case(every=1), [rec])


def test_a_record_without_a_case_is_skipped():
    assert Baseline.of({"status": "ok", "measurement": {"step_time_median_s": 1.0,
                                                        "layer_times": {"forward_s": [0.1]}}}) is None
    assert Baseline.of({"status": "ok", "case": {"model": 3}, "measurement": {
        "step_time_median_s": 1.0, "layer_times": {"forward_s": [0.1]}}}) is None


def test_compiled_and_multi_rank_points_say_why_they_are_not_predicted():
    assert "compiled" in predict(case(every=0, compile_budget=0.5), [record(case(), 0.2)])["error"]
    assert "multi-rank" in predict(replace(case(), world_size=2), [record(case(), 0.2)])["error"]


def test_the_layer_clock_times_each_layers_forward_in_place_and_never_a_backward():
    import torch

    from ckptbench.measure.layertime import LayerClock
    from ckptbench.train.checkpointing import decoder_layers, enable_checkpointing
    from ckptbench.train.models import build_model, synthetic_batch

    torch.manual_seed(0)
    spec = preset("llama-tiny", layers=3)
    model = build_model(spec, torch.device("cpu"))
    enable_checkpointing(model, 1, False)
    layers = decoder_layers(model)
    clock = LayerClock(layers, torch.device("cpu"), model)
    batch = synthetic_batch(spec.vocab, 2, 32, 0, torch.device("cpu"))
    for k in range(3):
        if k:
            clock.start()
        model(input_ids=batch, labels=batch).loss.backward()  # checkpointed: every layer runs again in backward
        if k:
            clock.stop()
    out = clock.result()
    clock.close()
    assert out["clock"] == "wall" and out["steps"] == 2 and len(out["forward_s"]) == 3
    assert all(t > 0 and math.isfinite(t) for t in out["forward_s"])
    # the layers run inside the model's forward: their sum never exceeds it, step by step
    assert out["layers_forward_s"] <= out["model_forward_s"]
    # one forward a layer a step: the recomputation in backward is not counted as a forward
    assert [len(p) for p in clock.steps[0]] == [1, 1, 1]
    assert not any(layer._forward_hooks or layer._forward_pre_hooks for layer in layers)  # closed


def test_a_twin_of_the_target_is_never_its_baseline():
    """On a CPU full+offload is full's very step, and a seed variant is the same step too: a prediction from
    either would be the observation again, so neither is used; on CUDA offload's copies make it another."""
    none, off = record(case(), 0.200), record(case(every=1, offload=True), 0.246)
    seeded = Case(preset("llama-small"), TrainSpec(seed=7), 2, 128, every_n_layers=1)
    p = predict(case(every=1), [none, off, record(seeded, 0.247)])
    assert p["baseline_strategies"] == ["none"]
    assert p["predicted_s"] == pytest.approx(0.200 + sum(FORWARD))
    only_twins = predict(case(every=1), [off, record(seeded, 0.247)])
    assert "predicted_s" not in only_twins
    gpu = predict(case(every=1, device="cuda"), [record(case(every=1, offload=True, device="cuda"), 0.3)])
    assert gpu["baseline_strategies"] == ["full+offload"]
