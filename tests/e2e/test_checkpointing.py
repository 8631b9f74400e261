"""Real tiny models: checkpointing does exactly what transformers says, and we measure it exactly.

Tiny Llama, fp32, batch 2, seq 128, hidden 64, 4 layers: one layer input is 2 x 128 x 64 x 4 bytes =
65,536 bytes, so full checkpointing keeps 4 x 65,536 = 262,144 bytes of checkpointed inputs.
"""

from __future__ import annotations

import pytest

from ckptbench.point.case import Case, preset
from ckptbench.point.training import TrainSpec
from ckptbench.run.worker import measure

pytestmark = pytest.mark.e2e

LAYER_INPUT = 2 * 128 * 64 * 4


def run(every_n: int, offload: bool = False, family: str = "llama"):
    case = Case(model=preset(f"{family}-tiny"), train=TrainSpec(steps=1), batch_size=2, seq_len=128,
                every_n_layers=every_n, offload=offload)
    return measure(case)


@pytest.fixture(scope="module")
def llama():
    return {(n, off): run(n, off) for n, off in [(0, False), (2, False), (1, False), (2, True), (1, True)]}


def test_full_checkpointing_keeps_exactly_the_layer_inputs(llama):
    m = llama[(1, False)]
    assert m["checkpointed_input_bytes"] == 4 * LAYER_INPUT == 262_144
    assert m["recomputed_layers"] == [0, 1, 2, 3]
    assert m["offloaded_bytes"] == 0


def test_every_second_layer_keeps_half(llama):
    m = llama[(2, False)]
    assert m["checkpointed_input_bytes"] == 2 * LAYER_INPUT
    assert m["recomputed_layers"] == [0, 2]


def test_no_checkpointing_recomputes_nothing(llama):
    m = llama[(0, False)]
    assert m["checkpointed_input_bytes"] == 0
    assert m["recomputed_layers"] == []
    assert m["saved_by_hook"]["checkpoint"] == 0


def test_offload_moves_exactly_the_checkpointed_inputs(llama):
    for n, layers in [(1, 4), (2, 2)]:
        m = llama[(n, True)]
        assert m["offloaded_bytes"] == layers * LAYER_INPUT
        assert m["checkpointed_input_bytes"] == layers * LAYER_INPUT
        assert m["recomputed_layers"] == list(range(0, 4, n))
        # this CPU-only torch has no pinned allocator: the record says so instead of crashing
        assert m["offload_pinned"] is False
        assert "pin_memory" in m["offload_note"]


def test_memory_after_forward_strictly_decreases(llama):
    none, every2, full = (llama[(n, False)]["mem_after_forward_bytes"] for n in (0, 2, 1))
    assert none > every2 > full


def test_breakdown_adds_up(llama):
    for m in llama.values():
        assert sum(m["peak_breakdown"].values()) == m["peak_bytes"]
        assert m["peak_breakdown"]["params"] == m["params_bytes"]
        # AdamW keeps two fp32 moments per parameter plus one fp32 scalar `step` per parameter tensor:
        # tiny Llama has 39 tensors (embed, 4 x 9 per layer, final norm, lm_head).
        assert m["optimizer_bytes"] == 2 * 4 * m["n_params"] + 39 * 4


@pytest.mark.parametrize("family", ["qwen2", "gpt2"])
def test_other_families(family):
    full = run(1, family=family)
    none = run(0, family=family)
    assert full["checkpointed_input_bytes"] == 4 * LAYER_INPUT
    assert full["recomputed_layers"] == [0, 1, 2, 3]
    assert none["mem_after_forward_bytes"] > full["mem_after_forward_bytes"]


def test_gradient_accumulation_counts_the_first_micro_batch():
    # grad_accum 2: the memory step runs two forwards; the counted one keeps exactly 4 layer inputs
    case = Case(model=preset("llama-tiny"), train=TrainSpec(steps=1), batch_size=2, seq_len=128,
                every_n_layers=1, grad_accum=2)
    m = measure(case)
    assert m["checkpointed_input_bytes"] == 4 * LAYER_INPUT
    assert m["recomputed_layers"] == [0, 1, 2, 3]


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_checkpointed_layers_are_observed_not_assumed(dtype):
    """transformers checkpoints other layers than the Case says: the probes report what really ran.

    The Case asks for every layer (0-3), the model is set to every second one (0, 2).  In fp32 a layer
    that is not checkpointed keeps its input anyway (RMSNorm saves it), so counting the *expected*
    layers' inputs would have found all four and agreed with the estimate; what torch's checkpoint
    packed says 0 and 2, and the checks fail as they must.
    """
    import torch

    from ckptbench.run.worker import _memory_step
    from ckptbench.theory.verdicts.checks import check
    from ckptbench.train.checkpointing import decoder_layers, enable_checkpointing
    from ckptbench.train.models import build_model, synthetic_batch

    spec = preset("llama-tiny", dtype=dtype)
    case = Case(model=spec, train=TrainSpec(steps=1), batch_size=2, seq_len=128, every_n_layers=1)
    torch.manual_seed(0)
    model = build_model(spec)
    enable_checkpointing(model, 2, offload=False)  # not what the Case says
    optimizer = torch.optim.AdamW(model.parameters())
    batch = synthetic_batch(spec.vocab, 2, 128, seed=0)
    m = _memory_step(case, model, optimizer, batch, decoder_layers(model))
    layer_input = 2 * 128 * 64 * spec.bytes_per_element
    assert m["checkpointed_layers"] == [0, 2] and m["recomputed_layers"] == [0, 2]
    assert m["checkpointed_input_bytes"] == 2 * layer_input
    by = {c.quantity: c for c in check(case, m)}
    assert by["checkpointed_layers"].verdict == "fail" and by["checkpointed_layers"].difference == [1, 3]
    assert by["checkpointed_input_bytes"].verdict == "fail"
    assert by["checkpointed_input_bytes"].estimated == 4 * layer_input
