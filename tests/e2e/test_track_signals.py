"""A run signalled while the tracker measures it: what was measured is written (a valid record), and the
signal goes on to the handlers the run had: Python's default ends it, the user's own is called."""

from __future__ import annotations

import pathlib
import signal
import subprocess
import sys

import pytest

from ckptbench.store.records import load_records

pytestmark = pytest.mark.e2e
SCRIPT = pathlib.Path(__file__).parent / "track_scripts" / "interrupted_loop.py"


def _signalled(tmp_path, *flags, signum=signal.SIGTERM):
    proc = subprocess.Popen([sys.executable, str(SCRIPT), "--out", str(tmp_path / "records"), *flags],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    for line in proc.stdout:
        if line.strip() == "MEASURING":
            break
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=120)
    return proc.returncode, out, err, load_records(str(tmp_path / "records"))


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_while_measuring_writes_what_was_measured_and_ends_the_run_as_it_would(tmp_path, signum):
    code, _, err, loaded = _signalled(tmp_path, signum=signum)
    (tmp_path / "untracked").mkdir()
    untracked, _, untracked_err, _ = _signalled(tmp_path / "untracked", "--untracked", signum=signum)
    # the run ends as it does without the tracker: Python's defaults (SIGTERM ends the process; SIGINT raises
    # KeyboardInterrupt, after which CPython ends by SIGINT, or with status 1 in a process that imported
    # torch._dynamo while tabulate is installed: `import torch._dynamo; raise KeyboardInterrupt` exits 1 with
    # tabulate, by SIGINT without; transformers imports torch._dynamo, asv brings tabulate)
    assert code == untracked and code in (-signum, 1)
    if signum == signal.SIGINT:
        assert "KeyboardInterrupt" in untracked_err
    if signum == signal.SIGINT:
        assert "KeyboardInterrupt" in err
    assert loaded.problems == [] and len(loaded.records) == 1
    record = loaded.records[0]
    assert record["track"]["interrupted_by"] == signal.Signals(signum).name
    assert record["status"] == "ok" and record["measurement"]["timed_steps"] >= 1
    assert record["measurement"]["peak_bytes"] > 0


def test_the_users_own_handler_still_runs_and_the_run_ends_its_own_way(tmp_path):
    code, out, _, loaded = _signalled(tmp_path, "--own-handler")
    assert code == 0 and "USER HANDLER" in out and "STOPPED at" in out
    record = loaded.records[0]
    assert record["status"] == "ok" and record["track"]["interrupted_by"] == "SIGTERM"
