"""Scale of the outputs: a run of thousands of records renders a page of bounded size, and the work of
loading, reporting and comparing grows with the records, not with their square.

Structural assertions only (bytes, rows, calls): no wall-clock thresholds on a shared machine.
"""

from __future__ import annotations

import csv
import math
import os
import re

import numpy as np
import pytest

from ckptbench.measure import interval
from ckptbench.measure.interval import ranks
from ckptbench.report import compare as compare_view
from ckptbench.report.checks import csv_path
from ckptbench.report.render import render_report
from ckptbench.store import stats
from ckptbench.store.compare import compare_runs
from ckptbench.store.records import load_records
from tests.synthetic_run import synthetic_records, write_run

N = 5000
# The old page listed every check of every record: 5,000 records × 16 checks came to some 35 MB.
# Summaries, the failing checks and the figures fit in a small fraction of that.
HTML_BOUND = 4 * 2**20


def _one_interval(samples, level=stats.CONFIDENCE):
    """The interval of one sample alone, as the order statistics define it."""
    if len(samples) < 3:
        return None
    k, _ = ranks(len(samples), level)
    ordered = sorted(samples)
    return ordered[k - 1], ordered[len(samples) - k]


def _one_ratio(num, den):
    a, b = _one_interval(num, stats.CONFIDENCE ** 0.5), _one_interval(den, stats.CONFIDENCE ** 0.5)
    return None if a is None or b is None else (a[0] / b[1], a[1] / b[0])


def _samples(k: int, seed: int = 3) -> list[list[float]]:
    rng = np.random.default_rng(seed)
    out = [list(rng.uniform(0.05, 0.1, size=n)) for n in rng.integers(0, 12, size=k)]
    return out + [[0.1, 0.1, 0.2], [1.0, 2.0, 2.0, 3.0], [0.2] * 5]


def test_batched_intervals_are_the_intervals_drawn_one_at_a_time():
    samples = _samples(200)
    assert [ci and tuple(ci) for ci in stats.median_cis(samples)] == [_one_interval(s) for s in samples]
    pairs = list(zip(samples, reversed(samples)))
    assert [ci and tuple(ci) for ci in stats.ratio_cis(pairs)] == [_one_ratio(a, b) for a, b in pairs]


def test_batched_rank_tests_are_the_tests_run_one_at_a_time():
    pytest.importorskip("scipy")
    from scipy.stats import mannwhitneyu

    samples = _samples(120)
    triples = [(a, [t * 1.07 for t in b], "slower" if k % 2 else "faster")
               for k, (a, b) in enumerate(zip(samples, samples[1:]))]
    triples += [([1.0, 2.0, 3.0], [2.0, 3.0, 4.0], "slower"), ([1.0, 2.0, 3.0], [4.0, 5.0, 6.0], "slower")]
    expected = [None if len(o) < 2 or len(n) < 2 else
                float(mannwhitneyu(n, o, alternative="greater" if d == "slower" else "less").pvalue)
                for o, n, d in triples]
    got = stats.p_values(triples)
    assert [g is None for g in got] == [e is None for e in expected]
    assert all(g == e or math.isclose(g, e, rel_tol=1e-12) for g, e in zip(got, expected) if e is not None)


def test_batched_welch_tests_are_scipys_welch_test_run_one_at_a_time():
    pytest.importorskip("scipy")
    from scipy.stats import ttest_ind

    from ckptbench.store import significance

    samples = _samples(120)
    triples = [(a, [t * 1.07 for t in b], "slower" if k % 2 else "faster")
               for k, (a, b) in enumerate(zip(samples, samples[1:]))]
    expected = [None if len(o) < 2 or len(n) < 2 else
                float(ttest_ind(np.log(n), np.log(o), equal_var=False,
                                alternative="greater" if d == "slower" else "less").pvalue) for o, n, d in triples]
    got = significance.p_values(triples)
    assert [g is None for g in got] == [e is None for e in expected] and sum(e is not None for e in expected) > 80
    assert all(math.isclose(g, e, rel_tol=1e-9) for g, e in zip(got, expected) if e is not None)
    assert significance.p_values([([0.1], [0.2, 0.3], "slower")]) == [None]  # one time: nothing to test


@pytest.fixture(scope="module")
def big_run(tmp_path_factory):
    return write_run(str(tmp_path_factory.mktemp("big") / "run"), N)


@pytest.mark.slow
def test_a_large_run_renders_a_bounded_page_with_every_failing_check(big_run, tmp_path):
    loaded = load_records(big_run)
    assert len(loaded.records) == N and not loaded.problems
    # the estimate's checks and the meters' (the report lists both: every check a verdict counts)
    checks = [c for r in loaded.records for c in (r.get("checks") or []) + ((r.get("meters") or {}).get("checks") or [])]
    failing = [c for c in checks if c["verdict"] == "fail"]
    assert failing and len(checks) > 50_000

    html_path = render_report(big_run, str(tmp_path / "big.html"), loaded=loaded)
    html = open(html_path, encoding="utf-8").read()
    size = len(html.encode())
    assert size < HTML_BOUND, f"{size} bytes"
    assert "could not be rendered" not in html
    # every failing check is listed row by row; the passing ones are counted, not listed
    listed = html.split('<table class="check-rows">', 1)[1].split("</table>", 1)[0]
    assert listed.count('<tr class="fail">') == len(failing)
    assert '<tr class="pass">' not in listed
    assert f"{len(checks)} checks, {len(failing)} failing" in html
    summary = html.split('<table class="check-summary">', 1)[1].split("</table>", 1)[0]
    counts = [int(n) for n in re.findall(r'<td class="num">(\d+)</td><td class="num">(\d+)</td>', summary)[0]]
    assert counts[0] == len(failing)
    # and the whole table is beside the page
    with open(csv_path(html_path), encoding="utf-8", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == len(checks)
    assert [r["verdict"] for r in rows[:len(failing)]] == ["fail"] * len(failing)
    assert {r["case_id"] for r in rows} == {r["case_id"] for r in loaded.records
                                             if r.get("checks") or (r.get("meters") or {}).get("checks")}


# A page of 20,000 records stays under this whatever varies from point to point (a sweep's shape)
SHAPE_BOUND = 10 * 2**20


def _shape_page(tmp_path, n: int, vary: str) -> tuple[str, str]:
    run = write_run(str(tmp_path / f"run-{vary}"), n, vary=vary)
    path = render_report(run, str(tmp_path / f"{vary}.html"))
    return run, open(path, encoding="utf-8").read()


def _figures_are_bounded(html: str) -> None:
    from ckptbench.report.answers_table import SHOWN
    from ckptbench.report.figures import MAX_PANELS

    assert "could not be rendered" not in html
    table = html.split('<table class="headline">', 1)[1].split("</table>", 1)[0]
    assert 0 < table.count("<tr>") - 1 <= SHOWN
    for fig in re.findall(r'<figure><img src="data:image/svg\+xml;base64,([^"]+)"', html):
        assert len(fig) < 2 * 2**20  # each figure thinned, binned or its panels chosen: no figure is megabytes
    assert html.count('<img ') <= 12 and MAX_PANELS == 6


@pytest.mark.parametrize("vary", ["seq", "batch", "variant"])
def test_a_sweep_of_any_shape_renders_a_bounded_page(tmp_path, vary):
    """1,500 points, each at its own sequence length, batch or model variant: the headline's panels are
    chosen, its table folded and cut (every answer in the CSV), the memory lines binned."""
    _, html = _shape_page(tmp_path, 1500, vary)
    _figures_are_bounded(html)
    with open(tmp_path / f"{vary}.answers.csv", encoding="utf-8", newline="") as fh:
        lines = list(csv.DictReader(fh))
    groups = {(r["variant"], r["seq"]) for r in lines}
    assert len(lines) >= len(groups) * 2  # each group: its lowest peak and its fastest, at least
    if vary == "seq":
        assert len(groups) > 1000 and "groups (variant, sequence length) drawn, evenly spaced" in html
        assert "binned into 120 log-spaced bins" in html
    if vary == "variant":  # each point a preset with its own width: a model of its own, and its lines capped
        assert len({r["variant"] for r in lines}) > 1000
        assert "6 of " in html and "models and settings (variants) drawn, evenly spaced" in html


@pytest.mark.slow
@pytest.mark.parametrize("vary", ["seq", "batch", "variant"])
def test_twenty_thousand_points_of_any_shape_make_a_page_under_ten_megabytes(tmp_path, vary):
    _, html = _shape_page(tmp_path, 20_000, vary)
    _figures_are_bounded(html)
    assert len(html.encode()) < SHAPE_BOUND


def test_loading_draws_intervals_per_size_not_per_record(big_run, monkeypatch):
    calls = []
    real = interval.np.sort
    monkeypatch.setattr(interval.np, "sort", lambda rows, axis: calls.append(len(rows)) or real(rows, axis=axis))
    loaded = load_records(big_run)
    assert sum(calls) == N  # every record's interval ...
    assert len(calls) <= 10  # ... in a handful of array operations, not one per record
    assert all(r["measurement"]["step_time_ci95_s"] for r in loaded.records if r["status"] == "ok")


def test_compare_runs_its_tests_in_batches_and_draws_only_what_moved(monkeypatch):
    pytest.importorskip("scipy")
    from ckptbench.store import significance

    old, new = synthetic_records(N, seed=0), synthetic_records(N, seed=1)
    tests = []
    real = significance.welch
    monkeypatch.setattr(significance, "welch", lambda *a, **k: tests.append(1) or real(*a, **k))
    comparison = compare_runs(old, new)
    assert len(comparison.points) == N
    timed = sum(1 for p in comparison.points for d in p.deltas if d.p_value is not None)
    assert timed >= N  # every point's times were tested ...
    assert len(tests) <= 4  # ... in a few calls (one per pair of sample sizes), not one per point
    shown = compare_view.shown_points(comparison)
    assert len(shown) == compare_view.TABLE_POINTS and all(compare_view.notable(p) for p in shown)
    regressions = comparison.regressions
    assert shown == regressions[:len(shown)] or shown[:len(regressions)] == regressions


def test_a_small_comparison_draws_every_point():
    old, new = synthetic_records(30, seed=0), synthetic_records(30, seed=1)
    comparison = compare_runs(old, new)
    assert compare_view.shown_points(comparison) == comparison.points


def test_baseline_rows_are_capped_to_the_largest_changes():
    from ckptbench.report import tables
    from ckptbench.report.columns import tidy
    from ckptbench.store.records import to_frame

    old = synthetic_records(300, seed=0)
    old[5].update(status="crash", reason="gone", checks=None)
    cur, base = tidy(to_frame(synthetic_records(300, seed=1))), tidy(to_frame(old))
    out = tables.deltas(cur, base, limit=50)
    assert out["matched"] == 300 and out["total_rows"] > 50 and len(out["rows"]) == 50
    status = [r for r in out["rows"] if r["quantity"] == "status" and r["delta"] == "changed"]
    assert status  # a point ok on one side only is never cut
    everything = tables.deltas(cur, base, limit=10**6)["rows"]
    assert len(everything) == out["total_rows"]


def _case_variants(case: dict) -> list:
    """A good case and shapes of it Case.from_dict accepts or refuses, for the validator's fast path."""
    model, train = case["model"], case["train"]
    drop = lambda d, k: {x: v for x, v in d.items() if x != k}  # noqa: E731
    return [case, {**case, "extra": 1}, drop(case, "model"), drop(case, "train"), drop(case, "batch_size"),
            drop(case, "seq_len"), {**case, "model": [model]}, {**case, "model": "llama"},
            {**case, "model": drop(model, "hidden")}, {**case, "model": {**model, "bogus": 1}},
            {**case, "model": {**model, "hidden": "wide"}}, {**case, "train": {**train, "bogus": 1}},
            {**case, "train": {}}, {**case, "train": None}, {**case, "data": {}}, {**case, "data": None},
            {**case, "data": {"source": "file", "path": "/x"}}, {**case, "data": {"nope": 1}},
            {**case, "data": [1]}, {**case, "data": "stdlib"}, {**case, "setup": {"autocast": "bf16"}},
            {**case, "setup": {"loop": "trainer", "bogus": 1}}, {**case, "setup": 0}, {**case, "setup": 7},
            {**case, "batch_size": "4"}, {**case, "batch_size": True}, {**case, "device": 3}, [case], "case",
            # the setup's own parts: adapters (a part inside a part), sharding, the optimizer, and a record
            # written before the optimizer moved from the train table to the setup
            {**case, "setup": {"lora": {"r": 8, "alpha": 16}, "optimizer": "sgd"}},
            {**case, "setup": {"lora": {"r": 8, "rank": 4}}}, {**case, "setup": {"lora": 8}},
            {**case, "setup": {"sharding": "fsdp"}}, {**case, "train": {**train, "optimizer": "adamw"}},
            {**case, "train": drop(train, "optimizer")},
            # the timing: a part of the train table, stated only where it is not the default
            {**case, "train": {**train, "timing": {"precision": 0.05, "max_steps": 20}}},
            {**case, "train": {**train, "timing": {"precision": 0.05, "bogus": 1}}},
            {**case, "train": {**train, "timing": [0.05]}}, {**case, "train": {**train, "timing": 0.05}},
            {**case, "train": {**train, "timing": {}}}]


def test_the_fast_case_check_accepts_only_what_building_the_case_accepts(monkeypatch):
    from ckptbench.point.case import Case
    from ckptbench.store import validate

    records = synthetic_records(60)
    lines = [r for base in records[:30] for r in ({**base, "case": c} for c in _case_variants(base["case"]))]
    lines += [{**records[0], "measurement": {"peak_bytes": "big"}}, {**records[1], "measurement": {"losses": 1.0}},
              {**records[2], "measurement": {"step_times_s": [0.1, float("inf")]}}, {**records[3], "status": "?"}]
    for line in lines:
        case = line["case"]
        if isinstance(case, dict) and validate._builds_a_case(case):
            Case.from_dict(case)  # the fast path's "yes" is always right
    assert all(validate._builds_a_case(r["case"]) for r in records)  # and it is taken for every good record
    fast = [validate.record_problem(r) for r in lines]
    monkeypatch.setattr(validate, "_builds_a_case", lambda case: False)
    full = [validate.record_problem(r) for r in lines]
    assert fast == full  # the same verdict and the same words, line by line
    assert sum(p is None for p in full) > 30 and sum(p is not None for p in full) > 300


def test_the_report_frame_reads_the_columns_flattening_gave():
    from ckptbench.report.columns import record_frame, tidy
    from ckptbench.store.records import to_frame

    records = synthetic_records(300)
    records[4] = {**records[4], "env": {**records[4]["env"], "nested": {"a": 1}}}
    flat, read = tidy(to_frame(records)), tidy(record_frame(records))
    assert list(flat.columns) == list(read.columns)
    for column in flat.columns:
        assert [None if v != v else v for v in flat[column]] == [None if v != v else v for v in read[column]], column
    env = [c for c in to_frame(records).columns if c.startswith("env.")]
    assert env == [c for c in record_frame(records).columns if c.startswith("env.")] and "env.nested.a" in env


def test_thinning_keeps_one_marker_in_every_occupied_cell():
    from ckptbench.report import scatters

    rng = np.random.default_rng(0)
    x, y = rng.normal(size=20_000), rng.normal(size=20_000)
    span = scatters._span(x, y)
    keep = scatters._thin(x, y, span)
    w, h = scatters.CELLS

    def cells(idx):
        cx = np.clip(((x[idx] - span[0]) / (span[1] - span[0]) * w).astype(int), 0, w)
        cy = np.clip(((y[idx] - span[2]) / (span[3] - span[2]) * h).astype(int), 0, h)
        return list(zip(cx, cy))

    assert len(keep) < len(x) and len(set(cells(keep))) == len(keep)  # one marker per cell ...
    assert set(cells(keep)) == set(cells(np.arange(len(x))))  # ... and every occupied cell has one
    few = np.arange(scatters.DENSE - 1)
    assert list(scatters._thin(x[few], y[few], span)) == list(few)  # a small figure draws every point


def test_a_large_run_draws_its_scatters_thinned_and_says_so(big_run):
    from ckptbench.report import scatters
    from ckptbench.report.checks import check_table
    from ckptbench.report.columns import record_frame, tidy

    t = tidy(record_frame(load_records(big_run).records))
    points = check_table(t).points
    for fig, n in ((scatters.pareto(t), int(t["ok"].sum())), (scatters.estimate_vs_measured(points), len(points))):
        note = re.search(r"([\d,]+) points, drawn as one marker per occupied cell of a \d+×\d+ grid over the axes "
                         r"\(([\d,]+) markers\)", fig.caption)
        assert note, fig.caption
        shown, drawn = (int(g.replace(",", "")) for g in note.groups())
        assert shown == n and drawn < n
    small = scatters.pareto(t.head(50))
    assert "drawn as one marker" not in small.caption


def test_two_large_runs_are_read_at_once_with_the_same_comparison(tmp_path, monkeypatch):
    from ckptbench.base.errors import UsageError
    from ckptbench.store import compare as store_compare

    old, new = write_run(str(tmp_path / "old"), 120, seed=0), write_run(str(tmp_path / "new"), 120, seed=1)
    one_by_one = store_compare.compare_paths(old, new).to_dict()
    monkeypatch.setattr(store_compare, "PARALLEL_BYTES", 0)  # every run counts as large
    forked = []
    real = store_compare.ProcessPoolExecutor
    monkeypatch.setattr(store_compare, "ProcessPoolExecutor", lambda *a, **k: forked.append(1) or real(*a, **k))
    assert store_compare.compare_paths(old, new).to_dict() == one_by_one
    assert forked == [1] or len(os.sched_getaffinity(0)) == 1
    for side in ("bad_old", "bad_new"):
        (tmp_path / side).mkdir()
        (tmp_path / side / "records.jsonl").write_text("not json\n")
    with pytest.raises(UsageError, match="bad_old"):  # the old side's error first, as when read in turn
        store_compare.compare_paths(str(tmp_path / "bad_old"), str(tmp_path / "bad_new"))
    with pytest.raises(UsageError, match="bad_new"):
        store_compare.compare_paths(old, str(tmp_path / "bad_new"))


@pytest.mark.slow
def test_a_run_with_timelines_beside_its_records_parses_only_those_it_draws(tmp_path, monkeypatch):
    """Records stay small and are read without their timelines; the report parses a line per series drawn."""
    from ckptbench.store import timelines as tl_store

    run = write_run(str(tmp_path / "run"), 600, timelines=True)
    with open(os.path.join(run, "records.jsonl"), "rb") as fh:
        assert max(len(line) for line in fh) < 12 * 1024
    assert os.path.getsize(os.path.join(run, tl_store.TIMELINES)) > 500 * 20_000
    parsed = []
    real = tl_store._parse
    monkeypatch.setattr(tl_store, "_parse", lambda data: parsed.append(len(data)) or real(data))
    loaded = load_records(run)
    assert parsed == [] and not loaded.problems
    html = open(render_report(run, str(tmp_path / "r.html"), loaded=loaded), encoding="utf-8").read()
    section = html.split('<section id="timeline">', 1)[1].split("</section>", 1)[0]
    drawn = re.findall(r"live bytes over the memory step for ([^,]*), and saved bytes", section)
    assert drawn and 'class="absent"' not in section
    assert len(parsed) == sum(len(d.split(" vs ")) for d in drawn) <= 12


def test_a_preset_with_overridden_dimensions_is_named_by_what_differs():
    from ckptbench.point.case import preset
    from ckptbench.report.columns import SHAPE, model_label

    dims = {k: getattr(preset("llama-small"), k) for k in SHAPE}
    assert model_label("llama-small", "llama", dims) == "llama-small"
    assert model_label("llama-small", "llama", {**dims, "hidden": 512, "layers": 8}) == "llama-small (h512 l8)"
    assert model_label("my-model", "llama", dims) == "my-model"  # not a preset: its own name
    assert model_label("", "llama", dims) == "llama-h256-l4"
