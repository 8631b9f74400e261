"""On a CUDA device: the CUDA probes through worker.measure on a tiny model, bandwidth and calibration.

Skipped without CUDA (tests/conftest.py)."""

from __future__ import annotations

import pytest

from ckptbench.point.case import Case, preset
from ckptbench.point.training import TrainSpec

pytestmark = pytest.mark.gpu


def _case(**kw) -> Case:
    values = dict(model=preset("llama-tiny", dtype="bf16", attn="sdpa"),
                  train=TrainSpec(warmup_steps=1, memory_steps=1, steps=3), batch_size=2, seq_len=64,
                  device="cuda")
    values.update(kw)
    return Case(**values)


def test_measure_on_cuda_uses_the_cuda_probes():
    from ckptbench.run.worker import measure

    m = measure(_case(every_n_layers=1))
    assert m["memory_probe"] == "cuda-allocator" and m["timer"] == "cuda-events"
    assert m["step_probe"] == "cuda-allocator-per-step"
    assert 0 < m["cuda_max_allocated_bytes"] <= m["cuda_max_reserved_bytes"]
    assert m["peak_bytes"] >= m["params_bytes"] + m["optimizer_bytes"]
    # every parameter has a gradient when the memory step's probe stops (before zero_grad); the allocator
    # cannot say how many were live at its peak, so the peak's breakdown does not pretend to
    assert m["cuda_grads_bytes_at_stop"] == m["params_bytes"]
    assert set(m["peak_breakdown"]) == {"params", "optimizer"}
    # checkpointed inputs: 4 layers x 2 x 64 x 64 x 2 bytes (bf16)
    assert m["checkpointed_input_bytes"] == 4 * 2 * 64 * 64 * 2
    # one allocator peak per timed step (as many as the stop rule timed), none of them raised by the losses
    # of the steps before it (a kept 0-d loss holds a 512-byte block: H200, torch 2.11, each peak was 512
    # bytes above the last)
    peaks = m["cuda_step_max_allocated_bytes"]
    assert len(peaks) == len(m["step_times_s"]) and min(peaks) > 0
    assert max(peaks) - min(peaks) < 512 * max(len(peaks) - 1, 1)
    assert m["cuda_first_step_max_allocated_bytes"] > 0
    assert all(t > 0 for t in m["step_times_s"])
    assert m["recomputed_layers"] == [0, 1, 2, 3]
    assert m["ideal_recompute_ratio"] > 1
    # NVML is optional: present, its figures are numbers; absent, None
    if m["nvml_available"]:
        assert m["nvml_used_bytes_after_steps"] > 0
    else:
        assert m["energy_per_step_j"] is None


def test_offload_on_cuda_is_pinned_and_moves_bytes_to_host():
    from ckptbench.run.worker import measure

    m = measure(_case(every_n_layers=1, offload=True))
    assert m["offload_pinned"] is True
    assert m["offloaded_bytes"] > 0
    if m.get("cuda_host_pinned_peak_bytes") is not None:
        assert m["cuda_host_pinned_peak_bytes"] >= m["offloaded_bytes"]


def test_bandwidth_and_calibration():
    from ckptbench.measure.calibrate import calibrate, copy_bandwidth

    bw = copy_bandwidth(16 * 2**20, reps=2)
    assert bw["h2d_bytes_per_s"] > 1e8 and bw["d2h_bytes_per_s"] > 1e8
    cal = calibrate(size_mib=16, reps=2)
    assert cal["available"] and cal["matmul_flops_per_s"] > 1e12


def test_cuda_oom_is_torch_out_of_memory_error():
    import torch

    with pytest.raises(torch.OutOfMemoryError):
        torch.empty(2**50, dtype=torch.uint8, device="cuda")
