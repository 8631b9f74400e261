"""``ckptbench compare`` on real tiny sweeps, made worse on purpose in two ways.

The baseline and the slowed run are real sweeps (isolated workers, a few seconds each).  The slowdown is
the worker's test-only ``slow`` fault: 500 ms slept inside each timed step of one Case, about fifty
times that Case's step time, so the regression is certain, not a matter of machine speed.  (At 50 ms, a
baseline whose steps were slowed by load spikes from the other test worker once hid it: CI saw exit 0.
The t-test on 5 vs 5 log times needs the difference of logs to stand well above one loaded step's.)  The memory
regression rewrites the baseline's records so that the full-checkpointing Case carries the measurement of
the no-checkpointing Case under its own id: exactly what a change that silently disabled checkpointing
would record.
"""

from __future__ import annotations

import json

import pytest

from ckptbench.cli import main
from ckptbench.run.faults import Fault
from ckptbench.run.sweep import SweepOptions, run_sweep
from ckptbench.store.machine_speed import load_readings
from ckptbench.store.records import RecordStore, load_records
from ckptbench.suite.parse import load_suite

pytestmark = pytest.mark.e2e

SLEEP_S = 0.5  # slept inside each timed step of the full-checkpointing Case in the slowed run

SUITE = """
[suite]
name = "compare-e2e"
timeout_s = 120

[model]
preset = "llama-tiny"

[train]
warmup_steps = 1
memory_steps = 1
steps = 5
max_steps = 5  # exactly 5 timed steps a side: the test below names them
threads = 1

[sweep]
batch_size = [2]
seq_len = [64]
every_n_layers = [0, 1]
"""


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    path = tmp_path_factory.mktemp("suite") / "compare.toml"
    path.write_text(SUITE)
    return load_suite(str(path))


@pytest.fixture(scope="module")
def full_case(suite):
    return next(c for c in suite.cases if c.every_n_layers == 1)


@pytest.fixture(scope="module")
def none_case(suite):
    return next(c for c in suite.cases if c.every_n_layers == 0)


@pytest.fixture(scope="module")
def baseline(suite, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("baseline"))
    result = run_sweep(suite, SweepOptions(out_dir=out))
    assert [r["status"] for r in result.records] == ["ok", "ok"]
    return out


@pytest.fixture(scope="module")
def slowed(suite, full_case, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("slowed"))
    result = run_sweep(suite, SweepOptions(out_dir=out, faults={full_case.id: Fault("slow", SLEEP_S)}))
    assert [r["status"] for r in result.records] == ["ok", "ok"]
    return out


def _compare(capsys, *args) -> tuple[int, str]:
    code = main(["compare", *args])
    return code, capsys.readouterr().out


def _regression_lines(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("REGRESSION ")]


def test_a_run_compared_with_itself_passes(baseline, capsys):
    code, out = _compare(capsys, baseline, baseline)
    assert code == 0
    assert _regression_lines(out) == []
    assert "no regression among 2 compared points" in out
    assert "machine speed: the calibration kernel (fp32 matmul" in out and "within its noise" in out


def test_each_sweep_times_the_calibration_kernel_at_its_start_and_end(baseline, slowed):
    for run in (baseline, slowed):
        readings = load_readings(run)
        assert [r["at"] for r in readings] == ["start", "start", "end", "end"]
        assert all(r["threads"] == 1 and len(r["times_s"]) == 7 and min(r["times_s"]) > 0 for r in readings)


def test_injected_step_delay_is_a_time_regression(baseline, slowed, full_case, capsys):
    code, out = _compare(capsys, baseline, slowed)
    assert code == 1, out
    lines = [line for line in _regression_lines(out) if full_case.id in line]
    assert len(lines) == 1, out
    assert "llama-tiny full" in lines[0] and "step time" in lines[0]

    code, out = _compare(capsys, baseline, slowed, "--json")
    assert code == 1, out
    report = json.loads(out)
    point = next(p for p in report["points"] if p["key"] == full_case.id)
    step = next(d for d in point["deltas"] if d["quantity"] == "step_time_median_s")
    assert point["regressed"] and step["regressed"]
    assert step["new"] >= SLEEP_S  # the injected sleep is inside the timed step
    # the product's bar (p < 0.05), not a stricter one: the baseline's steps run on whatever the machine is
    # doing, and one of them slowed by load widens the t-test's variance (CI saw p = 0.0199 once)
    assert step["verdict"] == "regression" and step["p_value"] < 0.05
    assert step["test"] == "one-sided Welch t on log times, 5 vs 5 steps"
    assert 0.9 <= step["old_ci_coverage"] <= 1  # a bootstrap interval over 5 steps: about 94 %, not 95
    # every new step holds the sleep, so every bootstrap median does (whether the old interval ends
    # below it depends on how loaded the machine was while the baseline ran: not asserted)
    assert step["new_ci"][0] >= SLEEP_S
    tokens = next(d for d in point["deltas"] if d["quantity"] == "tokens_per_s")
    assert tokens["regressed"]


def test_checkpointing_silently_off_is_a_memory_regression(baseline, full_case, none_case, tmp_path, capsys):
    records = load_records(baseline).records
    by_id = {r["case_id"]: r for r in records}
    store = RecordStore(str(tmp_path / "worse"))
    store.ensure()
    for r in records:
        rewritten = {k: v for k, v in r.items() if k != "schema"}
        if r["case_id"] == full_case.id:
            rewritten["measurement"] = by_id[none_case.id]["measurement"]
        store.append(rewritten)

    code, out = _compare(capsys, baseline, store.run_dir)
    assert code == 1
    lines = _regression_lines(out)
    assert len(lines) == 1 and full_case.id in lines[0], out
    assert "peak memory" in lines[0] and "after-forward memory" in lines[0] and "saved activations" in lines[0]
