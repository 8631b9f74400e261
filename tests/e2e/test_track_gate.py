"""The CI gate: the ``ckptbench_step`` fixture (pytest plugin) fails a test on a peak over its budget or on
memory grown past a stored baseline, and passes an unchanged step."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

from ckptbench.point.case import preset
from ckptbench.point.training import Timing, TrainSpec
from ckptbench.store.records import load_records
from ckptbench.track.plugin import StepGate, parse_bytes
from ckptbench.train.models import build_model, synthetic_batch

pytestmark = pytest.mark.e2e

FEW = TrainSpec(warmup_steps=1, steps=3, timing=Timing(max_steps=3))  # enough for these judgements


def run(gate: StepGate, leak: list | None = None, **judge) -> dict:
    torch.manual_seed(0)
    model = build_model(preset("llama-tiny"))
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch = synthetic_batch(256, 2, 32, 0)

    def step():
        loss = model(input_ids=batch, labels=batch).loss
        if leak is not None:  # a change that keeps 1 MiB more alive through the step
            leak.append(torch.empty(2**18))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if leak:
            leak.clear()

    return gate(model, optimizer, batch, step, train=FEW, **judge)


def test_parse_bytes():
    assert parse_bytes("64 MiB") == 64 * 2**20 and parse_bytes("1.5GiB") == 3 * 2**29 and parse_bytes(123) == 123


def test_a_peak_over_budget_fails_and_one_within_passes(tmp_path):
    record = run(StepGate(str(tmp_path / "a"), False, "t"), budget="64 MiB")
    peak = record["measurement"]["peak_bytes"]
    with pytest.raises(pytest.fail.Exception, match="over the budget"):
        run(StepGate(str(tmp_path / "b"), False, "t"), budget=peak - 1)


def test_memory_grown_past_the_baseline_fails(tmp_path):
    baseline = str(tmp_path / "baseline")
    # no record of the Case yet: the gate fails closed, naming the Case and how to record it
    with pytest.raises(pytest.fail.Exception, match="has no record of this Case .* --ckptbench-update-baseline"):
        run(StepGate(str(tmp_path / "0"), False, "t"), baseline=baseline)
    assert load_records(baseline).records == []
    first = run(StepGate(str(tmp_path / "1"), True, "t"), baseline=baseline)  # --ckptbench-update-baseline
    assert load_records(baseline).records[0]["case_id"] == first["case_id"]
    # the same step again: equal memory; time is not judged here (a test never asserts on the wall clock)
    gate = StepGate(str(tmp_path / "2"), False, "t")
    run(gate, baseline=baseline, time_tolerance=1e9)
    assert not gate.comparison.failed
    with pytest.raises(pytest.fail.Exception, match="regressed against"):
        run(StepGate(str(tmp_path / "3"), False, "t"), leak=[], baseline=baseline, time_tolerance=1e9)


def test_a_new_case_is_recorded_and_passes_only_when_allowed(tmp_path):
    baseline = str(tmp_path / "baseline")
    record = run(StepGate(str(tmp_path / "1"), False, "t"), baseline=baseline, allow_new=True)
    assert [r["case_id"] for r in load_records(baseline).records] == [record["case_id"]]


def test_the_fixture_is_a_pytest_plugin(tmp_path):
    (tmp_path / "test_mine.py").write_text(textwrap.dedent("""
        import torch
        from ckptbench.point.case import preset
        from ckptbench.train.models import build_model, synthetic_batch

        def test_step(ckptbench_step):
            model = build_model(preset("llama-tiny"))
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
            batch = synthetic_batch(256, 1, 16, 0)
            def step():
                model(input_ids=batch, labels=batch).loss.backward()
                optimizer.step()
                optimizer.zero_grad()
            record = ckptbench_step(model, optimizer, batch, step, budget="1 KiB")
    """))
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                           str(tmp_path / "test_mine.py")], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert done.returncode == 1 and "over the budget of 1,024 bytes" in done.stdout, done.stdout[-2000:]
