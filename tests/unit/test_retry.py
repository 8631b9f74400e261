"""``--resume --retry STATUSES``: failures that may be the machine's (a full disk, a kill, a loaded machine's
timeout) run again, each record counting its ``attempt``, up to ``--max-attempts``."""

from __future__ import annotations

import errno
import multiprocessing
import os

import pytest

from ckptbench.cli import main
from ckptbench.point.case import Case, preset
from ckptbench.point.training import TrainSpec
from ckptbench.run.sweep import next_attempts, pending
from ckptbench.store.records import load_records

CASES = [Case(model=preset("llama-tiny"), train=TrainSpec(), batch_size=b, seq_len=8) for b in range(1, 6)]
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


def _line(case: Case, status: str, attempt: int | None = None) -> dict:
    r = {"case_id": case.id, "repeat": 0, "status": status}
    if attempt is not None:
        r["attempt"] = attempt
    return r


RECORDED = [_line(CASES[0], "crash", 1), _line(CASES[1], "timeout", 3), _line(CASES[2], "ok", 1),
            _line(CASES[3], "oom"), _line(CASES[4], "skipped", 2)]


def test_resume_reruns_the_retried_statuses_under_the_cap():
    todo, passed = pending(CASES, RECORDED, resume=True, retry=("crash", "timeout"), max_attempts=3)
    # a crash on its first attempt runs again; a timeout that had its 3 runs does not; oom was not asked for
    assert [c for c, _ in todo] == [CASES[0], CASES[4]]
    assert passed == [CASES[1].id, CASES[2].id, CASES[3].id]
    assert [c for c, _ in pending(CASES, RECORDED, resume=True)[0]] == [CASES[4]]  # no --retry: skipped only
    assert len(pending(CASES, RECORDED, resume=True, retry=("timeout",), max_attempts=4)[0]) == 2


def test_the_last_line_of_a_point_decides():
    later_ok = [*RECORDED, _line(CASES[0], "ok", 2)]
    assert [c for c, _ in pending(CASES, later_ok, resume=True, retry=("crash",))[0]] == [CASES[4]]


def test_attempts_count_runs_not_skips():
    attempts = next_attempts(RECORDED)
    assert attempts[(CASES[0].id, 0)] == 2 and attempts[(CASES[1].id, 0)] == 4
    assert attempts[(CASES[3].id, 0)] == 2  # a record from before attempts were counted was the first
    assert attempts[(CASES[4].id, 0)] == 2  # skipped: the run it stood for has not happened yet


class _CrashingRunner:
    def kill_current(self) -> None:
        pass

    def run(self, case, *args, **kwargs) -> dict:
        return {"status": "crash", "reason": "worker killed by signal SIGKILL", "wall_s": 0.0}


@pytest.fixture
def quick_sweep(tmp_path, monkeypatch):
    from ckptbench.run import calibration, sweep

    monkeypatch.setattr(sweep, "IsolatedRunner", _CrashingRunner)
    monkeypatch.setattr(calibration, "machine_rates", lambda cases, forked=False: (None, "not measured in this test"))
    monkeypatch.setattr(sweep, "take_readings", lambda *args, **kwargs: [])  # no calibration kernel either
    suite = tmp_path / "suite.toml"
    suite.write_text(SUITE)
    out = str(tmp_path / "run")
    return lambda *extra: main(["sweep", "--suite", str(suite), "--out", out, *extra]), out


def test_retry_runs_crashed_points_again_until_the_cap(quick_sweep):
    run, out = quick_sweep
    assert run() == 0
    assert run("--resume") == 0  # crashes are results: nothing runs again unless asked
    assert [r["attempt"] for r in load_records(out).records] == [1, 1, 1]
    assert run("--resume", "--retry", "crash,timeout", "--max-attempts", "3") == 0
    assert run("--resume", "--retry", "crash", "--max-attempts", "3") == 0
    assert [r["attempt"] for r in load_records(out).records] == [3, 3, 3]
    assert run("--resume", "--retry", "crash", "--max-attempts", "3") == 0  # each has had its 3 runs
    with open(os.path.join(out, "records.jsonl")) as fh:
        assert len(fh.readlines()) == 9


@pytest.mark.parametrize("flags, message", [
    (["--resume", "--retry", "ok"], "--retry takes statuses among crash,timeout,oom"),
    (["--resume", "--retry", "crash", "--max-attempts", "0"], "must be >= 1"),
    (["--retry", "crash"], "error: --retry reruns recorded points: it goes with --resume"),
])
def test_bad_retry_flags_are_one_line_exit_2(quick_sweep, capsys, flags, message):
    run, _ = quick_sweep
    try:
        code = run(*flags)
    except SystemExit as exc:  # argparse's own one-line error
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def _child(result_path: str, log_path: str) -> None:
    from ckptbench.run import worker

    worker.measure = lambda *args: {}
    worker.write_json_atomic = _full_disk
    worker.child_main(CASES[0].to_dict(), result_path, log_path, 0.0)


def _full_disk(*args):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_worker_that_cannot_write_its_result_on_a_full_disk_says_so_by_its_exit_status(tmp_path):
    from ckptbench.base.errors import WORKER_DISK_FULL_EXIT

    proc = multiprocessing.get_context("fork").Process(
        target=_child, args=(str(tmp_path / "r.json"), str(tmp_path / "w.log")))
    proc.start()
    proc.join(120)
    assert proc.exitcode == WORKER_DISK_FULL_EXIT
