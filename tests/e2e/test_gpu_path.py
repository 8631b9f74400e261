"""The GPU path's CPU-testable parts end to end: the --max-minutes guard, the CPU record's FLOP figures,
and scripts/gpu_check.sh itself (ALLOW_CPU=1 with a tiny CPU suite)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ckptbench.cli import main
from ckptbench.run.faults import Fault
from ckptbench.run.sweep import SweepOptions, run_sweep
from ckptbench.store.records import load_records
from ckptbench.suite.parse import load_suite

pytestmark = pytest.mark.e2e

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

THREE = """
[suite]
name = "three"
timeout_s = 120
[model]
preset = "llama-tiny"
[train]
warmup_steps = 1
memory_steps = 1
steps = 2
max_steps = 2
[sweep]
batch_size = [1]
seq_len = [16]
every_n_layers = [0, 1, 2]
"""


def test_max_minutes_tiny_budget_records_cases_as_skipped(write_suite, tmp_path):
    out = str(tmp_path / "run")
    assert main(["sweep", "--suite", write_suite(THREE), "--out", out, "--max-minutes", "0.0001", "--yes"]) == 0
    records = load_records(out).records
    assert len(records) == 3
    # 6 ms is gone before the first worker could start: every Case is recorded, none ran
    assert all(r["status"] == "skipped" for r in records[1:])
    assert all("--max-minutes 0.0001" in r["reason"] for r in records if r["status"] == "skipped")


@pytest.mark.slow
def test_deadline_passes_during_the_first_case_then_resume_runs_the_rest(write_suite, tmp_path):
    suite = load_suite(write_suite(THREE))
    first = suite.cases[0]
    out = str(tmp_path / "run")
    # deadline 0.6 s; the first Case starts at once and takes over 1.5 s (injected sleep); no calibration
    # readings, whose seconds at the start would be the deadline's on a loaded machine
    run_sweep(suite, SweepOptions(out_dir=out, max_minutes=0.01, faults={first.id: Fault("slow", 1.5)},
                                  calibrate=False))
    statuses = [r["status"] for r in load_records(out).records]
    assert statuses == ["ok", "skipped", "skipped"]
    run_sweep(suite, SweepOptions(out_dir=out, resume=True))
    records = load_records(out).records  # the resumed results replace the skipped lines
    assert [r["status"] for r in records] == ["ok", "ok", "ok"]
    assert [r["case_id"] for r in records] == [c.id for c in suite.cases]
    with open(f"{out}/records.jsonl") as fh:
        assert len(fh.readlines()) == 5  # nothing already written was rewritten


def test_cpu_record_has_the_ideal_ratio_but_no_utilisation(write_suite, tmp_path):
    out = str(tmp_path / "run")
    assert main(["sweep", "--suite", write_suite(THREE), "--out", out]) == 0
    by_n = {r["case"]["every_n_layers"]: r["measurement"] for r in load_records(out).records}
    assert by_n[0]["ideal_recompute_ratio"] == 1.0
    assert by_n[1]["ideal_recompute_ratio"] > by_n[2]["ideal_recompute_ratio"] > 1.0
    assert by_n[1]["checkpointing_api"] == "activation_checkpointing_enable"
    assert by_n[0]["checkpointing_api"] is None
    assert all("mfu" not in m and "energy_per_step_j" not in m for m in by_n.values())
    # the warm-up step's loss and each timed step's
    assert all(len(m["losses"]) == 1 + m["timed_steps"] and all(isinstance(x, float) for x in m["losses"])
               for m in by_n.values())


@pytest.mark.slow
def test_gpu_check_script_on_cpu(tmp_path, write_suite):
    suite = write_suite(THREE.replace("[0, 1, 2]", "[0, 1]"), name="two.toml")
    env = {**os.environ, "ALLOW_CPU": "1", "SUITE": suite, "MAX_MINUTES": "2", "PYTHON": sys.executable}
    out = tmp_path / "out"
    proc = subprocess.run(["bash", os.path.join(REPO, "scripts", "gpu_check.sh"), str(out)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    files = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    # what the device returns (achieved_fit.txt: the fit the card's run allows, here "nothing fitted")
    assert len(files) <= 13 and all(f.count("/") <= 1 for f in files), files
    assert "run/records.jsonl" in files and "gpu_check.log" in files and "logs.tar.gz" in files
    assert "statuses: ok 2" in proc.stdout
    summary = json.loads((out / "run" / "summary.json").read_text())
    assert len(summary["points"]) == 2


def test_gpu_check_script_refuses_a_machine_without_cuda(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    env = {**os.environ, "PYTHON": sys.executable}
    env.pop("ALLOW_CPU", None)
    proc = subprocess.run(["bash", os.path.join(REPO, "scripts", "gpu_check.sh"), str(tmp_path / "o")], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3
    assert "needs one" in proc.stdout
