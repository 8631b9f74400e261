"""The judging rules of ``compare``: thresholds, one-sided points, status, the noisy flag, input kinds.

Rules are tested on small synthetic records (inputs built here to exercise a rule, not measurements).
The pytest-benchmark parser is tested on JSON that pytest-benchmark itself writes: a trivial benchmark
run in a subprocess, whose memory number is a real tracemalloc peak.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from ckptbench.base.errors import UsageError
from ckptbench.cli import main
from ckptbench.point.case import Case, preset
from ckptbench.point.training import TrainSpec
from ckptbench.report.compare import summary_lines
from ckptbench.store.compare import (
    BENCHMARK,
    SWEEP,
    Thresholds,
    compare_paths,
    compare_runs,
    load_side,
    parse_percent,
)
from ckptbench.store.records import RecordStore

MIB = 2**20
CASE = Case(model=preset("llama-tiny"), train=TrainSpec(), batch_size=2, seq_len=64).to_dict()


def synthetic_record(case_id: str, status: str = "ok", peak=10 * MIB, after_forward=8 * MIB, saved=4 * MIB,
                     median=0.100, p90=None, cv=0.0) -> dict:
    """A record shaped like the sweep's, with chosen numbers to put one rule on trial."""
    measurement = {} if status not in ("ok", "over_budget") else {
        "peak_bytes": peak, "mem_after_forward_bytes": after_forward, "saved_bytes": saved,
        "checkpointed_input_bytes": 0, "step_time_median_s": median,
        "step_time_p90_s": median if p90 is None else p90, "step_time_cv": cv,
        "tokens_per_s": 128 / median,
    }
    return {"case_id": case_id, "strategy": "full", "status": status, "measurement": measurement,
            "case": CASE}


def delta(comparison, key, quantity):
    point = next(p for p in comparison.points if p.key == key)
    return next(d for d in point.deltas if d.quantity == quantity)


# ------------------------------------------------------------------------------------ thresholds

@pytest.mark.parametrize("text, value", [("2%", 0.02), ("2", 0.02), ("2.5%", 0.025), (" 10 % ", 0.10),
                                         ("0", 0.0)])
def test_parse_percent_accepts_percentages(text, value):
    assert parse_percent(text) == pytest.approx(value)


@pytest.mark.parametrize("text", ["abc", "-1%", "nan", "inf", "%", ""])
def test_parse_percent_rejects_nonsense(text):
    with pytest.raises(ValueError):
        parse_percent(text)


def test_bad_threshold_on_the_command_line_exits_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["compare", str(tmp_path), str(tmp_path), "--fail-memory", "lots"])
    assert exc.value.code == 2
    assert "--fail-memory" in capsys.readouterr().err


def test_memory_threshold_is_strict_and_applies_to_every_gated_quantity():
    old = [synthetic_record("a"), synthetic_record("b"), synthetic_record("c")]
    new = [synthetic_record("a", peak=10 * MIB * 1.02),  # exactly at 2%: not beyond it
           synthetic_record("b", after_forward=8 * MIB * 1.03),
           synthetic_record("c", saved=4 * MIB * 1.03)]
    comparison = compare_runs(old, new, Thresholds(memory=0.02))
    assert not delta(comparison, "a", "peak_bytes").regressed
    assert delta(comparison, "b", "mem_after_forward_bytes").regressed
    assert delta(comparison, "c", "saved_bytes").regressed
    assert [p.key for p in comparison.regressions] == ["b", "c"]
    assert compare_runs(old, new, Thresholds(memory=0.05)).regressions == []


def test_time_regresses_on_median_growth_and_tokens_drop_but_improvements_pass():
    old = [synthetic_record("slower"), synthetic_record("faster")]
    new = [synthetic_record("slower", median=0.125), synthetic_record("faster", median=0.050)]
    comparison = compare_runs(old, new, Thresholds(time=0.10))
    assert delta(comparison, "slower", "step_time_median_s").regressed
    assert delta(comparison, "slower", "tokens_per_s").regressed
    assert delta(comparison, "faster", "step_time_median_s").improved
    assert [p.key for p in comparison.regressions] == ["slower"]


def test_memory_appearing_from_zero_is_a_regression():
    comparison = compare_runs([synthetic_record("a", saved=0)], [synthetic_record("a", saved=1)])
    d = delta(comparison, "a", "saved_bytes")
    assert d.change == float("inf") and d.regressed


# ------------------------------------------------------------------------------------ status, sides

def test_ok_to_failure_is_a_regression_and_failure_to_ok_is_not():
    old = [synthetic_record("broke"), synthetic_record("fixed", status="oom")]
    new = [synthetic_record("broke", status="oom"), synthetic_record("fixed")]
    comparison = compare_runs(old, new)
    assert [p.key for p in comparison.regressions] == ["broke"]
    assert comparison.regressions[0].reasons(comparison.thresholds) == ["status ok -> oom"]


def test_one_sided_points_are_listed_and_do_not_fail():
    comparison = compare_runs([synthetic_record("both"), synthetic_record("retired")],
                              [synthetic_record("both"), synthetic_record("added", status="crash")])
    assert [p.key for p in comparison.only_old] == ["retired"]
    assert [p.key for p in comparison.only_new] == ["added"]
    assert not comparison.failed
    lines = summary_lines(comparison)
    assert any(line.startswith("only in old: retired") for line in lines)
    assert any(line.startswith("only in new: added") and "(crash)" in line for line in lines)


def test_a_deadline_skipped_point_is_unmeasured_not_a_regression():
    comparison = compare_runs([synthetic_record("a"), synthetic_record("b")],
                              [synthetic_record("a"), synthetic_record("b", status="skipped")])
    assert not comparison.failed
    assert [p.key for p in comparison.only_old] == ["b"]


def test_no_common_point_is_said_out_loud():
    comparison = compare_runs([synthetic_record("a")], [synthetic_record("b")])
    assert not comparison.failed and comparison.points == []
    assert any("no point in common" in line for line in summary_lines(comparison))


def test_a_case_recorded_twice_keeps_the_last_record_and_says_so():
    old = [synthetic_record("a")]
    new = [synthetic_record("a", peak=20 * MIB), synthetic_record("a")]
    comparison = compare_runs(old, new)
    assert not comparison.failed
    assert any("duplicate" in p for p in comparison.problems)


# ------------------------------------------------------------------------------------ noisy flag

def test_noisy_when_either_side_spreads_wider_than_the_time_threshold():
    old = [synthetic_record("p90", p90=0.115), synthetic_record("cv", cv=0.2), synthetic_record("calm", cv=0.05)]
    new = [synthetic_record("p90"), synthetic_record("cv"), synthetic_record("calm", p90=0.105)]
    comparison = compare_runs(old, new, Thresholds(time=0.10))
    assert sorted(p.key for p in comparison.noisy) == ["cv", "p90"]
    assert any(line.startswith("noisy comparison: cv") for line in summary_lines(comparison))


def test_noisy_flag_warns_but_does_not_hide_a_regression():
    comparison = compare_runs([synthetic_record("a", cv=0.5)], [synthetic_record("a", median=0.2, cv=0.5)])
    assert comparison.noisy and comparison.failed


# ------------------------------------------------------------------------------------ inputs

def write_run(path, records) -> str:
    store = RecordStore(str(path))
    store.ensure()
    for r in records:
        store.append(r)
    return str(path)


def test_results_directory_and_records_file_are_both_sweep_inputs(tmp_path):
    run = write_run(tmp_path / "run", [synthetic_record("a")])
    assert load_side(run).kind == SWEEP
    assert load_side(f"{run}/records.jsonl").kind == SWEEP


@pytest.mark.parametrize("name, content, message", [
    ("missing", None, "no such file"),
    ("", None, "not a results directory"),
    ("x.json", b"{not json", "not JSON"),
    ("x.json", b"\xff\xfe\x00", "not JSON"),
    ("x.json", b'{"a": 1}', "no 'benchmarks' list"),
    ("records.jsonl", b"torn", "no readable records"),
])
def test_bad_inputs_are_usage_errors(tmp_path, name, content, message):
    path = tmp_path / name
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(UsageError, match=message):
        load_side(str(path))


@pytest.mark.parametrize("flags", [[], ["--json"]])
def test_runs_with_no_point_in_common_exit_2_in_one_line(tmp_path, capsys, flags):
    old = write_run(tmp_path / "old", [synthetic_record("a"), synthetic_record("b")])
    new = write_run(tmp_path / "new", [synthetic_record("c")])
    assert main(["compare", old, new, *flags]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == (
        f"error: {old} and {new} have no point in common (2 only in old, 1 only in new): nothing was compared; "
        "Case ids hash every setting (model, steps, seed, ...), so runs of different suites share no points\n")


def test_bad_input_on_the_command_line_is_one_line_and_exit_2(tmp_path, capsys):
    assert main(["compare", str(tmp_path / "nope"), str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1


# ------------------------------------------------------------------------------------ pytest-benchmark JSON

BENCH_MODULE = """
import os
import tracemalloc

SIZE = int(os.environ["BENCH_SIZE"])


def build():
    return [str(i) for i in range(SIZE)]


def test_build(benchmark):
    tracemalloc.start()
    build()
    benchmark.extra_info["peak_bytes"] = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    benchmark.pedantic(build, rounds=5, warmup_rounds=1)


if os.environ.get("BENCH_EXTRA"):
    def test_extra(benchmark):
        benchmark(sum, range(100))
"""


def run_pytest_benchmark(tmp_path, name: str, size: int, extra: bool) -> str:
    """Run pytest-benchmark for real on a trivial module; returns the JSON file it wrote."""
    work = tmp_path / name
    work.mkdir()
    (work / "test_bench.py").write_text(textwrap.dedent(BENCH_MODULE))
    (work / "pytest.ini").write_text("[pytest]\n")
    out = work / "bench.json"
    env = {"BENCH_SIZE": str(size), **({"BENCH_EXTRA": "1"} if extra else {})}
    # a pytest of its own, not a worker of this one's (pytest-benchmark turns itself off under xdist)
    outer = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_XDIST", "PYTEST_CURRENT"))}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                           "-c", "pytest.ini", "--benchmark-only", f"--benchmark-json={out}", "test_bench.py"],
                          cwd=work, env={**outer, **env}, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return str(out)


@pytest.fixture(scope="module")
def bench_files(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bench")
    return run_pytest_benchmark(tmp, "old", 20_000, extra=False), run_pytest_benchmark(tmp, "new", 60_000, extra=True)


def test_pytest_benchmark_json_is_read_by_fullname_with_memory_from_extra_info(bench_files):
    old_path, _ = bench_files
    side = load_side(old_path)
    with open(old_path) as fh:
        data = json.load(fh)
    (bench,) = data["benchmarks"]
    assert side.kind == BENCHMARK
    (point,) = side.points
    assert point.key == bench["fullname"] == "test_bench.py::test_build"
    assert point.values["peak_bytes"] == bench["extra_info"]["peak_bytes"] > 0
    assert point.values["step_time_median_s"] == bench["stats"]["median"]
    assert point.values["tokens_per_s"] is None  # not a training benchmark: nothing to invent
    assert point.spread is not None and point.spread >= 0


def test_pytest_benchmark_files_compare_memory_and_list_new_benchmarks(bench_files, capsys):
    old_path, new_path = bench_files
    comparison = compare_paths(old_path, new_path)
    assert [p.key for p in comparison.only_new] == ["test_bench.py::test_extra"]
    (point,) = comparison.points
    assert next(d for d in point.deltas if d.quantity == "peak_bytes").regressed  # three times the strings
    assert main(["compare", old_path, old_path]) == 0
    assert main(["compare", old_path, new_path]) == 1
    assert "peak memory" in capsys.readouterr().out


def test_mixed_kinds_are_refused(bench_files, tmp_path):
    run = write_run(tmp_path / "run", [synthetic_record("a")])
    with pytest.raises(UsageError, match="cannot compare"):
        compare_paths(run, bench_files[0])


def test_the_terminal_summary_caps_each_kind_of_line_and_says_how_many_more():
    from ckptbench.report.compare import _capped

    lines = [f"noisy comparison: p{i}" for i in range(120)]
    assert _capped(lines, None, "noisy points") == lines
    capped = _capped(lines, 50, "noisy points")
    assert capped[:50] == lines[:50] and capped[50] == "... and 70 more noisy points (--json lists every one)"
    assert _capped(lines[:50], 50, "noisy points") == lines[:50]
