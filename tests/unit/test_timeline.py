"""The memory step's timeline and per-layer saved bytes: the timeline's maximum is the exact peak the record
reports, its marks fall where the step's own figures say, it stays within its bound however long the step,
and the layers' saved bytes add up to the record's saved_bytes (the rest saved outside any layer)."""

from __future__ import annotations

import copy
import random
from array import array
from contextlib import nullcontext

import pytest
import torch

from ckptbench.measure import timeline as tl_mod
from ckptbench.measure.timeline import CudaHistory, Timeline, downsample, replay
from ckptbench.point.case import Case, preset
from ckptbench.point.training import TrainSpec
from ckptbench.run.worker import _memory_step
from ckptbench.store.records import RecordStore, load_records
from ckptbench.store.timelines import Timelines
from ckptbench.train.checkpointing import decoder_layers, enable_checkpointing, offload_without_pinning
from ckptbench.train.models import build_model, synthetic_batch
from ckptbench.train.step import train_step

B, S = 2, 64


def _step(every_n: int, offload: bool = False, device: str = "cpu", grad_accum: int = 1) -> dict:
    case = Case(model=preset("llama-tiny"), train=TrainSpec(), batch_size=B, seq_len=S, every_n_layers=every_n,
                offload=offload, device=device, grad_accum=grad_accum)
    dev = torch.device(device)
    with offload_without_pinning() if offload and device == "cpu" else nullcontext():
        torch.manual_seed(0)
        model = build_model(case.model, dev)
        enable_checkpointing(model, case.every_n_layers, case.offload)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        batch = synthetic_batch(case.model.vocab, case.batch_size, case.seq_len, 0, dev)
        train_step(model, optimizer, batch, 1)  # the optimizer state exists before the measured step
        return _memory_step(case, model, optimizer, batch, decoder_layers(model))


@pytest.fixture(scope="module")
def steps() -> dict:
    return {name: _step(n, off) for name, (n, off) in
            {"none": (0, False), "every-2": (2, False), "full+offload": (1, True)}.items()}


def _value_at(tl: dict, event: int) -> int:
    """The total after `event` (the last kept sample at or before it)."""
    i = max(k for k, e in enumerate(tl["event"]) if e <= event)
    return tl["bytes"][i]


# -- downsampling ----------------------------------------------------------------------------------------
def test_a_short_series_is_kept_whole():
    assert downsample(array("q", [5, 7, 6])) == ([0, 1, 2], [5, 7, 6])


@pytest.mark.parametrize("n, cap", [(2001, 2000), (100_000, 2000), (10_007, 101), (50, 4)])
def test_downsampling_keeps_the_extremes_of_every_bucket(n, cap):
    rng = random.Random(n)
    values, x = array("q"), 10**6
    for _ in range(n):
        x += rng.randint(-1000, 1000)
        values.append(x)
    events, kept = downsample(values, cap)
    assert len(kept) == len(events) <= cap
    assert max(kept) == max(values) and min(kept) == min(values)
    assert events[0] == 0 and events[-1] == n - 1 and events == sorted(set(events))
    assert kept == [values[e] for e in events]


# -- the CPU timeline of a real step ---------------------------------------------------------------------
def test_the_timelines_maximum_is_the_exact_peak_and_its_marks_are_the_steps(steps):
    for name, m in steps.items():
        tl = m["timeline"]
        assert tl["meter"] == "cpu-live-storages" and len(tl["bytes"]) <= tl_mod.MAX_SAMPLES
        assert max(tl["bytes"]) == m["peak_bytes"], name
        assert tl["bytes"][tl["event"].index(tl["peak_event"])] == m["peak_bytes"]
        assert tl["bytes"][0] == m["tracked_start_bytes"]
        labels = [label for _, label in tl["marks"]]
        phases = [x for x in labels if not x.startswith(("forward-layer-", "recompute-layer-"))]
        assert phases == ["forward", "backward-head", "backward-layer-3", "backward-layer-2", "backward-layer-1",
                          "backward-layer-0", "backward-embedding", "optimizer"], name
        entered = [x for x in labels if x.startswith("forward-layer-")]
        assert entered == [f"forward-layer-{i}{end}" for i in range(4) for end in ("", "-end")]
        recomputed = [int(x.rsplit("-", 1)[1]) for x in labels if x.startswith("recompute-layer-")]
        assert sorted(recomputed) == m["recomputed_layers"]
        events = [e for e, _ in tl["marks"]]
        assert events == sorted(events) and events[-1] <= tl["events"]
        # the probe reads the after-forward total just before backward-head is marked: the same sample
        backward = dict((label, e) for e, label in tl["marks"])["backward-head"]
        assert _value_at(tl, backward) == m["mem_after_forward_bytes"]
        # the moment the record names for its peak: the phase marked last before the peak's event (a mark at
        # event e names what follows sample e)
        before = [label for e, label in tl["marks"] if e < tl["peak_event"] and label in phases]
        assert before[-1] == m["peak_phase"], name


def test_the_stored_timeline_is_the_measured_one_and_still_peaks_at_the_records_peak(steps, tmp_path):
    """What the report draws is read back from timelines.jsonl: the same timeline, to the byte."""
    store = RecordStore(str(tmp_path))
    case = Case(model=preset("llama-tiny"), train=TrainSpec(), batch_size=B, seq_len=S).to_dict()
    for k, m in enumerate(steps.values()):
        store.append({"case_id": f"p{k}", "status": "ok", "case": case, "measurement": copy.deepcopy(m)})
    timelines = Timelines(str(tmp_path))
    for record, m in zip(load_records(str(tmp_path)).records, steps.values()):
        assert "timeline" not in record["measurement"]
        tl = timelines.get(record)
        assert tl == m["timeline"] and max(tl["bytes"]) == record["measurement"]["peak_bytes"]
    assert timelines.problems == []


def test_a_downsampled_timeline_still_peaks_at_the_exact_peak(steps, monkeypatch):
    monkeypatch.setattr(tl_mod, "MAX_SAMPLES", 64)
    m = _step(2)
    tl = m["timeline"]
    assert len(tl["bytes"]) <= 64 < tl["events"]
    assert max(tl["bytes"]) == m["peak_bytes"] == steps["every-2"]["peak_bytes"]
    assert tl["marks"] == steps["every-2"]["timeline"]["marks"]  # marks keep the raw event index


def test_the_timeline_is_the_same_to_the_byte_on_an_identical_step(steps):
    again = _step(0)
    assert again["timeline"] == steps["none"]["timeline"]


def test_gradient_accumulation_marks_each_micro_batch():
    m = _step(1, grad_accum=2)
    labels = [label for _, label in m["timeline"]["marks"]]
    assert labels.count("forward") == 2 and labels.count("backward-head") == 2
    assert labels.count("recompute-layer-0") == 2 and labels[-1] == "optimizer"
    assert max(m["timeline"]["bytes"]) == m["peak_bytes"]


# -- saved bytes per layer -------------------------------------------------------------------------------
def test_layers_and_the_outside_sum_to_saved_bytes_exactly(steps):
    for name, m in steps.items():
        per = m["saved_bytes_per_layer"]
        assert len(per) == 4
        assert sum(per) + m["saved_outside_layers_bytes"] == m["saved_bytes"], name
        # what no layer saved is the same whatever the layers do: embedding indices, final norm, head, loss
        assert m["saved_outside_layers_bytes"] == steps["none"]["saved_outside_layers_bytes"]


def test_every_2_checkpointing_leaves_layers_0_and_2_only_their_input(steps):
    hidden = preset("llama-tiny").hidden
    m, none = steps["every-2"], steps["none"]["saved_bytes_per_layer"]
    per = m["saved_bytes_per_layer"]
    assert per[0] == per[2] == B * S * hidden * 4  # fp32 hidden states: the checkpoint's saved input
    assert per[0] + per[2] == m["checkpointed_input_bytes"]
    assert per[0] < per[1] and per[2] < per[3]
    # rotary cos/sin (batch 1) are saved by every layer that keeps its activations, counted in the first
    head_dim = hidden // preset("llama-tiny").heads
    cos_sin = 2 * S * head_dim * 4
    assert none[1] == none[2] == none[3] == none[0] - cos_sin
    assert per[1] == none[0] and per[3] == none[3]
    assert m["offloaded_bytes_per_layer"] == [0, 0, 0, 0]


def test_offloaded_layers_keep_nothing_on_the_device(steps):
    m = steps["full+offload"]
    hidden = preset("llama-tiny").hidden
    assert m["saved_bytes_per_layer"] == m["offloaded_bytes_per_layer"] == [B * S * hidden * 4] * 4


# -- CUDA: the allocator's history, replayed ---------------------------------------------------------------
TRACE = [
    {"action": "segment_alloc", "size": 2**21},
    {"action": "alloc", "size": 1000},
    {"action": "alloc", "size": 512},
    {"action": "free_requested", "size": 1000},
    {"action": "free_completed", "size": 1000},
    {"action": "alloc", "size": 4096},
    {"action": "free_requested", "size": 512},
    {"action": "snapshot", "size": 0},
    {"action": "free_completed", "size": 512},
]


def test_the_allocator_history_replays_to_its_requested_bytes():
    values = replay(TRACE, 100)
    assert list(values) == [100, 1100, 1612, 612, 4708, 4196]


def test_a_cuda_history_becomes_a_compact_timeline_with_its_marks():
    history = CudaHistory(device=None)
    history.start_bytes, history.events0 = 100, 0
    for event, label in ((0, "forward"), (3, "backward-head"), (9, "optimizer")):
        history.marks.add(event, label)
    history.snapshot = {"device_traces": [[], TRACE]}
    timeline, why = history.result(1)
    assert why is None and timeline["bytes"] == [100, 1100, 1612, 612, 4708, 4196]
    assert timeline["peak_event"] == 4 and timeline["marks"][-1] == [5, "optimizer"]  # clipped to the end
    assert timeline["meter"] == "cuda-allocator-history"
    history.snapshot = {"device_traces": [[], [{"action": "alloc", "size": 1}] * tl_mod.HISTORY_ENTRIES]}
    timeline, why = history.result(1)
    assert timeline is None and "filled" in why


def test_marks_past_the_cap_are_counted_not_kept(monkeypatch):
    monkeypatch.setattr(tl_mod, "MAX_MARKS", 3)
    t = Timeline(0)
    for i in range(5):
        t.values.append(i)
        t.mark(f"m{i}")
    t.mark("m4")
    out = t.result("cpu-live-storages", "bytes")
    assert out["marks"] == [[1, "m0"], [2, "m1"], [3, "m2"]] and out["marks_dropped"] == 2


@pytest.mark.gpu
def test_the_cuda_timeline_peaks_at_the_allocators_requested_peak():
    m = _step(2, device="cuda")
    tl = m["timeline"]
    assert tl["meter"] == "cuda-allocator-history" and len(tl["bytes"]) <= tl_mod.MAX_SAMPLES
    assert max(tl["bytes"]) == m["cuda_max_requested_bytes"] <= m["peak_bytes"]
    labels = [label for _, label in tl["marks"]]
    assert labels[0] == "forward" and "backward-head" in labels and labels[-1] == "optimizer"
    assert [x for x in labels if x.startswith("recompute-layer-")] == ["recompute-layer-2", "recompute-layer-0"]
    events = [e for e, _ in tl["marks"]]
    assert events == sorted(events) and events[-1] <= tl["events"]
    assert m["saved_bytes_per_layer"][0] == B * S * preset("llama-tiny").hidden * 4
