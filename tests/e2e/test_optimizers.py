"""Each optimizer measured on CPU against its prediction, to the byte: the simulation of the same step (the
real optimizer on fake tensors) and, for SGD and AdamW, the analytic estimate; the record's verdict; and
8-bit AdamW recorded unsupported where bitsandbytes is missing."""

from __future__ import annotations

import importlib.util

import pytest

from ckptbench.point.case import Case, preset
from ckptbench.point.setup import PRECISIONS, Setup
from ckptbench.point.training import TrainSpec
from ckptbench.run.worker import Unsupported, measure
from ckptbench.theory.memory.simulate import simulate
from ckptbench.theory.verdicts.annotate import annotate_record
from tests.conftest import covering

pytestmark = pytest.mark.e2e

QUANTITIES = ("params_bytes", "optimizer_bytes", "mem_after_forward_bytes", "activations_after_forward_bytes",
              "peak_bytes", "peak_phase", "checkpointed_input_bytes")
CLASSES = {"adamw-loop": "torch.optim.adamw.AdamW", "adamw-foreach": "torch.optim.adamw.AdamW",
           "adamw-fused": "torch.optim.adamw.AdamW",
           "sgd": "torch.optim.sgd.SGD", "adafactor": "transformers.optimization.Adafactor"}


def _case(precision: str, optimizer: str, every_n: int, loop: str = "manual", batch: int = 2, seq: int = 32) -> Case:
    dtype, autocast = PRECISIONS[precision]
    return Case(model=preset("llama-tiny", dtype=dtype, attn="sdpa"), train=TrainSpec(warmup_steps=1, steps=1),
                batch_size=batch, seq_len=seq, every_n_layers=every_n,
                setup=Setup(autocast=autocast, loop=loop, optimizer=optimizer))


def _judged(case: Case, m: dict) -> dict:
    record = {"status": "ok", "measurement": m}
    annotate_record(case, record)
    return record


GRID = [(precision, optimizer, every_n) for precision in ("fp32", "bf16-mixed")
        for optimizer in ("adamw-loop", "adamw-foreach", "adamw-fused", "sgd", "adafactor") for every_n in (0, 1)]


@pytest.mark.parametrize("point", covering(GRID, unpack=False), ids=lambda p: "-".join(map(str, p)))
def test_measured_step_equals_the_predicted_one_to_the_byte(point):
    case = _case(*point)
    m = measure(case)
    sim = simulate(case.model, case.batch_size, case.seq_len, case.every_n_layers, setup=case.setup).to_dict()
    for q in QUANTITIES:
        assert m[q] == sim[q], (q, m[q], sim[q])
    assert m["peak_breakdown"] == sim["peak_breakdown"]
    ran = m["optimizer"]
    assert ran["class"] == CLASSES[case.setup.optimizer]
    if case.setup.optimizer.startswith("adamw"):
        assert ran["implementation"] == case.setup.optimizer.split("-")[1]
        assert ran["settings"]["foreach"] is {"adamw-foreach": True, "adamw-loop": False}.get(case.setup.optimizer)
        assert bool(ran["settings"]["fused"]) is (case.setup.optimizer == "adamw-fused")
    record = _judged(case, m)
    source = "simulation" if case.setup.optimizer in ("adafactor", "adamw-fused") else "analytic"
    assert record["estimate_source"] == source and record["verdict"] == "pass", record["checks"]
    if source == "analytic":
        est = record["estimate"]
        for q in ("optimizer_bytes", "mem_after_forward_bytes", "peak_phase"):
            assert m[q] == est[q], (q, m[q], est[q])
        # exact, the per-parameter AdamW's step included: two copies of the largest tensor beside the
        # denominator of the parameter before it (theory/memory/params.py loop_step)
        assert m["peak_bytes"] == est["peak_bytes"] and m["peak_breakdown"] == est["peak_breakdown"]


@pytest.mark.parametrize("optimizer", covering(["sgd", "adafactor"], keep={0}))
def test_a_trainer_step_with_the_optimizer_trainer_builds(optimizer):
    case = _case("fp32", optimizer, 1, loop="trainer")
    m = measure(case)
    sim = simulate(case.model, case.batch_size, case.seq_len, case.every_n_layers, setup=case.setup).to_dict()
    for q in QUANTITIES:
        assert m[q] == sim[q], (q, m[q], sim[q])
    assert m["peak_breakdown"] == sim["peak_breakdown"]
    assert m["optimizer"]["class"] == CLASSES[optimizer] and m["optimizer"]["param_groups"] == 2
    if optimizer == "sgd":
        assert m["optimizer"]["settings"]["momentum"] == 0.9
    else:
        assert m["optimizer"]["settings"]["relative_step"] is False
    record = _judged(case, m)
    assert record["estimate_source"] == "simulation" and record["verdict"] == "pass", record["checks"]


@pytest.mark.skipif(importlib.util.find_spec("bitsandbytes") is not None, reason="bitsandbytes is installed here")
def test_8bit_adamw_is_unsupported_without_bitsandbytes():
    for loop in ("manual", "trainer"):
        with pytest.raises(Unsupported, match="bitsandbytes is not installed"):
            measure(_case("fp32", "adamw-8bit", 0, loop=loop))


def test_an_unsupported_point_is_recorded_so(tmp_path):
    """Through the worker's entry point, as a sweep runs it: status ``unsupported`` and the reason."""
    if importlib.util.find_spec("bitsandbytes") is not None:
        pytest.skip("bitsandbytes is installed here")
    import json
    from multiprocessing import get_context

    from ckptbench.run.worker import child_main

    result, log = tmp_path / "result.json", tmp_path / "log.txt"
    # child_main redirects its process's output: it runs in a process of its own
    p = get_context("fork").Process(target=child_main,
                                    args=(_case("fp32", "adamw-8bit", 0).to_dict(), str(result), str(log), 0.0))
    p.start()
    p.join(120)
    out = json.loads(result.read_text())
    assert out["status"] == "unsupported" and "bitsandbytes" in out["reason"]
