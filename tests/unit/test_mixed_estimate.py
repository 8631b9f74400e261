"""bf16-mixed (autocast over fp32 weights, the manual loop): the analytic estimate against the simulated step.

The simulation runs the real step under ``torch.autocast("cpu", dtype=torch.bfloat16)`` on fake tensors
with the tracker a CPU measurement uses (``tests/e2e/test_precision_loops.py`` holds it to real runs), so
on a CPU the analytic terms must give its bytes exactly: the peak, the phase it falls in and its parts.
The optimizer step included: when it is the peak (only at a handful of tokens), the final norm's AdamW
denominator (4·h bytes) is alive beside the two copies of the largest tensor and the batch's ids, and the
estimate counts all three.
"""

from __future__ import annotations

import functools
import itertools

import pytest

from ckptbench.point.case import Case, ModelSpec, preset
from ckptbench.point.setup import Setup
from ckptbench.point.training import TrainSpec
from ckptbench.theory.memory import estimate as est_mod
from ckptbench.theory.memory.activations import head_activation_terms, layer_activation_terms
from ckptbench.theory.memory.estimate import estimate
from ckptbench.theory.memory.simulate import simulate
from tests.conftest import covering

MIXED = Setup(autocast="bf16")
SHAPES = [(8, 64), (1, 512)]  # parameter-bound (the loss's N·V) and activation-bound (a layer's moments)


@functools.cache
def simulated(spec: ModelSpec, batch: int, seq: int, every_n: int, offload: bool, device: str):
    return simulate(spec, batch, seq, every_n, offload, device=device, setup=MIXED)


def estimated(spec: ModelSpec, batch: int, seq: int, every_n: int, offload: bool, device: str):
    return estimate(spec, batch, seq, every_n, offload, device=device, autocast="bf16")


def _misses(spec, batch, seq, every_n, offload, device="cpu") -> list[str]:
    sim = simulated(spec, batch, seq, every_n, offload, device)
    est = estimated(spec, batch, seq, every_n, offload, device)
    out = [f"{what} {a - b:+,} B" for what, a, b in (
        ("peak", sim.peak_bytes, est.peak_bytes),
        ("after forward", sim.activations_after_forward_bytes, est.activations_after_forward_bytes),
        ("params", sim.params_bytes, est.params_bytes), ("optimizer", sim.optimizer_bytes, est.optimizer_bytes),
        ("checkpointed inputs", sim.checkpointed_input_bytes, est.checkpointed_input_bytes),
        ("offloaded", sim.offloaded_bytes, est.offloaded_bytes),
        # on a CPU the host is the device: the simulation moves nothing there, the estimate names what save_on_cpu packs
        ("host", sim.host_bytes, est.host_bytes if device == "cuda" else 0),
        *((f"peak {k}", sim.peak_breakdown[k], est.peak_breakdown[k]) for k in est.peak_breakdown)) if a != b]
    if sim.peak_phase != est.peak_phase:
        out.append(f"phase {est.peak_phase} != {sim.peak_phase}")
    return out


@pytest.mark.parametrize("offload, every_n, attn, name", covering(list(itertools.product(
    [False, True], [0, 1, 2], ["eager", "sdpa"], ["llama-tiny", "qwen2-tiny"]))))
def test_bf16_mixed_estimate_is_the_simulated_step_to_the_byte_on_cpu(name, attn, every_n, offload):
    spec = preset(name, attn=attn, max_positions=4096)
    for batch, seq in SHAPES:
        assert _misses(spec, batch, seq, every_n, offload) == [], (batch, seq)


@pytest.mark.parametrize("every_n, name", covering(list(itertools.product([1, 2], ["llama-tiny", "qwen2-tiny"]))))
def test_offload_to_the_host_of_a_cuda_device_is_accounted_to_the_byte(name, every_n):
    """The simulation moves each checkpointed fp32 input to the host between its layer's forward and
    backward, as save_on_cpu does; the estimate's device and host columns must follow it."""
    spec = preset(name, attn="sdpa", max_positions=4096)
    for batch, seq in SHAPES:
        assert _misses(spec, batch, seq, every_n, True, "cuda") == [], (batch, seq)


# dimensions unlike the tiny presets' (kv ≠ h/2, i not a multiple of h), tied and not: every term scales
OTHER = [ModelSpec(family=f, hidden=320, layers=3, heads=10, kv_heads=5, intermediate=600, vocab=1000, attn=a,
                   tie_embeddings=t, max_positions=4096) for f, a, t in
         (("llama", "eager", True), ("qwen2", "sdpa", False), ("qwen2", "eager", True), ("llama", "sdpa", False))]


@pytest.mark.parametrize("spec", covering(OTHER, keep={0}, unpack=False), ids=lambda s: f"{s.family}-{s.attn}-{'tied' if s.tie_embeddings else 'untied'}")
def test_other_dimensions_and_a_tied_head_are_exact_too(spec):
    for batch, seq, every_n in ((2, 300, 0), (1, 1024, 1), (3, 100, 2)):
        assert _misses(spec, batch, seq, every_n, False) == [], (batch, seq, every_n)


def test_the_optimizer_step_is_exact_as_in_the_pure_precisions():
    """The per-parameter AdamW's moment holds the final norm's denominator beside two copies of the head
    (theory/memory/params.py: loop_step): 4·h bytes the estimate once named as a residue."""
    spec = preset("llama-tiny", attn="sdpa")
    sim, est = simulated(spec, 1, 16, 0, False, "cpu"), estimated(spec, 1, 16, 0, False, "cpu")
    assert sim.peak_phase == est.peak_phase == "optimizer"
    assert sim.peak_bytes == est.peak_bytes
    pure = estimate(spec, 1, 16)
    assert pure.peak_phase == "optimizer" and simulate(spec, 1, 16).peak_bytes == pure.peak_bytes


def test_what_stays_fp32_and_what_is_cast():
    spec = preset("llama-tiny", attn="sdpa")
    est, pure = estimate(spec, 2, 32, autocast="bf16"), estimate(spec, 2, 32)
    assert (est.params_bytes, est.grads_bytes, est.optimizer_bytes) == (
        pure.params_bytes, pure.grads_bytes, pure.optimizer_bytes)
    assert est.checkpointed_input_bytes == pure.checkpointed_input_bytes  # the residual stream is fp32
    lt = layer_activation_terms(spec, 2, 32, autocast="bf16")
    assert lt["linear_weights"] == 2 * (2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 128)
    assert lt["linear_inputs"] == 5 * 2 * 64 * 64
    assert head_activation_terms(spec, 2, 32, False, autocast="bf16")["lm_head_weight"] == 2 * 256 * 64
    with pytest.raises(NotImplementedError):
        estimate(preset("gpt2-tiny"), 2, 32, autocast="bf16")
    with pytest.raises(NotImplementedError):
        estimate(preset("llama-tiny"), 2, 32, autocast="fp16")


def test_the_analytic_estimate_is_asked_only_where_it_is_exact():
    def case(name="llama-tiny", setup=MIXED, device="cpu"):
        return Case(model=preset(name), train=TrainSpec(), batch_size=1, seq_len=16, setup=setup, device=device)

    assert case().analytic and case("qwen2-tiny").analytic
    assert est_mod.estimate_case(case()).peak_bytes == estimated(preset("llama-tiny"), 1, 16, 0, False, "cpu").peak_bytes
    assert not case("gpt2-tiny").analytic
    assert not case(setup=Setup(autocast="bf16", loop="trainer")).analytic
    assert not case(setup=Setup(autocast="fp16")).analytic
    assert not case(device="cuda").analytic


def _without(fn, key):
    def dropped(*args, **kwargs):
        return {k: v for k, v in fn(*args, **kwargs).items() if k != key}
    return dropped


MUTATIONS = {
    "the cast cache's weight copies a layer saves": (
        "layer_activation_terms", lambda: _without(est_mod.layer_activation_terms, "linear_weights")),
    "the LM head's cached bf16 weight": (
        "head_activation_terms", lambda: _without(est_mod.head_activation_terms, "lm_head_weight")),
    "the cast cache's copies alive through the forward only": ("mixed_forward_only_bytes", lambda: lambda *a: 0),
    "gradients counted as bf16": (
        "gradient_bytes", lambda: lambda spec, autocast="": 2 if autocast else spec.bytes_per_element),
    "each linear's own input cast": (
        "layer_activation_terms", lambda: _without(est_mod.layer_activation_terms, "linear_inputs")),
}
MUTATION_POINTS = [("llama-tiny", "sdpa", 0, 8, 64), ("llama-tiny", "eager", 1, 8, 64), ("llama-tiny", "sdpa", 1, 8, 64),
                   ("qwen2-tiny", "sdpa", 2, 1, 1024)]


@pytest.mark.parametrize("mutation", list(MUTATIONS))
def test_dropping_a_mixed_precision_term_fails(mutation, monkeypatch):
    name, make = MUTATIONS[mutation]
    monkeypatch.setattr(est_mod, name, make())
    missed = [_misses(preset(n, attn=a, max_positions=4096), b, s, e, False)
              for n, a, e, b, s in MUTATION_POINTS]
    assert any(missed), f"{mutation} went unnoticed"
