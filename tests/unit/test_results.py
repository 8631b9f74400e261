"""The records store: whole-line appends under a lock, torn lines detected and never parsed."""

from __future__ import annotations

import json
import multiprocessing
import os

from ckptbench.point.case import Case, preset
from ckptbench.point.training import TrainSpec
from ckptbench.store.records import RecordStore, load_records, to_frame

CASE = Case(model=preset("llama-tiny"), train=TrainSpec(), batch_size=1, seq_len=8).to_dict()


def rec(case_id: str, status: str = "ok", **fields) -> dict:
    """The smallest line the reader accepts as a record: an id, a status and a Case."""
    return {"case_id": case_id, "status": status, "case": CASE, **fields}


def _append_many(run_dir: str, worker: int, n: int) -> None:
    store = RecordStore(run_dir)
    for i in range(n):
        store.append(rec(f"w{worker}-{i}", payload="x" * (1000 + 37 * i)))


def test_append_and_load_round_trip(tmp_path):
    store = RecordStore(str(tmp_path))
    store.ensure()
    store.append(rec("a", measurement={"peak_bytes": 10}))
    store.append(rec("b", measurement={"peak_bytes": 20}))
    loaded = load_records(str(tmp_path))
    assert [r["case_id"] for r in loaded.records] == ["a", "b"]
    assert loaded.problems == []
    frame = to_frame(loaded.records)
    assert list(frame["measurement.peak_bytes"]) == [10, 20]


def test_concurrent_appenders_never_interleave(tmp_path):
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_append_many, args=(str(tmp_path), w, 150)) for w in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    loaded = load_records(str(tmp_path))
    assert loaded.problems == []
    assert len(loaded.records) == 450
    assert len(loaded.ids()) == 450


def test_torn_last_line_is_reported_and_skipped_then_repaired(tmp_path):
    store = RecordStore(str(tmp_path))
    store.append(rec("a"))
    whole = json.dumps({"schema": 1, **rec("b", measurement={"peak_bytes": 5})})
    with open(store.path, "a") as fh:
        fh.write(whole[: len(whole) // 2])  # a crash mid-write leaves half a line
    loaded = load_records(str(tmp_path))
    assert [r["case_id"] for r in loaded.records] == ["a"]
    assert len(loaded.problems) == 1 and "truncated last line" in loaded.problems[0]
    # The next append starts on a fresh line; the fragment stays, reported as unreadable, never parsed.
    store.append(rec("c"))
    loaded = load_records(str(tmp_path))
    assert [r["case_id"] for r in loaded.records] == ["a", "c"]
    assert len(loaded.problems) == 1 and "unreadable line" in loaded.problems[0]


def test_missing_file_and_foreign_lines(tmp_path):
    assert "no records file" in load_records(str(tmp_path)).problems[0]
    path = os.path.join(tmp_path, "records.jsonl")
    with open(path, "w") as fh:
        fh.write('{"no_id": 1}\n{"schema": 99, "case_id": "x"}\n\n')
    loaded = load_records(path)
    assert loaded.records == []
    assert len(loaded.problems) == 2


def test_a_later_record_of_the_same_case_replaces_the_earlier(tmp_path):
    store = RecordStore(str(tmp_path))
    store.append(rec("a", "skipped"))
    store.append(rec("b", "ok"))
    store.append(rec("a", "ok"))
    loaded = load_records(str(tmp_path))
    assert [(r["case_id"], r["status"]) for r in loaded.records] == [("a", "ok"), ("b", "ok")]
