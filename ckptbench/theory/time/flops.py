"""FLOPs of a training step, model and hardware FLOPs utilisation, and the ideal cost of recompute.

Pure arithmetic on a :class:`~ckptbench.point.case.ModelSpec` (no torch), so the CPU tests pin every formula
and the report can recompute any figure from a record.

Convention (PaLM, Chowdhery et al. 2022, appendix B): model FLOPs per token

    6·N + 12·L·H·Q·T

- ``N`` counts the weights that take part in a matmul for every token: the decoder layers' projection
  and MLP matrices *and the LM head* (its matmul runs whether or not it is tied to the embedding).  The
  input embedding is a gather and norms/biases are element-wise, so neither is counted.
- ``12·L·H·Q·T`` is the attention score and value products (``QKᵀ`` and ``AV``: 2 matmuls × 2 FLOPs per
  multiply-add × H·Q·T per token, forward 4·H·Q·T, backward twice that) over L layers, H query heads of
  width Q and sequence length T.
- The causal mask is **not** halved by default: PaLM, Megatron and nanoGPT count the full T, so our MFU
  compares with published numbers.  ``causal_halving=True`` gives the count a causal kernel needs
  (T/2 keys per query on average); records store the attention term separately so either can be drawn.

Hardware FLOPs (HFU) add what the device really does beyond that, as torch's own FLOP counter sees it
on the memory step (``counted_flops`` in every record, checked against this formula exactly):

- the recomputation of each checkpointed layer during backward: its forward *except its last op*.
  Non-reentrant checkpoint stops recomputing once every tensor backward needs is back, and the layer's
  last matmul (Llama's ``down_proj``, GPT-2's ``mlp.c_proj``, h·i weights) produces nothing that is
  saved, so it is not run again: ``2·(N_layer − h·i) + 4·H·Q·T`` per token per layer;
- with sdpa, the flash kernel's backward recomputes the attention scores: five matmuls where eager
  attention's backward has four, half a forward attention more per layer.

The ideal recompute ratio is hardware FLOPs with checkpointing over hardware FLOPs without: the
step-time ratio checkpointing would cost if every FLOP ran at the same rate; the report draws it beside
the measured ratio.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...point.case import Case, ModelSpec
from ...point.strategy import SAC_POLICIES, SDPA_OPS

CONVENTION = ("PaLM app. B: 6N + 12*L*H*Q*T per token; N = matmul weights incl. LM head, no embedding "
              "lookup/norms/biases; attention not halved for the causal mask")

# Dense peak FLOP/s by device-name substring (first match wins, so more specific names come first).
# bf16/fp16 are dense tensor-core rates from the vendors' datasheets; fp32 is the plain (non-TF32) rate,
# since torch leaves TF32 off for fp32 matmuls by default.
PEAK_FLOPS: tuple[tuple[str, dict[str, float]], ...] = (
    ("H200 NVL", {"bf16": 835e12, "fp16": 835e12, "fp32": 60e12}),
    ("H200", {"bf16": 989e12, "fp16": 989e12, "fp32": 67e12}),
    ("H100 PCIe", {"bf16": 756e12, "fp16": 756e12, "fp32": 51e12}),
    ("H100", {"bf16": 989e12, "fp16": 989e12, "fp32": 67e12}),
    ("A100", {"bf16": 312e12, "fp16": 312e12, "fp32": 19.5e12}),
    ("L40S", {"bf16": 362e12, "fp16": 362e12, "fp32": 91.6e12}),  # dense tensor-core rates
    ("RTX 4090", {"bf16": 165.2e12, "fp16": 165.2e12, "fp32": 82.6e12}),  # fp32 accumulate (as training runs)
)


@dataclass(frozen=True)
class FlopModel:
    """The counts the formulas need, taken from a ModelSpec once."""

    layer_matmul_params: int  # weights of one decoder layer's matmuls
    last_matmul_params: int  # the layer's last matmul (MLP down projection), never recomputed
    head_matmul_params: int  # LM head (hidden × vocab)
    layers: int
    heads: int
    head_dim: int

    @property
    def matmul_params(self) -> int:
        """N of the PaLM formula."""
        return self.layers * self.layer_matmul_params + self.head_matmul_params


def flop_model(spec: ModelSpec) -> FlopModel:
    if not spec.analytic:
        raise NotImplementedError(f"no FLOP formula for model_type {spec.family!r}")
    h, hd = spec.hidden, spec.head_dim
    if spec.family == "gpt2":
        # fused qkv (h × 3h), output projection (h × h), MLP fc and proj (h × I each)
        layer = 4 * h * h + 2 * h * spec.intermediate
    else:
        # llama / qwen2: q and o are h × h, k and v are h × (kv_heads·head_dim); SwiGLU has 3 matrices
        layer = 2 * h * h + 2 * h * spec.kv_heads * hd + 3 * h * spec.intermediate
    return FlopModel(layer, h * spec.intermediate, h * spec.vocab, spec.layers, spec.heads, hd)


def attention_forward_flops_per_token(spec: ModelSpec, seq: int, causal_halving: bool = False) -> float:
    """QKᵀ and AV of one layer for one token: 2 matmuls × 2 FLOPs × H·Q·T (T/2 with causal halving)."""
    keys = seq / 2 if causal_halving else seq
    return 4 * spec.heads * spec.head_dim * keys


def model_flops_per_token(spec: ModelSpec, seq: int, causal_halving: bool = False) -> float:
    """6N + 12·L·H·Q·T: forward (2N + 4LHQT) plus a backward of twice that."""
    fm = flop_model(spec)
    return 6 * fm.matmul_params + 3 * spec.layers * attention_forward_flops_per_token(spec, seq, causal_halving)


def recompute_flops_per_token(spec: ModelSpec, seq: int, checkpointed_layers: int,
                              causal_halving: bool = False, sac: str = "") -> float:
    """The recomputed forward of each checkpointed layer, stopped before its last matmul (the LM head is
    never recomputed).  Under a SAC policy (:data:`~ckptbench.point.strategy.SAC_POLICIES`) an operator whose
    output the policy keeps is not run again: the projections' and MLP's matmuls when it keeps ``aten.mm``
    and ``aten.addmm``, the attention products when it keeps the kernel that computes them (sdpa's fused
    kernel; eager's ``aten.bmm``).  Every other operator the counter counts is recomputed as without SAC."""
    fm = flop_model(spec)
    keep = set(SAC_POLICIES[sac]) if sac else set()
    attention_ops = set(SDPA_OPS) if spec.attn == "sdpa" else {"aten.bmm"}
    matmuls = 0 if {"aten.mm", "aten.addmm"} <= keep else fm.layer_matmul_params - fm.last_matmul_params
    attention = 0 if attention_ops <= keep else attention_forward_flops_per_token(spec, seq, causal_halving)
    return checkpointed_layers * (2 * matmuls + attention)


def flash_backward_flops_per_token(spec: ModelSpec, seq: int, causal_halving: bool = False) -> float:
    """sdpa's backward recomputes the scores (QKᵀ) from the saved log-sum-exp: half a forward attention
    per layer beyond the 2× backward of the PaLM count; eager attention keeps the probabilities."""
    if spec.attn != "sdpa":
        return 0.0
    return spec.layers * attention_forward_flops_per_token(spec, seq, causal_halving) / 2


def hardware_flops_per_token(spec: ModelSpec, seq: int, checkpointed_layers: int,
                             causal_halving: bool = False, sac: str = "") -> float:
    """What the device runs per token: model FLOPs, the recomputation, and flash attention's extra."""
    return (model_flops_per_token(spec, seq, causal_halving)
            + recompute_flops_per_token(spec, seq, checkpointed_layers, causal_halving, sac)
            + flash_backward_flops_per_token(spec, seq, causal_halving))


def ideal_recompute_ratio(spec: ModelSpec, seq: int, checkpointed_layers: int,
                          causal_halving: bool = False, sac: str = "") -> float:
    """Step time with checkpointing / without, if all FLOPs ran at one rate: hardware FLOPs with the
    recomputation over hardware FLOPs without it."""
    return (hardware_flops_per_token(spec, seq, checkpointed_layers, causal_halving, sac)
            / hardware_flops_per_token(spec, seq, 0, causal_halving))


def peak_flops(device_name: str | None, dtype: str) -> tuple[float, str] | None:
    """(peak FLOP/s, table key) for a device name such as 'NVIDIA H200', or None when not in the table."""
    if not device_name:
        return None
    for key, by_dtype in PEAK_FLOPS:
        if key.lower() in device_name.lower() and dtype in by_dtype:
            return by_dtype[dtype], key
    return None


def utilisation(flops_per_step: float, step_time_s: float | None, peak: float | None) -> float | None:
    """Achieved FLOP/s over peak; None when any input is missing or not positive."""
    if not step_time_s or not peak or step_time_s <= 0 or peak <= 0:
        return None
    return flops_per_step / step_time_s / peak


def figures(case: Case, step_time_s: float | None, device_name: str | None = None,
            measured_peak: float | None = None) -> dict:
    """The FLOP figures of one measured point, ready to merge into its measurement.

    The ideal recompute ratio is arithmetic and always present; MFU/HFU need a peak, so they appear when
    the device is in :data:`PEAK_FLOPS` (``mfu``/``hfu``) or a measured matmul peak is given
    (``mfu_measured_peak``/``hfu_measured_peak``).
    """
    spec, seq, tokens = case.model, case.seq_len, case.tokens_per_step
    n_ckpt, sac = len(case.checkpointed_layers), case.recompute.sac
    model_tok = model_flops_per_token(spec, seq)
    out = {
        "flops_convention": CONVENTION,
        "matmul_params": flop_model(spec).matmul_params,
        "model_flops_per_token": model_tok,
        "attention_flops_per_token": 3 * spec.layers * attention_forward_flops_per_token(spec, seq),
        "model_flops_per_step": model_tok * tokens,
        "recompute_flops_per_step": recompute_flops_per_token(spec, seq, n_ckpt, sac=sac) * tokens,
        "hardware_flops_per_step": hardware_flops_per_token(spec, seq, n_ckpt, sac=sac) * tokens,
        "ideal_recompute_ratio": ideal_recompute_ratio(spec, seq, n_ckpt, sac=sac),
    }
    table = peak_flops(device_name, spec.dtype)
    if table is not None:
        out.update(peak_flops=table[0], peak_flops_source=f"datasheet:{table[1]}:{spec.dtype}",
                   mfu=utilisation(out["model_flops_per_step"], step_time_s, table[0]),
                   hfu=utilisation(out["hardware_flops_per_step"], step_time_s, table[0]))
    if measured_peak:
        out.update(measured_peak_flops=measured_peak,
                   mfu_measured_peak=utilisation(out["model_flops_per_step"], step_time_s, measured_peak),
                   hfu_measured_peak=utilisation(out["hardware_flops_per_step"], step_time_s, measured_peak))
    return out
