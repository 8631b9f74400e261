"""gpu-summary's pure rows: recompute ratio against the no-checkpointing twin, checks, text lines."""

from __future__ import annotations

import pytest

from ckptbench.point.case import Case, preset
from ckptbench.point.training import TrainSpec
from ckptbench.report.gpu_summary import check_rows, format_summary, point_rows, summarise


def _record(cid, every_n, offload, t, batch=4, status="ok", **measurement):
    case = Case(model=preset("gpt2-tiny"), train=TrainSpec(), batch_size=batch, seq_len=2048, every_n_layers=every_n,
                offload=offload, device="cuda").to_dict()
    return {"case_id": cid, "case": case, "status": status, "strategy": f"s{every_n}{'o' if offload else ''}",
            "measurement": {"step_time_median_s": t, **measurement}}


RECORDS = [
    _record("none", 0, False, 0.100, model_flops_per_step=5e13, hardware_flops_per_step=5e13,
            ideal_recompute_ratio=1.0, mfu=0.5),
    _record("full", 1, False, 0.130, model_flops_per_step=5e13, hardware_flops_per_step=6.5e13,
            ideal_recompute_ratio=1.28, offloaded_bytes=0),
    _record("fullo", 1, True, 0.150, offloaded_bytes=2**30),
    _record("big", 0, False, None, batch=8, status="oom"),
]


def test_point_rows_ratio_against_no_checkpointing():
    rows = {r["case_id"]: r for r in point_rows(RECORDS, measured_peak=1e15)}
    assert set(rows) == {"none", "full", "fullo"}  # the oom point has no row
    assert rows["full"]["recompute_ratio_measured"] == pytest.approx(1.3)
    assert rows["full"]["recompute_ratio_ideal"] == 1.28
    # 5e13 FLOP in 0.13 s against 1e15 FLOP/s
    assert rows["full"]["mfu_measured_peak"] == pytest.approx(5e13 / 0.13 / 1e15)
    assert rows["full"]["hfu_measured_peak"] == pytest.approx(6.5e13 / 0.13 / 1e15)


def test_check_rows_flatten_record_checks():
    rec = _record("x", 1, False, 0.1)
    rec["checks"] = [{"quantity": "peak_bytes", "measured": 10, "estimated": 11, "ratio": 10 / 11,
                      "verdict": "pass", "tolerance": 0.1}]
    (row,) = check_rows([rec])
    assert row["quantity"] == "peak_bytes" and row["verdict"] == "pass" and "tolerance" not in row
    assert check_rows(RECORDS) == []


def test_summary_and_text_with_missing_values():
    summary = summarise(RECORDS, {"h2d_bytes_per_s": 5e10, "d2h_bytes_per_s": 5e10,
                                  "matmul_flops_per_s": 8e14})
    assert summary["statuses"] == {"ok": 3, "oom": 1}
    (off,) = summary["offload"]
    assert off["overhead_s"] == pytest.approx(0.020)
    text = "\n".join(format_summary(summary))
    assert "H2D 50.0 GB/s" in text and "bf16 matmul 800 TFLOP/s" in text
    assert "offload point" in text
    assert "estimate checks: none" in text
    assert format_summary(summarise([], None))[0] == "statuses: "


def test_simulated_predictions_are_joined_to_the_measured_points():
    rec = {**_record("a", 1, False, 0.1, batch=1, peak_bytes=2 * 2**30), "strategy": "full"}
    summary = summarise([rec], {}, {"a": {"status": "ok", "simulated": {"peak_bytes": 2**31 + 2**20}}})
    (row,) = summary["simulated"]
    assert row["measured"] == 2**31 and row["simulated"] == 2**31 + 2**20
    text = "\n".join(format_summary(summary))
    assert "simulated GiB" in text and "0.9995" in text
    assert summarise([rec], {}, {})["simulated"] == []
