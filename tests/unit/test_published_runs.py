"""scripts/published_runs.py: a run's row is plan's prediction at its setup beside the figure given."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
SCRIPT = os.path.join(ROOT, "scripts", "published_runs.py")
# a setup of this test's own, with a figure chosen for the test: not a published run
RUN = """[[run]]
source = "test setup"
device = "h100"
world = 16
network = "400G IB"
model = "llama-8b"
seq = 4096
batch = 1
precision = "bf16-mixed"
sharding = "fsdp"
checkpointing = "CKPT"
tokens_per_s_per_gpu = 5000.0
fitted = FITTED
"""


@pytest.mark.slow
def test_each_row_is_the_figure_over_plans_prediction_and_in_sample_rows_are_not_judged(tmp_path):
    runs = tmp_path / "runs.toml"
    runs.write_text(RUN.replace("CKPT", "every-2").replace("FITTED", "false")
                    + RUN.replace("CKPT", "full").replace("FITTED", "true").replace("5000.0", "4000.0"))
    proc = subprocess.run([sys.executable, SCRIPT, "--runs", str(runs)], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr
    plan = subprocess.run([sys.executable, "-m", "ckptbench", "plan", "--model", "llama-8b", "--device", "h100",
                           "--seq", "4096", "--batch", "1", "--precision", "bf16-mixed", "--world", "16",
                           "--sharding", "fsdp", "--network", "400G IB", "--attn", "sdpa", "--json"],
                          capture_output=True, text=True, timeout=600)
    by = {o["strategy"]: o for o in json.loads(plan.stdout)["options"]}
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| test setup")]
    assert len(rows) == 2
    for line, (name, figure) in zip(rows, (("every-2", 5000.0), ("full", 4000.0))):
        predicted = by[name]["tokens_per_s"] / 16
        assert f"| {predicted:,.0f} |" in line and f"| {figure / predicted:.2f} |" in line
    assert rows[1].endswith("| no (in-sample) |")
    assert "held out: " in proc.stdout and " of 1 within" in proc.stdout
    # both are settings of one setup: plan's pick and the regret of it
    pick = max(("every-2", "full"), key=lambda n: by[n]["tokens_per_s"])
    regret = 5000.0 / (5000.0 if pick == "every-2" else 4000.0) - 1
    assert f"plan picks {pick} of 2 published settings; regret {regret:.1%}" in proc.stdout


def test_a_run_missing_a_key_is_one_line_exit_2(tmp_path):
    runs = tmp_path / "runs.toml"
    runs.write_text(RUN.replace("CKPT", "full").replace("FITTED", "false").replace("seq = 4096\n", ""))
    proc = subprocess.run([sys.executable, SCRIPT, "--runs", str(runs)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr.strip().endswith("run 1: seq: missing")


def test_a_value_of_the_wrong_kind_is_one_line_exit_2(tmp_path):
    runs = tmp_path / "runs.toml"
    runs.write_text(RUN.replace("CKPT", "full").replace("FITTED", "false").replace("world = 16", 'world = "16"'))
    proc = subprocess.run([sys.executable, SCRIPT, "--runs", str(runs)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr.strip().endswith("run 1: world: must be a whole number, got '16'")


def test_the_committed_file_is_read():
    proc = subprocess.run([sys.executable, SCRIPT], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "no [[run]] entries" in proc.stdout
