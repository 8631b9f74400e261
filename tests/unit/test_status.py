"""``ckptbench status``: done, running, waiting and missing points, read from a directory's files alone."""

from __future__ import annotations

import json
import os
import pickle

import pytest

from ckptbench.errors import UsageError
from ckptbench.run.shards import SweepLock
from ckptbench.run.status import run_status
from ckptbench.run.sweep import plan
from ckptbench.store.records import RecordStore
from ckptbench.suite import load_suite

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
    store.append({"case_id": first[0].id, "repeat": 0, "status": "ok"})
    store.append({"case_id": first[1].id, "repeat": 0, "status": "timeout"})
    store.append({"case_id": first[2].id, "repeat": 0, "status": "skipped"})  # deadline: --resume runs it
    store.append({"case_id": second[0].id, "repeat": 0, "status": "ok"})
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    # submitted from where the run was before it was copied here: its job files are read from here
    (jobs / "submitted.jsonl").write_text(json.dumps({"launcher": "slurm", "folder": "/scratch/gone/jobs", "jobs": [
        {"shard": [1, 2], "job_id": "9_0"}, {"shard": [2, 2], "job_id": "9_1"}]}) + "\n")
    with open(jobs / "9_0_0_result.pkl", "wb") as fh:
        pickle.dump(("error", "Traceback ...\nStopped: stopped with job 9_0 at its time limit"), fh)

    with SweepLock(out, (2, 2), n_cases=6, job="9_1") as lock:
        lock.running([{"case_id": second[1].id, "repeat": 0, "where": "cores 1"}])
        st = run_status(out)
    assert st.runs == 6 and dict(st.done) == {"ok": 2, "timeout": 1}
    assert [p["case_id"] for p in st.running] == [second[1].id] and st.running[0]["job"] == "9_1"
    assert st.waiting == 1  # second[2]: shard 2/2 runs now and will reach it
    assert [c.id for c, _ in st.missing] == [first[2].id] and st.skipped == 1
    assert [(j.job_id, j.state) for j in st.jobs] == [
        ("9_0", "failed: Stopped: stopped with job 9_0 at its time limit"), ("9_1", "running")]

    st = run_status(out)  # the sweep of shard 2/2 has gone: nothing waits for a live sweep any more
    assert st.running == [] and st.waiting == 0 and len(st.missing) == 3
    assert [(j.job_id, j.state) for j in st.jobs][1] == ("9_1", "no result yet (queued, or ended without one)")


def test_status_of_a_directory_without_a_suite_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="no suite.toml here"):
        run_status(str(tmp_path))
    assert not os.path.exists(tmp_path / "records.jsonl")
