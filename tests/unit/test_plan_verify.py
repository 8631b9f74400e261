"""`plan --verify` and the plan's step times: predicted from op rates before anything runs, never fitted.

The op rates and the steps are stubbed, so each figure is exact: the plan's timer prices a step at
``10 ms + 2 ms a sequence``, and the verify steps run 5 % slower than that.
"""

from __future__ import annotations

import json
import os
import types

import pytest

from ckptbench.cli import main
from ckptbench.run import steptime, sweep
from ckptbench.store import records

STAMP = "2026-01-02 03:04:05"


def _priced(case, directory=None, threads=None, trace=None) -> dict:
    return {"predicted_s": 0.010 + 0.002 * case.batch_size, "measured_at": [STAMP]}


@pytest.fixture
def measured_here(monkeypatch):
    """The plan's CPU timer, its op rates stubbed: no microbenchmark runs."""
    monkeypatch.setattr(steptime, "predict", _priced)


def _plan(capsys, *flags: str) -> tuple[int, str]:
    rc = main(["plan", "--model", "llama-tiny", "--device", "cpu", "--memory", "0.005GiB", "--seq", "64",
               "--precision", "fp32", "--attn", "eager", *flags])
    return rc, capsys.readouterr().out


def test_a_cpu_plan_says_its_step_times_come_from_op_rates_measured_here_and_when(measured_here, capsys, tmp_path):
    rc, out = _plan(capsys, "--rates-dir", str(tmp_path))
    assert rc == 0
    line = next(x for x in out.splitlines() if x.startswith("step time: "))
    assert "op rates measured here" in line and STAMP in line and str(tmp_path) in line
    # tokens/s depend on the batch: 10 ms a step whatever the batch, 2 ms a sequence
    rows = {x.split()[0]: x.split() for x in out.splitlines() if x.split() and x.split()[0] in ("none", "full")}
    for name in ("none", "full"):
        batch, step, tokens = int(rows[name][1]), float(rows[name][4]), float(rows[name][5].replace(",", ""))
        assert step == pytest.approx(0.010 + 0.002 * batch, abs=1e-3)
        assert tokens == pytest.approx(batch * 64 / (0.010 + 0.002 * batch), rel=1e-2)


def test_a_card_plan_says_its_step_times_are_datasheet_rates(capsys):
    rc = main(["plan", "--model", "llama-tiny", "--device", "h100", "--seq", "64", "--precision", "bf16",
               "--attn", "sdpa"])
    out = capsys.readouterr().out
    assert rc == 0
    line = next(x for x in out.splitlines() if x.startswith("step time: "))
    assert "datasheet rates of the NVIDIA H100 80GB HBM3" in line and "lower bound" in line


def test_verify_sets_each_point_beside_its_prediction_and_writes_no_calibration(measured_here, tmp_path,
                                                                                 monkeypatch, capsys):
    ran = []

    def run(suite, options, annotate=None):
        os.makedirs(options.out_dir)
        ran.extend(suite.cases)

    def load(out):
        return types.SimpleNamespace(records=[
            {"case_id": c.id, "status": "ok", "measurement": {"step_time_median_s": 1.05 * _priced(c)["predicted_s"]}}
            for c in ran])

    monkeypatch.setattr(sweep, "run_sweep", run)
    monkeypatch.setattr(records, "load_records", load)
    cal = tmp_path / "cal.json"
    cal.write_text(json.dumps({"training_efficiency": 0.4, "kept": 1}))  # what an older --verify wrote
    rc, out = _plan(capsys, "--verify", "--out", str(tmp_path / "run"), "--calibration", str(cal),
                    "--rates-dir", str(tmp_path))
    assert rc == 0 and ran
    assert json.loads(cal.read_text()) == {"training_efficiency": 0.4, "kept": 1}  # read, never written
    assert "40% in " in out and "not used, step times come from op rates" in out
    table = out[out.index("predicted vs measured"):]
    assert "none of these points used to predict" in table
    errors = [x.split()[-2] for x in table.splitlines()[2:2 + len(ran)]]
    assert errors == ["-4.8%"] * len(ran)  # 1 / 1.05 - 1
    assert f"largest error 4.8% over {len(ran)} points" in out
