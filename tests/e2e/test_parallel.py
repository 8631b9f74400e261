"""Sweeps past one point at a time: slots on one machine, and shards as jobs through submitit's local executor."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

from ckptbench.run.faults import Fault
from ckptbench.run.submit import JOBS_DIR, SlurmSettings, make_executor, submit_shards
from ckptbench.run.sweep import SweepOptions, run_sweep
from ckptbench.store.records import load_records
from ckptbench.suite.parse import load_suite

pytestmark = [pytest.mark.e2e, pytest.mark.slow]  # make test-all only: parallel slots and local jobs (94 s)

SMOKE = str(pathlib.Path(__file__).resolve().parents[2] / "suites" / "smoke.toml")


def memory_figures(record: dict) -> dict:
    m = record["measurement"]
    return {k: v for k, v in m.items() if k.endswith("_bytes") or k in ("peak_breakdown", "peak_phase")}


def sweep_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ckptbench", "sweep", "--suite", SMOKE, *args],
                          capture_output=True, text=True, timeout=600)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores to pin two workers")
def test_two_slots_give_the_serial_memory_figures_to_the_byte(tmp_path):
    serial = run_sweep(load_suite(SMOKE), SweepOptions(out_dir=str(tmp_path / "serial"))).records
    proc = sweep_cli("--out", str(tmp_path / "parallel"), "--parallel", "2")
    assert proc.returncode == 0, proc.stderr
    parallel = {r["case_id"]: r for r in load_records(str(tmp_path / "parallel")).records}

    assert sorted(parallel) == sorted(r["case_id"] for r in serial)
    for r in serial:
        assert r["status"] == parallel[r["case_id"]]["status"] == "ok"
        figures = memory_figures(r)
        assert len(figures) > 10 and figures == memory_figures(parallel[r["case_id"]])
    # each point ran pinned to its slot's core, and says so
    where = [r["placement"] for r in parallel.values()]
    assert {tuple(p["cores"]) for p in where} == {(k,) for k in sorted(os.sched_getaffinity(0))[:2]}
    assert all(p["cores_seen"] == p["cores"] and p["of"] == 2 and len(p["slots"]) == 1 for p in where)
    assert all(r["placement"]["of"] == 1 and r["placement"]["cores"] == [] for r in serial)


def test_two_local_jobs_run_two_shards_into_one_directory_every_point_once(tmp_path):
    out = str(tmp_path / "run")
    proc = sweep_cli("--out", out, "--launcher", "local", "--jobs", "2")
    assert proc.returncode == 0, proc.stderr
    assert "submitted 2 jobs (5 runs) through local" in proc.stderr
    loaded = load_records(out, merged=False)
    ids = [r["case_id"] for r in loaded.records]
    assert loaded.problems == [] and sorted(ids) == sorted(c.id for c in load_suite(SMOKE).cases)
    assert len(ids) == len(set(ids))
    with open(os.path.join(out, JOBS_DIR, "submitted.jsonl")) as fh:
        (submitted,) = [json.loads(line) for line in fh]
    job_of = {tuple(j["shard"]): j["job_id"] for j in submitted["jobs"]}
    assert set(job_of) == {(1, 2), (2, 2)}
    for r in loaded.records:  # each record names the shard and the job that ran it
        i, n = (int(x) for x in r["placement"]["shard"].split("/"))
        assert r["placement"]["job"] == job_of[(i, n)]

    status = subprocess.run([sys.executable, "-m", "ckptbench", "status", out], capture_output=True, text=True,
                            timeout=120)
    assert status.returncode == 0, status.stderr
    assert "done          5  (ok 5)" in status.stdout and "missing       0" in status.stdout
    assert f"job {job_of[(1, 2)]} (local, shard 1/2): finished" in status.stdout
    again = sweep_cli("--out", out, "--launcher", "local", "--jobs", "2", "--resume")
    assert again.returncode == 0 and "nothing to submit" in again.stderr


ONE_HANG = """
[suite]
name = "hang"
timeout_s = 300

[model]
preset = "llama-tiny"
attn = "eager"

[train]
warmup_steps = 1
memory_steps = 1
steps = 1
max_steps = 1

[sweep]
batch_size = [1]
seq_len = [16]
"""


def test_a_job_at_its_time_limit_records_its_point_as_timeout_and_is_requeued(tmp_path, write_suite):
    """The local executor sends the time-limit signal 15 s into a 60 s limit, as Slurm sends it 90 s
    before the end; the point in flight (it hangs) is recorded timeout, submitit requeues the job, and
    the requeued job finds its shard done."""
    suite = load_suite(write_suite(ONE_HANG))
    out = str(tmp_path / "run")
    executor = make_executor("local", os.path.join(out, JOBS_DIR), SlurmSettings(), "hang")
    executor.update_parameters(timeout_min=1, signal_delay_s=45)
    options = SweepOptions(out_dir=out, faults={suite.cases[0].id: Fault("hang")})
    (job,) = submit_shards(suite, options, [1], 1, executor, "local")
    summary = job.result()  # the requeued run's answer: nothing was left to run
    assert summary == {"shard": [1, 1], "job": job.job_id, "ran": 0, "statuses": {}}
    (record,) = load_records(out, merged=False).records
    assert record["status"] == "timeout"
    assert record["reason"].startswith(f"stopped with job {job.job_id} at its time limit (SIGUSR2)")
    assert record["placement"]["job"] == job.job_id
    with open(job.paths.stdout) as fh:
        assert "Requeued job" in fh.read() or "Requeued job" in open(job.paths.stderr).read()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_local_job_killed_takes_its_sweep_fork_server_and_worker_along(tmp_path, write_suite):
    """SIGKILL to a local job (submitit's controller, whose pid is the job id) while its point hangs: the
    task running the sweep, its fork server and its worker end with it, none left running under init."""
    import signal
    import time

    from ckptbench.run.launch import descendants

    suite = load_suite(write_suite(ONE_HANG))
    out = str(tmp_path / "run")
    executor = make_executor("local", os.path.join(out, JOBS_DIR), SlurmSettings(), "hang")
    options = SweepOptions(out_dir=out, faults={suite.cases[0].id: Fault("hang")})
    (job,) = submit_shards(suite, options, [1], 1, executor, "local")
    work = os.path.join(out, "work")
    deadline = time.monotonic() + 300
    while not (os.path.isdir(work) and any(f.endswith(".log") for f in os.listdir(work))):
        assert time.monotonic() < deadline and not job.done(), "the hanging point never started"
        time.sleep(0.1)
    time.sleep(0.5)
    controller = int(job.job_id)
    under = descendants(controller)
    assert len(under) >= 3  # the task (the sweep), its fork server, the worker
    os.kill(controller, signal.SIGKILL)
    deadline = time.monotonic() + 5  # the kernel's parent-death signal takes well under a second
    while any(_alive(p) for p in under) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [p for p in under if _alive(p)] == []
