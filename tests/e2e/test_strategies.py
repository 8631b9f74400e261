"""Real CPU steps of the strategies beyond every n-th layer, measured and judged as a sweep judges them.

Layer sets: transformers switches checkpointing on, each block's flag is then set as transformers sets it
for every_n_layers; the probes see exactly the set checkpointed and recomputed, and the analytic estimate
(which asks only which layers are checkpointed) equals the measured peak to the byte, as it does for every_n.
"""

from __future__ import annotations

import pytest

from ckptbench.point.case import Case, preset
from ckptbench.point.setup import Setup
from ckptbench.point.strategy import Recompute
from ckptbench.point.training import TrainSpec
from ckptbench.run.worker import measure
from ckptbench.theory.verdicts.annotate import annotate_record
from tests.conftest import covering

pytestmark = pytest.mark.e2e

LLAMA = preset("llama-tiny", attn="eager", max_positions=4096)


def judged(case: Case) -> dict:
    record = {"status": "ok", "measurement": measure(case)}
    annotate_record(case, record)
    return record


# (layers, offload, loop) -> the measured peak, bytes (llama-tiny fp32 eager, batch 1, seq 1024)
LAYER_SET_POINTS = {
    ((0, 1, 3), False, "manual"): 80_891_364,
    ((2,), True, "manual"): 102_133_220,  # offload on a CPU moves nothing: the bytes are counted
    ((1, 3), False, "trainer"): 102_141_424,  # Trainer switches every block on; its on_train_begin keeps the set
}


@pytest.mark.slow
@pytest.mark.parametrize("point", list(LAYER_SET_POINTS), ids=lambda p: f"{p[0]}-{'offload' if p[1] else ''}-{p[2]}")
def test_a_layer_set_is_checkpointed_as_asked_and_estimated_exactly(point):
    layers, offload, loop = point
    case = Case(model=LLAMA, train=TrainSpec(warmup_steps=1, steps=1), batch_size=1, seq_len=1024,
                offload=offload, recompute=Recompute(layers=layers), setup=Setup(loop=loop))
    record = judged(case)
    m, est = record["measurement"], record["estimate"]
    assert m["checkpointed_layers"] == m["recomputed_layers"] == list(layers)
    assert m["checkpointed_input_bytes"] == len(layers) * 1024 * 64 * 4
    assert m["offloaded_bytes"] == (len(layers) * 1024 * 64 * 4 if offload else 0)
    assert m["peak_bytes"] == est["peak_bytes"] == LAYER_SET_POINTS[point]
    assert m["peak_phase"] == est["peak_phase"]
    assert record["verdict"] == "pass" and record["meters"]["agreement"] == "agree"
    assert not [c for c in record["checks"] if c["verdict"] == "fail"]


# SAC: (attention, policy, loop) -> the measured peak, bytes (llama-tiny fp32, every layer, batch 1, seq 512).
# The simulated step is the estimate and equals the measurement to the byte; the FLOPs the step ran again
# (torch's counter, ops run under grad in backward) equal the simulation's count.
SAC_POINTS = {
    ("sdpa", "save-nothing", "manual"): 5_681_892,  # = full checkpointing's peak
    ("sdpa", "save-matmuls", "manual"): 9_487_332,
    ("sdpa", "save-attention", "manual"): 6_048_996,
    ("eager", "save-attention", "manual"): 30_344_676,  # eager's kept batched matmuls hold the s² scores
    ("sdpa", "save-matmuls", "trainer"): 9_491_440,  # the policy through TrainingArguments' checkpoint kwargs
}


@pytest.mark.parametrize("point", covering(list(SAC_POINTS), unpack=False), ids="-".join)
def test_a_sac_policy_measured_equals_its_simulated_step(point):
    attn, sac, loop = point
    case = Case(model=preset("llama-tiny", attn=attn), train=TrainSpec(warmup_steps=1, steps=1), batch_size=1,
                seq_len=512, every_n_layers=1, recompute=Recompute(sac=sac), setup=Setup(loop=loop))
    record = judged(case)
    m, sim = record["measurement"], record["measurement"]["simulation"]
    assert record["estimate_source"] == "simulation"
    assert m["peak_bytes"] == sim["peak_bytes"] == SAC_POINTS[point]
    assert (m["peak_phase"], m["peak_breakdown"]) == (sim["peak_phase"], sim["peak_breakdown"])
    assert m["mem_after_forward_bytes"] == sim["mem_after_forward_bytes"]
    assert m["counted_flops"] == {**sim["counted_flops"], "optimizer": m["counted_flops"]["optimizer"]}
    assert m["counted_flops"]["recompute"] == m["recompute_flops_per_step"]  # the policy's formula too
    assert m["checkpointed_layers"] == m["recomputed_layers"] == [0, 1, 2, 3]
    assert record["verdict"] == "pass" and record["meters"]["agreement"] == "agree"
    by = {c["quantity"]: c["verdict"] for c in record["checks"]}
    assert by["recompute_flops"] == by["hardware_flops"] == by["peak_bytes"] == "pass"
