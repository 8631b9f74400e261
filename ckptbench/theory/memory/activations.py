"""What one decoder layer and the model head keep for backward, term by term (bytes).

Pure functions over a :class:`~ckptbench.point.case.ModelSpec` (no torch import), so the CLI, the suite
validator and the report can ask "what should this point cost?" without building anything.

Every activation term below was derived from the operators that save tensors for backward in the
transformers 5.x modelling code (LlamaDecoderLayer, Qwen2DecoderLayer, GPT2Block) under torch 2.x
autograd, and then checked byte for byte against a live-storage tracker on CPU (see
``tests/unit/test_estimate.py``).  The reference point is Korthikanti et al. 2022, "Reducing Activation
Recomputation in Large Transformer Models", eq. 1: a GPT-style layer in 16-bit with dropout keeps
``s·b·h·(34 + 5·a·s/h)`` bytes.  We differ from it on purpose, because we model what this code keeps:

* no dropout masks (every dropout here has p=0 and saves nothing; the paper counts 2 + 1 + 1 bytes·sbh
  and 1·a·s² bytes of masks);
* RMSNorm and the loss compute in fp32 even for bf16 models (``hidden.to(float32)`` and
  ``logits.float()``), so their saved copies are 4 bytes per element whatever the model dtype;
* Llama's MLP is SwiGLU with an intermediate size that is not 4h, and GQA: with eager attention k and v
  are expanded to all heads (``repeat_kv``) before being saved, with sdpa they are saved un-expanded;
* eager attention keeps the probabilities twice in bf16 (fp32 softmax output and its bf16 cast), sdpa
  keeps no s² term at all.

Symbols: b batch, s sequence, N = b·s tokens, h hidden, a heads, kv = kv_heads·head_dim, i intermediate,
V vocab, B bytes per element of the model dtype.
"""

from __future__ import annotations

from ...point.case import ModelSpec
from .units import FP32, HALF, INT64


def layer_activation_terms(spec: ModelSpec, batch: int, seq: int, device: str = "cpu",
                           autocast: str = "") -> dict[str, int]:
    """Bytes one *non-checkpointed* decoder layer keeps for backward, by term (its input included).

    Llama / Qwen2 (RMSNorm, RoPE, GQA, SwiGLU):
      - ``norm_inputs_fp32`` 2·4·N·h: both RMSNorms upcast their input and ``pow``/``mul`` save the fp32
        tensor (in an fp32 model that *is* the layer input and the mid-layer residual);
      - ``norm_rsqrt`` 2·4·N; ``norm_outputs`` 2·2·B·N·h: the normalised tensor (saved by ``weight *``)
        and the weighted output (saved by the next Linear);
      - RoPE saves only cos/sin (shared, counted in the head): q·cos does not keep q since cos needs no
        grad; the projections' outputs are not kept either;
      - eager: ``attn_qkv`` 3·B·N·h (q copied by matmul's reshape, k and v expanded by ``repeat_kv``),
        ``attn_probs`` a·N·s·(4 + B) in bf16 (fp32 softmax output plus its cast) or 4·a·N·s in fp32,
        ``attn_out`` B·N·h (the ``transpose().contiguous()`` copy o_proj saves);
      - sdpa (CPU ``_scaled_dot_product_flash_attention_for_cpu`` with ``is_causal`` and ``enable_gqa``,
        no mask): ``attn_qkv`` B·N·(h + 2·kv) un-expanded, ``attn_out`` B·N·h (already in o_proj's
        layout, no copy), ``attn_logsumexp`` 4·a·N.  No s² term;
      - ``mlp`` 4·B·N·i: gate output (silu input), silu output, up output, their product.
      Per layer in bf16: eager 24·N·h + 8·N + 8·N·i + 6·a·N·s bytes; sdpa 20·N·h + 4·N·kv + 8·N + 8·N·i
      + 4·a·N bytes.

    GPT-2 (LayerNorm, fused Conv1D qkv, gelu_new):
      - ``ln_inputs`` 2·B·N·h, ``ln_stats`` 2·2·N·(B on CPU, 4 on CUDA) mean and rstd, ``ln_outputs``
        2·B·N·h;
      - eager: ``attn_qkv`` 3·B·N·h copies, ``attn_probs`` B·a·N·s (softmax in the model dtype),
        ``attn_out`` B·N·h; sdpa: ``attn_qkv`` 3·B·N·h (the c_attn output q/k/v are views of),
        ``attn_out`` B·N·h, ``attn_logsumexp`` 4·a·N;
      - ``mlp`` 5·B·N·i: c_fc output, tanh, 1+tanh, 0.5·x, and the product (gelu_new's tanh form).
      Against Korthikanti eq. 1 (16-bit, i = 4h): ours is 56·sbh + 2·a·s²·b bytes, theirs
      34·sbh + 5·a·s²·b.  Differences: gelu_new runs as five unfused elementwise ops, so the MLP keeps
      5·i-sized tensors (40·sbh) where a fused GeLU keeps two (16·sbh); q, k and v are copied for matmul
      (6·sbh, theirs 4 + the shared input 2); no dropout masks (theirs 2·sbh + a·s²·b); and the softmax
      output is kept once instead of before and after dropout (theirs 4·a·s²·b, ours 2).
    """
    if autocast:
        return mixed_layer_activation_terms(spec, batch, seq, autocast)
    B = spec.bytes_per_element
    N = batch * seq
    h, a, i = spec.hidden, spec.heads, spec.intermediate
    kv = spec.kv_heads * spec.head_dim
    t: dict[str, int] = {}
    if spec.family in ("llama", "qwen2"):
        t["norm_inputs_fp32"] = 2 * FP32 * N * h
        t["norm_rsqrt"] = 2 * FP32 * N
        t["norm_outputs"] = 2 * 2 * B * N * h
        if spec.attn == "eager":
            t["attn_qkv"] = 3 * B * N * h
            t["attn_probs"] = a * N * seq * (FP32 + (B if B != FP32 else 0))
            t["attn_out"] = B * N * h
        else:
            t["attn_qkv"] = B * N * (h + 2 * kv)
            t["attn_out"] = B * N * h
            t["attn_logsumexp"] = FP32 * a * N
        t["mlp"] = 4 * B * N * i
    elif spec.family == "gpt2":
        stat = B if device == "cpu" else FP32
        t["ln_inputs"] = 2 * B * N * h
        t["ln_stats"] = 2 * 2 * stat * N
        t["ln_outputs"] = 2 * B * N * h
        t["attn_qkv"] = 3 * B * N * h
        t["attn_out"] = B * N * h
        if spec.attn == "eager":
            t["attn_probs"] = B * a * N * seq
        else:
            t["attn_logsumexp"] = FP32 * a * N
        t["mlp"] = 5 * B * N * i
    else:
        raise ValueError(f"unknown model family {spec.family!r}")
    return t


def head_activation_terms(spec: ModelSpec, batch: int, seq: int, any_checkpointed: bool,
                          all_checkpointed: bool = False, device: str = "cpu", autocast: str = "") -> dict[str, int]:
    """Bytes live after the forward outside the decoder layers: inputs, final norm, loss, shared tensors.

    - ``input_ids`` 8·N (saved by the embedding; the harness counts the batch as activations);
    - ``final_norm``: as one norm of a layer, its input being the last layer's output;
    - ``log_softmax`` 4·N·V: ``ForCausalLMLoss`` upcasts the logits to fp32 and cross-entropy keeps the
      log-softmax output.  The logits themselves are freed once the caller drops the model output (we
      assume ``loss = model(...).loss``).  At real vocabularies this term dominates: Llama-3 8B at
      b=4, s=8192 keeps 4·32768·128256 B = 15.7 GiB here;
    - ``labels`` 8·N: the shifted labels nll_loss keeps (8·(s+1) when b=1: the padded tensor is then
      already contiguous and kept whole); ``loss`` 4, the fp32 loss the caller holds, and
      ``nll_total_weight`` 4, the fp32 scalar nll_loss saves;
    - Llama: ``rope_cos_sin`` 2·B·s·head_dim (batch 1), saved by RoPE or held by the checkpoint closure;
      GPT-2: ``position_ids`` 8·s, saved by the position embedding;
    - with any checkpointed layer, the closure ``partial(forward, **kwargs)`` keeps the kwargs until
      backward: ``causal_mask`` B·b·s² with eager attention (sdpa passes no mask), and Llama's
      ``position_ids`` 8·s.  GPT-2 hands the mask to the checkpoint positionally, so checkpoint's
      ``save_inputs`` saves it (a saved tensor, at every batch size); Llama passes it by keyword.
    """
    B = spec.bytes_per_element
    N = batch * seq
    h = spec.hidden
    t: dict[str, int] = {"input_ids": INT64 * N}
    if autocast:
        _mixed_family(spec, autocast)
        # fp32 input, rsqrt and normalised tensor as in a layer; the LM head saves its own 16-bit cast of
        # the (fp32) weighted output, and the cast cache's 16-bit copy of its weight
        t["final_norm"] = FP32 * N * h + FP32 * N + FP32 * N * h + HALF * N * h
        t["lm_head_weight"] = HALF * spec.vocab * h
        t["rope_cos_sin"] = 2 * B * seq * spec.head_dim
        if any_checkpointed:
            t["position_ids"] = INT64 * seq
    elif spec.family in ("llama", "qwen2"):
        t["final_norm"] = FP32 * N * h + FP32 * N + 2 * B * N * h
        t["rope_cos_sin"] = 2 * B * seq * spec.head_dim
        if any_checkpointed:
            t["position_ids"] = INT64 * seq
    else:
        stat = B if device == "cpu" else FP32
        t["final_norm"] = 2 * B * N * h + 2 * stat * N
        t["position_ids"] = INT64 * seq
    if any_checkpointed and spec.attn == "eager":
        t["causal_mask"] = B * batch * seq * seq
    t["log_softmax"] = FP32 * N * spec.vocab
    t["labels"] = INT64 * batch * (seq + 1 if batch == 1 else seq)
    t["loss"] = FP32
    t["nll_total_weight"] = FP32
    return t


def _mixed_family(spec: ModelSpec, autocast: str) -> None:
    if autocast != "bf16" or spec.family not in ("llama", "qwen2") or spec.dtype != "fp32":
        raise NotImplementedError(f"no analytic terms for {autocast}-mixed {spec.dtype} {spec.family}")


def linear_weight_elements(spec: ModelSpec) -> int:
    """Elements of one decoder layer's nn.Linear weights (q, k, v, o, gate, up, down): what autocast's cast
    cache copies to 16 bits."""
    h, i, kv = spec.hidden, spec.intermediate, spec.kv_heads * spec.head_dim
    return 2 * h * h + 2 * h * kv + 3 * h * i


def mixed_layer_activation_terms(spec: ModelSpec, batch: int, seq: int, autocast: str) -> dict[str, int]:
    """Bytes one non-checkpointed Llama / Qwen2 layer keeps for backward under bf16 autocast over fp32
    weights (``torch.autocast("cpu", dtype=torch.bfloat16)``), by term.

    The residual stream and both RMSNorms stay fp32 (elementwise ops are not autocast), every nn.Linear
    and sdpa run in bf16 and each saves its own casts:
      - ``norm_inputs_fp32`` 2·4·N·h, ``norm_rsqrt`` 2·4·N, ``norm_outputs`` 2·4·N·h: as in an fp32 model
        the input, the rsqrt and the normalised tensor (saved by ``weight *``); the weighted fp32 output
        is not saved, the linears keep their casts of it instead;
      - ``linear_inputs`` 5·2·N·h: q, k, v, gate and up each cast the norm's output to bf16 afresh (the
        cast cache keeps only leaf tensors that require grad, i.e. weights), and each saves its copy;
      - ``linear_weights`` 2·(2h² + 2h·kv + 3h·i): the cast cache's bf16 copy of each weight, which its
        linear saves for the input gradient (so it outlives the autocast region until this layer's
        backward);
      - RoPE multiplies the bf16 projections by fp32 cos/sin (type promotion: fp32 q and k, not saved);
        sdpa casts them back: ``attn_qkv`` 2·N·(h + 2·kv) (v is the bf16 projection itself),
        ``attn_out`` 2·N·h, ``attn_logsumexp`` 4·a·N;
        eager: ``attn_qkv`` 3·2·N·h (matmul's bf16 casts of q and the expanded k; v expanded in bf16),
        ``attn_probs`` a·N·s·(4 + 2) (the fp32 softmax output, and the bf16 cast the second matmul
        saves), ``attn_out`` 2·N·h (the contiguous copy o_proj saves);
      - ``mlp`` 4·2·N·i: gate, silu, up and their product, all bf16 (silu and mul follow their inputs).
    Qwen2's q/k/v biases are cast and cached too, but no op saves them: they live only while autocast
    does (:func:`mixed_forward_only_bytes`).
    """
    _mixed_family(spec, autocast)
    N = batch * seq
    h, a, i = spec.hidden, spec.heads, spec.intermediate
    kv = spec.kv_heads * spec.head_dim
    t = {"norm_inputs_fp32": 2 * FP32 * N * h, "norm_rsqrt": 2 * FP32 * N, "norm_outputs": 2 * FP32 * N * h,
         "linear_inputs": 5 * HALF * N * h, "linear_weights": HALF * linear_weight_elements(spec)}
    if spec.attn == "eager":
        t["attn_qkv"] = 3 * HALF * N * h
        t["attn_probs"] = a * N * seq * (FP32 + HALF)
        t["attn_out"] = HALF * N * h
    else:
        t["attn_qkv"] = HALF * N * (h + 2 * kv)
        t["attn_out"] = HALF * N * h
        t["attn_logsumexp"] = FP32 * a * N
    t["mlp"] = 4 * HALF * N * i
    return t


def mixed_forward_only_bytes(spec: ModelSpec, checkpointed: int) -> int:
    """16-bit weight copies the cast cache holds until the autocast region (forward and loss) ends that no
    op saves: a checkpointed layer's (its forward saves nothing; the recomputation casts again), and
    Qwen2's q/k/v biases (addmm does not save its bias)."""
    extra = checkpointed * HALF * linear_weight_elements(spec)
    if spec.family == "qwen2":
        extra += spec.layers * HALF * (spec.hidden + 2 * spec.kv_heads * spec.head_dim)
    return extra


def not_saved_head_terms(spec: ModelSpec, all_checkpointed: bool) -> tuple[str, ...]:
    """Head terms that are live but not autograd-saved tensors (held by Python references instead)."""
    names = ["loss"]
    if spec.family in ("llama", "qwen2"):
        names += ["causal_mask", "position_ids"]
        if all_checkpointed:
            names.append("rope_cos_sin")
    return tuple(names)
