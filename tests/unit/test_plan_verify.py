"""`plan --verify`: the efficiency it writes is a fraction of the matmul rate of the moment its steps ran in.

The rates and the steps are stubbed, so each case is exact: the plan measured its rate on a busy machine
(half the rate the steps later ran at), the steps ran at 58% of the rate beside them.
"""

from __future__ import annotations

import json
import os
import types

import pytest

from ckptbench.cli import main
from ckptbench.run import calibration, sweep
from ckptbench.store import records
from ckptbench.theory.plan import Analytic, Assumptions, step_seconds

PLAN_RATE, STEP_RATE = 1e9, 2e9  # FLOP/s: the plan's, under load; the one the steps ran beside


def _verify(tmp_path, monkeypatch, capsys, rates: list[float | None], efficiency: float) -> tuple[int, str, str]:
    """Run `plan --verify` with `rates` as successive matmul measurements and steps at `efficiency` of STEP_RATE."""
    measured = iter(rates)
    monkeypatch.setattr(calibration, "cpu_matmul_rate",
                        lambda *a, **k: (r := next(measured), "measured here" if r else "unknown: stubbed"))
    ran = []

    def run(suite, options, annotate=None):
        os.makedirs(options.out_dir)
        ran.extend(suite.cases)

    monkeypatch.setattr(sweep, "run_sweep", run)
    exact = Assumptions(memory_bytes=2**30, device="cpu", peak_flops_per_s=STEP_RATE, efficiency=1.0)

    def load(out):
        return types.SimpleNamespace(records=[
            {"case_id": c.id, "status": "ok",
             "measurement": {"step_time_median_s": step_seconds(c, exact, Analytic())[0] / efficiency}}
            for c in ran])

    monkeypatch.setattr(records, "load_records", load)
    cal = tmp_path / "cal.json"
    cal.write_text(json.dumps({"kept": 1}))
    rc = main(["plan", "--model", "llama-tiny", "--device", "cpu", "--memory", "0.005GiB", "--seq", "64",
               "--precision", "fp32", "--attn", "eager", "--verify", "--out", str(tmp_path / "run"), "--calibration", str(cal)])
    assert ran, "the verify points did not reach the sweep"
    return rc, capsys.readouterr().out, cal.read_text()


def test_the_efficiency_is_measured_against_the_rate_beside_the_steps_not_the_plans(tmp_path, monkeypatch, capsys):
    # the plan's rate was taken under load: against it these steps would be 116% efficient
    rc, out, written = _verify(tmp_path, monkeypatch, capsys, [PLAN_RATE, STEP_RATE, 0.9 * STEP_RATE], 0.58)
    assert rc == 0
    cal = json.loads(written)
    assert cal["training_efficiency"] == pytest.approx(0.58) and cal["kept"] == 1
    assert "2.0 GFLOP/s, the higher of the matmul rates measured before and after the steps (2.0, 1.8)" in out
    assert cal["training_efficiency_peak"].startswith("2.0 GFLOP/s")


@pytest.mark.parametrize("rates, efficiency, why", [
    ([PLAN_RATE, STEP_RATE, STEP_RATE], 1.16, "the measured efficiency 116% of the peak FLOP/s is above 100%"),
    ([PLAN_RATE, None, None], 0.5, "no point has both a predicted and a measured step time"),
])
def test_an_efficiency_that_is_not_a_fraction_is_never_written_and_the_command_says_why(
        tmp_path, monkeypatch, capsys, rates, efficiency, why):
    rc, out, written = _verify(tmp_path, monkeypatch, capsys, rates, efficiency)
    assert rc == 0 and json.loads(written) == {"kept": 1}  # the file as it was
    said = [line for line in out.splitlines() if line.startswith("no calibration written")]
    assert len(said) == 1 and why in said[0], out
    assert "measured training efficiency" not in out


@pytest.mark.parametrize("ratio", [float("nan"), float("inf"), 0.0, -1.0, 1.2])
def test_only_a_finite_fraction_of_the_peak_is_an_efficiency(ratio):
    from ckptbench.cli.verify import calibrated_efficiency

    efficiency, why = calibrated_efficiency(1.0, [ratio])
    assert efficiency is None and why
    assert calibrated_efficiency(0.5, [1.5]) == (0.75, "")
