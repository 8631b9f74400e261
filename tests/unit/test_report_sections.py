"""Report sections that need fields a CPU smoke sweep does not produce yet (estimates, checks, local SGD),
fed with hand-made records of the record schema, plus the pure pieces (savings, Pareto, deltas)."""

from __future__ import annotations

import json
import math

import pandas as pd

from ckptbench.report import columns, headline, tables
from ckptbench.report.render import SECTIONS, build_context, render_report
from ckptbench.spec import Case, TrainSpec, preset
from ckptbench.store.records import SCHEMA_VERSION, to_frame

HEADINGS = dict(SECTIONS)
MIB = 2**20


def record(batch=2, seq=64, every_n=0, offload=False, K=0, world=1, peak=100 * MIB, step=0.01,
           status="ok", estimate=True, checks=True, **measurement) -> dict:
    case = Case(model=preset("llama-tiny"), train=TrainSpec(), batch_size=batch, seq_len=seq,
                every_n_layers=every_n, offload=offload, local_sgd_steps=K, world_size=world)
    m = {"mem_after_forward_bytes": peak * 0.8, "peak_bytes": peak, "step_time_median_s": step,
         "tokens_per_s": case.tokens_per_step / step, "losses": [5.5, 5.4, 5.3],
         "peak_breakdown": {"params": 10 * MIB, "grads": 10 * MIB, "optimizer": 20 * MIB,
                            "activations": peak - 40 * MIB}, **measurement} if status == "ok" else {}
    r = {"schema": SCHEMA_VERSION, "case_id": case.id, "suite": "unit", "case": case.to_dict(),
         "strategy": case.strategy, "status": status, "reason": "" if status == "ok" else "out of memory",
         "stderr_tail": "" if status == "ok" else "Traceback ...\nOutOfMemoryError", "measurement": m,
         "env": {"torch_version": "2.13.0", "git_commit": "abc"}}
    if estimate and status == "ok":
        r["estimate"] = {"peak_bytes": peak * 1.05, "mem_after_forward_bytes": peak * 0.75}
    if checks and status == "ok":
        r["checks"] = [
            {"quantity": "peak_bytes", "measured": peak, "estimated": peak * 1.05, "ratio": 1 / 1.05,
             "tolerance": 0.1, "verdict": "pass", "difference": -0.05 * peak},
            {"quantity": "mem_after_forward_bytes", "measured": peak * 0.8, "estimated": peak * 0.75,
             "ratio": 0.8 / 0.75, "tolerance": 0.05, "verdict": "fail" if every_n else "pass",
             "difference": 0.05 * peak},
        ]
    return r


def ckpt_run() -> list[dict]:
    out = []
    for seq in (64, 128):
        for n, off, frac, slow in ((0, False, 1.0, 1.0), (2, False, 0.75, 1.3), (1, False, 0.5, 1.6),
                                   (1, True, 0.5, 2.0)):
            out.append(record(seq=seq, every_n=n, offload=off, peak=seq * MIB * frac, step=0.01 * slow))
    out.append(record(batch=64, seq=128, status="oom"))
    return out


def write(tmp_path, records, suite_text=None):
    with open(tmp_path / "records.jsonl", "w") as fh:
        for r in records:
            fh.write(json.dumps(r) + "\n")
    if suite_text is not None:
        (tmp_path / "suite.toml").write_text(suite_text)
    return tmp_path


SUITE = """
[suite]
name = "unit"
budgets_gib = [0.1, 0.0001]
[model]
preset = "llama-tiny"
[sweep]
batch_size = [2]
seq_len = [64, 128]
every_n_layers = [0, 2, 1]
"""


def test_tidy_survives_missing_fields():
    frame = to_frame([{"case_id": "x", "status": "crash"}])
    t = columns.tidy(frame)
    assert set(columns.COLUMNS) <= set(t.columns)
    assert t.loc[0, "strategy"] == "?" and math.isnan(t.loc[0, "peak"]) and not t.loc[0, "ok"]


def test_strategy_order():
    names = ["full+offload", "full", "none", "every-4", "every-2", "every-2+offload"]
    assert sorted(names, key=columns.strategy_order) == ["none", "every-4", "every-2", "full",
                                                         "every-2+offload", "full+offload"]


def test_savings_against_none():
    t = columns.tidy(to_frame(ckpt_run()))
    rows = {r["strategy"]: r for r in tables.savings(t)}
    assert rows["full"]["points"] == 2
    assert rows["full"]["peak_saving"] == "50.0 %"
    assert rows["full"]["time_x"] == "1.60×"
    assert rows["every-2"]["peak_saving"] == "25.0 %"


def test_pareto_mask():
    x = pd.Series([1.0, 2.0, 3.0, 2.5])
    y = pd.Series([5.0, 3.0, 1.0, 4.0])
    assert list(tables.pareto_mask(x, y)) == [True, True, True, False]
    assert list(tables.pareto_mask(x, y, maximize_y=True)) == [True, False, False, False]


def test_headline_budgets():
    t = columns.tidy(to_frame(ckpt_run()))
    rows = {r["question"]: r for r in headline.headline(t, (0.1, 0.0001))}
    assert rows["seq 64: lowest peak memory"]["value"] == "32.00 MiB"
    assert rows["seq 128: fastest within 0.0001 GiB"]["answer"] == "no measured point fits"
    # none at seq 128 (128 MiB) is over 0.1 GiB; every-2 at seq 128 (96 MiB) has the most tokens/s under it,
    # but these records carry no step times: no interval, so nothing is separated from anything
    within = rows["seq 128: fastest within 0.1 GiB"]
    assert within["answer"].startswith("tied within noise: every-2, ")
    assert within["value"].startswith("best median") and "too few steps for an interval" in within["value"]
    assert rows["seq 64: fastest"]["against"].startswith("none: is no checkpointing")


def test_estimate_and_checks_sections(tmp_path):
    run = write(tmp_path, ckpt_run(), SUITE)
    ctx = build_context(str(run))
    assert ctx.data["check_summary"][0]["quantity"] == "mem_after_forward_bytes"  # failures first
    assert [c["verdict"] for c in ctx.data["checks"]][:6] == ["fail"] * 6  # 3 checkpointed × 2 seq
    html = open(render_report(str(run), str(tmp_path / "r.html"))).read()
    assert "Dashed: analytic estimate" in html
    assert "Measured vs estimate" in html
    assert html.count("<tr class=\"fail\">") == 6 + 1  # six failed checks, one failing quantity
    assert HEADINGS["localsgd"] + " (no data in this run)" in html
    assert "out of memory" in html and "OutOfMemoryError" in html


def test_local_sgd_section(tmp_path):
    recs = [record(world=2, K=k, estimate=False, checks=False, comm_payload_bytes_per_step=4 * MIB / max(k, 1),
                   comm_bus_bytes_per_step=4 * MIB / max(k, 1), collectives_per_step=1 / max(k, 1),
                   sync_time_s=0.002, loss_per_rank=[[5.5, 5.4, 5.3], [5.6, 5.35, 5.2]]) for k in (0, 4, 16)]
    run = write(tmp_path, recs)
    html = open(render_report(str(run), str(tmp_path / "r.html"))).read()
    assert f"<h2>{HEADINGS['localsgd']}</h2>" in html
    assert "Communication per step vs K" in html and "Loss vs step per K" in html
    assert html.count("<td>DDP</td>") == 1
    assert "No estimate checks in this run" in html
    assert "could not be rendered" not in html


def test_deltas_match_by_case_id():
    cur = columns.tidy(to_frame([record(peak=110 * MIB)]))
    base = columns.tidy(to_frame([record(peak=100 * MIB), record(seq=128)]))
    out = tables.deltas(cur, base)
    assert out["matched"] == 1 and out["only_baseline"] == 1
    peak = next(r for r in out["rows"] if r["quantity"] == "peak memory")
    assert peak["delta"] == "+10.0 %"


def test_a_broken_section_is_a_note_not_a_traceback(tmp_path, monkeypatch):
    from ckptbench.report import figures

    def boom(_):
        raise ValueError("no")

    monkeypatch.setattr(figures, "breakdown", boom)
    run = write(tmp_path, ckpt_run())
    html = open(render_report(str(run), str(tmp_path / "r.html"))).read()
    assert "section &#39;breakdown&#39; could not be rendered: ValueError: no" in html
    assert HEADINGS["breakdown"] + " (no data in this run)" in html
