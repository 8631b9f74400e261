"""The projected duration of a sweep: arithmetic pinned, and the CLI refuses a sweep projected past its limit."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ckptbench.spec import Case, Timing, TrainSpec, preset
from ckptbench.theory import duration
from ckptbench.theory.duration import Rates, point_seconds, project
from ckptbench.theory.flops import hardware_flops_per_token
from ckptbench.theory.params import param_count


def test_a_point_is_overhead_plus_build_plus_its_steps_at_the_training_rate():
    spec = preset("llama-small")
    case = Case(model=spec, train=TrainSpec(warmup_steps=1, memory_steps=1, steps=3), batch_size=2, seq_len=256,
                every_n_layers=2)
    rates = Rates({("cpu", "fp32", 1): 80e9}, init_elements_per_s=2e8)
    # 8 steps (1 warm-up, 1 memory, 6 timed: the fewest a 95 % interval of the median needs), layers 0 and 2
    # recomputed
    flops = 8 * hardware_flops_per_token(spec, 256, 2) * 2 * 256
    expected = duration.POINT_S + param_count(spec).total / 2e8 + flops / (duration.EFFICIENCY * 80e9)
    assert point_seconds(case, rates) == pytest.approx(expected, rel=1e-12)
    group = Case(model=spec, train=case.train, batch_size=2, seq_len=256, every_n_layers=2, world_size=2)
    # a torchrun group pays its start instead of a fork, and times its fixed 3 steps
    three = flops * 5 / 8
    assert point_seconds(group, rates) - point_seconds(case, rates) == pytest.approx(
        duration.GROUP_POINT_S - duration.POINT_S - (flops - three) / (duration.EFFICIENCY * 80e9))
    # a step cap below 6 is what a point runs
    capped = Case(model=spec, train=TrainSpec(steps=3, timing=Timing(max_steps=4)), batch_size=2, seq_len=256,
                  every_n_layers=2)
    assert duration.timed_steps(capped) == 4


def test_points_without_a_rate_here_are_counted_not_guessed():
    cpu = Case(model=preset("llama-tiny"), train=TrainSpec(), batch_size=1, seq_len=8)
    gpu = Case(model=preset("llama-tiny", dtype="bf16"), train=TrainSpec(), batch_size=1, seq_len=8, device="cuda")
    rates = Rates({("cpu", "fp32", 1): 80e9, ("cuda", "bf16", 1): None}, 2e8)
    p = project([cpu, gpu], rates)
    assert (p.projected, p.unprojected) == (1, 1)
    assert p.seconds == pytest.approx(duration.FORK_SERVER_S + point_seconds(cpu, rates))
    assert "1 points not projected" in p.text()
    assert project([gpu], rates).text().startswith("duration not projected")


def test_a_sweep_projected_past_max_minutes_asks_for_yes(write_suite, tmp_path):
    path = write_suite()
    out = tmp_path / "never"
    proc = subprocess.run([sys.executable, "-m", "ckptbench", "sweep", "--suite", path, "--out", str(out),
                           "--max-minutes", "0.001"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and not out.exists()
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: projected ") and "> --max-minutes 0.001" in last and "--yes" in last


def test_dry_run_states_the_projection_and_the_memory_check(write_suite):
    proc = subprocess.run([sys.executable, "-m", "ckptbench", "sweep", "--suite", write_suite(), "--dry-run"],
                          capture_output=True, text=True, timeout=120)
    lines = proc.stdout.splitlines()
    assert proc.returncode == 0
    assert lines[-2].startswith("projected duration ") and "cpu fp32 1 thread:" in lines[-2]
    assert lines[-1] == "memory: every point's estimated peak fits in the memory available now"


def test_nothing_is_measured_for_a_sweep_no_flop_formula_describes(monkeypatch):
    from ckptbench.run import calibration

    def no_child(*args, **kwargs):
        raise AssertionError("a calibration child was started for points it cannot project")

    monkeypatch.setattr(calibration.subprocess, "run", no_child)
    mistral = Case(model=preset("mistral-7b", layers=2, hidden=64, vocab=256), train=TrainSpec(), batch_size=1,
                   seq_len=32)
    assert not mistral.model.analytic
    rates, why = calibration.machine_rates([mistral])
    assert rates is None and why == "no FLOP formula for the model type of any point"
