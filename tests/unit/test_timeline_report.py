"""The report's memory timeline section: which points it draws, a bounded number of figures, and no section
at all for runs whose records carry no timeline."""

from __future__ import annotations

import copy
import re

from ckptbench.report.columns import record_frame, tidy
from ckptbench.report.render import build_context, render_html
from ckptbench.report.timeline import MAX_FIGURES, choose
from ckptbench.spec import Case, TrainSpec, preset
from ckptbench.store.records import RecordStore


def _record(batch: int, seq: int, every_n: int = 0, offload: bool = False, dtype: str = "fp32",
            timeline: bool = True, attn: str = "eager") -> dict:
    case = Case(model=preset("llama-tiny", dtype=dtype, attn=attn), train=TrainSpec(), batch_size=batch, seq_len=seq,
                every_n_layers=every_n, offload=offload)
    top = 1000 * batch * seq // (every_n + 1)
    m = {"peak_bytes": top, "mem_after_forward_bytes": top // 2, "peak_phase": "backward-head",
         "saved_bytes": 40 + 3 * 10, "saved_bytes_per_layer": [10, 10, 10, 10],
         "offloaded_bytes_per_layer": [10] * 4 if offload else [0] * 4, "saved_outside_layers_bytes": 30}
    if timeline:
        m["timeline"] = {"meter": "cpu-live-storages", "unit": "bytes", "events": 4, "event": [0, 1, 2, 3, 4],
                         "bytes": [0, top // 2, top, top // 3, 0], "peak_event": 2,
                         "marks": [[0, "forward"], [0, "forward-layer-0"], [1, "backward-head"],
                                   [2, "recompute-layer-0"], [3, "optimizer"]], "marks_dropped": 0,
                         "max_samples": 2000}
    return {"case_id": case.id, "case": case.to_dict(), "strategy": case.strategy, "status": "ok", "measurement": m}


def _chosen(records):
    groups, left_out = choose(records, tidy(record_frame(records)))
    return [(g.batch, g.seq, [s.strategy for s in g.series]) for g in groups], left_out


def test_the_largest_point_of_a_variant_with_none_the_fullest_checkpointing_and_offload():
    records = [_record(b, s, n, off) for b, s in ((2, 64), (4, 64), (2, 256)) for n, off in
               ((0, False), (2, False), (1, False), (2, True), (1, True))]
    assert _chosen(records) == ([(2, 256, ["none", "full", "full+offload"])], 0)
    # what a point lacks is left out; a point without a timeline is not a candidate
    partial = [_record(2, 256, 2), _record(2, 256, 2, True), _record(8, 256, 0, timeline=False)]
    assert _chosen(partial) == ([(2, 256, ["every-2", "every-2+offload"])], 0)


def test_at_most_four_figures_one_per_variant():
    variants = [(d, a) for d in ("fp32", "bf16", "fp16") for a in ("eager", "sdpa")]
    records = [_record(2, 64, 0, dtype=d, attn=a) for d, a in variants]
    chosen, left_out = _chosen(records)
    assert len(chosen) == MAX_FIGURES and left_out == len(variants) - MAX_FIGURES


def _html(tmp_path, records) -> str:
    store = RecordStore(str(tmp_path))
    for r in records:
        store.append(copy.deepcopy(r))
    ctx = build_context(str(tmp_path))
    assert not [p for p in ctx.problems if "could not be rendered" in p], ctx.problems
    return render_html(ctx)


def test_the_section_draws_the_chosen_points(tmp_path):
    html = _html(tmp_path, [_record(2, 64, n, off) for n, off in ((0, False), (1, False), (1, True))])
    section = re.search(r'<section id="timeline">(.*?)</section>', html, re.S).group(1)
    assert section.count("<img ") == 1 and "data:image/svg+xml;base64," in section
    assert 'href="#timeline"' in html


def test_old_records_without_a_timeline_leave_the_section_out(tmp_path):
    html = _html(tmp_path, [_record(2, 64, n, timeline=False) for n in (0, 1)])
    assert 'id="timeline"' not in html and "Memory timeline" not in html
