"""`plan --verify` and the plan's step times: predicted from measured baseline steps before anything runs.

The baseline steps are stubbed, so each figure is exact: a plain step of L layers at batch b takes
``10 ms + 2 ms · b · L`` (its one- and two-layer steps are what is measured), each layer's forward
``1 ms · b``; the verify steps run 5 % slower than the prediction.
"""

from __future__ import annotations

import json
import os
import types

import pytest

from ckptbench.cli import main
from ckptbench.run import baselines, sweep
from ckptbench.store import records

MEASURED: list = []


def _measure(case) -> dict:
    MEASURED.append(case)
    layers, b = case.model.layers, case.batch_size
    return {"step_s": 0.010 + 0.002 * b * layers, "forward_s": [0.001 * b] * layers}


def _priced(case) -> float:
    """What the plan must predict for `case` from the stub: the plain step at its depth, plus each
    checkpointed layer's forward (a CPU's offload copies nothing)."""
    b = case.batch_size
    return 0.010 + 0.002 * b * case.model.layers + 0.001 * b * len(case.checkpointed_layers)


@pytest.fixture
def measured_here(monkeypatch):
    """The plan's CPU timer, its baseline steps stubbed: no step runs."""
    MEASURED.clear()
    monkeypatch.setattr(baselines, "measure_step", _measure)


def _plan(capsys, *flags: str) -> tuple[int, str]:
    rc = main(["plan", "--model", "llama-tiny", "--device", "cpu", "--memory", "0.005GiB", "--seq", "64",
               "--precision", "fp32", "--attn", "eager", *flags])
    return rc, capsys.readouterr().out


def test_a_cpu_plan_times_its_steps_from_baselines_measured_here(measured_here, capsys, tmp_path):
    rc, out = _plan(capsys, "--baselines-dir", str(tmp_path))
    assert rc == 0
    line = next(x for x in out.splitlines() if x.startswith("step time: "))
    assert "measured here" in line and "transformed by the step-time model" in line and str(tmp_path) in line
    rows = {x.split()[0]: x.split() for x in out.splitlines() if x.split() and x.split()[0] in ("none", "full")}
    for name, checkpointed in (("none", 0), ("full", 4)):
        batch, step, tokens = int(rows[name][1]), float(rows[name][5]), float(rows[name][-1].replace(",", ""))
        expected = 0.010 + 0.008 * batch + 0.001 * batch * checkpointed
        assert step == pytest.approx(expected, abs=1e-3)
        assert tokens == pytest.approx(batch * 64 / expected, rel=1e-2)
    # only plain one- and two-layer steps were measured, each once
    assert {c.model.layers for c in MEASURED} == {1, 2} and not any(c.checkpointed_layers for c in MEASURED)
    assert len(MEASURED) == len({c.id for c in MEASURED})
    # the next plan takes them from the directory, measuring nothing again
    kept = len(MEASURED)
    assert _plan(capsys, "--baselines-dir", str(tmp_path))[0] == 0
    assert len(MEASURED) == kept


@pytest.mark.parametrize("text", ["not json", "[]", '{"k": {"step_s": "x", "forward_s": []}}',
                                  '{"k": {"step_s": 1e400, "forward_s": [1]}}', '{"k": {"step_s": 1, "forward_s": [true]}}'])
def test_a_baselines_file_that_does_not_read_back_is_ignored(tmp_path, text):
    (tmp_path / "baselines.json").write_text(text)
    assert baselines.MeasuredTimer(str(tmp_path)).kept == {}


def test_a_baselines_file_that_is_no_regular_file_is_ignored_without_blocking(tmp_path):
    os.mkfifo(tmp_path / "baselines.json")  # opening a FIFO for reading would wait for a writer
    assert baselines.MeasuredTimer(str(tmp_path)).kept == {}


def test_a_card_plan_says_its_step_times_are_expected_and_a_lower_bound_only_when_asked(capsys):
    flags = ["plan", "--model", "llama-tiny", "--device", "h100", "--seq", "64", "--precision", "bf16", "--attn", "sdpa"]
    assert main(flags) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("step time: "))
    assert line.startswith("step time: expected (x0.87-x1.10") and "carried to the NVIDIA H100 80GB HBM3" in line
    assert "lower bound" not in line
    assert main([*flags, "--lower-bound"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("step time: "))
    assert "roofline: datasheet rates of the NVIDIA H100 80GB HBM3" in line and "lower bound" in line


def test_verify_sets_each_point_beside_its_prediction_and_writes_no_calibration(measured_here, tmp_path,
                                                                                 monkeypatch, capsys):
    ran = []

    def run(suite, options, annotate=None):
        os.makedirs(options.out_dir)
        ran.extend(suite.cases)

    def load(out):
        return types.SimpleNamespace(records=[
            {"case_id": c.id, "status": "ok", "case": c.to_dict(), "strategy": c.strategy,
             "measurement": {"step_time_median_s": 1.05 * _priced(c)}}
            for c in ran])

    monkeypatch.setattr(sweep, "run_sweep", run)
    monkeypatch.setattr(records, "load_records", load)
    cal = tmp_path / "cal.json"
    cal.write_text(json.dumps({"training_efficiency": 0.4, "kept": 1}))  # what an older --verify wrote
    rc, out = _plan(capsys, "--verify", "--out", str(tmp_path / "run"), "--calibration", str(cal),
                    "--baselines-dir", str(tmp_path))
    assert rc == 0 and ran
    assert json.loads(cal.read_text()) == {"training_efficiency": 0.4, "kept": 1}  # read, never written
    assert "40% in " in out and "not used, step times come from measured baseline steps" in out
    table = out[out.index("predicted vs measured"):]
    assert "none of these points used to predict" in table
    errors = [x.split()[-2] for x in table.splitlines()[2:2 + len(ran)]]
    assert errors == ["-4.8%"] * len(ran)  # 1 / 1.05 - 1
    assert f"largest error 4.8% over {len(ran)} points" in out


def test_a_one_and_two_layer_pair_that_does_not_hang_together_is_measured_again(monkeypatch, tmp_path):
    """The one-layer step once ran 1.7x slow as a whole (its layer's forward 1.6x): the depth carried that into
    a 1.7x too fast prediction.  Such a pair is measured again, and the undisturbed one is used and kept."""
    from ckptbench.point.case import Case, preset
    from ckptbench.point.training import TrainSpec

    disturbed = {"left": 1}

    def measure(case) -> dict:
        out = _measure(case)
        if case.model.layers == 1 and disturbed["left"]:
            disturbed["left"] -= 1
            out = {"step_s": out["step_s"] * 1.7, "forward_s": [f * 1.6 for f in out["forward_s"]]}
        return out

    MEASURED.clear()
    monkeypatch.setattr(baselines, "measure_step", measure)
    case = Case(model=preset("llama-tiny"), train=TrainSpec(), batch_size=3, seq_len=64)
    timer = baselines.MeasuredTimer(str(tmp_path))
    assert timer(case) == pytest.approx(_priced(case))
    assert timer.remeasured == 1 and "1 one- and two-layer pairs measured again" in timer.source
    kept = baselines.MeasuredTimer(str(tmp_path))  # the file holds the pair that was used
    assert kept(case) == pytest.approx(_priced(case)) and kept.remeasured == 0


def test_a_pair_that_never_hangs_together_is_measured_again_at_most_twice(monkeypatch, tmp_path):
    from ckptbench.point.case import Case, preset
    from ckptbench.point.training import TrainSpec

    def measure(case) -> dict:  # the second layer costs nothing: never coherent
        MEASURED.append(case)
        return {"step_s": 0.05, "forward_s": [0.01] * case.model.layers}

    MEASURED.clear()
    monkeypatch.setattr(baselines, "measure_step", measure)
    case = Case(model=preset("llama-tiny"), train=TrainSpec(), batch_size=3, seq_len=64)
    timer = baselines.MeasuredTimer(str(tmp_path))
    assert not baselines.coherent(*timer.pair(baselines._plain(case, 1)))
    assert timer(case) == pytest.approx(0.05)
    assert timer.remeasured == baselines.RETRIES == 2 and len(MEASURED) == 2 * (1 + baselines.RETRIES)
