"""The projected duration of a sweep: arithmetic pinned, and the CLI refuses a sweep projected past its limit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace

import pytest

from ckptbench.point.case import Case, preset
from ckptbench.point.training import Timing, TrainSpec
from ckptbench.theory.memory.params import param_count
from ckptbench.theory.time import duration
from ckptbench.theory.time.duration import Rates, point_seconds, project
from ckptbench.theory.time.flops import hardware_flops_per_token

RESULTS = os.path.join(os.path.dirname(__file__), "..", "..", "results")


def test_a_point_is_overhead_plus_build_plus_its_steps_at_the_training_rate():
    spec = preset("llama-small")
    case = Case(model=spec, train=TrainSpec(warmup_steps=1, memory_steps=1, steps=3), batch_size=2, seq_len=256,
                every_n_layers=2)
    rates = Rates({("cpu", "fp32", 1): 80e9}, init_elements_per_s=2e8)
    # layers 0 and 2 recomputed; a CPU point times as many steps as its caps allow: 50 steps here (each well
    # under 20 s / 50), plus 1 warm-up and 1 memory step
    step = hardware_flops_per_token(spec, 256, 2) * 2 * 256 / (duration.EFFICIENCY * 80e9)
    assert duration.step_seconds(case, rates) == pytest.approx(step, rel=1e-12)
    assert duration.timed_steps(case, step) == 50
    expected = duration.POINT_S + param_count(spec).total / 2e8 + 52 * step
    assert point_seconds(case, rates) == pytest.approx(expected, rel=1e-12)
    group = Case(model=spec, train=case.train, batch_size=2, seq_len=256, every_n_layers=2, world_size=2)
    # a torchrun group pays its start instead of a fork, and times its fixed 3 steps
    assert point_seconds(group, rates) - point_seconds(case, rates) == pytest.approx(
        duration.GROUP_POINT_S - duration.POINT_S - 47 * step)
    # a step cap below the rest is what a point runs
    capped = Case(model=spec, train=TrainSpec(steps=3, timing=Timing(max_steps=4)), batch_size=2, seq_len=256,
                  every_n_layers=2)
    assert duration.timed_steps(capped, step) == duration.timed_steps(capped) == 4


def test_timed_steps_follow_the_stop_rule_by_device():
    spec = preset("llama-tiny", dtype="bf16")
    cpu = Case(model=spec, train=TrainSpec(), batch_size=1, seq_len=8)
    gpu = Case(model=spec, train=TrainSpec(), batch_size=1, seq_len=8, device="cuda")
    # a CPU: max_time_s's worth at most max_steps (and at least `steps`)
    assert [duration.timed_steps(cpu, s) for s in (0.01, 0.5, 3.0, 60.0)] == [50, 40, 7, 3]
    # CUDA: 9 steps give a 95 % interval without the fastest and slowest step; read every 4th step from the
    # 3rd, the rule can stop at 11
    assert [duration.timed_steps(gpu, s) for s in (0.01, 0.5, 3.0, 60.0)] == [11, 11, 7, 3]
    assert duration.timed_steps(replace(gpu, train=TrainSpec(steps=12))) == 12  # the first read, from 12 on
    assert duration.timed_steps(replace(gpu, train=TrainSpec(timing=Timing(max_steps=8)))) == 8


def _recorded(run: str) -> tuple[list[dict], list[Case]]:
    path = os.path.join(RESULTS, run, "records.jsonl")
    with open(path, encoding="utf-8") as fh:
        records = [json.loads(line) for line in fh]
    return records, [Case.from_dict(r["case"]) for r in records]


def _old_point_seconds(case: Case, matmul: float, init: float) -> float:
    """The projection both runs were made with: 0.25 s, the build at the CPU's init rate, and 8 steps
    (1 warm-up, 1 memory, 6 timed) at 40 % of the rate of 1024-sided matmuls."""
    return duration.POINT_S + param_count(case.model).total / init + 8 * duration.step_seconds(
        case, Rates({duration.rate_key(case): matmul}))


def test_the_projection_of_the_h200_run_from_its_recorded_figures():
    """results/h200-20261204-gpu-small: 42 points, the sweep took 329.1 s (gpu_check.log), projected 1,366 s
    from a bf16 matmul rate of 115,895 GFLOP/s (1024-sided: gpu_check.log) and a CPU init rate of 1.207e8
    parameters/s, which the records' projected_s give back.  Now priced at the 8192-sided bf16 rate the same
    H200 measured (run/calibration.json), the build in the CUDA point overhead, 11 timed steps a point."""
    records, cases = _recorded(os.path.join("h200-20261204-gpu-small", "run"))
    took = 329.1
    for r, case in zip(records, cases):
        assert _old_point_seconds(case, 115.895e12, 1.207e8) == pytest.approx(r["projected_s"], rel=2e-3)
    old = duration.FORK_SERVER_S + sum(r["projected_s"] for r in records)
    assert old == pytest.approx(1366.2, abs=0.1) and old / took > 4
    with open(os.path.join(RESULTS, "h200-20261204-gpu-small", "run", "calibration.json"), encoding="utf-8") as fh:
        bf16_8192 = json.load(fh)["matmul_flops_per_s"]
    assert bf16_8192 == pytest.approx(795.4e12, rel=1e-3)
    new = project(cases, Rates({("cuda", "bf16", 4): bf16_8192}, 1.207e8))
    assert (new.projected, new.unprojected) == (42, 0)
    assert 0.7 * took <= new.seconds <= 1.3 * took  # 304.5 s: 0.93 of it
    # the timed steps it counts: 11 a point (462) where the points timed 7-50 (913); the steps it prices at
    # 0.4 of 795 TFLOP/s ran at 0.09-0.62 of it
    assert sum(duration.timed_steps(c, duration.step_seconds(c, new.rates)) for c in cases) == 42 * 11
    assert sum(r["measurement"]["timed_steps"] for r in records) == 913


def test_the_projection_of_the_cpu_reference_run_from_its_recorded_figures():
    """results/reference-cpu-timed: 30 llama-small points on 2 shared cores, 558.2 s of points (their wall_s)
    plus the fork server's start.  Projected 252.7 s then (its records' projected_s: a matmul rate of 115.5
    GFLOP/s and 6 timed steps a point where they timed 4-50, 25 of 30 stopped by a cap); now each point
    times up to its caps."""
    records, cases = _recorded("reference-cpu-timed")
    took = duration.FORK_SERVER_S + sum(r["wall_s"] for r in records)
    assert took == pytest.approx(562.2, abs=0.1)
    for r, case in zip(records, cases):
        assert _old_point_seconds(case, 115.53e9, 1.21e8) == pytest.approx(r["projected_s"], rel=2e-3)
    old = duration.FORK_SERVER_S + sum(r["projected_s"] for r in records)
    assert old / took < 0.5
    new = project(cases, Rates({("cpu", "fp32", 1): 115.53e9}, 1.21e8))
    assert 0.7 * took <= new.seconds <= 1.3 * took  # 549.4 s: 0.98 of it


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


def test_the_held_out_bench_runs_projection_is_its_records_and_console():
    """results/reference-cpu-bench ran after the constants were set: its projection, each record's
    projected_s plus the sweep's start, and its time, the console's; docs/suites.md states both."""
    import re

    from ckptbench.store.records import load_records

    run = os.path.join(RESULTS, "reference-cpu-bench")
    records = load_records(run).records
    with open(os.path.join(run, "console.log"), encoding="utf-8") as fh:
        took, projected = (float(x) for x in re.search(r"the sweep took ([0-9.]+) s; projected ([0-9.]+) s",
                                                       fh.read()).groups())
    assert projected == pytest.approx(duration.start_seconds(True, False) + sum(r["projected_s"] for r in records),
                                      abs=0.05)
    with open(os.path.join(os.path.dirname(__file__), "..", "..", "docs", "suites.md"), encoding="utf-8") as fh:
        docs = " ".join(fh.read().split())
    stated = re.search(r"took ([0-9.]+) s of sweep against ([0-9.]+) s projected when it started \(([0-9.]+) times",
                       docs)
    assert (float(stated.group(1)), float(stated.group(2))) == (took, projected)
    assert float(stated.group(3)) == round(projected / took, 2)
