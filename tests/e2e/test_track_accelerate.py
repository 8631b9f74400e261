"""ckptbench.track in a script of the shape of accelerate's by_feature examples (gradient accumulation,
LocalSGD under torchrun), with the lines docs/track.md says to add: each micro-batch's ``t.step`` is one
optimizer step until Accelerate says it stepped, a LocalSGD's K is the record's, the output the script keeps
through the backward is named and judged, and the training is the untracked one, bit for bit."""

from __future__ import annotations

import dataclasses
import json
import pathlib
import subprocess
import sys

import pytest
import torch

from ckptbench.point.case import Case
from ckptbench.run.worker import measure
from ckptbench.store.records import load_records
from tests.e2e.test_track import example

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("fresh_accelerate")]

SCRIPTS = pathlib.Path(__file__).resolve().parent / "track_scripts"
SCRIPT = SCRIPTS / "accelerate_by_feature.py"


def by_feature(argv: list[str]):
    script = example("accelerate_by_feature", SCRIPTS)
    return script.training_function(script.arguments(argv))


def test_gradient_accumulation_is_measured_as_the_sweeps_optimizer_step(tmp_path):
    record, _, _ = by_feature(["--gradient_accumulation_steps", "2", "--out", str(tmp_path)])
    case = Case.from_dict(record["case"])
    assert case.grad_accum == 2 and case.setup.loop == "accelerate"
    assert record["status"] == "ok" and record["verdict"] == "pass", record["checks"]
    m, swept = record["measurement"], measure(case)
    # the memory step is the whole optimizer step (two micro-batches, then AdamW: its state measured), as
    # the sweep's Accelerate loop runs it
    assert m["optimizer_bytes"] == swept["optimizer_bytes"] > 0
    assert m["peak_phase"] == swept["peak_phase"] == "backward-layer-3"
    # the script keeps `output` (its logits: batch 2 x seq 64 x vocab 256 fp32) through the backward, and
    # its collated labels are a tensor of their own (2 x 64 int64) where the sweep's point passes one
    held = m["loop_held_output_bytes"]
    assert held == 2 * 64 * 256 * 4
    assert m["mem_after_forward_bytes"] == swept["mem_after_forward_bytes"] + held + 2 * 64 * 8
    assert record["estimate"]["mem_after_forward_bytes"] == swept["mem_after_forward_bytes"] + held
    assert [x["name"] for x in record["track"]["mistakes"]] == ["output-held"]
    assert "131,072 B" in record["estimate_note"]
    # the steps are optimizer steps: 16 micro-batches of 2 rows (32 rows), at most 8 optimizer steps seen
    assert record["track"]["steps_seen"] <= 32 // 2 // 2


def test_an_accumulating_loop_trains_as_it_would_untracked(tmp_path):
    from accelerate.state import AcceleratorState, GradientState

    tracked = by_feature(["--gradient_accumulation_steps", "2", "--out", str(tmp_path)])
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    untracked = by_feature(["--gradient_accumulation_steps", "2"])
    assert tracked[0]["status"] == "ok" and untracked[0] is None
    assert tracked[1] == untracked[1]  # every micro-batch's loss
    assert torch.equal(tracked[2], untracked[2])  # every parameter, bit for bit


def _torchrun(tmp_path: pathlib.Path, name: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", str(SCRIPT),
                           "--local_sgd_steps", "4", "--losses", str(tmp_path / name), *args],
                          capture_output=True, text=True, timeout=300)


def test_local_sgd_under_torchrun_is_recorded_with_its_k_and_trains_as_untracked(tmp_path):
    done = _torchrun(tmp_path, "tracked", "--out", str(tmp_path / "records"))
    assert done.returncode == 0, done.stderr[-3000:]
    # the profiler's and the allocator's C++ lines, which torchrun prefixes with the rank, stay off fd 2
    assert "CPUAllocator" not in done.stderr and "USDT" not in done.stderr, done.stderr[-2000:]
    for rank, record in enumerate(load_records(str(tmp_path / "records")).records):  # both ranks, in order
        assert record["track"]["rank"] == rank
        assert record["case"]["local_sgd_steps"] == 4 and record["strategy"] == "full+K4+accelerate"
        assert record["status"] == "ok" and record["verdict"] == "pass", record["checks"]
        # LocalSGD's steps run under DDP's no_sync: the backward writes no bucket, so the rank is judged as
        # the one-process step of the same setting (with the output the script keeps)
        assert record["measurement"]["ddp_bucket_bytes"] > 0 and "(0 B)" in record["checked_as"]
        judged = {c["quantity"]: c["verdict"] for c in record["checks"]}
        assert judged["peak_bytes"] == judged["mem_after_forward_bytes"] == "pass", record["checks"]
        alone = measure(dataclasses.replace(Case.from_dict(record["case"]), world_size=1, local_sgd_steps=0))
        assert record["measurement"]["peak_phase"] == alone["peak_phase"]
    plain = _torchrun(tmp_path, "untracked")
    assert plain.returncode == 0, plain.stderr[-3000:]
    for rank in (0, 1):
        tracked = json.loads((tmp_path / f"tracked.{rank}").read_text())
        untracked = json.loads((tmp_path / f"untracked.{rank}").read_text())
        assert tracked == untracked  # losses and the parameters' checksum, each rank
