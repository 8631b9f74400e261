"""The pytest plugin: the ``ckptbench_step`` fixture, a CI gate on a training step's memory and time.

Registered through the ``pytest11`` entry point, so installing ckptbench is enough::

    def test_training_memory(ckptbench_step):
        ...  # build the model, optimizer, batch as the training script does
        def step():
            model(input_ids=batch, labels=batch).loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        ckptbench_step(model, optimizer, batch, step, budget="64 MiB", baseline="tests/memory-baseline")

The step runs as a tracked run (warm-up, the memory step, timed steps: :mod:`ckptbench.track.loop`) and its
record is written under the test's own directory.  The test fails when the record is not ``ok``, when the
peak is over `budget`, or when ``compare``'s judgement against the record of the same Case in `baseline`
(a results directory) is a regression: peak or after-forward memory grown beyond `memory_tolerance`, the
step time beyond `time_tolerance` *and* significant by compare's one-sided Welch test.  A Case the
baseline has no record of fails (closed: a changed batch, sequence or config is another Case, never a silent
pass), naming the Case and how to record it; with ``--ckptbench-update-baseline`` the record is written into
`baseline` instead and the test passes, and with ``allow_new=True`` (or ``--ckptbench-allow-new``) a Case
the baseline lacks is recorded there and passes while every Case it has is judged.
"""

from __future__ import annotations

import os
import re

import pytest

from ..point.training import TrainSpec

UNITS = {"": 1, "b": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30, "kb": 10**3, "mb": 10**6, "gb": 10**9}


def parse_bytes(value) -> int:
    """``123``, ``"64 MiB"``, ``"1.5GiB"`` -> bytes."""
    if isinstance(value, int):
        return value
    match = re.fullmatch(r"\s*([0-9.]+)\s*([kmg]i?b|b)?\s*", str(value).lower())
    if not match:
        raise ValueError(f"not a byte count: {value!r} (e.g. 64 MiB)")
    return int(float(match.group(1)) * UNITS[match.group(2) or ""])


class StepGate:
    """The fixture's value: call it with the run's objects and its step (see the module's text)."""

    def __init__(self, out: str, update: bool, name: str, allow_new: bool = False):
        self.out, self.update, self.name, self.allow_new = out, update, name, allow_new
        self.record: dict | None = None
        self.comparison = None

    def __call__(self, model, optimizer, batch, step, *, budget=None, baseline: str | None = None,
                 memory_tolerance: float = 0.02, time_tolerance: float = 0.10,
                 train: TrainSpec | None = None, max_steps: int = 100, allow_new: bool = False) -> dict:
        from . import measure_step

        record = self.record = measure_step(model, optimizer, batch, step, out=self.out, name=self.name,
                                            train=train, max_steps=max_steps)
        if record is None or record["status"] != "ok":
            pytest.fail(f"ckptbench: the step was not measured: {record and record.get('reason')}")
        peak = record["measurement"]["peak_bytes"]
        if budget is not None and peak > parse_bytes(budget):
            pytest.fail(f"ckptbench: peak {peak:,} bytes ({record['measurement'].get('peak_phase')}) is over the "
                        f"budget of {parse_bytes(budget):,} bytes")
        if baseline is not None:
            self._judge(record, baseline, memory_tolerance, time_tolerance, allow_new or self.allow_new)
        return record

    def _judge(self, record: dict, baseline: str, memory_tolerance: float, time_tolerance: float,
               allow_new: bool = False) -> None:
        from ..store.compare import compare_runs
        from ..store.comparison import Thresholds
        from ..store.records import RecordStore, load_records

        old = [r for r in load_records(baseline).records if r["case_id"] == record["case_id"]]
        if not old and not (self.update or allow_new):
            pytest.fail(f"ckptbench: {baseline} has no record of this Case ({record['strategy']} · batch "
                        f"{record['case']['batch_size']} · seq {record['case']['seq_len']}, case {record['case_id']}): "
                        "record it with `pytest --ckptbench-update-baseline` and commit the directory, or pass "
                        "allow_new=True", pytrace=False)
        if self.update or not old:
            store = RecordStore(baseline)
            store.ensure()
            store.append(dict(record))
            return
        thresholds = Thresholds(memory=memory_tolerance, time=time_tolerance)
        comparison = self.comparison = compare_runs(old, [record], thresholds)
        if comparison.failed:
            reasons = "; ".join(r for p in comparison.regressions for r in p.reasons(thresholds))
            pytest.fail(f"ckptbench: {record['strategy']} regressed against {baseline}: {reasons}")


def pytest_addoption(parser) -> None:
    parser.addoption("--ckptbench-update-baseline", action="store_true", default=False,
                     help="ckptbench_step: write each measured step into its baseline instead of judging it")
    parser.addoption("--ckptbench-allow-new", action="store_true", default=False,
                     help="ckptbench_step: a Case its baseline has no record of is recorded there and passes "
                          "(default: it fails)")


@pytest.fixture
def ckptbench_step(request, tmp_path) -> StepGate:
    """Measure a training step inside a test and fail it past a budget or a baseline (:class:`StepGate`)."""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", request.node.nodeid)[-80:]
    update = bool(request.config.getoption("--ckptbench-update-baseline", default=False))
    allow_new = bool(request.config.getoption("--ckptbench-allow-new", default=False))
    return StepGate(os.path.join(str(tmp_path), "ckptbench"), update, name, allow_new)
