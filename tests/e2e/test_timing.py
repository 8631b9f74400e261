"""A sweep on a tiny Llama times each point to a stated precision or a cap, records why it stopped and the
interval it reached, and names a fastest setting only where the intervals say so."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from ckptbench.measure.interval import ranks
from ckptbench.store.records import load_records

pytestmark = [pytest.mark.e2e, pytest.mark.slow]  # make test-all only: timing to a precision, several sweeps (19 s)

SUITE = """
[suite]
name = "timing"
timeout_s = 120
budgets_gib = [0.01]

[model]
preset = "llama-tiny"

[train]
warmup_steps = 1
memory_steps = 1
steps = 3
time_precision = 0.1
max_steps = 12
max_time_s = 10

[sweep]
batch_size = [2]
seq_len = [32, 64]
every_n_layers = [0, 1]
"""


def test_each_point_says_how_many_steps_it_timed_why_it_stopped_and_what_its_interval_covers(write_suite, tmp_path):
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "ckptbench", "sweep", "--suite", write_suite(SUITE), "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    records = load_records(str(out)).records
    assert len(records) == 4 and all(r["status"] == "ok" for r in records)
    for r in records:
        m = r["measurement"]
        n = m["timed_steps"]
        assert 3 <= n <= 12 and len(m["step_times_s"]) == n == m["steps"]["timed"]
        assert m["timing_stopped_by"] in ("precision", "max_steps", "max_time")
        assert m["timing_target"]["precision"] == 0.1 and m["timing_target"]["min_steps"] == 3
        assert m["step_time_ci_method"] == "order-statistic" and m["step_time_ci_n"] == n
        assert m["step_time_ci_coverage"] == ranks(n)[1]
        low, high = m["step_time_ci95_s"]
        median = m["step_time_median_s"]
        assert low <= median <= high
        if m["timing_stopped_by"] == "precision":  # a real 95 % interval within ±10 % of the median
            assert n >= 6 and m["step_time_ci_coverage"] >= 0.95 and max(median - low, high - median) <= 0.1 * median
        elif m["timing_stopped_by"] == "max_steps":
            assert n == 12
        else:
            assert m["timing_window_s"] >= m["timing_target"]["max_time_s"]
        assert r["load"]["cores"] and r["load"]["loaded"] in (True, False)
    # the console names a fastest setting per sequence length (and budget), or says which are tied
    lines = [line for line in proc.stderr.splitlines() if ": fastest" in line]  # the console: stderr
    assert [line.split(":")[0] for line in lines] == ["seq 32", "seq 32", "seq 64", "seq 64"]
    for line in lines:
        answer = re.match(r"seq \d+: fastest(?: within 0.01 GiB)?: (.*)", line).group(1)
        assert re.match(r"(none|full|tied within noise: (none|full), (none|full)) — ", answer), line
        assert "interval)" in answer
