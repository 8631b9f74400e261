"""Whole sweeps on a tiny Llama: failures are results, nothing is lost, resume finishes the plan."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from ckptbench.base.errors import UsageError
from ckptbench.run.faults import Fault
from ckptbench.run.sweep import SweepOptions, run_sweep
from ckptbench.store.records import load_records
from ckptbench.suite.parse import load_suite

pytestmark = pytest.mark.e2e

SIX = """
[suite]
name = "six"
timeout_s = 60

[model]
preset = "llama-tiny"

[train]
warmup_steps = 1
memory_steps = 1
steps = 1
time_precision = 0.1
max_steps = 6

[sweep]
batch_size = [1, 2]
seq_len = [16]
every_n_layers = [0, 1, 2]
"""


def test_each_fault_is_recorded_and_the_sweep_goes_on(tmp_path, write_suite):
    suite = load_suite(write_suite(SIX))
    ids = [c.id for c in suite.cases]
    faults = {ids[0]: Fault("raise"), ids[1]: Fault("segfault"), ids[2]: Fault("hang"), ids[3]: Fault("exit")}
    result = run_sweep(suite, SweepOptions(out_dir=str(tmp_path / "run"), timeout_s=8, faults=faults))
    by_id = {r["case_id"]: r for r in load_records(str(tmp_path / "run")).records}
    assert list(by_id) == ids  # every planned point recorded, in order
    assert by_id[ids[0]]["status"] == "crash"
    assert "injected fault" in by_id[ids[0]]["reason"]
    assert "Traceback" in by_id[ids[0]]["stderr_tail"]
    assert by_id[ids[1]]["status"] == "crash" and "SIGSEGV" in by_id[ids[1]]["reason"]
    assert by_id[ids[2]]["status"] == "timeout" and "8 s" in by_id[ids[2]]["reason"]
    assert by_id[ids[3]]["status"] == "crash" and "code 3" in by_id[ids[3]]["reason"]
    assert [by_id[i]["status"] for i in ids[4:]] == ["ok", "ok"]
    assert len(result.records) == 6


def test_a_full_disk_is_recorded_as_such_and_retry_runs_the_point_again(tmp_path, write_suite):
    one = SIX.replace("batch_size = [1, 2]", "batch_size = [1]").replace("every_n_layers = [0, 1, 2]",
                                                                          "every_n_layers = [0]")
    suite = load_suite(write_suite(one))
    out = str(tmp_path / "run")
    run_sweep(suite, SweepOptions(out_dir=out, faults={suite.cases[0].id: Fault("disk-full")}))
    (first,) = load_records(out).records
    assert first["status"] == "crash" and first["attempt"] == 1
    assert first["reason"].startswith("disk full (ENOSPC) writing ")
    again = run_sweep(suite, SweepOptions(out_dir=out, resume=True, retry=("crash",)))
    assert [(r["status"], r["attempt"]) for r in again.records] == [("ok", 2)]
    assert [r["status"] for r in load_records(out).records] == ["ok"]


def test_memory_budget_turns_peak_into_over_budget(tmp_path, write_suite):
    # At batch 2, seq 64 the tiny Llama peaks at about 5.3 MiB without checkpointing and 3.5 MiB with
    # full checkpointing, so a 0.004 GiB (4.19 MiB) budget splits them.
    text = (SIX.replace('timeout_s = 60', 'timeout_s = 60\nmemory_budget_gib = 0.004')
            .replace("batch_size = [1, 2]", "batch_size = [2]").replace("seq_len = [16]", "seq_len = [64]")
            .replace("every_n_layers = [0, 1, 2]", "every_n_layers = [0, 1]"))
    suite = load_suite(write_suite(text))
    run_sweep(suite, SweepOptions(out_dir=str(tmp_path / "run")))
    records = load_records(str(tmp_path / "run")).records
    status = {(r["case"]["batch_size"], r["strategy"]): r["status"] for r in records}
    for r in records:
        over = r["measurement"]["peak_bytes"] > 0.004 * 2**30
        assert r["status"] == ("over_budget" if over else "ok"), r["reason"]
    assert status == {(2, "none"): "over_budget", (2, "full"): "ok"}


def test_resume_skips_finished_cases(tmp_path, write_suite):
    suite = load_suite(write_suite(SIX))
    out = str(tmp_path / "run")
    first = run_sweep(suite, SweepOptions(out_dir=out, shard=(1, 2)))
    assert len(first.records) == 3
    second = run_sweep(suite, SweepOptions(out_dir=out, resume=True))
    assert len(second.records) == 3 and len(second.skipped_ids) == 3
    records = load_records(out).records
    assert sorted(r["case_id"] for r in records) == sorted(c.id for c in suite.cases)
    # each point's timed steps timed every decoder layer's forward in place (measure/layertime.py), and each
    # point recorded after another of its batch and sequence is predicted from it, by the two strategies
    layers = suite.cases[0].model.layers
    seen: dict[tuple[int, int], int] = {}
    for r in records:  # in the order they were recorded
        m = r["measurement"]
        forward = m["layer_times"]["forward_s"]
        assert len(forward) == layers and all(isinstance(t, float) and t > 0 for t in forward), forward
        assert "op_trace" not in m
        shape = (r["case"]["batch_size"], r["case"]["seq_len"])
        seen[shape] = seen.get(shape, 0) + 1
        if seen[shape] > 1:
            assert m["step_time_model"]["method"] == "transformed", m["step_time_model"]


def _default_sigint() -> None:
    # a shell starts background jobs with SIGINT ignored and Python then keeps ignoring it: the sweep
    # under test must get Ctrl-C however pytest itself was started
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _cli(suite_path: str, out: str, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "ckptbench", "sweep", "--suite", suite_path, "--out", out,
                             *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_default_sigint)


def _wait_for_records(path: str, k: int, proc: subprocess.Popen, limit_s: float = 120) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if os.path.exists(path):
            with open(path, "rb") as fh:
                if fh.read().count(b"\n") >= k:
                    return
        if proc.poll() is not None:
            return
        time.sleep(0.02)
    raise AssertionError(f"no {k} records in {limit_s} s")


@pytest.mark.slow
def test_sigkill_then_resume_runs_every_case_exactly_once(tmp_path, write_suite):
    """Killed early (after the first record), then, resumed, killed late (after the fourth): the records
    are valid after each kill, and the last resume runs every Case exactly once."""
    path = write_suite(SIX)
    out = str(tmp_path / "run")
    for k, extra in ((1, ()), (4, ("--resume",))):
        proc = _cli(path, out, *extra)
        _wait_for_records(os.path.join(out, "records.jsonl"), k, proc)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        before = load_records(out)
        assert before.problems == [] and len(before.records) >= k
    resumed = subprocess.run([sys.executable, "-m", "ckptbench", "sweep", "--suite", path, "--out", out,
                              "--resume"], capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    ids = [r["case_id"] for r in load_records(out).records]
    planned = [c.id for c in load_suite(path).cases]
    assert sorted(ids) == sorted(planned)
    assert len(ids) == len(set(ids))


@pytest.mark.slow
def test_ctrl_c_keeps_finished_records_and_says_how_to_resume(tmp_path, write_suite):
    path = write_suite(SIX)
    out = str(tmp_path / "run")
    proc = _cli(path, out)
    _wait_for_records(os.path.join(out, "records.jsonl"), 2, proc)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert "--resume" in err and "Traceback" not in err
    loaded = load_records(out)
    assert loaded.problems == [] and 2 <= len(loaded.records) < 6
    assert all(r["status"] == "ok" for r in loaded.records)


@pytest.mark.slow
def test_sigterm_says_how_many_points_are_done_and_exits_143_with_valid_records(tmp_path, write_suite):
    path = write_suite(SIX)
    out = str(tmp_path / "run")
    proc = _cli(path, out)
    _wait_for_records(os.path.join(out, "records.jsonl"), 2, proc)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    loaded = load_records(out)
    assert proc.returncode == 143, err
    assert err.strip().splitlines()[-1] == f"interrupted by SIGTERM: {len(loaded.records)} points done, resume with --resume"
    assert "Traceback" not in err
    assert loaded.problems == [] and 2 <= len(loaded.records) < 6
    assert all(r["status"] == "ok" for r in loaded.records)  # the point in flight was dropped, not recorded


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_suite_on_a_machine_without_cuda_is_recorded_unsupported(tmp_path, write_suite):
    text = SIX.replace('timeout_s = 60', 'timeout_s = 60\ndevice = "cuda"').replace("batch_size = [1, 2]",
                                                                                  "batch_size = [1]")
    suite = load_suite(write_suite(text))
    run_sweep(suite, SweepOptions(out_dir=str(tmp_path / "run")))
    records = load_records(str(tmp_path / "run")).records
    assert len(records) == 3
    assert all(r["status"] == "unsupported" and "no CUDA device" in r["reason"] for r in records)


@pytest.mark.slow
def test_a_different_suite_may_not_write_into_a_run(tmp_path, write_suite):
    out = str(tmp_path / "run")
    first = load_suite(write_suite(SIX.replace("batch_size = [1, 2]", "batch_size = [1]"), "a.toml"))
    run_sweep(first, SweepOptions(out_dir=out, shard=(1, 3)))
    # other training settings: the recorded point is not one of this suite's points
    other = load_suite(write_suite(SIX.replace("steps = 1", "steps = 2"), "b.toml"))
    with pytest.raises(UsageError, match="points of another suite"):
        run_sweep(other, SweepOptions(out_dir=out, resume=True))
    # a grown suite (one more batch size) keeps every recorded point: it may resume, and is stored
    grown = load_suite(write_suite(SIX, "c.toml"))
    result = run_sweep(grown, SweepOptions(out_dir=out, resume=True))
    assert len(result.skipped_ids) == 1 and len(result.records) == 5
    with open(os.path.join(out, "suite.toml")) as fh:
        assert fh.read() == grown.text


@pytest.mark.slow
def test_shards_started_together_share_one_output(tmp_path, write_suite):
    path = write_suite(SIX)
    out = str(tmp_path / "run")
    procs = [_cli(path, out, "--shard", f"{i}/2") for i in (1, 2)]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    loaded = load_records(out)
    assert loaded.problems == []
    assert sorted(r["case_id"] for r in loaded.records) == sorted(c.id for c in load_suite(path).cases)


def test_running_into_a_results_directory_again_without_resume_is_refused(tmp_path, write_suite):
    path = write_suite(SIX)
    suite = load_suite(path)
    out = str(tmp_path / "run")
    run_sweep(suite, SweepOptions(out_dir=out, shard=(1, 3)))
    before = open(os.path.join(out, "records.jsonl")).read()
    with pytest.raises(UsageError, match="already holds 2 of the 6 points.*--resume"):
        run_sweep(suite, SweepOptions(out_dir=out))
    # nothing was appended; the CLI says the same in one line, exit 2
    assert open(os.path.join(out, "records.jsonl")).read() == before
    proc = subprocess.run([sys.executable, "-m", "ckptbench", "sweep", "--suite", path, "--out", out],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.startswith(f"error: {out} already holds 2 of the 6 points")
    assert len(proc.stderr.splitlines()) == 1


HANGING_DRIVER = """
import sys
from ckptbench.run.faults import Fault
from ckptbench.run.sweep import SweepOptions, run_sweep
from ckptbench.suite.parse import load_suite
suite = load_suite(sys.argv[1])
shard = tuple(int(x) for x in sys.argv[3].split("/")) if len(sys.argv) > 3 else (1, 1)
run_sweep(suite, SweepOptions(out_dir=sys.argv[2], shard=shard, faults={suite.cases[0].id: Fault("hang")}))
"""


def _start_hanging(path: str, out: str, *shard: str) -> subprocess.Popen:
    """A sweep (not the CLI) whose first point hangs, once that point's worker has started."""
    driver = subprocess.Popen([sys.executable, "-c", HANGING_DRIVER, path, out, *shard])
    deadline = time.monotonic() + 60
    while not (os.path.isdir(os.path.join(out, "work")) and any(
            f.endswith(".log") for f in os.listdir(os.path.join(out, "work")))):
        assert time.monotonic() < deadline and driver.poll() is None, "the hanging point never started"
        time.sleep(0.05)
    return driver


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow
def test_sigkill_of_the_sweep_alone_takes_the_fork_server_and_worker_with_it(tmp_path, write_suite):
    """The sweep's main process is killed alone while a worker hangs: nothing of the sweep survives it by
    more than a second (the kernel kills the fork server and the worker; waiting for the fork server to
    notice took seconds on a loaded machine), and a second sweep of the same shard was refused while the
    first ran, naming its pid."""
    from ckptbench.run.launch import descendants

    path = write_suite(SIX)
    out = str(tmp_path / "run")
    driver = _start_hanging(path, out)
    time.sleep(0.5)  # the worker is in its step loop, hanging
    helpers = descendants(driver.pid)
    assert len(helpers) >= 2  # the fork server and the worker (and resource trackers)

    second = subprocess.run([sys.executable, "-m", "ckptbench", "sweep", "--suite", path, "--out", out, "--resume"],
                            capture_output=True, text=True, timeout=60)
    assert second.returncode == 2
    assert second.stderr.startswith(f"error: another sweep (pid {driver.pid}) is running shard 1/1 into {out}")

    driver.send_signal(signal.SIGKILL)
    driver.wait()
    deadline = time.monotonic() + 1.0  # the bound; the kernel's own signal takes ~0.2 s at load 7
    while any(_alive(p) for p in helpers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [p for p in helpers if _alive(p)] == []
    # the kernel dropped the lock with the process: --resume may start at once
    from ckptbench.run.shards import SweepLock

    with SweepLock(out, (1, 1), n_cases=6):
        pass


def test_a_worker_whose_parent_is_gone_ends_after_its_own_timeout(tmp_path):
    """No parent left to enforce the timeout: the worker's own alarm ends it."""
    import multiprocessing

    from ckptbench.point.case import Case, preset
    from ckptbench.point.training import TrainSpec
    from ckptbench.run import worker

    case = Case(model=preset("llama-tiny"), train=TrainSpec(), batch_size=1, seq_len=8)
    proc = multiprocessing.get_context("fork").Process(
        target=worker.child_main,
        args=(case.to_dict(), str(tmp_path / "r.json"), str(tmp_path / "w.log"), 0.0, Fault("hang"), 0.5))
    start = time.monotonic()
    proc.start()
    proc.join(30)
    assert proc.exitcode == -signal.SIGALRM and time.monotonic() - start < 15


@pytest.mark.slow
def test_a_shard_of_another_suite_is_refused_while_a_shard_of_this_one_runs(tmp_path, write_suite):
    """Shards 1/2 and 2/2 share no point, but of two different suites they would mix two experiments in
    one directory (no record is written yet to tell): the second is refused at start, in one line."""
    out = str(tmp_path / "run")
    first = _start_hanging(write_suite(SIX, "a.toml"), out, "1/2")
    try:
        other = write_suite(SIX.replace('name = "six"', 'name = "other"').replace("steps = 1", "steps = 2"), "b.toml")
        proc = subprocess.run([sys.executable, "-m", "ckptbench", "sweep", "--suite", other, "--out", out,
                               "--shard", "2/2"], capture_output=True, text=True, timeout=300)
    finally:
        first.kill()
        first.wait()
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith(f"error: another sweep (pid {first.pid}) is running shard 1/2 of a different "
                                  f"suite (six) into {out}")
    assert len(proc.stderr.splitlines()) == 1
    assert load_records(out).records == []
