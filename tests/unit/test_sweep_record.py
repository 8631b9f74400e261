"""A point's record states what its harness cost beside its steps, in parts."""

from __future__ import annotations

import pytest

from ckptbench.point.case import Case, Suite, preset
from ckptbench.point.training import TrainSpec
from ckptbench.run.sweep import harness_parts, make_record


def test_the_harness_ratio_is_split_into_the_wall_over_timed_steps_the_memory_step_and_the_warm_up():
    walls = {"warmup": 0.5, "memory": 0.9, "timed": 3.0}  # 10 timed steps of 0.3 s; the memory step 3x one
    parts = harness_parts(6.0, walls, 10, 1)
    assert parts == {"wall_over_timed": pytest.approx(2.0), "memory_step_over_timed_step": pytest.approx(3.0),
                     "warmup_s": 0.5}
    assert harness_parts(6.0, {"warmup": 0.5, "memory": 0.9, "timed": 0.0}, 0, 1)["wall_over_timed"] is None


def test_a_record_carries_both_the_ratio_and_its_parts():
    case = Case(model=preset("llama-tiny"), train=TrainSpec(), batch_size=1, seq_len=8)
    result = {"status": "ok", "wall_s": 6.0,
              "measurement": {"steps_wall_s": {"warmup": 0.5, "memory": 0.9, "timed": 3.0}, "timed_steps": 10}}
    record = make_record(Suite(name="t", path="", cases=(case,)), case, result, {})
    assert record["harness_ratio"] == pytest.approx(6.0 / 4.4)
    assert record["harness_parts"]["memory_step_over_timed_step"] == pytest.approx(3.0)
