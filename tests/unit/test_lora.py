"""LoRA adapters through peft: what is trainable, that the suite's targets reach peft, that checkpointing
still reaches the decoder blocks inside the PeftModel, and that the simulation of a LoRA step counts
gradients and AdamW state for the adapters only, by sizes worked out here from r and the model's dims."""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch

from ckptbench.point.case import Case, preset
from ckptbench.point.setup import Lora, Setup
from ckptbench.point.training import TrainSpec
from ckptbench.theory.memory.simulate import simulate
from ckptbench.train.adapters import adapter_facts, base_parameter_count, with_adapters
from ckptbench.train.checkpointing import decoder_layers, enable_checkpointing
from ckptbench.train.models import build_model, synthetic_batch
from ckptbench.train.support import refusal

warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)

TINY = preset("llama-tiny")


def linear_dims(spec, name: str) -> tuple[int, int]:
    """(in, out) features of a Llama projection, from the spec's dimensions."""
    h, i, q, kv = spec.hidden, spec.intermediate, spec.heads * spec.head_dim, spec.kv_heads * spec.head_dim
    return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
            "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}[name]


def adapter_elements(spec, r: int, targets) -> int:
    """LoRA's A (r × in) and B (out × r) on each target of every layer."""
    return spec.layers * sum(r * sum(linear_dims(spec, t)) for t in targets)


def test_only_the_adapters_require_grad_and_only_they_get_gradients():
    torch.manual_seed(0)
    model = with_adapters(build_model(TINY), Lora(r=8, targets=("q_proj", "o_proj", "down_proj")))
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    expected = adapter_elements(TINY, 8, ("q_proj", "o_proj", "down_proj"))
    facts = adapter_facts(model)
    assert facts["trainable_params"] == facts["adapter_params"] == expected
    assert facts["lora_targets"] == ["down_proj", "o_proj", "q_proj"] and facts["lora_modules"] == 3 * TINY.layers
    # the model's own parameters, the adapters left out: what the unwrapped model has
    assert base_parameter_count(model) == sum(p.numel() for p in build_model(TINY).parameters())
    batch = synthetic_batch(TINY.vocab, 2, 16, 0)
    model(input_ids=batch, labels=batch).loss.backward()
    with_grad = {n for n, p in model.named_parameters() if p.grad is not None}
    assert with_grad == trainable
    assert sum(p.grad.numel() for p in model.parameters() if p.grad is not None) == expected


def test_without_targets_peft_picks_its_defaults_for_the_model_type():
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as DEFAULTS

    facts = adapter_facts(with_adapters(build_model(TINY), Lora(r=4)))
    assert facts["lora_targets"] == sorted(DEFAULTS["llama"])
    assert facts["trainable_params"] == adapter_elements(TINY, 4, DEFAULTS["llama"])


def test_a_target_the_model_lacks_is_peft_s_error():
    with pytest.raises(ValueError, match="not found"):
        with_adapters(build_model(TINY), Lora(targets=("c_attn",)))


def test_checkpointing_reaches_the_blocks_inside_the_peft_model_and_makes_inputs_require_grad():
    model = with_adapters(build_model(TINY), Lora())
    layers = decoder_layers(model)
    assert len(layers) == TINY.layers
    assert enable_checkpointing(model, 2, offload=False) == "activation_checkpointing_enable"
    assert [layer.gradient_checkpointing for layer in layers] == [True, False, True, False]
    # transformers' enable_input_require_grads: the frozen embedding's output requires grad
    batch = synthetic_batch(TINY.vocab, 1, 8, 0)
    assert model.get_input_embeddings()(batch).requires_grad


def test_a_lora_simulation_keeps_gradients_and_adamw_state_for_the_adapters_only():
    """Against full fine-tuning of the same model: params grow by the adapters, AdamW state is two fp32
    moments and a step scalar per adapter tensor instead of per model tensor."""
    spec = preset("llama-tiny", dtype="bf16")
    targets = ("q_proj", "v_proj")
    lora = simulate(spec, 2, 32, 1, setup=Setup(lora=Lora(r=8, targets=targets)))
    full = simulate(spec, 2, 32, 1)
    adapters = adapter_elements(spec, 8, targets)
    n_tensors = 2 * len(targets) * spec.layers
    # peft makes the adapters of a bf16 base in fp32 (autocast_adapter_dtype)
    assert lora.params_bytes - full.params_bytes == 4 * adapters
    assert lora.optimizer_bytes == 2 * 4 * adapters + 4 * n_tensors
    base = list(build_model(spec, "meta").parameters())
    assert full.optimizer_bytes == 2 * 2 * sum(p.numel() for p in base) + 4 * len(base)  # bf16 moments, every tensor
    assert lora.peak_breakdown["grads"] <= 4 * adapters  # whenever the peak is, no gradient but the adapters'


def test_a_deep_model_with_adapters_simulates_at_reduced_depth_as_the_planner_does():
    spec = dataclasses.replace(preset("llama-8b", dtype="bf16", attn="sdpa"), layers=2)
    targets = ("q_proj", "k_proj", "v_proj", "o_proj")
    r = simulate(spec, 1, 64, 1, setup=Setup(lora=Lora(r=16, targets=targets)))
    assert r.optimizer_bytes == 2 * 4 * adapter_elements(spec, 16, targets) + 4 * 2 * len(targets) * spec.layers
    assert r.recomputed_layers == [0, 1]


@pytest.mark.parametrize("installed", [True, False])
def test_qlora_is_refused_with_the_reason(monkeypatch, installed):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: (object() if installed else None) if name == "bitsandbytes" else real(name, *a))
    case = Case(model=TINY, train=TrainSpec(), batch_size=1, seq_len=8, setup=Setup(lora=Lora(quantize="nf4")))
    reason = refusal(case)
    assert "QLoRA (nf4)" in reason
    assert ("not installed" in reason) != installed
    assert refusal(dataclasses.replace(case, setup=Setup(lora=Lora()))) is None
    assert "more than one rank" in refusal(dataclasses.replace(case, setup=Setup(lora=Lora()), world_size=2))
