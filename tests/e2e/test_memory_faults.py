"""Memory faults are named as such only where a mechanism stopped the worker: an allocation refused by the
limit a worker sets at --memory-gib, a worker the sweep stops past that cap, and a point too big to start.
A SIGKILL near the cap, with nothing behind it, is a crash.  The faults are injected (a worker that really
allocates the bytes), never provoked by exhausting the machine."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ckptbench.run.faults import Fault
from ckptbench.run.hostmem import human_bytes
from ckptbench.run.sweep import SweepOptions, run_sweep
from ckptbench.store.records import load_records
from ckptbench.suite.parse import load_suite
from ckptbench.theory.memory.estimate import estimate_case

from .test_sweep import SIX

pytestmark = pytest.mark.e2e

GIB = 2**30
CAP = int(1.5 * GIB)  # above a forked worker's own ~0.5 GiB (torch and transformers loaded), far below the machine

FOUR = SIX.replace("every_n_layers = [0, 1, 2]", "every_n_layers = [0, 1]")  # 4 tiny points


def _records(out) -> dict:
    return {r["case_id"]: r for r in load_records(str(out)).records}


def test_workers_killed_or_stopped_at_the_memory_limit_are_oom_with_figures(tmp_path, write_suite):
    suite = load_suite(write_suite(FOUR))
    ids = [c.id for c in suite.cases]
    faults = {ids[0]: Fault("alloc", nbytes=int(1.2 * CAP)),  # a tensor past the cap: the worker's limit refuses it
              ids[1]: Fault("hog", nbytes=int(1.2 * CAP)),  # holds more than the cap (shared): the sweep stops it
              ids[2]: Fault("hog-kill", nbytes=int(0.95 * CAP))}  # SIGKILL near the cap, by no mechanism: a crash
    run_sweep(suite, SweepOptions(out_dir=str(tmp_path / "run"), memory_cap=CAP, faults=faults))
    by_id = _records(tmp_path / "run")

    refused = by_id[ids[0]]
    assert refused["status"] == "oom", refused["reason"]
    assert refused["reason"].startswith("RuntimeError: ") and "can't allocate memory" in refused["reason"]
    assert refused["reason"].endswith("(private memory limited to the --memory-gib cap of 1.50 GiB)")

    stopped = by_id[ids[1]]
    assert stopped["status"] == "oom" and stopped["reason"].startswith("stopped by the sweep: the worker held ")
    seen = stopped["host_memory"]
    assert seen["worker_peak_rss_bytes"] > CAP and seen["memory_cap_bytes"] == CAP
    assert seen["samples"] >= 1 and seen["machine_bytes"] > CAP and seen["last_available_bytes"] > 0

    near = by_id[ids[2]]
    assert near["status"] == "crash" and near["reason"] == "worker killed by signal SIGKILL"
    assert 0.95 * CAP <= near["host_memory"]["worker_peak_rss_bytes"] < CAP

    assert by_id[ids[3]]["status"] == "ok"  # and the sweep went on


def test_a_point_estimated_above_the_available_memory_is_skipped_without_starting(tmp_path, write_suite):
    # Llama-3-8B in fp32 with AdamW needs more than 120 GiB for its weights, gradients and moments alone
    text = FOUR.replace('preset = "llama-tiny"', 'preset = "llama-8b"').replace("batch_size = [1, 2]", "batch_size = [1]")
    suite = load_suite(write_suite(text))
    run_sweep(suite, SweepOptions(out_dir=str(tmp_path / "run")))
    for case in suite.cases:
        record = _records(tmp_path / "run")[case.id]
        assert record["status"] == "skipped"
        need = human_bytes(estimate_case(case).peak_bytes)
        assert record["reason"].startswith(f"estimated {need} > available ")
        assert record["reason"].endswith("(available RAM); --force runs it anyway")
        assert not os.path.exists(tmp_path / "run" / "work" / f"{case.id}.log")  # no worker was started


def test_force_starts_a_point_the_memory_cap_would_not(tmp_path, write_suite):
    suite = load_suite(write_suite(FOUR.replace("batch_size = [1, 2]", "batch_size = [1]")
                                   .replace("every_n_layers = [0, 1]", "every_n_layers = [0]")))
    case = suite.cases[0]
    cap = 2**20  # 1 MiB: below the tiny point's estimate and far below any worker
    run_sweep(suite, SweepOptions(out_dir=str(tmp_path / "a"), memory_cap=cap))
    skipped = _records(tmp_path / "a")[case.id]
    assert skipped["status"] == "skipped"
    # the point's tensors and, against a --memory cap, the worker's own resident baseline
    assert skipped["reason"].startswith(f"estimated {human_bytes(estimate_case(case).peak_bytes)} + ")
    assert skipped["reason"].endswith("worker baseline (interpreter, torch, transformers) > available 1.0 MiB "
                                      "(--memory cap); --force runs it anyway")
    run_sweep(suite, SweepOptions(out_dir=str(tmp_path / "b"), memory_cap=cap, force=True))
    forced = _records(tmp_path / "b")[case.id]
    assert forced["status"] == "oom" and forced["reason"].startswith("stopped by the sweep")  # it did start


def test_dry_run_counts_points_above_the_memory_cap(write_suite):
    proc = subprocess.run([sys.executable, "-m", "ckptbench", "sweep", "--suite", write_suite(FOUR), "--dry-run",
                           "--memory-gib", "0.001"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0
    last = proc.stdout.splitlines()[-1]
    assert last.startswith("memory: 4 points estimated above the memory available now would be recorded skipped")
    assert "> available 1.0 MiB (--memory cap)" in last
