"""Offload bound arithmetic and the pairing of offloaded points with their twins."""

from __future__ import annotations

import pytest

from ckptbench.measure import calibrate
from ckptbench.point.case import Case, preset
from ckptbench.point.training import TrainSpec
from ckptbench.report.gpu_summary import offload_overheads
from ckptbench.theory.memory.offload import offload_bound_s, transfer_time_s

GB = 1e9


def test_transfer_and_bound():
    # 2 GB at 50 GB/s is 40 ms; the bound is one D2H (forward) plus one H2D (backward)
    assert transfer_time_s(2 * GB, 50 * GB) == pytest.approx(0.04)
    # 1 GB out at 40 GB/s (25 ms) + back at 50 GB/s (20 ms) = 45 ms, twice with 2 micro-batches
    assert offload_bound_s(1 * GB, 40 * GB, 50 * GB) == pytest.approx(0.045)
    assert offload_bound_s(1 * GB, 40 * GB, 50 * GB, grad_accum=2) == pytest.approx(0.09)
    assert offload_bound_s(1 * GB, None, 50 * GB) is None
    assert transfer_time_s(1, 0) is None


def _record(case_id, every_n, offload, t, offloaded=0, status="ok", batch=4):
    case = Case(model=preset("gpt2-tiny"), train=TrainSpec(), batch_size=batch, seq_len=1024, every_n_layers=every_n,
                offload=offload, device="cuda").to_dict()
    return {"case_id": case_id, "case": case, "status": status, "strategy": "x",
            "measurement": {"step_time_median_s": t, "offloaded_bytes": offloaded}}


def test_offload_overheads_pair_by_everything_but_offload():
    records = [
        _record("a", 1, False, 0.100),
        _record("b", 1, True, 0.150, offloaded=2 * GB),
        _record("c", 2, True, 0.130, offloaded=1 * GB),  # no every-2 twin
        _record("d", 1, True, 0.2, offloaded=2 * GB, batch=8),  # twin has another batch size: none
    ]
    rows = {r["case_id"]: r for r in offload_overheads(records, {"d2h_bytes_per_s": 50 * GB,
                                                                         "h2d_bytes_per_s": 50 * GB})}
    assert set(rows) == {"b", "c", "d"}
    b = rows["b"]
    assert b["twin_case_id"] == "a"
    assert b["overhead_s"] == pytest.approx(0.050)
    assert b["bound_s"] == pytest.approx(0.080)  # 2 GB out + 2 GB back at 50 GB/s
    assert b["overhead_over_bound"] == pytest.approx(0.625)
    assert rows["c"]["overhead_s"] is None and rows["c"]["bound_s"] == pytest.approx(0.04)
    assert rows["d"]["twin_case_id"] is None


def test_offload_overheads_without_bandwidth_and_last_record_wins():
    records = [_record("a", 1, False, 0.100), _record("b", 1, True, 0.5, offloaded=GB, status="oom"),
               _record("b", 1, True, 0.120, offloaded=GB)]
    (row,) = offload_overheads(records, None)
    assert row["overhead_s"] == pytest.approx(0.020)
    assert row["bound_s"] is None and row["overhead_over_bound"] is None


def test_measure_needs_cuda():
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA present: covered by the gpu tests")
    with pytest.raises(RuntimeError, match="CUDA"):
        calibrate.copy_bandwidth(2**20, 1)
