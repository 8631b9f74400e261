"""A full disk, a read-only folder or a refused permission: one line naming the file and why, an exit
status, no temporary file left behind, and the records already written still whole."""

from __future__ import annotations

import errno
import os

import pytest

from ckptbench.base.errors import StorageError
from ckptbench.cli import EXIT_STORAGE, main
from ckptbench.point.case import Case, preset
from ckptbench.point.training import TrainSpec
from ckptbench.store.files import write_text_atomic
from ckptbench.store.records import RecordStore, load_records

CASE = Case(model=preset("llama-tiny"), train=TrainSpec(), batch_size=1, seq_len=8).to_dict()
FAULTS = [(errno.ENOSPC, "disk full (ENOSPC)"), (errno.EROFS, "read-only file system (EROFS)"),
          (errno.EACCES, "permission denied (EACCES)")]
SUITE = """
[suite]
name = "three"

[model]
preset = "llama-tiny"
attn = "eager"

[sweep]
batch_size = [1]
seq_len = [16]
every_n_layers = [0, 1, 2]
"""


def _raise(code: int):
    def fail(*args, **kwargs):
        raise OSError(code, os.strerror(code))
    return fail


def _leftovers(folder) -> list[str]:
    return [name for _, _, files in os.walk(folder) for name in files if ".tmp" in name]


@pytest.mark.parametrize("code, words", FAULTS)
@pytest.mark.parametrize("step", ["fsync", "replace"])
def test_a_failed_atomic_write_leaves_no_temporary_file_and_the_old_file(tmp_path, monkeypatch, code, words, step):
    path = tmp_path / "plan.json"
    path.write_text("old")
    monkeypatch.setattr(os, step, _raise(code))
    with pytest.raises(StorageError) as caught:
        write_text_atomic(str(path), "new " * 1000)
    monkeypatch.undo()
    assert str(caught.value) == f"{words} writing {path}"
    assert _leftovers(tmp_path) == [] and path.read_text() == "old"


@pytest.mark.parametrize("step", ["fsync", "replace"])
def test_a_failed_checks_csv_leaves_no_temporary_file_and_the_old_file(tmp_path, monkeypatch, step):
    from ckptbench.report.checks import write_checks_csv
    from ckptbench.report.columns import record_frame, tidy
    from tests.synthetic_run import synthetic_records

    path = tmp_path / "report.checks.csv"
    path.write_text("old")
    frame = tidy(record_frame(synthetic_records(20)))
    monkeypatch.setattr(os, step, _raise(errno.ENOSPC))
    with pytest.raises(StorageError) as caught:
        write_checks_csv(frame, str(path))
    monkeypatch.undo()
    assert str(path) in str(caught.value)
    assert _leftovers(tmp_path) == [] and path.read_text() == "old"


def test_an_append_that_fills_the_disk_leaves_the_records_before_it_whole(tmp_path, monkeypatch):
    store = RecordStore(str(tmp_path))
    store.append({"case_id": "a", "status": "ok", "case": CASE})
    before = open(store.path, "rb").read()
    real_write = os.write

    def half_then_full(fd, data):  # the disk fills halfway through the line
        real_write(fd, data[: len(data) // 2])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "write", half_then_full)
    with pytest.raises(StorageError, match=r"disk full \(ENOSPC\) writing .*records.jsonl"):
        store.append({"case_id": "b", "status": "ok", "case": CASE, "measurement": {"peak_bytes": 1}})
    monkeypatch.undo()
    assert open(store.path, "rb").read() == before  # the half line is gone, nothing before it touched
    store.append({"case_id": "c", "status": "ok", "case": CASE})
    loaded = load_records(str(tmp_path))
    assert [r["case_id"] for r in loaded.records] == ["a", "c"] and loaded.problems == []


class _FakeRunner:
    """Stands in for the fork server: every point ends at once, unsupported (no worker, no torch)."""

    def kill_current(self) -> None:
        pass

    def run(self, case, *args, **kwargs) -> dict:
        return {"status": "unsupported", "reason": "fake worker", "wall_s": 0.0}


@pytest.fixture
def quick_sweep(tmp_path, monkeypatch):
    """`ckptbench sweep` of three points with workers that end at once and no calibration."""
    from ckptbench.run import calibration, sweep

    monkeypatch.setattr(sweep, "IsolatedRunner", _FakeRunner)
    monkeypatch.setattr(calibration, "machine_rates", lambda cases, forked=False: (None, "not measured in this test"))
    monkeypatch.setattr(sweep, "take_readings", lambda *args, **kwargs: [])  # no calibration kernel either
    suite = tmp_path / "suite.toml"
    suite.write_text(SUITE)
    out = str(tmp_path / "run")
    return lambda *extra: main(["sweep", "--suite", str(suite), "--out", out, *extra]), out


def _error_lines(err: str) -> list[str]:
    assert "Traceback" not in err
    return [line for line in err.splitlines() if line.startswith("error:")]


def test_a_disk_that_fills_during_a_sweep_is_one_line_and_exit_4(quick_sweep, monkeypatch, capsys):
    run, out = quick_sweep
    real_write, lines = os.write, []

    def full_after_one_record(fd, data):
        if data.startswith(b'{"'):
            lines.append(data)
            if len(lines) > 1:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", full_after_one_record)
    assert run() == EXIT_STORAGE
    monkeypatch.setattr(os, "write", real_write)
    errors = _error_lines(capsys.readouterr().err)
    assert len(errors) == 1 and errors[0].startswith(
        f"error: disk full (ENOSPC) writing {os.path.join(out, 'records.jsonl')}; what was written before is kept")
    loaded = load_records(out)
    assert len(loaded.records) == 1 and loaded.problems == [] and _leftovers(out) == []
    assert run("--resume") == 0  # space again: the points not recorded run
    assert len(load_records(out).records) == 3


@pytest.mark.parametrize("code, words", FAULTS[1:])
def test_an_unwritable_out_is_one_line_and_exit_2(quick_sweep, monkeypatch, capsys, code, words):
    run, out = quick_sweep
    real_makedirs = os.makedirs

    def refuse(path, *args, **kwargs):
        if str(path).startswith(out):
            raise OSError(code, os.strerror(code), path)
        return real_makedirs(path, *args, **kwargs)

    monkeypatch.setattr(os, "makedirs", refuse)
    assert run() == 2
    assert _error_lines(capsys.readouterr().err) == [f"error: {words} creating {out}"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through a read-only mode")
def test_a_read_only_out_folder_is_one_line_and_exit_2(quick_sweep, capsys):
    run, out = quick_sweep
    os.makedirs(out)
    os.chmod(out, 0o555)
    try:
        assert run() == 2
    finally:
        os.chmod(out, 0o755)
    errors = _error_lines(capsys.readouterr().err)
    assert len(errors) == 1 and "permission denied (EACCES)" in errors[0] and out in errors[0]


# -- the memory timeline's line in timelines.jsonl: secondary to the record --------------------------------
TIMELINE = {"meter": "cpu-live-storages", "unit": "bytes", "events": 2, "event": [0, 1, 2], "bytes": [5, 9, 4],
            "peak_event": 1, "marks": [[0, "forward"]], "marks_dropped": 0, "max_samples": 2000}


def _timeline_record(case_id: str) -> dict:
    return {"case_id": case_id, "repeat": 0, "attempt": 1, "status": "ok", "case": CASE,
            "measurement": {"peak_bytes": 9, "timeline": dict(TIMELINE)}}


def _fail_timeline_lines(monkeypatch, everything: bool = False) -> None:
    """The disk fills halfway through each timeline's line (and, with `everything`, each record's too)."""
    real_write = os.write

    def half_then_full(fd, data):
        if b'"timeline": {' in data or (everything and data.startswith(b'{"')):
            real_write(fd, data[: len(data) // 2])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", half_then_full)


def test_a_timeline_that_fills_the_disk_costs_the_timeline_not_the_record(tmp_path, monkeypatch):
    from ckptbench.store.timelines import TIMELINES, Timelines

    store = RecordStore(str(tmp_path))
    store.append(_timeline_record("a"))
    side = tmp_path / TIMELINES
    before = side.read_bytes()
    _fail_timeline_lines(monkeypatch)
    store.append(_timeline_record("b"))  # no error: the record is written, saying why it has no timeline
    monkeypatch.undo()
    assert side.read_bytes() == before  # the half line is cut back
    store.append(_timeline_record("c"))  # space again
    loaded = load_records(str(tmp_path))
    assert [r["case_id"] for r in loaded.records] == ["a", "b", "c"] and loaded.problems == []
    b = loaded.records[1]["measurement"]
    assert b["timeline_note"] == f"timeline not stored: disk full (ENOSPC) writing {side}"
    assert "timeline_stored" not in b and "timeline" not in b
    timelines = Timelines(str(tmp_path))
    assert [timelines.get(r) for r in loaded.records] == [TIMELINE, None, TIMELINE] and timelines.problems == []


def test_a_disk_full_for_the_timeline_and_the_record_is_the_records_error(tmp_path, monkeypatch):
    store = RecordStore(str(tmp_path))
    store.append(_timeline_record("a"))
    files = {name: (tmp_path / name).read_bytes() for name in ("records.jsonl", "timelines.jsonl")}
    _fail_timeline_lines(monkeypatch, everything=True)
    with pytest.raises(StorageError, match=r"disk full \(ENOSPC\) writing .*records.jsonl"):
        store.append(_timeline_record("b"))
    monkeypatch.undo()
    assert {name: (tmp_path / name).read_bytes() for name in files} == files


class _TimelineRunner(_FakeRunner):
    """Every point ends at once, ok, with a memory timeline (no worker, no torch)."""

    def run(self, case, *args, **kwargs) -> dict:
        return {"status": "ok", "reason": "", "wall_s": 0.0,
                "measurement": {"peak_bytes": 9, "timeline": dict(TIMELINE)}}


@pytest.fixture
def timeline_sweep(quick_sweep, monkeypatch):
    from ckptbench.run import sweep

    monkeypatch.setattr(sweep, "IsolatedRunner", _TimelineRunner)
    return quick_sweep


def test_a_sweep_whose_timelines_fill_the_disk_records_every_point(timeline_sweep, monkeypatch, capsys):
    run, out = timeline_sweep
    _fail_timeline_lines(monkeypatch)
    assert run() == 0
    monkeypatch.undo()
    loaded = load_records(out)
    assert len(loaded.records) == 3 and loaded.problems == [] and _leftovers(out) == []
    for r in loaded.records:
        assert r["measurement"]["timeline_note"].startswith("timeline not stored: disk full (ENOSPC) writing ")
    assert os.path.getsize(os.path.join(out, "timelines.jsonl")) == 0
    assert "Traceback" not in capsys.readouterr().err


def test_a_disk_that_fills_under_timelines_ends_as_the_records_error(timeline_sweep, monkeypatch, capsys):
    run, out = timeline_sweep
    real_write, lines = os.write, []

    def full_after_one_point(fd, data):
        if data.startswith(b'{"'):
            lines.append(data)
            if len(lines) > 2:  # the first point's timeline and record, then nothing
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", full_after_one_point)
    assert run() == EXIT_STORAGE
    monkeypatch.undo()
    errors = _error_lines(capsys.readouterr().err)
    assert len(errors) == 1 and errors[0].startswith(
        f"error: disk full (ENOSPC) writing {os.path.join(out, 'records.jsonl')}; what was written before is kept")
    loaded = load_records(out)
    assert len(loaded.records) == 1 and loaded.problems == []
    assert loaded.records[0]["measurement"]["timeline_stored"] == "timelines.jsonl"
    with open(os.path.join(out, "timelines.jsonl"), "rb") as fh:
        assert len(fh.read().splitlines()) == 1
