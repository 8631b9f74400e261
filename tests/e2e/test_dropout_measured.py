"""A model measured with its published dropout: the record says what ran, and the simulation of the same
step (which saves the masks the real step saves) is its estimate, to the byte on CPU."""

from __future__ import annotations

import pytest

from ckptbench.point.case import Case, ModelSpec, canonical_config
from ckptbench.point.training import TrainSpec
from ckptbench.run.worker import measure
from ckptbench.theory.verdicts.annotate import annotate_record

pytestmark = pytest.mark.e2e

STARCODER2 = {"attention_dropout": 0.1, "residual_dropout": 0.1, "embedding_dropout": 0.1}


def _case(dropout: str) -> Case:
    spec = ModelSpec(family="starcoder2", hidden=64, layers=2, heads=4, kv_heads=2, intermediate=128, vocab=256,
                     max_positions=256, attn="sdpa", config=canonical_config(STARCODER2), dropout=dropout)
    return Case(model=spec, train=TrainSpec(warmup_steps=1, steps=1), batch_size=2, seq_len=64)


def test_starcoder2_keeps_its_dropout_and_its_simulation_matches_the_measurement():
    case = _case("published")
    record = {"status": "ok", "measurement": measure(case)}
    annotate_record(case, record)
    m = record["measurement"]
    assert m["dropout"] == STARCODER2
    assert record["estimate_source"] == "simulation" and record["verdict"] == "pass"
    assert m["peak_bytes"] == record["estimate"]["peak_bytes"] == 3_308_248
    by = {c["quantity"]: c for c in record["checks"]}
    assert by["config"]["verdict"] == "pass"
    # the masks are real: the same model with dropout off keeps less (and sdpa's fused kernel runs again)
    off = measure(_case("off"))
    assert set(off["dropout"].values()) == {0.0}
    assert off["peak_bytes"] == 2_296_536
    assert off["saved_bytes"] < m["saved_bytes"]
