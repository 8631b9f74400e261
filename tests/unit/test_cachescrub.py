"""The framework probe's reads of the point's traffic between its modules (measure/cachescrub.py), the probe's
second step each round that takes them (run/probethread.py) and the framework figure priced from it."""

from __future__ import annotations

import json

import pytest
import torch

from ckptbench.measure.cachescrub import SCRUB_MAX, CacheScrub, forward_traffic, leaf_modules, scrub_bytes


def _entry(kind: str, nbytes: int, **counts) -> dict:
    return {"key": f"{kind}{nbytes}", "kind": kind, "bytes": nbytes,
            "counts": {"forward": 0, "backward": 0, "recompute": 0, "optimizer": 0, **counts}}


def test_the_forward_traffic_counts_forward_and_recomputed_calls_and_no_view_or_copy():
    entries = [_entry("memory", 100, forward=3, backward=5), _entry("matmul", 1000, forward=1, recompute=1),
               _entry("view", 10**6, forward=9), _entry("copy", 10**6, forward=2), _entry("memory", 7, optimizer=4)]
    assert forward_traffic(entries) == 3 * 100 + 2 * 1000


def test_the_read_is_the_traffic_over_the_calls_in_whole_floats_and_never_past_its_cap():
    assert scrub_bytes(1000, 3) == 332  # 333 rounded down to a whole float32
    assert scrub_bytes(10**12, 10) == SCRUB_MAX
    assert scrub_bytes(0, 10) == scrub_bytes(100, 0) == 0


class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)
        self.drop = torch.nn.Dropout(0.0)  # p = 0: returns its input, runs no kernel
        self.act = torch.nn.GELU()

    def forward(self, x):
        return self.act(self.drop(self.proj(x)))


def test_counting_finds_the_modules_that_run_a_kernel_and_reading_reads_before_those_only():
    """A recorder's count of non-view ops tells the modules apart: the dropout of probability 0 runs none.
    Reading then reads before each call of the other two, every read timed by the clock given, and the
    hooks are gone after :meth:`off` (a step without them runs no read)."""
    from ckptbench.measure.optrace import OpRecorder

    layers = [_Block(), _Block()]
    assert len(leaf_modules(layers)) == 6
    recorder = OpRecorder()
    ticks = iter(range(1000))
    scrub = CacheScrub(layers, clock=lambda: float(next(ticks)), ops=recorder.kernel_calls)
    x = torch.ones(2, 4)
    scrub.counting()
    with recorder:
        for layer in layers:
            layer(x)
    scrub.off()
    assert scrub.calls == 4  # proj and act of each block; the dropouts ran nothing
    scrub.reading(4096)
    assert scrub._buffer.numel() == 1024
    for _ in range(3):
        for layer in layers:
            layer(x)
    assert scrub.calls == 12 and scrub.spent_s == 12.0  # one tick a read
    scrub.off()
    layers[0](x)
    assert scrub.calls == 12


def test_the_probe_takes_a_second_step_with_the_reads_where_the_point_has_traffic():
    """With traffic, each call gives a plain step (and its ops' timings) and a second step with the reads
    between the modules that run kernels, their time taken out; without, one step and no reads."""
    from ckptbench.run.probethread import ProbeThread
    from ckptbench.spec import Case, TrainSpec, preset

    torch.set_num_threads(1)
    case = Case(model=preset("gpt2-tiny"), train=TrainSpec(), batch_size=1, seq_len=8, every_n_layers=1)
    probe = ProbeThread(case, traffic=10 * 2**20)
    for calls in (1, 2):
        assert probe.step(), probe.error
        assert len(probe.schedule.steps) == len(probe.schedule.polluted) == calls
    probe.close()
    result = probe.result()
    assert result["scrub_calls"] > 0 and result["scrub_bytes"] == scrub_bytes(10 * 2**20, result["scrub_calls"])
    assert len(result["polluted_s"]) == 2 and min(result["polluted_s"]) > 0
    plain = ProbeThread(case)
    assert plain.step(), plain.error
    plain.close()
    assert plain.result()["polluted_s"] == [] and plain.result()["scrub_bytes"] == 0


def test_the_point_is_priced_at_the_second_steps_figure_and_the_plain_one_is_kept_beside_it():
    from ckptbench.run.steptime import framework_from_rounds

    trace = [_entry("matmul", 8, forward=2, backward=2) | {"key": "mm", "op": "aten.mm.default", "flops": 0}]
    figures = {"dispatch_s": 1e-6, "bandwidth_bytes_per_s": 1e9}
    probe = {"trace": trace, "steps_s": [1e-3, 2e-3, 4e-3], "polluted_s": [3e-3, 5e-3], "label": "x",
             "timed": [{"mm": 1e-4}, {"mm": 2e-4}, {"mm": 1e-4}], "scrub_bytes": 2**20, "scrub_calls": 40}
    found = framework_from_rounds(probe, figures, "cpu")
    # 4 mm calls; the third round's second step never ran (the probe ended between them)
    assert found["rounds_per_op_s"] == pytest.approx([(3e-3 - 4e-4) / 4, (5e-3 - 8e-4) / 4])
    assert found["per_op_s"] == pytest.approx(((3e-3 - 4e-4) / 4 + (5e-3 - 8e-4) / 4) / 2)
    assert found["clean_per_op_s"] == pytest.approx((2e-3 - 8e-4) / 4) and found["scrub_bytes"] == 2**20
    assert found["probe"].endswith("after a read of 1.00 MiB, the point's forward traffic over 40 module calls")
    without = framework_from_rounds({**probe, "polluted_s": []}, figures, "cpu")
    assert without["per_op_s"] == without["clean_per_op_s"] and without["scrub_bytes"] == 0
    json.dumps(found)
