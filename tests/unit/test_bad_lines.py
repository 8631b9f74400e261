"""A valid-JSON line of the wrong shape in records.jsonl is skipped and listed by every command: it never
replaces its Case's good record, and no command ends in a traceback over it."""

from __future__ import annotations

import json
import os

import pytest

from ckptbench.cli import main
from ckptbench.store.records import RecordStore, load_records
from ckptbench.suite.parse import load_suite
from tests.synthetic_run import ONE_POINT_SUITE as SUITE

GIB = 2**30

# Lines that parse as JSON and carry the good record's case id, each of a shape no sweep writes.
BAD_SHAPES = {
    "measurement a string": {"status": "ok", "measurement": "x", "case": {}},
    "case missing": {"status": "ok", "measurement": {}},
    "case not a dict": {"status": "ok", "case": "llama-tiny"},
    "unknown status": {"status": "bogus"},
}


def _good(case, device: str = "cpu") -> dict:
    d = case.to_dict()
    d["device"] = device
    return {"case_id": case.id, "repeat": 0, "repeats": 1, "suite": "one", "case": d, "strategy": case.strategy,
            "status": "ok", "reason": "", "env": {"torch_version": "2.0"},
            "measurement": {"peak_bytes": 10 * GIB, "mem_after_forward_bytes": 8 * GIB, "step_time_median_s": 0.01,
                            "step_times_s": [0.01, 0.011, 0.009], "tokens_per_s": 1600.0,
                            "cuda_max_allocated_bytes": 10 * GIB, "cuda_max_reserved_bytes": 10 * GIB + GIB // 2},
            "meters": {"cuda_context_bytes": 700 * 2**20}}


@pytest.fixture(params=sorted(BAD_SHAPES))
def run(tmp_path, request):
    """A results directory whose one Case has a good line followed by a bad-shaped line."""
    out = tmp_path / "run"
    out.mkdir()
    (out / "suite.toml").write_text(SUITE)
    case = load_suite(str(out / "suite.toml")).cases[0]
    store = RecordStore(str(out))
    store.append(_good(case))
    store.append({"case_id": case.id, "repeat": 0, **BAD_SHAPES[request.param]})
    return str(out), case


def _skipped_said(text: str, run_dir: str) -> bool:
    return f"{os.path.join(run_dir, 'records.jsonl')}: 1 line skipped (not valid records)" in text


def test_the_good_record_wins_and_the_bad_line_is_listed(run):
    run_dir, case = run
    loaded = load_records(run_dir)
    assert [(r["case_id"], r["status"]) for r in loaded.records] == [(case.id, "ok")]
    assert loaded.skipped == 1 and "records.jsonl:2: not a record (" in loaded.problems[0]
    assert _skipped_said(loaded.notes()[0], run_dir)


def test_report(run, tmp_path, capsys):
    run_dir, _ = run
    html = str(tmp_path / "r.html")
    assert main(["report", run_dir, "-o", html]) == 0
    assert _skipped_said(capsys.readouterr().err, run_dir)
    page = open(html, encoding="utf-8").read()
    assert "1 line skipped (not valid records)" in page


def test_compare(run, capsys):
    run_dir, _ = run
    assert main(["compare", run_dir, run_dir, "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert [p["old_status"] for p in result["points"]] == ["ok"]
    assert any(_skipped_said(p, run_dir) for p in result["problems"])


def test_status(run, capsys):
    run_dir, _ = run
    assert main(["status", run_dir]) == 0
    text = capsys.readouterr()
    assert _skipped_said(text.out + text.err, run_dir)
    assert "(ok 1)" in text.out


def test_sweep_resume_keeps_the_good_record_and_runs_nothing(run, capsys):
    run_dir, _ = run
    assert main(["sweep", "--suite", os.path.join(run_dir, "suite.toml"), "--out", run_dir, "--resume"]) == 0
    err = capsys.readouterr().err
    assert _skipped_said(err, run_dir) and "1 cases already in" in err
    assert len(load_records(run_dir).records) == 1


def test_plan_from_run(tmp_path, capsys):
    out = tmp_path / "gpu"
    out.mkdir()
    case = load_suite(_write(tmp_path, SUITE)).cases[0]
    store = RecordStore(str(out))
    store.append(_good(case, device="cuda"))
    store.append({"case_id": case.id, "repeat": 0, **BAD_SHAPES["measurement a string"]})
    assert main(["plan", "--model", "llama-1b", "--device", "h100", "--seq", "4096", "--dtype", "bf16",
                 "--attn", "sdpa", "--from-run", str(out)]) == 0
    text = capsys.readouterr()
    assert _skipped_said(text.err, str(out))
    assert "context 700 MiB on the peak (measured in" in text.out


def _write(tmp_path, text: str) -> str:
    path = tmp_path / "suite.toml"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("line, why", [
    ({"case_id": "a", "status": "ok", "case": {"batch_size": 1}}, "case is not a Case"),
    ({"case_id": "a", "status": "ok", "repeat": [0]}, "repeat [0] is not a count"),
    ({"case_id": 3, "status": "ok"}, "case_id 3 is not a string"),
    ({"case_id": "a", "status": "ok"}, "no case"),
    ({"case_id": "a"}, "no status"),
    ([1, 2], "a JSON list"),
])
def test_each_wrong_shape_is_named(tmp_path, line, why):
    path = tmp_path / "records.jsonl"
    path.write_text(json.dumps({"schema": 1, **line} if isinstance(line, dict) else line) + "\n")
    loaded = load_records(str(path))
    assert loaded.records == [] and loaded.skipped == 1
    assert why in loaded.problems[0]


def test_the_sweep_axes_must_be_numbers(tmp_path):
    case = load_suite(_write(tmp_path, SUITE)).cases[0]
    good = _good(case)
    bad = {**good, "case": {**good["case"], "seq_len": "16"}}
    store = RecordStore(str(tmp_path))
    store.append(good)
    store.append(bad)
    loaded = load_records(str(tmp_path))
    assert loaded.records[0]["case"]["seq_len"] == 16
    assert "case.seq_len is '16', not an integer" in loaded.problems[0]


def test_step_time_lists_are_finite_numbers_whatever_path_decides():
    from ckptbench.store.validate import _finite_numbers

    assert _finite_numbers([0.1, 0.2, 0.3]) and _finite_numbers([1, 0.5])  # floats, or ints among them
    assert _finite_numbers([1e308, 1e308])  # finite values whose sum overflows: looked at one by one
    for bad in ([0.1, float("nan")], [float("inf")], [0.1, "0.2"], [0.1, None], [True, 0.1], [0.1, [0.2]]):
        assert not _finite_numbers(bad), bad


def test_a_step_time_no_sweep_could_have_timed_is_a_bad_line(tmp_path):
    """1e308 s is a finite number, and compare then called a step that had taken 24 ms "new (was 0)" while
    the charts overflowed: over MAX_STEP_S a step's seconds are a damaged or planted value, the line is
    skipped and named, and the run's other lines are read."""
    from ckptbench.store.validate import MAX_STEP_S

    case = load_suite(_write(tmp_path, SUITE)).cases[0]
    good = _good(case)
    lines = [good]
    for key, value in (("step_time_median_s", 1e308), ("timing_window_s", MAX_STEP_S * 2),
                       ("step_times_s", [0.01, 1e308]), ("repeat_medians_s", [MAX_STEP_S + 1])):
        lines.append({**good, "measurement": {**good["measurement"], key: value}})
    lines.append({**good, "measurement": {**good["measurement"], "step_times_s": [MAX_STEP_S, 0.01]}})
    store = RecordStore(str(tmp_path))
    for record in lines:
        store.append(record)
    loaded = load_records(str(tmp_path))
    assert loaded.skipped == 4  # the one exactly at the bound is a record: the point's latest
    assert [r["measurement"]["step_times_s"] for r in loaded.records] == [[MAX_STEP_S, 0.01]]
    assert "measurement.step_time_median_s is 1e+308, over 1e+06 s: not a step's time" in loaded.problems[0]
    assert "measurement.step_times_s holds 1e+308, over 1e+06 s" in loaded.problems[2]


def test_lines_the_fast_parser_refuses_read_as_the_json_module_reads_them(tmp_path):
    """NaN and Infinity are JSON the json module writes and reads; a line that holds them reads the same as
    before (and is then judged by its shape); an integer past 64 bits reads as the float nearest it (orjson's
    reading: no count a sweep writes comes near); a line nested past any parser's depth is an unreadable
    line, never a crash."""
    from ckptbench.store.records import parse_line

    case = load_suite(_write(tmp_path, SUITE)).cases[0]
    good = _good(case)
    big = {**good, "measurement": {**good["measurement"], "allocator_events": 2**70}}
    nan = {**good, "measurement": {**good["measurement"], "step_times_s": [0.01, float("nan")]}}
    line = json.dumps(nan).encode()
    assert json.dumps(parse_line(line)) == json.dumps(json.loads(line))
    path = tmp_path / "records.jsonl"
    deep = b"[" * 200_000 + b"]" * 200_000
    path.write_bytes(b"\n".join([deep, json.dumps({"schema": 1, **nan}).encode(),
                                 json.dumps({"schema": 1, **big}).encode()]) + b"\n")
    loaded = load_records(str(path))
    assert loaded.skipped == 2 and "1: unreadable line" in loaded.problems[0]
    assert "step_times_s holds something other than finite numbers" in loaded.problems[1]
    assert loaded.records[0]["measurement"]["allocator_events"] == float(2**70)


def test_a_cuda_records_per_step_peaks_are_lists_of_byte_counts(tmp_path):
    """A CUDA worker writes the allocator's peak of each timed step as a list under a ``_bytes`` name; it is
    read (the H200's first run's every record had been refused for it), and a list holding anything but
    byte counts is a bad line."""
    case = load_suite(_write(tmp_path, SUITE)).cases[0]
    good = _good(case, device="cuda")
    peaks = {"cuda_step_max_allocated_bytes": [20978022912, 20978022912], "cuda_step_max_reserved_bytes": [2**35] * 2}
    lines = [{**good, "measurement": {**good["measurement"], **peaks}}]
    for bad in ([-1, 5], [1, "2"], [1.5, float("nan")], 7):
        lines.append({**good, "repeat": len(lines), "measurement": {**good["measurement"], **peaks,
                                                                   "cuda_step_max_reserved_bytes": bad}})
    path = tmp_path / "records.jsonl"
    path.write_text("".join(json.dumps({"schema": 1, **line}) + "\n" for line in lines))
    loaded = load_records(str(path))
    assert [r["measurement"]["cuda_step_max_allocated_bytes"] for r in loaded.records] == [peaks["cuda_step_max_allocated_bytes"]]
    assert loaded.skipped == 4
    assert all("cuda_step_max_reserved_bytes" in p for p in loaded.problems)


def test_every_record_the_h200_wrote_is_read():
    """The records of the first GPU run (results/h200-20261204-gpu-small), as the CUDA workers wrote them."""
    path = os.path.join(os.path.dirname(__file__), "..", "..", "results", "h200-20261204-gpu-small", "run",
                        "records.jsonl")
    loaded = load_records(path)
    assert loaded.skipped == 0 and len(loaded.records) == 42
    assert {r["status"] for r in loaded.records} == {"ok"}
    assert all(len(r["measurement"]["cuda_step_max_allocated_bytes"]) == r["measurement"]["timed_steps"]
               for r in loaded.records)


def test_without_orjson_the_json_module_reads_the_same_records(tmp_path, monkeypatch):
    """A machine's own python without orjson (the H200's image had none) reads the records as before."""
    from ckptbench.store import records

    case = load_suite(_write(tmp_path, SUITE)).cases[0]
    path = tmp_path / "records.jsonl"
    path.write_text(json.dumps({"schema": 1, **_good(case)}) + "\n{not json\n")
    fast = load_records(str(path))
    monkeypatch.setattr(records, "orjson", None)
    plain = load_records(str(path))
    assert plain.records == fast.records and len(plain.records) == 1
    assert plain.problems == fast.problems and plain.skipped == fast.skipped == 1


def test_a_tracked_runs_ranks_read_as_records_of_their_own_and_a_bad_rank_line_is_listed(tmp_path):
    """A tracked torchrun's directory holds rank 0's records and rank-<r>/records.jsonl: read together,
    each rank is a record of its own (never merged as a repeat of rank 0), ordered by rank; a bad line in a
    rank's file is skipped and named, the others kept."""
    out = tmp_path / "run"
    out.mkdir()
    (out / "suite.toml").write_text(SUITE)
    case = load_suite(str(out / "suite.toml")).cases[0]
    RecordStore(str(out)).append({**_good(case), "track": {"rank": 0}})
    for rank in (2, 1):
        store = RecordStore(str(out / f"rank-{rank}"))
        store.ensure()
        store.append({**_good(case), "track": {"rank": rank}})
    with open(out / "rank-2" / "records.jsonl", "a", encoding="utf-8") as fh:
        fh.write('{"case_id": "truncated\n')
    (out / "rank-x").mkdir()  # not a rank: left alone
    loaded = load_records(str(out))
    assert [r["track"]["rank"] for r in loaded.records] == [0, 1, 2]
    assert loaded.skipped == 1 and "rank-2" in loaded.problems[0] and "records.jsonl:2:" in loaded.problems[0]
