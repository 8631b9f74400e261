"""The report's memory timeline section: which points it draws, a bounded number of figures, timelines read
from timelines.jsonl beside the records (or inline, in older runs), a hostile timelines file rendered with a
note, and no section at all for runs whose records carry no timeline."""

from __future__ import annotations

import copy
import json
import re

from ckptbench.point.case import Case, preset
from ckptbench.point.training import TrainSpec
from ckptbench.report.columns import record_frame, tidy
from ckptbench.report.render import build_context, render_html
from ckptbench.report.timeline import MAX_FIGURES, choose
from ckptbench.store.records import SCHEMA_VERSION, RecordStore
from ckptbench.store.timelines import TIMELINES


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


def _html(tmp_path, records, inline: bool = False, side: bytes | None = None) -> str:
    """The page of `records`, appended as a sweep appends them (timelines to timelines.jsonl), or `inline`
    as runs before that file wrote them; `side` replaces the timelines file the appends wrote."""
    if inline:
        with open(tmp_path / "records.jsonl", "w") as fh:
            for r in records:
                fh.write(json.dumps({"schema": SCHEMA_VERSION, **r}, sort_keys=True) + "\n")
    else:
        store = RecordStore(str(tmp_path))
        for r in records:
            store.append(copy.deepcopy(r))
    if side is not None:
        (tmp_path / TIMELINES).write_bytes(side)
    ctx = build_context(str(tmp_path))
    assert not [p for p in ctx.problems if "could not be rendered" in p], ctx.problems
    return render_html(ctx)


def _section(html: str) -> str:
    return re.search(r'<section id="timeline">(.*?)</section>', html, re.S).group(1)


THREE = ((0, False), (1, False), (1, True))


def test_the_section_draws_the_chosen_points(tmp_path):
    html = _html(tmp_path, [_record(2, 64, n, off) for n, off in THREE])
    section = _section(html)
    assert section.count("<img ") == 1 and "data:image/svg+xml;base64," in section
    assert 'href="#timeline"' in html and 'class="absent"' not in section
    records = [json.loads(line) for line in (tmp_path / "records.jsonl").read_text().splitlines()]
    assert all("timeline" not in r["measurement"] and r["measurement"]["timeline_samples"] == 5 for r in records)
    assert len((tmp_path / TIMELINES).read_text().splitlines()) == 3


def test_a_run_with_its_timelines_inline_still_draws_them(tmp_path):
    html = _html(tmp_path, [_record(2, 64, n, off) for n, off in THREE], inline=True)
    assert _section(html).count("<img ") == 1 and not (tmp_path / TIMELINES).exists()


def _line(record: dict, timeline) -> bytes:
    return json.dumps({"attempt": 1, "case_id": record["case_id"], "repeat": 0, "schema": 1, "timeline": timeline},
                      sort_keys=True).encode()


def test_a_hostile_timelines_file_draws_what_is_valid_and_says_what_is_not(tmp_path):
    records = [_record(2, 64, n, off) for n, off in THREE] + [_record(2, 32, 1)]
    none, full, offload, small_full = records
    good = copy.deepcopy(small_full["measurement"]["timeline"])
    side = b"\n".join([
        _line(none, good).replace(b'"bytes": [0, ', b'"bytes": [NaN, ', 1),
        _line(full, {"event": [0, 2, 1], "bytes": [1, 2, 3]}),  # events out of order
        _line(offload, {"event": list(range(3000)), "bytes": [1] * 3000}),  # beyond the bound
        _line(small_full, good),
        b"[1, 2]", b'"text"', b"{not json",
        _line({"case_id": "f" * 40}, good),  # a point the records do not have
        _line(offload, good)[:50],  # torn
    ])
    assert b"NaN" in side
    html = _html(tmp_path, records, side=side)
    section = _section(html)
    # no timeline of the largest point reads: the next largest point of the variant is drawn
    assert section.count("<img ") == 1 and "batch 2, seq 32" in section
    note = re.search(r'<p class="absent">(.*?)</p>', section, re.S).group(1)
    for words in ("unreadable line", "indices do not increase", "over the bound", "truncated last line",
                  "no case id found", "belongs to no point in the records"):
        assert words in note, words
    assert "Traceback" not in html


def test_a_timeline_that_does_not_read_gives_way_to_the_next_setting_of_its_role(tmp_path):
    records = [_record(2, 64, n) for n in (0, 1, 2)]
    good = records[0]["measurement"]["timeline"]
    side = b"\n".join([_line(records[0], good), _line(records[1], {"event": 1}), _line(records[2], good)]) + b"\n"
    html = _html(tmp_path, records, side=side)
    assert "live bytes over the memory step for none vs every-2" in html  # full's line is bad: every-2 instead


def test_timelines_that_all_fail_leave_the_section_with_its_note(tmp_path):
    records = [_record(2, 64, n, off) for n, off in THREE]
    html = _html(tmp_path, records, side=b"garbage\n")
    section = _section(html)
    assert "<img " not in section and "no valid line for repeat 0" in section


def test_old_records_without_a_timeline_leave_the_section_out(tmp_path):
    html = _html(tmp_path, [_record(2, 64, n, timeline=False) for n in (0, 1)])
    assert 'id="timeline"' not in html and "Memory timeline" not in html
