"""``ckptbench status``: done, running, waiting and missing points, read from a directory's files alone."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys

import pytest

from ckptbench.base.errors import UsageError
from ckptbench.run.outcome import job_outcome, write_outcome
from ckptbench.run.shards import SweepLock
from ckptbench.run.status import run_status
from ckptbench.run.submit import JOBS_DIR, ShardJob, SlurmSettings, make_executor
from ckptbench.run.sweep import SweepOptions, plan
from ckptbench.store.records import RecordStore
from ckptbench.suite.parse import load_suite

SIX = """
[suite]
name = "six"

[model]
preset = "llama-tiny"
attn = "eager"

[sweep]
batch_size = [1, 2]
seq_len = [16]
every_n_layers = [0, 1, 2]
"""


def test_status_across_two_shards_and_their_jobs(tmp_path):
    out = str(tmp_path)
    (tmp_path / "suite.toml").write_text(SIX)
    suite = load_suite(str(tmp_path / "suite.toml"))
    first, second = plan(suite, (1, 2)), plan(suite, (2, 2))  # three points each
    store = RecordStore(out)
    store.append({"case_id": first[0].id, "repeat": 0, "status": "ok", "case": first[0].to_dict()})
    store.append({"case_id": first[1].id, "repeat": 0, "status": "timeout", "case": first[1].to_dict()})
    store.append({"case_id": first[2].id, "repeat": 0, "status": "skipped", "case": first[2].to_dict()})  # deadline: --resume runs it
    store.append({"case_id": second[0].id, "repeat": 0, "status": "ok", "case": second[0].to_dict()})
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    # submitted from where the run was before it was copied here: its job files are read from here
    (jobs / "submitted.jsonl").write_text(json.dumps({"launcher": "slurm", "folder": "/scratch/gone/jobs", "jobs": [
        {"shard": [1, 2], "job_id": "9_0"}, {"shard": [2, 2], "job_id": "9_1"}]}) + "\n")
    write_outcome(str(jobs), "9_0", Exception("stopped after 1 points, 2 not run: at its time limit"))

    with SweepLock(out, (2, 2), n_cases=6, job="9_1") as lock:
        lock.running([{"case_id": second[1].id, "repeat": 0, "where": "cores 1"}])
        st = run_status(out)
    assert st.runs == 6 and dict(st.done) == {"ok": 2, "timeout": 1}
    assert [p["case_id"] for p in st.running] == [second[1].id] and st.running[0]["job"] == "9_1"
    assert st.waiting == 1  # second[2]: shard 2/2 runs now and will reach it
    assert [c.id for c, _ in st.missing] == [first[2].id] and st.skipped == 1
    assert [(j.job_id, j.state) for j in st.jobs] == [
        ("9_0", "failed: Exception: stopped after 1 points, 2 not run: at its time limit"), ("9_1", "running")]

    st = run_status(out)  # the sweep of shard 2/2 has gone: nothing waits for a live sweep any more
    assert st.running == [] and st.waiting == 0 and len(st.missing) == 3
    assert [(j.job_id, j.state) for j in st.jobs][1] == ("9_1", "no result yet (queued, or ended without one)")


def test_status_of_a_directory_without_a_suite_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="no suite.toml here"):
        run_status(str(tmp_path))
    assert not os.path.exists(tmp_path / "records.jsonl")


class Planted:
    """A crafted result pickle: unpickling it creates `marker` (any code could run in its place)."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_status_never_unpickles_what_a_results_directory_holds(tmp_path):
    (tmp_path / "suite.toml").write_text(SIX)
    jobs, elsewhere = tmp_path / "jobs", tmp_path / "elsewhere"
    jobs.mkdir()
    elsewhere.mkdir()
    marker = tmp_path / "unpickled"
    # the manifest names a folder of its own: neither it nor the run's jobs/ is unpickled from
    (jobs / "submitted.jsonl").write_text(json.dumps({"launcher": "local", "folder": str(elsewhere), "jobs": [
        {"shard": [1, 1], "job_id": "77"}]}) + "\n")
    for folder in (jobs, elsewhere):
        (folder / "77_0_result.pkl").write_bytes(pickle.dumps(Planted(str(marker))))
    (jobs / "77_0_log.err").write_text("submitit ERROR: Submitted job triggered an exception\n"
                                       "RuntimeError: no space left on device [/red]\n\n")

    proc = subprocess.run([sys.executable, "-m", "ckptbench", "status", str(tmp_path)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert not marker.exists()
    assert ("job 77 (local, shard 1/1): ended without an outcome file; 77_0_log.err ends: "
            "RuntimeError: no space left on device [/red]") in " ".join(proc.stdout.split())  # rich wraps at 80


def test_each_job_notes_how_it_ended_beside_submitits_files(tmp_path):
    (tmp_path / "six.toml").write_text(SIX)
    suite = load_suite(str(tmp_path / "six.toml"))
    out = str(tmp_path / "run")
    folder = os.path.join(out, JOBS_DIR)
    (tmp_path / "a-file").write_text("")
    executor = make_executor("local", folder, SlurmSettings(), "six")
    empty = executor.submit(ShardJob(suite, SweepOptions(out_dir=out, shard=(7, 7))))  # six points: none in 7/7
    failing = executor.submit(ShardJob(suite, SweepOptions(out_dir=str(tmp_path / "a-file"))))
    assert empty.result()["ran"] == 0
    with pytest.raises(Exception, match="is a file"):
        failing.result()
    assert job_outcome(folder, empty.job_id) == "finished"
    assert job_outcome(folder, failing.job_id) == (
        f"failed: UsageError: --out {tmp_path / 'a-file'} is a file, not a results directory")
