"""FLOP formulas on hand-computed cases (the arithmetic is in the comments)."""

from __future__ import annotations

import pytest

from ckptbench.point.case import Case, preset
from ckptbench.point.training import TrainSpec
from ckptbench.theory.time import flops

TINY = preset("llama-tiny")  # hidden 64, 4 layers, 4 heads (head_dim 16), 2 kv heads, intermediate 128, vocab 256


def test_tiny_llama_matmul_params():
    # q 64·64 = 4096, k and v 64·(2·16) = 2048 each, o 4096  -> 12288
    # SwiGLU gate/up/down 3·64·128                          -> 24576
    # one layer 36864; 4 layers 147456; LM head 64·256 = 16384 -> N = 163840
    fm = flops.flop_model(TINY)
    assert fm.layer_matmul_params == 36864
    assert fm.head_matmul_params == 16384
    assert fm.matmul_params == 163840


def test_llama_1b_matches_published_parameter_count():
    # Llama-3.2-1B has 1,235,814,400 parameters: our N (matmul weights, tied head counted once as the head)
    # plus the norms (2 per layer + final = 33 × 2048 = 67,584) gives exactly that.
    spec = preset("llama-1b")
    assert flops.flop_model(spec).matmul_params + 33 * 2048 == 1_235_814_400


def test_gpt2_layer_params():
    # gpt2-tiny: hidden 64, intermediate 256: fused qkv 3·64·64 + proj 64·64 = 16384, MLP 2·64·256 = 32768
    assert flops.flop_model(preset("gpt2-tiny")).layer_matmul_params == 16384 + 32768


def test_model_flops_per_token_palm_convention():
    # 6N = 6 · 163840 = 983040; attention 12·L·H·Q·T = 12·4·4·16·32 = 98304  -> 1,081,344 at T = 32
    assert flops.model_flops_per_token(TINY, 32) == 983040 + 98304
    # causal halving halves only the attention term: 983040 + 49152
    assert flops.model_flops_per_token(TINY, 32, causal_halving=True) == 983040 + 49152


def test_recompute_and_ideal_ratio():
    # one layer's forward per token without its last matmul (down_proj, 64·128 = 8192 weights):
    # 2·(36864 - 8192) + 4·H·Q·T = 57344 + 4·4·16·32 (8192) = 65536
    assert flops.recompute_flops_per_token(TINY, 32, 1) == 65536
    # full (4 layers): 262144 / 1081344  -> ratio 1.2424...
    assert flops.ideal_recompute_ratio(TINY, 32, 4) == pytest.approx(1 + 262144 / 1081344)
    # every-2 (layers 0 and 2): half of that
    assert flops.ideal_recompute_ratio(TINY, 32, 2) == pytest.approx(1 + 131072 / 1081344)
    assert flops.ideal_recompute_ratio(TINY, 32, 0) == 1.0


def test_sdpa_backward_recomputes_the_scores():
    sdpa = preset("llama-tiny", attn="sdpa")
    # half a forward attention per layer: 4 layers · 8192 / 2
    assert flops.flash_backward_flops_per_token(sdpa, 32) == 16384
    assert flops.flash_backward_flops_per_token(TINY, 32) == 0
    assert flops.hardware_flops_per_token(sdpa, 32, 0) == 1081344 + 16384


def test_peak_table_lookup_most_specific_first():
    assert flops.peak_flops("NVIDIA H200", "bf16") == (989e12, "H200")
    assert flops.peak_flops("NVIDIA H200 NVL", "bf16") == (835e12, "H200 NVL")
    assert flops.peak_flops("NVIDIA H100 80GB HBM3", "bf16") == (989e12, "H100")
    assert flops.peak_flops("NVIDIA H100 PCIe", "fp32") == (51e12, "H100 PCIe")
    assert flops.peak_flops("NVIDIA A100-SXM4-80GB", "fp16") == (312e12, "A100")
    assert flops.peak_flops("NVIDIA GeForce RTX 4090", "bf16") == (165.2e12, "RTX 4090")
    assert flops.peak_flops("NVIDIA L40S", "fp32") == (91.6e12, "L40S")
    assert flops.peak_flops("NVIDIA GeForce RTX 3090", "bf16") is None
    assert flops.peak_flops(None, "bf16") is None


def test_figures_mfu_hfu_on_a_known_device():
    case = Case(model=preset("llama-tiny", dtype="bf16"), train=TrainSpec(), batch_size=2, seq_len=32,
                every_n_layers=1)
    # 64 tokens: model 64 · 1,081,344 = 69,206,016; hardware adds 64 · 262,144 = 16,777,216
    f = flops.figures(case, step_time_s=1e-3, device_name="NVIDIA H200")
    assert f["model_flops_per_step"] == 69_206_016
    assert f["recompute_flops_per_step"] == 16_777_216
    assert f["hardware_flops_per_step"] == 69_206_016 + 16_777_216
    assert f["mfu"] == pytest.approx(69_206_016 / 1e-3 / 989e12)
    assert f["hfu"] == pytest.approx(85_983_232 / 1e-3 / 989e12)
    assert f["ideal_recompute_ratio"] == pytest.approx(1 + 262144 / 1081344)
    g = flops.figures(case, 1e-3, "NVIDIA H200", measured_peak=790e12)
    assert g["mfu_measured_peak"] == pytest.approx(69_206_016 / 1e-3 / 790e12)


def test_figures_on_cpu_keep_the_ratio_only():
    case = Case(model=TINY, train=TrainSpec(), batch_size=2, seq_len=32, every_n_layers=2)
    f = flops.figures(case, 0.01, device_name=None)
    assert "mfu" not in f and "hfu" not in f
    assert f["ideal_recompute_ratio"] == pytest.approx(1 + 131072 / 1081344)


def test_utilisation_guards():
    assert flops.utilisation(1e12, None, 1e15) is None
    assert flops.utilisation(1e12, 0.0, 1e15) is None
    assert flops.utilisation(1e12, 1.0, None) is None
    assert flops.utilisation(1e12, 1.0, 1e15) == pytest.approx(1e-3)


@pytest.mark.parametrize("family", ["llama", "qwen2", "gpt2"])
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("every_n", [0, 2, 1])
def test_formula_equals_torchs_flop_counter(family, attn, every_n):
    """The FLOPs torch's counter sees in a real step of the real model, split into forward, backward and
    recompute, equal the formula exactly: the early stop and flash attention's backward included."""
    import torch

    from ckptbench.measure.flops import FlopCounter
    from ckptbench.point.strategy import checkpointed_layers
    from ckptbench.train.checkpointing import enable_checkpointing
    from ckptbench.train.models import build_model, synthetic_batch

    spec = preset(f"{family}-tiny", attn=attn)
    batch, seq = 2, 48
    torch.manual_seed(0)
    model = build_model(spec)
    enable_checkpointing(model, every_n, offload=False)
    ids = synthetic_batch(spec.vocab, batch, seq, seed=0)
    counter = FlopCounter()
    with counter:
        loss = model(input_ids=ids, labels=ids).loss
        counter.phase = "backward"
        loss.backward()
    n = len(checkpointed_layers(spec.layers, every_n))
    tokens = batch * seq
    c = counter.flops
    assert c["forward"] + c["backward"] == (flops.model_flops_per_token(spec, seq)
                                            + flops.flash_backward_flops_per_token(spec, seq)) * tokens
    assert c["recompute"] == flops.recompute_flops_per_token(spec, seq, n) * tokens
    if n:  # the old count (a whole forward per checkpointed layer) is what the early stop refutes
        whole = n * (2 * flops.flop_model(spec).layer_matmul_params
                     + flops.attention_forward_flops_per_token(spec, seq)) * tokens
        assert c["recompute"] < whole


def test_grouped_query_attention_counts_as_its_heads_repeated():
    """Grouped-query attention (fewer key/value heads than query heads) counts as the same attention with the
    key/value heads repeated, forward and backward; and where a formula refuses the grouped shapes (torch's
    before 2.13 assert the heads equal), the counter counts them at the repeated shapes instead of failing."""
    import torch
    import torch.nn.functional as F

    from ckptbench.measure.flops import FlopCounter, _grouped_heads

    def count(q, k, v, **kw) -> dict:
        counter = FlopCounter()
        with counter:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, **kw)
            counter.phase = "backward"
            out.sum().backward()
        return counter.flops

    torch.manual_seed(0)
    q = torch.randn(2, 8, 32, 16, requires_grad=True)
    k, v = (torch.randn(2, 2, 32, 16, requires_grad=True) for _ in range(2))
    grouped = count(q, k, v, enable_gqa=True)
    repeated = count(q, *(t.detach().repeat_interleave(4, dim=1).requires_grad_() for t in (k, v)))
    assert grouped == repeated and grouped["forward"] == 2 * 2 * (2 * 8 * 32 * 32 * 16)

    op = torch.ops.aten._scaled_dot_product_flash_attention
    torch_formula = FlopCounter().registry[op]

    def strict(query, key, value, *args, out_val=None, **kwargs):  # the rule of torch before 2.13
        shape = [t.shape if isinstance(t, torch.Tensor) else t for t in (query, key, value)]  # it takes shapes too
        assert shape[0] == shape[1] == shape[2], "shapes are incompatible"
        return torch_formula(query, key, value, *args, out_val=out_val, **kwargs)

    qm, km = torch.empty(2, 8, 32, 16, device="meta"), torch.empty(2, 2, 32, 16, device="meta")
    with pytest.raises(AssertionError):
        strict(qm, km, km)
    assert _grouped_heads(strict)(qm, km, km) == strict(qm, qm, qm) == grouped["forward"]
    odd = torch.empty(2, 3, 32, 16, device="meta")  # 8 query heads cannot share 3: refused as before
    with pytest.raises(AssertionError):
        _grouped_heads(strict)(qm, odd, odd)
