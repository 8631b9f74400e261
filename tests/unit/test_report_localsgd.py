"""The local-SGD part of the report from hand-made records: the quality gap per K with the interval it
names (t over 3+ seeds, min–max of 2, none for 1) at equal tokens, the seed in every table, the smoothed
training loss, and the order the section tells it in (quality first, speed after)."""

from __future__ import annotations

import json
import math
import re

import pytest

from ckptbench.point.case import Case, DataSpec, preset
from ckptbench.point.training import TrainSpec
from ckptbench.report import columns, localsgd_quality, loss_curves
from ckptbench.report.render import render_report
from ckptbench.store.records import SCHEMA_VERSION, to_frame
from tests.e2e.report_html import Page

DDP_FINAL = {0: 2.40, 1: 2.50, 2: 2.45}
GAPS = {4: {0: 0.01, 1: 0.03, 2: 0.05}, 16: {0: 0.10, 1: 0.20}}  # K=16 ran two seeds only


def curve(final: float, last_tokens: int = 2000) -> list[dict]:
    tokens = [0, 1000, 2000] + ([last_tokens] if last_tokens != 2000 else [])
    losses = [5.5, 3.0, final] + ([final - 0.5] if last_tokens != 2000 else [])
    return [{"step": i * 10, "tokens": n, "loss": loss} for i, (n, loss) in enumerate(zip(tokens, losses))]


def point(k: int, seed: int, final: float, last_tokens: int = 2000, steps: int = 100) -> dict:
    case = Case(model=preset("llama-tiny"), train=TrainSpec(seed=seed), data=DataSpec(source="stdlib"),
                batch_size=4, seq_len=64, local_sgd_steps=k, world_size=2)
    ranks = [[5.0 - 0.01 * i + 0.05 * ((i + r + seed) % 2) for i in range(steps)] for r in range(2)]
    m = {"losses": ranks[0], "loss_per_rank": ranks, "eval_curve": curve(final, last_tokens),
         "comm_payload_bytes": 1000 * 2**20 // max(k, 1), "comm_payload_bytes_per_step": 2**20 / max(k, 1),
         "comm_bus_bytes_per_step": 2**20 / max(k, 1), "collectives_per_step": 1 / max(k, 1), "syncs": 100 // max(k, 1),
         "sync_time_s": 0.001, "step_time_median_s": 0.01, "tokens_per_s": 1000.0}
    return {"schema": SCHEMA_VERSION, "case_id": case.id, "suite": "q", "case": case.to_dict(), "strategy": case.strategy,
            "status": "ok", "reason": "", "measurement": m, "env": {}}


def quality_run() -> list[dict]:
    recs = [point(0, s, f) for s, f in DDP_FINAL.items()]
    for k, gaps in GAPS.items():
        # K=16's curves go on past DDP's last evaluation: the gap is read at 2,000 tokens, both curves' last common
        recs += [point(k, s, DDP_FINAL[s] + g, last_tokens=3000 if k == 16 else 2000) for s, g in gaps.items()]
    return recs


@pytest.fixture(scope="module")
def tidy_run():
    return columns.tidy(to_frame(quality_run()))


def test_the_gap_interval_says_what_it_is():
    three = localsgd_quality.seed_interval([0.01, 0.03, 0.05])
    half = 4.302652729911275 * 0.02 / math.sqrt(3)  # t(0.975, 2 df) × sd / √n
    assert (three.lo, three.hi) == pytest.approx((0.03 - half, 0.03 + half))
    assert three.method == "95 % t-interval, 3 seeds"
    two = localsgd_quality.seed_interval([0.2, 0.1])
    assert (two.lo, two.hi, two.method) == (0.1, 0.2, "min–max of 2 seeds")
    one = localsgd_quality.seed_interval([0.1])
    assert math.isnan(one.lo) and one.method == "1 seed: no interval"


def test_gap_rows_pair_seeds_at_equal_tokens(tidy_run):
    rows = {r["series"]: r for r in localsgd_quality.gap_rows(tidy_run)}
    assert list(rows) == ["DDP", "K=4", "K=16"]
    assert rows["DDP"]["interval"] == "" and math.isnan(rows["DDP"]["gap"])
    assert rows["K=4"]["gap"] == pytest.approx(0.03)
    assert rows["K=4"]["interval"] == "95 % t-interval, 3 seeds"
    assert rows["K=16"]["gap"] == pytest.approx(0.15)  # at 2,000 tokens, not K=16's own last point
    assert (rows["K=16"]["gap_lo"], rows["K=16"]["gap_hi"]) == pytest.approx((0.10, 0.20))
    assert rows["K=16"]["interval"] == "min–max of 2 seeds" and rows["K=16"]["gap_tokens"] == "2,000"
    seeds = [(r["series"], r["seed"], r["gap"]) for r in localsgd_quality.seed_rows(tidy_run)]
    assert [(s, seed) for s, seed, _ in seeds] == [("DDP", "0"), ("DDP", "1"), ("DDP", "2"), ("K=4", "0"),
                                                  ("K=4", "1"), ("K=4", "2"), ("K=16", "0"), ("K=16", "1")]
    assert [g for *_, g in seeds[3:]] == pytest.approx([0.01, 0.03, 0.05, 0.10, 0.20])


def test_trailing_mean_smooths_over_the_stated_window():
    assert loss_curves.window(300) == 15 and loss_curves.window(17) == 1
    assert loss_curves.trailing_mean([1.0, 3.0, 5.0, 7.0], 2) == [1.0, 2.0, 4.0, 6.0]
    assert loss_curves.trailing_mean([1.0, 2.0], 1) == [1.0, 2.0]


def test_the_section_leads_with_the_gap_and_shows_seeds(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    with open(run / "records.jsonl", "w") as fh:
        for r in quality_run():
            fh.write(json.dumps(r) + "\n")
    html = open(render_report(str(run), str(tmp_path / "r.html"))).read()
    page = Page(html)
    section = html.split('<section id="localsgd">', 1)[1].split("</section>", 1)[0]
    order = re.findall(r"<h3>([^<]*)</h3>|<strong>([^<]*)\.</strong>", section)
    names = [a or b for a, b in order]
    assert names[:5] == ["Quality: held-out loss gap per K against DDP", "Communication saved vs held-out loss gap",
                         "Held-out loss vs tokens per K", "Training loss", "Training loss vs step per K (smoothed)"]
    assert names.index("Communication and speed per point") > names.index("Training loss")
    quality = page.tables["quality"]
    assert [row[0] for row in quality] == ["DDP", "K=4", "K=16"]
    assert [row[3:6] for row in quality] == [
        ["baseline", "–", "–"],
        ["+0.0300", "[-0.0197, +0.0797]", "95 % t-interval, 3 seeds"],
        ["+0.1500", "[+0.1000, +0.2000]", "min–max of 2 seeds"]]
    assert "Student-t interval of the mean paired gap" in section
    seeds = page.tables["quality-seeds"]
    assert [row[1] for row in seeds] == ["0", "1", "2", "0", "1", "2", "0", "1"]
    assert seeds[3][3:] == ["2.4100", "2.4000", "+0.0100"]
    assert section.count("<th colspan") == 2  # the group (model, batch, sequence, data) heads each table once
    assert [row[2] for row in page.tables["localsgd"]] == ["0", "1", "2", "0", "1", "2", "0", "1"]
    assert "trailing moving average over 5 steps" in section and "band: min–max over seeds" in section
    assert "<script" not in html and "could not be rendered" not in html
