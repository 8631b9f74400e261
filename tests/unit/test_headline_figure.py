"""The headline as a picture and a table of distinct answers: the frontier, the budgets' answers starred,
repeated answers folded (over budgets and over consecutive sequence lengths), every answer in the CSV, and
the plan drawn the same way with --verify's measured points beside their predictions."""

from __future__ import annotations

import csv

from ckptbench.report import answers_table, columns, frontier, headline
from ckptbench.report.figures import chosen
from ckptbench.report.plan_section import plan_figure
from ckptbench.store.records import to_frame
from ckptbench.store.repeats import single_records

from .test_headline import MIB, rec


def groups(records, budgets=()):
    t = columns.tidy(to_frame(single_records(records)))
    return headline.group_answers(t, headline.budgets_of(budgets))


def test_the_frontier_keeps_only_points_nothing_beats_on_both():
    p = frontier.Point
    pts = [p("a", "none", 100, 10.0), p("b", "full", 50, 6.0), p("c", "every-2", 70, 5.0), p("d", "x", 120, 12.0),
           p("e", "y", 50, 4.0)]
    assert [q.name for q in frontier.front(pts)] == ["b", "a", "d"]


def test_many_panels_are_chosen_evenly_first_and_last_included():
    assert chosen(list(range(4))) == [0, 1, 2, 3]
    picked = chosen(list(range(100)))
    assert len(picked) == 6 and picked[0] == 0 and picked[-1] == 99 and picked == sorted(picked)


def test_budgets_with_one_answer_are_one_row_listing_them():
    gs = groups([rec(0, 0.100, peak=200 * MIB), rec(2, 0.120, peak=90 * MIB), rec(1, 0.150, peak=60 * MIB)],
                (0.5, 0.25, 0.08))
    rows, total = answers_table.distinct_rows(gs)
    assert total == len(rows) == 2
    by_setting = {r["setting"].split(";")[0]: r for r in rows}
    # none answers no budget and both budgets it fits; full is the lowest peak and the only point within
    # 0.08 GiB; every-2 answers no question, so it has no row
    assert by_setting["none"]["questions"] == "fastest: no budget, ≤ 0.5 GiB, ≤ 0.25 GiB"
    assert by_setting["full (the only point)"]["questions"] == "lowest peak; fastest: ≤ 0.08 GiB"
    assert by_setting["none"]["peak"] == "200.00 MiB" and "tokens/s [" in by_setting["none"]["value"]


def test_consecutive_lengths_with_the_same_answers_fold_into_one_row():
    records = [r for seq in (64, 65, 66) for r in (rec(0, 0.100, seq=seq), rec(1, 0.200, seq=seq, peak=50 * MIB))]
    records += [rec(0, 0.300, seq=67), rec(1, 0.100, seq=67, peak=50 * MIB)]  # full is fastest here
    gs = groups(records)
    rows, total = answers_table.distinct_rows(gs)
    assert [r["where"] for r in rows] == ["seq 64–66 (3 lengths)"] * 2 + ["seq 67"]  # full: lowest and fastest
    assert total == 3
    folded = next(r for r in rows if r["questions"] == "fastest: no budget" and r["where"].startswith("seq 64"))
    assert folded["setting"].startswith("none") and folded["value"].endswith("(first … last length)")
    assert rows[-1]["questions"] == "lowest peak; fastest: no budget" and rows[-1]["setting"].startswith("full")


def test_past_the_shown_rows_the_page_keeps_the_first_and_counts_all(tmp_path):
    # alternating answers: nothing folds
    records = [rec(0, 0.100 if seq % 2 else 0.300, seq=seq) for seq in range(64, 64 + 30)]
    records += [rec(1, 0.200, seq=seq, peak=50 * MIB) for seq in range(64, 64 + 30)]
    gs = groups(records, (0.08,))
    rows, total = answers_table.distinct_rows(gs, shown=10)
    assert len(rows) == 10 and total > 30
    path = answers_table.write_answers_csv(gs, str(tmp_path / "a.csv"))
    with open(path, encoding="utf-8", newline="") as fh:
        lines = list(csv.DictReader(fh))
    assert len(lines) == 30 * 3  # every length: lowest peak, no budget, ≤ 0.08 GiB
    assert {r["question"] for r in lines} == {"lowest peak", "fastest", "fastest ≤ 0.08 GiB"}
    fits = [r for r in lines if r["question"] == "fastest ≤ 0.08 GiB"]
    assert {r["setting"] for r in fits} == {"full"} and all(r["peak_bytes"] == repr(float(50 * MIB)) for r in fits)


def test_the_figure_stars_each_budgets_answer_and_says_it_in_words():
    gs = groups([rec(0, 0.100, peak=200 * MIB), rec(2, 0.120, peak=90 * MIB), rec(1, 0.150, peak=60 * MIB)],
                (0.25, 0.08))
    panel = frontier._measured_panel(gs[0])
    assert panel.marks == {"none": ["fastest", "fastest ≤ 0.25 GiB"], "full": ["fastest ≤ 0.08 GiB"]}
    assert [b for _, b in panel.budgets] == [0.25 * 2**30, 0.08 * 2**30]
    assert all(p.low is not None and p.low < p.tok_s < p.high for p in panel.points)
    fig = frontier.headline_figure(gs)
    assert fig.uri.startswith("data:image/svg+xml;base64,")
    assert "seq 64: fastest none" in fig.alt and "fastest ≤ 0.08 GiB full" in fig.alt
    many = groups([rec(0, 0.1, seq=s) for s in range(64, 84)])
    assert "6 of 20 groups (variant, sequence length) drawn" in frontier.headline_figure(many).caption


def test_the_plan_page_draws_its_points_and_the_measured_beside_them():
    gib = 2**30
    options = [{"strategy": "none", "max_batch": 4, "peak_bytes": 70 * gib, "tokens_per_s": 1000.0},
               {"strategy": "every-2", "max_batch": 6, "peak_bytes": 75 * gib, "tokens_per_s": 900.0},
               {"strategy": "full", "max_batch": 0, "peak_bytes": None, "tokens_per_s": None}]
    plan = {"model": "m", "seq_len": 64, "options": options, "recommendation": "none at batch 4",
            "assumptions": {"memory_bytes": 80 * gib}}
    alone = plan_figure(plan)
    assert "for 2 strategies" in alone.alt and "(none · batch 4) starred" in alone.alt and "✕" not in alone.alt
    from ckptbench.point.case import Case, preset
    from ckptbench.point.training import TrainSpec

    case = Case(model=preset("gpt2-tiny"), train=TrainSpec(), batch_size=4, seq_len=64)
    measured = [{"case_id": case.id, "strategy": "none", "status": "ok", "case": case.to_dict(),
                 "plan_prediction": {"peak_bytes": 70 * gib, "tokens_per_s": 1000.0},
                 "measurement": {"peak_bytes": 68 * gib, "tokens_per_s": 950.0}}]
    assert "✕ marks 1 measured point(s)" in plan_figure(plan, measured).alt
