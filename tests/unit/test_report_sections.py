"""Report sections that need fields a CPU smoke sweep does not produce yet (estimates, checks, local SGD),
fed with hand-made records of the record schema, plus the pure pieces (savings, Pareto, deltas)."""

from __future__ import annotations

import json
import math

import pandas as pd

from ckptbench.point.case import Case, preset
from ckptbench.point.training import TrainSpec
from ckptbench.report import columns, headline, tables
from ckptbench.report.render import SECTIONS, build_context, render_report
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
    assert HEADINGS["localsgd"] not in html  # no data, no heading and no entry in the contents
    assert "out of memory" in html and "OutOfMemoryError" in html


def test_local_sgd_section(tmp_path):
    recs = [record(world=2, K=k, estimate=False, checks=False, comm_payload_bytes_per_step=4 * MIB / max(k, 1),
                   comm_bus_bytes_per_step=4 * MIB / max(k, 1), collectives_per_step=1 / max(k, 1),
                   sync_time_s=0.002, loss_per_rank=[[5.5, 5.4, 5.3], [5.6, 5.35, 5.2]]) for k in (0, 4, 16)]
    run = write(tmp_path, recs)
    html = open(render_report(str(run), str(tmp_path / "r.html"))).read()
    assert f"<h2>{HEADINGS['localsgd']}</h2>" in html
    assert "Communication per step vs K" in html and "Training loss vs step per K (smoothed)" in html
    assert html.count("<td>DDP</td>") == 1
    assert HEADINGS["checks"] not in html  # the records carry no checks: no section
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
    assert HEADINGS["breakdown"] not in html


ENV = {"python": "3.11.7", "torch_version": "2.13.0+cpu", "cuda_runtime": None, "transformers_version": "5.23.0",
       "cpu": "AMD EPYC", "cpu_count": 2, "torch_threads": 1, "thread_env": "unset", "cuda_available": False,
       "nvml": "not available (no driver)", "driver": None, "driver_cuda": None, "nvml_devices": [], "devices": [],
       "ckptbench_version": "0.1.0", "git_commit": "abc123", "nvidia-ml-py_version": None,
       "extra_list": ["a", "b"]}


def env_run(tmp_path):
    recs = []
    for i, (seq, load) in enumerate(((64, "1.50 1.20 1.00"), (128, "2.50 1.40 1.10"), (256, "3.00 1.60 1.20"))):
        r = record(seq=seq)
        r["env"] = {**ENV, "load_average": load, **({"transformers_version": "5.24.0"} if i == 2 else {})}
        r["finished_at"] = f"2026-01-01T00:00:0{i}+0000"
        recs.append(r)
    return write(tmp_path, recs)


def test_environment_is_labelled_rows_with_the_load_summarised(tmp_path):
    from tests.e2e.report_html import Page

    html = open(render_report(str(env_run(tmp_path)), str(tmp_path / "r.html"))).read()
    env = html.split('<table class="environment">', 1)[1].split("</table>", 1)[0]
    rows = dict((th, td) for th, td in
                (cell.split("</th><td>") for cell in env.replace("<tr><th>", "\n").replace("</td></tr>", "").split("\n")[1:]))
    assert rows == {
        "ckptbench": "0.1.0, commit abc123",
        "Python": "3.11.7",
        "torch": "2.13.0+cpu (CPU-only build)",
        "transformers": "5.23.0 (2 points); 5.24.0 (1 point)",  # a value that differs between points: each, counted
        "nvidia-ml-py": "not installed",
        "CPU": "AMD EPYC, 2 logical cores",
        "Threads": "1 torch thread per process; OMP/MKL/OpenBLAS thread variables unset",
        "CUDA": "not available",
        "NVML": "not available (no driver)",
        "extra list": "a, b",  # a key no row knows: under its own name, the list joined
        "Load average": "1-minute load as each point ended, over 3 points: min 1.50, median 2.50, max 3.00, "
                        "against 2 logical cores; 2 points ended with more load than cores",
    }
    assert "[" not in env and "1.50 1.20 1.00" not in env  # no Python list text, no bare triples
    page = Page(html)
    assert page.tables["load-points"] == [
        ["2026-01-01T00:00:00+0000", "llama-tiny · fp32 · eager · dropout off · none · batch 2 · seq 64", "1.50", "1.20", "1.00"],
        ["2026-01-01T00:00:01+0000", "llama-tiny · fp32 · eager · dropout off · none · batch 2 · seq 128", "2.50", "1.40", "1.10"],
        ["2026-01-01T00:00:02+0000", "llama-tiny · fp32 · eager · dropout off · none · batch 2 · seq 256", "3.00", "1.60", "1.20"]]
    assert '<details class="load"><summary>Load average per point (3 points)</summary>' in html  # folded
    assert html.count('<tr class="fail"><td>2026-01-01') == 2  # the two points above the core count, shaded


def test_check_values_in_their_units_and_tolerances_in_percent():
    from ckptbench.report.check_format import cells, tolerance_text, tolerances_text, value_cell

    assert [tolerance_text(t) for t in (0.05, 0.1, 0.2, 0.005, 0.0, 0, None)] == \
        ["±5 %", "±10 %", "±20 %", "±0.5 %", "exact", "exact", "–"]
    assert tolerances_text([0.05, 0.2, 0.05, None]) == "±5 %, ±20 %"
    row = cells({"quantity": "peak_bytes", "measured": 56939804, "estimated": 56922396, "ratio": 1.0003058,
                 "tolerance": 0.05, "difference": 17408})
    assert (row["measured"].text, row["measured"].title) == ("54.30 MiB", "56,939,804 B")
    assert (row["difference"].text, row["difference"].title) == ("+17.00 KiB", "+17,408 B")
    assert (row["ratio"], row["tolerance"]) == ("1.0003", "±5 %")
    assert value_cell(-5 * MIB, "saved_bytes", signed=True).text == "-5.00 MiB"
    assert (value_cell(4, "saved_bytes", signed=True).text, value_cell(4, "saved_bytes").title) == ("+4 B", "")
    assert value_cell(2629828608, "hardware_flops").text == "2.63 GFLOP"
    assert value_cell(2629828608, "hardware_flops").title == "2,629,828,608 FLOP"
    assert value_cell(741, "allreduce_count").text == "741"  # a count, not bytes
    assert value_cell([], "recomputed_layers").text == "none"
    assert value_cell([0, 2], "recomputed_layers").text == "0, 2"
    assert value_cell("optimizer", "peak_phase").text == "optimizer"
    assert value_cell(None, "peak_bytes").text == "–"


def test_checks_table_text(tmp_path):
    from tests.e2e.report_html import Page

    html = open(render_report(str(write(tmp_path, ckpt_run(), SUITE)), str(tmp_path / "r.html"))).read()
    page = Page(html)
    summary = page.tables["check-summary"]
    assert [row[0] for row in summary] == ["mem_after_forward_bytes", "peak_bytes"]  # failing quantity first
    assert [row[-1] for row in summary] == ["±5 %", "±10 %"]
    rows = page.tables["check-rows"]
    assert [r[0] for r in rows] == ["fail"] * 6 + ["pass"] * 10  # failures first
    first = rows[0]  # every-2 at seq 64: 48 MiB peak, after forward 0.8 × 48 MiB against 0.75 × 48 MiB
    assert first[1:] == ["mem_after_forward_bytes", "llama-tiny · fp32 · eager · dropout off · every-2 · batch 2 · seq 64",
                         "38.40 MiB", "36.00 MiB", "1.0667", "±5 %", "+2.40 MiB"]
    assert '<td class="num" title="40,265,318.4 B">38.40 MiB</td>' in html  # the exact figure on hover
    assert '<td class="num" title="+2,516,582.4 B">+2.40 MiB</td>' in html


def test_sections_without_data_are_left_out(tmp_path):
    """No local SGD, no failure, no baseline, no plan: none of their headings, not even in the contents."""
    from tests.e2e.report_html import Page

    recs = [r for r in ckpt_run() if r["status"] == "ok"]
    html = open(render_report(str(write(tmp_path, recs, SUITE)), str(tmp_path / "r.html"))).read()
    page = Page(html)
    for key in ("localsgd", "failures", "baseline", "plan"):
        assert HEADINGS[key] not in page.h2, key
        assert f'href="#{key}"' not in html and f'id="{key}"' not in html, key
    assert "no data in this run" not in html and "finished ok." not in html
    # the sections that have data, in the order SECTIONS gives, each once in the contents
    present = [heading for key, heading in SECTIONS if key in ("headline", "memory", "pareto", "checks", "breakdown",
                                                               "environment")]
    assert page.h2 == present
    assert [ref for tag, _, ref in page.refs if tag == "a"] == [f"#{key}" for key, h in SECTIONS if h in present]


def test_environment_and_check_text_from_records_is_escaped(tmp_path):
    label = '<script>alert(1)</script>"'
    r = record(every_n=2)
    r["env"] = {**ENV, "hostname": label, "devices": [label], "load_average": "1.0 1.0 1.0"}
    r["checks"][0].update(quantity="peak_phase", measured=label, estimated="optimizer", difference=label)
    html = open(render_report(str(write(tmp_path, [r])), str(tmp_path / "r.html"))).read()
    assert "<script" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;&#34;" in html


def _with_setup(r: dict, suffix: str) -> dict:
    """A record renamed as the sweep names a point of another setup ("full" -> "full+bf16-mixed+lora8")."""
    return {**r, "case_id": r["case_id"] + suffix, "strategy": r["strategy"] + "+" + suffix}


def test_checkpointing_is_set_against_none_of_the_same_setup():
    # full fine-tuning and LoRA (and a loop) in one run: LoRA's own saving must not be credited to checkpointing
    plain = [record(every_n=0, peak=100 * MIB, step=0.010), record(every_n=1, peak=60 * MIB, step=0.015)]
    lora = [_with_setup(record(every_n=0, peak=50 * MIB, step=0.010), "lora8"),
            _with_setup(record(every_n=1, peak=30 * MIB, step=0.016), "lora8"),
            _with_setup(record(every_n=1, offload=True, peak=30 * MIB, step=0.020), "lora8")]
    trainer = [_with_setup(record(every_n=0, peak=100 * MIB, step=0.012), "trainer"),
               _with_setup(record(every_n=1, peak=80 * MIB, step=0.018), "trainer")]
    t = columns.tidy(to_frame(plain + lora + trainer))
    rows = {r["strategy"]: r for r in tables.savings(t)}
    assert set(rows) == {"full", "full+lora8", "full+offload+lora8", "full+trainer"}
    assert rows["full"]["peak_saving"] == "40.0 %"
    assert rows["full+lora8"]["peak_saving"] == "40.0 %"  # against none+lora8 (50 MiB), not none (100 MiB)
    assert rows["full+offload+lora8"]["peak_saving"] == "40.0 %"
    assert rows["full+trainer"]["peak_saving"] == "20.0 %"
    assert rows["full+trainer"]["time_x"] == "1.50×"
    low = {r["question"]: r for r in headline.headline(t, ())}["seq 64: lowest peak memory"]
    assert low["answer"] in ("full+lora8", "full+offload+lora8")
    assert low["against"].startswith("40.0 % less peak memory")
    alone = columns.tidy(to_frame([plain[0], lora[1]]))
    assert headline.against_none(alone[alone["strategy"] == "full+lora8"].iloc[0].to_dict(), alone) == \
        "no ok 'none+lora8' point at batch 2 to compare with"


def test_setup_of_strategy_names():
    assert columns.setup_of("full") == "" and columns.setup_of("full+offload-streamed") == ""
    assert columns.setup_of("every-2+sac-save-matmuls+offload") == ""
    assert columns.setup_of("full+offload+bf16-mixed+trainer+lora8") == "bf16-mixed+trainer+lora8"
    assert columns.setup_of("none+fsdp2") == "fsdp2" and columns.setup_of("compile-budget-0.5") == ""
