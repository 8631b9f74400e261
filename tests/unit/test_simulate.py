"""The fake-tensor simulation: exact agreement with the analytic model where that model is exact."""

from __future__ import annotations

import pytest

from ckptbench.point.case import Case, preset
from ckptbench.point.training import TrainSpec
from ckptbench.theory.memory.estimate import estimate
from ckptbench.theory.memory.simulate import simulate
from ckptbench.theory.verdicts.checks import check


@pytest.mark.parametrize("name,dtype,attn", [("llama-tiny", "fp32", "eager"), ("qwen2-tiny", "bf16", "sdpa"),
                                             ("gpt2-tiny", "bf16", "eager")])
@pytest.mark.parametrize("every", [0, 2, 1])
def test_simulated_step_matches_analytic(name, dtype, attn, every):
    spec = preset(name, dtype=dtype, attn=attn)
    sim = simulate(spec, 2, 128, every)
    e = estimate(spec, 2, 128, every)
    assert sim.params_bytes == e.params_bytes
    assert sim.optimizer_bytes == e.optimizer_bytes
    assert sim.activations_after_forward_bytes == e.activations_after_forward_bytes
    assert sim.checkpointed_input_bytes == e.checkpointed_input_bytes
    assert sim.recomputed_layers == list(e.checkpointed_layers)
    case = Case(model=spec, train=TrainSpec(), batch_size=2, seq_len=128, every_n_layers=every)
    verdicts = {c.quantity: c.verdict for c in check(case, sim.to_dict(), e)}
    assert verdicts["peak_bytes"] == "pass"
    assert verdicts["saved_bytes"] == "skip"


def test_simulated_offload_is_phase_aware():
    spec = preset("llama-tiny")
    plain = simulate(spec, 2, 128, 1)
    cpu = simulate(spec, 2, 128, 1, offload=True)  # on a CPU the host is the device: nothing moves
    assert cpu.offloaded_bytes == plain.checkpointed_input_bytes == 262144 and cpu.host_bytes == 0
    assert cpu.peak_bytes == plain.peak_bytes
    cuda = simulate(spec, 2, 128, 1, offload=True, device="cuda")
    assert cuda.host_bytes == 262144
    assert plain.mem_after_forward_bytes - cuda.mem_after_forward_bytes == 262144
    # inside backward the inputs of the layers not yet reached are still on the host, the one being
    # recomputed is back: the peak moves (top layer -> first layer here) and drops by what is away then
    long_plain = simulate(spec, 1, 1024, 1)
    long_cuda = simulate(spec, 1, 1024, 1, offload=True, device="cuda")
    assert (long_plain.peak_phase, long_cuda.peak_phase) == ("backward-layer-3", "backward-layer-0")
    assert 0 < long_cuda.peak_breakdown["activations"] < long_plain.peak_breakdown["activations"]
    for sim, offload in ((long_plain, False), (long_cuda, True)):
        est = estimate(spec, 1, 1024, 1, offload=offload, device="cuda" if offload else "cpu")
        assert (est.peak_phase, est.peak_bytes) == (sim.peak_phase, sim.peak_bytes)


@pytest.mark.slow
def test_llama_8b_shape_full_checkpointing_bf16():
    """hidden 4096, 32 layers, bf16, b=1, s=2048, every layer: a few seconds on 2 CPU cores."""
    spec = preset("llama-8b", dtype="bf16")
    sim = simulate(spec, 1, 2048, 1)
    e = estimate(spec, 1, 2048, 1, device="cpu")
    assert sim.params_bytes == e.params_bytes == 16_060_523_008
    assert sim.checkpointed_input_bytes == 32 * 2048 * 4096 * 2
    assert sim.mem_after_forward_bytes == e.mem_after_forward_bytes
    assert sim.peak_breakdown["grads"] == e.grads_bytes  # the peak is the optimizer step


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("width", [64, 6])  # 6: rows padded to 16 bytes (its backward the real kernel refuses)
def test_grouped_matmul_on_fake_tensors_gives_what_the_cpu_kernel_gives(dtype, width):
    """Mixture-of-experts layers multiply their experts with grouped_mm; fp32 ones were not simulated."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from ckptbench.theory.memory.simulate import _grouped_mm_as_the_cpu_kernel

    dt = getattr(torch, dtype)

    def run():
        a = torch.randn(12, 16, dtype=dt, requires_grad=True)
        b = torch.randn(3, width, 16, dtype=dt).transpose(-2, -1).requires_grad_()
        out = torch.nn.functional.grouped_mm(a, b, offs=torch.tensor([4, 8, 12], dtype=torch.int32))
        if width % 16 == 0:
            out.backward(torch.ones_like(out))
        return [(t.shape, t.stride(), t.dtype, t.untyped_storage().nbytes())
                for t in (out, a.grad, b.grad) if t is not None]

    real = run()
    with FakeTensorMode(), _grouped_mm_as_the_cpu_kernel():
        fake = run()
    assert fake == real


def test_an_fp32_mixture_of_experts_step_is_simulated():
    from ckptbench.point.case import ModelSpec, canonical_config

    experts = canonical_config({"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32})
    spec = ModelSpec(family="qwen3_moe", hidden=64, layers=2, heads=4, kv_heads=2, intermediate=96, vocab=128,
                     max_positions=64, dtype="fp32", config=experts)
    sim = simulate(spec, 2, 16, 1)  # its grouped matmul had a bf16-only fake kernel; to the byte: test_any_model
    assert sim.recomputed_layers == [0, 1] and sim.peak_bytes > sim.params_bytes + sim.optimizer_bytes > 0


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_an_attention_mask_is_simulated_as_transformers_uses_it(attn):
    """A mask of all ones is a batch tensor the model skips; one that pads makes sdpa build its 4-D boolean
    mask (b·s·s bytes, held from the forward on); eager builds its causal mask either way."""
    spec = preset("llama-tiny", attn=attn)
    plain, ones, padding = (simulate(spec, 2, 64, 1, padded=p) for p in (None, 0, 5))
    assert ones.mem_after_forward_bytes - plain.mem_after_forward_bytes == 2 * 64 * 8  # the int64 mask itself
    assert ones.peak_bytes - plain.peak_bytes == 2 * 64 * 8
    four_d = 2 * 64 * 64 if attn == "sdpa" else 0
    assert padding.mem_after_forward_bytes - ones.mem_after_forward_bytes == four_d
    assert (padding.peak_bytes > ones.peak_bytes) == (attn == "sdpa")
