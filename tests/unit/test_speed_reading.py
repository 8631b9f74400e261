"""The calibration readings a sweep takes: where they go, what a failed one leaves, which setting they use.

The kernel itself runs in the end-to-end sweeps (tests/e2e/test_compare.py); here its process is stood in
for, so the rules around it are on trial without torch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from ckptbench.point.case import Case, preset
from ckptbench.point.training import TrainSpec
from ckptbench.run import speed_reading
from ckptbench.store.machine_speed import READINGS, load_readings, machine_speed
from tests.conftest import TINY_SUITE


def _case(threads: int) -> Case:
    return Case(model=preset("llama-tiny"), train=TrainSpec(threads=threads), batch_size=2, seq_len=64)


def test_readings_use_the_threads_most_points_use():
    assert speed_reading.kernel_setting([_case(1), _case(2), _case(2)]) == ("cpu", 2)


def test_each_moment_appends_its_readings_beside_the_records(tmp_path, monkeypatch):
    times = iter([[0.030, 0.031], [0.029, 0.030], [0.032, 0.031], [0.030, 0.030]])
    monkeypatch.setattr(speed_reading, "_child_interpreter",
                        lambda device, threads: {"kernel": "k", "device": device, "threads": threads,
                                                 "times_s": next(times)})
    for at in ("start", "end"):
        assert speed_reading.take_readings(str(tmp_path), at, [_case(1)], forked=False, shard="1/2", job="7") == []
    readings = load_readings(str(tmp_path))
    assert [r["at"] for r in readings] == ["start"] * speed_reading.READINGS_PER_MOMENT + ["end"] * 2
    assert all(r["shard"] == "1/2" and r["job"] == "7" and r["threads"] == 1 for r in readings)
    assert load_readings(os.path.join(str(tmp_path), "records.jsonl")) == readings  # beside a records file too


def test_a_failed_reading_is_a_line_saying_why_and_compare_says_it(tmp_path, monkeypatch):
    monkeypatch.setattr(speed_reading, "_child_interpreter", lambda device, threads: {"error": "no torch here"})
    notes = speed_reading.take_readings(str(tmp_path), "start", [_case(1)], forked=False)
    assert notes == ["calibration reading at the start: no torch here"] * 2
    speed = machine_speed(load_readings(str(tmp_path)), [{"kernel": "k", "times_s": [0.03, 0.03]}])
    assert speed.state == "unknown" and speed.why == "the old run's calibration failed (no torch here)"


def test_an_unwritable_directory_costs_a_note_not_the_sweep(tmp_path, monkeypatch):
    monkeypatch.setattr(speed_reading, "_child_interpreter", lambda device, threads: {"times_s": [0.03]})
    (tmp_path / READINGS).mkdir()  # where the file should go, a folder: every write fails
    notes = speed_reading.take_readings(str(tmp_path), "end", [_case(1)], forked=False)
    assert len(notes) == 1 and notes[0].startswith("calibration reading at the end not written: ")


def test_readings_that_are_not_timings_never_correct_a_run():
    """Values a damaged or planted line can hold: infinity had compare divide the new run's times by inf
    and call every point improved, 1e308 overflowed into a traceback.  They are left out, and a side with
    nothing else says why."""
    old = [{"kernel": "k", "times_s": [0.030, 0.031, 0.029]}] * 4
    fine = [{"kernel": "k", "times_s": [0.030, 0.031, 0.030]}] * 4
    for bad in ([float("inf")] * 3, [1e308] * 3, [1e-300] * 3, [float("nan")] * 3, [-0.03] * 3, ["0.03"] * 3):
        speed = machine_speed(old, [{"kernel": "k", "times_s": bad}] * 4)
        assert speed.state == "unknown" and speed.ratio is None, bad
        assert speed.why.startswith("the new run's calibration readings hold no timing"), bad
        mixed = machine_speed(old, [{"kernel": "k", "times_s": [0.030, 0.031] + bad[:1]}] * 4)
        assert mixed.ratio == machine_speed(old, [{"kernel": "k", "times_s": [0.030, 0.031]}] * 4).ratio
    assert machine_speed(old, fine).state == "within noise"
    assert machine_speed(old, [{"kernel": "k"}] * 4).why.startswith("no calibration reading in the new run")


def test_a_torn_last_line_is_skipped(tmp_path):
    (tmp_path / READINGS).write_text('{"times_s": [0.03], "at": "start"}\n{"times_s": [0.0')
    assert load_readings(str(tmp_path)) == [{"times_s": [0.03], "at": "start"}]


def test_a_sweeps_parent_never_imports_torch(tmp_path, write_suite):
    """The sweep's parent starts workers, takes the calibration readings and measures the projection's
    rates, all in processes forked from the fork server, and imports neither torch nor transformers itself:
    the worker's entry is named, not imported, and answers come back as plain data (``torch.__version__``
    is a TorchVersion, which unpickled would import torch).  Each would cost every sweep seconds."""
    suite = write_suite(TINY_SUITE.replace("every_n_layers = [0, 1]", "every_n_layers = [0]"))
    out = tmp_path / "run"
    code = ("import sys, json\n"
            "from ckptbench.cli import main\n"
            f"rc = main(['sweep', '--suite', {suite!r}, '--out', {str(out)!r}])\n"
            "print(json.dumps({'rc': rc, 'torch': 'torch' in sys.modules, "
            "'transformers': 'transformers' in sys.modules}))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"rc": 0, "torch": False, "transformers": False}
    assert "GFLOP/s" in proc.stderr  # the projection's rate was measured (in a forked process)
    readings = load_readings(str(out))
    assert len(readings) == 2 * speed_reading.READINGS_PER_MOMENT and all(r["times_s"] for r in readings)
    assert all(type(r["torch"]) is str for r in readings)
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    assert [r["status"] for r in records] == ["ok"]
