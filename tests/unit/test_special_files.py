"""A directory, a FIFO or a device planted where a command reads a file of a run (or a file of the wrong
shape there) is one line on stderr naming the file and why, exit status 2 or a note: never a traceback,
and never a wait for a writer that does not come or an endless read."""

from __future__ import annotations

import fcntl
import json
import os

import pytest

from ckptbench.base.regularfile import open_regular
from ckptbench.cli import main
from ckptbench.store.records import RecordStore, load_records
from ckptbench.suite.parse import load_suite
from tests.synthetic_run import ONE_POINT_SUITE as SUITE


def _plant(path: str, kind: str) -> None:
    if kind == "directory":
        os.mkdir(path)
    elif kind == "FIFO":
        os.mkfifo(path)
    else:
        os.symlink("/dev/zero", path)


KINDS = ("directory", "FIFO", "device")


@pytest.fixture
def run(tmp_path):
    """A results directory with one good record."""
    out = tmp_path / "run"
    out.mkdir()
    (out / "suite.toml").write_text(SUITE)
    case = load_suite(str(out / "suite.toml")).cases[0]
    d = case.to_dict()
    RecordStore(str(out)).append({"case_id": case.id, "repeat": 0, "case": d, "strategy": case.strategy,
                                  "status": "ok", "measurement": {"peak_bytes": 2**20, "step_time_median_s": 0.01,
                                                                  "step_times_s": [0.01, 0.011, 0.009]}})
    return str(out)


@pytest.mark.parametrize("kind", KINDS)
def test_open_regular_refuses_without_waiting(tmp_path, kind):
    path = str(tmp_path / "f")
    _plant(path, kind)
    with pytest.raises(OSError, match=f"not a regular file \\(a {kind}\\)") as info:
        open_regular(path)
    assert info.value.filename == path


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("command", ["status", "report", "gpu-summary", "compare"])
def test_records_file_not_a_file(run, tmp_path, capsys, kind, command):
    path = os.path.join(run, "records.jsonl")
    os.remove(path)
    _plant(path, kind)
    argv = {"report": ["report", run, "-o", str(tmp_path / "r.html")], "compare": ["compare", run, run]}.get(
        command, [command, run])
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    if kind == "directory" and command == "compare":  # compare reads a directory given as a records file
        assert len(err) == 1 and "records.jsonl" in err[0]
        return
    assert err == [f"error: {path}: cannot read the records: not a regular file (a {kind})"]


@pytest.mark.parametrize("name", ["timelines.jsonl", "calibration.jsonl", "plan.json", "simulated.jsonl",
                                  "suite.toml"])
def test_report_notes_side_files_that_are_fifos(run, tmp_path, capsys, name):
    path = os.path.join(run, name)
    if os.path.exists(path):
        os.remove(path)
    os.mkfifo(path)
    assert main(["report", run, "-o", str(tmp_path / "r.html")]) == 0
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.parametrize("kind", KINDS)
def test_suite_file_not_a_file(tmp_path, capsys, kind):
    path = str(tmp_path / "s.toml")
    _plant(path, kind)
    assert main(["sweep", "--suite", path, "--dry-run"]) == 2
    assert capsys.readouterr().err.strip() == f"error: {path}: (file): cannot read: not a regular file (a {kind})"


@pytest.mark.parametrize("content, why", [
    (b"\x81garbage", "not JSON"), (b"[1]", "not a calibration (a JSON object), got list"),
    (b'{"h2d_bytes_per_s": "fast"}', "h2d_bytes_per_s: must be a positive number, got 'fast'"),
    (b'{"matmul_flops_per_s": NaN}', "matmul_flops_per_s: must be a positive number, got nan"),
    (None, "cannot read: not a regular file (a FIFO)")])
def test_gpu_summary_calibration_of_the_wrong_shape(run, capsys, content, why):
    path = os.path.join(run, "calibration.json")
    if content is None:
        os.mkfifo(path)
    else:
        with open(path, "wb") as fh:
            fh.write(content)
    assert main(["gpu-summary", run]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {path}: {why}")


def test_gpu_summary_skips_simulated_lines_of_the_wrong_shape(run, capsys):
    case_id = load_records(run).records[0]["case_id"]
    with open(os.path.join(run, "simulated.jsonl"), "w") as fh:
        for line in ({"case_id": case_id, "simulated": [1]}, {"case_id": case_id, "simulated": {"peak_bytes": "x"}},
                     {"case_id": [case_id], "simulated": {"peak_bytes": 1}}):
            fh.write(json.dumps(line) + "\n")
    assert main(["gpu-summary", run]) == 0
    assert "Traceback" not in capsys.readouterr().err


def test_status_skips_job_lines_of_the_wrong_shape(run, capsys):
    os.mkdir(os.path.join(run, "jobs"))
    with open(os.path.join(run, "jobs", "submitted.jsonl"), "wb") as fh:
        fh.write(b'[1]\n{"jobs": "x"}\n{"jobs": [1, {"shard": 3}, {"shard": [1, 1]}]}\n\xff\xfe\n'
                 b'{"jobs": [{"shard": [1, 1], "job_id": "42"}], "launcher": "local"}\n')
    assert main(["status", run]) == 0
    out = capsys.readouterr().out
    assert "job 42 (local, shard 1/1)" in out


def test_status_with_a_fifo_lock_and_a_held_shard_of_the_wrong_shape(run, capsys):
    os.mkfifo(os.path.join(run, ".sweep-1-of-1.lock"))  # opened to probe it: must not wait for a writer
    lock = os.path.join(run, ".sweep-1-of-2.lock")
    with open(os.path.join(run, ".sweep-1-of-2.json"), "w") as fh:
        json.dump({"running": [5, {"case_id": [1]}, "abc"], "pid": 1}, fh)
    open(os.path.join(run, ".sweep-0-of-0.lock"), "w").close()  # no shard a sweep names
    fd = os.open(lock, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # a live sweep holds shard 1/2
        assert main(["status", run]) == 0
    finally:
        os.close(fd)
    text = capsys.readouterr()
    assert "shard 1/2: running" in text.out and "Traceback" not in text.err


def test_impossible_byte_counts_are_not_records(run):
    good = load_records(run).records[0]
    with open(os.path.join(run, "records.jsonl"), "a") as fh:
        for peak in (-1, float("inf"), float("nan")):
            fh.write(json.dumps({**good, "measurement": {**good["measurement"], "peak_bytes": peak}}) + "\n")
    loaded = load_records(run)
    assert loaded.records[0]["measurement"]["peak_bytes"] == 2**20
    assert loaded.skipped == 3 and all("not a byte count" in p for p in loaded.problems)


def test_a_step_time_that_is_not_a_time_never_replaces_a_good_record(run):
    good = load_records(run).records[0]
    with open(os.path.join(run, "records.jsonl"), "a") as fh:
        for key, value in (("step_time_median_s", float("nan")), ("step_time_median_s", -0.5),
                           ("tokens_per_s", float("inf")), ("step_time_p90_s", float("nan"))):
            fh.write(json.dumps({**good, "measurement": {**good["measurement"], key: value}}) + "\n")
    loaded = load_records(run)
    assert loaded.records == [good]
    assert loaded.skipped == 4 and all("not a time or a rate" in p for p in loaded.problems)


@pytest.mark.parametrize("kind", KINDS)
def test_status_names_a_suite_toml_that_is_not_a_file(run, capsys, kind):
    path = os.path.join(run, "suite.toml")
    os.remove(path)
    _plant(path, kind)
    assert main(["status", run]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: {path}: not a regular file; status reads a results directory a sweep wrote"]
