"""Repeats: every Case N times in fresh workers, interleaved; memory identical to the byte, times pooled."""

from __future__ import annotations

import json

import pytest

from ckptbench.run.sweep import SweepOptions, run_sweep
from ckptbench.store.records import load_records
from ckptbench.store.repeats import merge_repeats
from ckptbench.suite.parse import load_suite
from ckptbench.theory.verdicts.annotate import annotate_record

pytestmark = pytest.mark.e2e


def _lines(out) -> list[dict]:
    with open(out / "records.jsonl") as fh:
        return [json.loads(line) for line in fh]


def test_repeats_are_interleaved_identical_in_memory_and_pooled_in_time(tmp_path, write_suite):
    suite = load_suite(write_suite())  # two points, 2 to 8 timed steps each
    ids = [c.id for c in suite.cases]
    run_sweep(suite, SweepOptions(out_dir=str(tmp_path / "run"), repeats=3), annotate=annotate_record)
    lines = _lines(tmp_path / "run")
    assert [(r["case_id"], r["repeat"]) for r in lines] == [(i, k) for k in range(3) for i in ids]  # A B A B A B
    for case_id in ids:
        mine = [r["measurement"] for r in lines if r["case_id"] == case_id]
        for key in ("peak_bytes", "mem_after_forward_bytes", "saved_bytes", "allocator_growth_bytes",
                    "tracked_resident_peak_bytes", "counted_flops"):
            assert len({json.dumps(m[key]) for m in mine}) == 1, key  # the same to the byte, every repeat
    merged = {r["case_id"]: r for r in load_records(str(tmp_path / "run")).records}
    assert list(merged) == ids
    for case_id, record in merged.items():
        m = record["measurement"]
        pooled = [t for r in lines if r["case_id"] == case_id for t in r["measurement"]["step_times_s"]]
        each = [r["measurement"]["timed_steps"] for r in lines if r["case_id"] == case_id]
        assert m["step_times_s"] == pooled and len(pooled) == sum(each) == m["timed_steps"]
        assert all(2 <= n <= 8 for n in each) and record["repeats"]["timing_stopped_by"]
        low, high = m["step_time_ci95_s"]
        assert low <= m["step_time_median_s"] <= high
        # over one median per repeat: [min, max] of 3, which covers 75 %, and says so
        assert (m["step_time_ci_unit"], m["step_time_ci_n"], m["step_time_ci_coverage"]) == ("repeat", 3, 0.75)
        assert record["repeats"]["n"] == 3 and record["repeats"]["memory_identical"]
        assert record["verdict"] == "pass"


@pytest.mark.slow
def test_resume_adds_the_missing_repeats_only(tmp_path, write_suite):
    suite = load_suite(write_suite())
    out = str(tmp_path / "run")
    run_sweep(suite, SweepOptions(out_dir=out))
    result = run_sweep(suite, SweepOptions(out_dir=out, resume=True, repeats=2))
    assert [r["repeat"] for r in result.records] == [1, 1]
    assert [(r["case_id"], r["repeat"]) for r in _lines(tmp_path / "run")] == \
        [(c.id, k) for k in range(2) for c in suite.cases]


def test_a_repeat_whose_memory_differs_fails_the_record_on_cpu(tmp_path, write_suite):
    suite = load_suite(write_suite())
    run_sweep(suite, SweepOptions(out_dir=str(tmp_path / "run"), repeats=2))
    a, b = [r for r in _lines(tmp_path / "run") if r["case_id"] == suite.cases[0].id]
    a["verdict"] = b["verdict"] = "pass"
    a["gates"] = {"nonfinite_losses": 0}
    b["measurement"]["peak_bytes"] += 64  # what a leak or a nondeterministic kernel would look like
    merged = merge_repeats([a, b])
    assert merged["repeats"]["memory_differs"] == ["peak_bytes"]
    assert merged["gates"]["memory_differs_across_repeats"] == 1 and merged["verdict"] == "fail"
