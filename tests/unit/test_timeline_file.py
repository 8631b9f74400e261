"""Timelines beside the records: a record's timeline goes to ``timelines.jsonl`` under the records' append
guarantees, the record keeps a pointer, and the reader parses only the lines asked for and treats the file
as hostile (every wrong shape skipped and named, never a traceback, never a winner over a valid line)."""

from __future__ import annotations

import copy
import json
import multiprocessing
import os

import pytest

from ckptbench.point.case import Case, preset
from ckptbench.point.training import TrainSpec
from ckptbench.store import timelines as tl_store
from ckptbench.store.records import RecordStore, load_records
from ckptbench.store.timelines import TIMELINES, Timelines, timeline_problem

CASE = Case(model=preset("llama-tiny"), train=TrainSpec(), batch_size=1, seq_len=8).to_dict()


def timeline(top: int = 100, n: int = 5) -> dict:
    values = [top * k // (n - 1) for k in range(n)]
    return {"meter": "cpu-live-storages", "unit": "bytes", "events": n - 1, "event": list(range(n)),
            "bytes": values, "peak_event": n - 1, "marks": [[0, "forward"], [1, "backward-head"]],
            "marks_dropped": 0, "max_samples": 2000}


def rec(case_id: str, tl: dict | None = None, repeat: int = 0, attempt: int | None = 1, **fields) -> dict:
    m = {"peak_bytes": 100, **({"timeline": tl} if tl is not None else {})}
    out = {"case_id": case_id, "repeat": repeat, "status": "ok", "case": CASE, "measurement": m, **fields}
    if attempt is not None:
        out["attempt"] = attempt
    return out


def stored(case_id: str, repeat: int = 0, attempt: int | None = 1) -> dict:
    """A record as read back after its timeline went to the side file."""
    out = rec(case_id, repeat=repeat, attempt=attempt)
    out["measurement"]["timeline_stored"] = TIMELINES
    return out


def _lines(path) -> list[dict]:
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh]


def test_the_timeline_goes_to_its_own_file_and_the_record_keeps_a_pointer(tmp_path):
    store = RecordStore(str(tmp_path))
    record = rec("a", timeline(), repeat=1, attempt=2)
    store.append(record)
    assert "timeline" not in record["measurement"]  # what the caller holds is what was written
    [line] = _lines(tmp_path / "records.jsonl")
    assert "timeline" not in line["measurement"] and "timeline_note" not in line["measurement"]
    assert line["measurement"]["timeline_stored"] == TIMELINES and line["measurement"]["timeline_samples"] == 5
    [side] = _lines(tmp_path / TIMELINES)
    assert side == {"schema": 1, "case_id": "a", "repeat": 1, "attempt": 2, "timeline": timeline()}
    loaded = load_records(str(tmp_path)).records
    timelines = Timelines(str(tmp_path))
    assert timelines.get(loaded[0]) == timeline() and timelines.problems == []
    # a record without a timeline is written as before, and nothing is written beside it
    store.append(rec("b"))
    assert len(_lines(tmp_path / TIMELINES)) == 1 and timelines.get(rec("b")) is None


def test_the_last_valid_line_of_each_repeat_wins(tmp_path):
    store = RecordStore(str(tmp_path))
    for repeat, top in ((0, 100), (1, 200), (0, 300)):
        store.append(rec("a", timeline(top), repeat=repeat))
    with open(tmp_path / TIMELINES, "a") as fh:  # a later line of the wrong shape does not replace it
        fh.write(json.dumps({"schema": 1, "case_id": "a", "repeat": 0, "timeline": {"event": [0], "bytes": ["x"]}})
                 + "\n")
    t = Timelines(str(tmp_path))
    assert max(t.get(stored("a", repeat=0))["bytes"]) == 300 and max(t.get(stored("a", repeat=1))["bytes"]) == 200
    assert len(t.problems) == 1 and ":4: not a timeline" in t.problems[0]


def test_a_timeline_of_another_attempt_is_not_the_records(tmp_path):
    RecordStore(str(tmp_path)).append(rec("a", timeline(), attempt=1))
    t = Timelines(str(tmp_path))
    assert t.get(stored("a", attempt=2)) is None and "attempt 1's timeline, not attempt 2's" in t.problems[0]


def test_an_old_record_with_its_timeline_inline_is_read_from_the_record(tmp_path):
    t = Timelines(str(tmp_path))  # no timelines.jsonl at all
    assert t.get(rec("a", timeline())) == timeline() and t.problems == []
    assert t.get(rec("b", {"event": [0, 0], "bytes": [1, 2]})) is None and "do not increase" in t.problems[0]


NAN = float("nan")
BAD = {
    "not an object": [1, 2],
    "lists missing": {"event": 3, "bytes": [1]},
    "lengths differ": {"event": [0, 1], "bytes": [1]},
    "empty": {"event": [], "bytes": []},
    "a text sample": {"event": [0, 1], "bytes": [1, "2"]},
    "a bool sample": {"event": [0, 1], "bytes": [1, True]},
    "a float sample": {"event": [0, 1], "bytes": [1, 2.5]},
    "NaN": {"event": [0, 1], "bytes": [1, NAN]},
    "a negative event": {"event": [-1, 1], "bytes": [1, 2]},
    "events not increasing": {"event": [0, 2, 1], "bytes": [1, 2, 3]},
    "over the bound": {"event": list(range(2001)), "bytes": [0] * 2001},
    "marks not a list": {"event": [0], "bytes": [1], "marks": {"a": 1}},
    "a mark of the wrong shape": {"event": [0], "bytes": [1], "marks": [[0, 1]]},
    "marks not in order": {"event": [0, 1], "bytes": [1, 2], "marks": [[1, "a"], [0, "b"]]},
    "too many marks": {"event": [0], "bytes": [1], "marks": [[0, "a"]] * 1001},
    "a huge label": {"event": [0], "bytes": [1], "marks": [[0, "x" * 10_000]]},
    "peak outside": {"event": [0, 1], "bytes": [1, 2], "peak_event": 7},
    "meter not text": {"event": [0], "bytes": [1], "meter": 3},
}


@pytest.mark.parametrize("why", list(BAD))
def test_a_timeline_of_the_wrong_shape_is_named(why):
    assert timeline_problem(BAD[why]) is not None
    assert timeline_problem(timeline()) is None


def _write_hostile(folder) -> None:
    good = json.dumps({"attempt": 1, "case_id": "good", "repeat": 0, "schema": 1, "timeline": timeline()},
                      sort_keys=True)
    lines = [good.encode()]
    for i, why in enumerate(BAD):
        lines.append(json.dumps({"case_id": f"bad{i}", "repeat": 0, "schema": 1, "timeline": BAD[why]}).encode())
    lines += [b'{"case_id": "nan", "repeat": 0, "schema": 1, "timeline": {"event": [0], "bytes": [NaN]}}',
              b'{"case_id": "inf", "repeat": 0, "schema": 1, "timeline": {"event": [0], "bytes": [Infinity]}}',
              b'{"case_id": "wrong", "repeat": "0", "schema": 1, "timeline": {"event": [0], "bytes": [1]}}',
              b'{"case_id": "schema2", "repeat": 0, "schema": 2, "timeline": {"event": [0], "bytes": [1]}}',
              b'{"case_id": "notjson", ',
              b'{"case_id": "deep", "timeline": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
              b'[1, 2, 3]', b'"just text"', b'\x00\xff\xfe binary',
              good.replace('"good"', '"unknown"').encode(),
              b'{"case_id": "long", "pad": "' + b"x" * (tl_store.MAX_LINE + 10) + b'"}']
    (folder / TIMELINES).write_bytes(b"\n".join(lines) + b'\n{"attempt": 1, "case_id": "torn", "repeat": 0, "sch')


def test_a_hostile_file_gives_what_is_valid_and_names_the_rest(tmp_path):
    _write_hostile(tmp_path)
    t = Timelines(str(tmp_path))
    ids = ["good", *[f"bad{i}" for i in range(len(BAD))], "nan", "inf", "wrong", "schema2", "notjson", "deep", "long",
           "torn", "absent"]
    got = {cid: t.get(stored(cid)) for cid in ids}
    assert got.pop("good") == timeline() and not any(got.values())
    assert t.get({**stored("good"), "repeat": [0]}) is None  # a record of the wrong shape asks
    text = "\n".join(t.problems)
    assert "truncated last line" in text and "longer than" in text and "unreadable line" in text
    assert "no case id found" in text and "schema 2 != 1" in text and "no valid line for repeat 0" in text
    assert t.unmatched({"good"}) == len(BAD) + 7  # the unknown point's line among them; torn, long: not indexed
    assert t.note().startswith(f"Timelines not used ({len(t.problems)}): ")


def test_only_the_lines_of_the_points_asked_for_are_parsed(tmp_path, monkeypatch):
    store = RecordStore(str(tmp_path))
    for i in range(200):
        store.append(rec(f"p{i:03d}", timeline(i + 1)))
    parsed = []
    real = tl_store._parse
    monkeypatch.setattr(tl_store, "_parse", lambda data: parsed.append(data) or real(data))
    t = Timelines(str(tmp_path))
    records = load_records(str(tmp_path)).records
    assert max(t.get(records[150])["bytes"]) == 151 and max(t.get(records[7])["bytes"]) == 8
    assert len(parsed) == 2


def _append_many(run_dir: str, worker: int, n: int) -> None:
    store = RecordStore(run_dir)
    for i in range(n):
        store.append(rec(f"w{worker}-{i}", timeline(1000 + i, n=50 + 7 * i)))


def test_shards_appending_at_once_never_interleave_their_timelines(tmp_path):
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_append_many, args=(str(tmp_path), w, 60)) for w in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    records = load_records(str(tmp_path))
    assert records.problems == [] and len(records.records) == 180
    t = Timelines(str(tmp_path))
    for r in records.records:
        worker, i = map(int, r["case_id"][1:].split("-"))
        assert max(t.get(r)["bytes"]) == 1000 + i
    assert t.problems == [] and len(_lines(tmp_path / TIMELINES)) == 180


def test_status_and_resume_never_read_the_timelines(tmp_path, monkeypatch, capsys):
    """A run's timelines.jsonl may be anything: `status` and `sweep --resume` read only the records."""
    from ckptbench.cli import main
    from ckptbench.run import calibration, sweep

    class Runner:
        def kill_current(self) -> None:
            pass

        def run(self, case, *args, **kwargs) -> dict:
            return {"status": "unsupported", "reason": "no worker here", "wall_s": 0.0}

    monkeypatch.setattr(sweep, "IsolatedRunner", Runner)
    monkeypatch.setattr(calibration, "machine_rates", lambda cases, forked=False: (None, "not measured in this test"))
    monkeypatch.setattr(sweep, "take_readings", lambda *args, **kwargs: [])
    suite = tmp_path / "suite.toml"
    suite.write_text('[suite]\nname = "two"\n[model]\npreset = "llama-tiny"\n[sweep]\nbatch_size = [1]\n'
                     'seq_len = [16]\nevery_n_layers = [0, 1]\n')
    out = tmp_path / "run"
    assert main(["sweep", "--suite", str(suite), "--out", str(out)]) == 0
    before = (out / "records.jsonl").read_bytes()
    _write_hostile(out)
    real_open = open

    def watched(path, *args, **kwargs):
        assert not str(path).endswith(TIMELINES), "read the timelines"
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr("builtins.open", watched)
    assert main(["sweep", "--suite", str(suite), "--out", str(out), "--resume"]) == 0
    assert main(["status", str(out)]) == 0
    monkeypatch.undo()
    assert (out / "records.jsonl").read_bytes() == before
    assert "Traceback" not in capsys.readouterr().err


def test_a_record_is_not_changed_by_reading_its_timeline(tmp_path):
    RecordStore(str(tmp_path)).append(rec("a", timeline()))
    record = load_records(str(tmp_path)).records[0]
    kept = copy.deepcopy(record)
    Timelines(str(tmp_path)).get(record)
    assert record == kept and os.path.getsize(tmp_path / TIMELINES) > 0


@pytest.mark.parametrize("seed", range(20))
def test_the_chunked_scan_finds_every_line_where_it_is(tmp_path, monkeypatch, seed):
    """Small chunks and a small bound, so lines straddle chunks and long lines span several."""
    import random

    rng = random.Random(seed)
    monkeypatch.setattr(tl_store, "CHUNK", rng.choice([7, 16, 64, 256]))
    monkeypatch.setattr(tl_store, "MAX_LINE", 40)
    lines = []
    for i in range(rng.randint(0, 30)):
        kind = rng.choice(["id", "id", "none", "blank", "long"])
        if kind == "id":
            lines.append(b'{"a": 1, "case_id": "c%d", "x": "%s"}\n' % (i, b"y" * rng.randint(0, 8)))
        elif kind == "none":
            lines.append(b"[%d]\n" % i)
        elif kind == "blank":
            lines.append(b"  \n")
        else:
            lines.append(b'{"case_id": "L%d", "pad": "%s"}\n' % (i, b"z" * rng.randint(30, 700)))
    if rng.random() < 0.5:
        lines.append(rng.choice([b'{"case_id": "torn', b"z" * 300]))  # a last line without its newline
    data = b"".join(lines)
    (tmp_path / TIMELINES).write_bytes(data)
    with open(tmp_path / TIMELINES, "rb") as fh:
        got = list(tl_store._scan(fh))
    offset, expected = 0, []
    for number, line in enumerate(lines, start=1):
        if len(line) > 40:
            what, case_id = "long", None
        elif not line.endswith(b"\n"):
            what, case_id = "torn", None
        else:
            what = "line" if line.strip() else "blank"
            case_id = line.split(b'"case_id": "')[1].split(b'"')[0].decode() if b"case_id" in line else None
        expected.append((number, offset, len(line), what, case_id))
        offset += len(line)
    assert got == expected
    for number, start, length, _, _ in got:
        assert data[start:start + length] == lines[number - 1]
