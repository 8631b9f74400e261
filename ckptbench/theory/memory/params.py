"""Parameter, gradient and optimizer-state counts of the models transformers builds: exact, torch-free."""

from __future__ import annotations

from dataclasses import dataclass

from ...point.case import ANALYTIC_OPTIMIZERS, ModelSpec
from .units import FP32


@dataclass(frozen=True)
class ParamCount:
    """Parameter elements by part, and how many parameter tensors (AdamW keeps one step scalar each)."""

    embedding: int
    position: int
    per_layer: int
    final_norm: int
    lm_head: int
    layers: int
    n_tensors: int
    largest_tensor: int
    buffers_bytes: int
    # the per-parameter AdamW's largest moment, in elements: max over the parameters, in the order the
    # optimizer visits them, of two copies of one (``exp_avg_sq.sqrt() / bc``) and the denominator of the one
    # before it, which the loop's ``denom`` still holds (:func:`loop_step_elements`)
    loop_step: int = 0

    @property
    def total(self) -> int:
        return self.embedding + self.position + self.per_layer * self.layers + self.final_norm + self.lm_head


def param_count(spec: ModelSpec) -> ParamCount:
    """Exact ``sum(p.numel() for p in model.parameters())`` of the model ``models.build_model`` builds.

    Tied embeddings are one tensor (``parameters()`` yields it once), so ``lm_head`` is 0 then.
    Llama has no biases; Qwen2 has biases on q/k/v only; GPT-2 has biases everywhere, LayerNorm weight and
    bias, learned position embeddings and fused Conv1D q/k/v.
    """
    if not spec.analytic:
        raise NotImplementedError(f"no analytic parameter count for model_type {spec.family!r}")
    h, i, v, kv = spec.hidden, spec.intermediate, spec.vocab, spec.kv_heads * spec.head_dim
    lm_head = 0 if spec.tie_embeddings else v * h
    if spec.family in ("llama", "qwen2"):
        attn = h * h + 2 * h * kv + h * h  # q, k, v, o
        if spec.family == "qwen2":
            attn += h + 2 * kv  # q/k/v biases
        per_layer = attn + 3 * h * i + 2 * h  # gate, up, down; two RMSNorm weights
        # rotary inv_freq and original_inv_freq buffers: head_dim/2 fp32 each (params_bytes includes buffers)
        buffers = 2 * (spec.head_dim // 2) * FP32
        per_layer_tensors = 9 + (3 if spec.family == "qwen2" else 0)
        n_tensors = 1 + spec.layers * per_layer_tensors + 1 + (0 if spec.tie_embeddings else 1)
        position, final_norm = 0, h
        largest = max(v * h, h * i, h * h)
    elif spec.family == "gpt2":
        attn = (h * 3 * h + 3 * h) + (h * h + h)  # c_attn, c_proj (Conv1D weight + bias)
        mlp = (h * i + i) + (i * h + h)  # c_fc, c_proj
        per_layer = attn + mlp + 2 * 2 * h  # ln_1, ln_2 weight + bias
        position, final_norm, buffers = spec.max_positions * h, 2 * h, 0
        n_tensors = 2 + spec.layers * 12 + 2 + (0 if spec.tie_embeddings else 1)
        largest = max(v * h, h * i, 3 * h * h, position)
    else:
        raise ValueError(f"unknown model family {spec.family!r}")
    return ParamCount(embedding=v * h, position=position, per_layer=per_layer, final_norm=final_norm,
                      lm_head=lm_head, layers=spec.layers, n_tensors=n_tensors, largest_tensor=largest,
                      buffers_bytes=buffers, loop_step=loop_step_elements(tensor_sizes(spec)))


def tensor_sizes(spec: ModelSpec) -> list[int]:
    """Elements of each parameter tensor, in ``model.parameters()`` order (modules in the order their
    ``__init__`` registers them, a weight before its bias; a tied head is the embedding, listed once)."""
    h, i, v, kv = spec.hidden, spec.intermediate, spec.vocab, spec.kv_heads * spec.head_dim
    head = [] if spec.tie_embeddings else [v * h]
    if spec.family in ("llama", "qwen2"):
        bias = spec.family == "qwen2"  # q, k and v carry biases
        attn = [h * h, *[h] * bias, kv * h, *[kv] * bias, kv * h, *[kv] * bias, h * h]
        layer = attn + [i * h, i * h, h * i, h, h]  # gate, up, down; input and post-attention norms
        return [v * h, *layer * spec.layers, h, *head]
    if spec.family == "gpt2":
        layer = [h, h, h * 3 * h, 3 * h, h * h, h, h, h, h * i, i, i * h, h]  # ln_1, attn, ln_2, mlp
        return [v * h, spec.max_positions * h, *layer * spec.layers, h, h, *head]
    raise ValueError(f"unknown model family {spec.family!r}")


def loop_step_elements(sizes: list[int]) -> int:
    """The per-parameter AdamW's largest moment in elements: at parameter i, ``exp_avg_sq.sqrt()`` and its
    quotient by the bias correction (two copies of it) while ``denom`` still holds parameter i−1's."""
    return max((2 * size + before for size, before in zip(sizes, [0, *sizes[:-1]])), default=0)



def optimizer_state_bytes(pc: ParamCount, bytes_per_element: int, optimizer: str = "adamw") -> int:
    """The optimizer's state after its first step: AdamW keeps ``exp_avg`` and ``exp_avg_sq`` like each
    parameter and an fp32 ``step`` scalar per parameter tensor; SGD with momentum one ``momentum_buffer``
    like each parameter (a clone of its first gradient, in the parameter's dtype)."""
    if optimizer.startswith("adamw") and optimizer in ANALYTIC_OPTIMIZERS:
        return 2 * pc.total * bytes_per_element + FP32 * pc.n_tensors
    if optimizer == "sgd":
        return pc.total * bytes_per_element
    raise ValueError(f"no analytic optimizer state for {optimizer!r}: it is estimated by its simulation")


def optimizer_step_bytes(pc: ParamCount, bytes_per_element: int, optimizer: str = "adamw",
                         device: str = "cpu") -> int:
    """What the optimizer step allocates beside the state at its largest moment.

    - the per-parameter AdamW (``adamw-loop``, and ``adamw`` on a CPU, where torch picks it):
      ``exp_avg_sq.sqrt() / bias_correction2_sqrt`` holds two copies of one tensor at once, beside the
      previous parameter's denominator (:attr:`ParamCount.loop_step`);
    - the multi-tensor AdamW (``adamw-foreach``, and ``adamw`` on CUDA): ``torch._foreach_sqrt`` of every
      ``exp_avg_sq`` at once, one copy of all the parameters, live until the update is applied;
    - SGD with momentum: nothing (``buf.mul_(momentum).add_(grad)`` and ``param.add_(buf)`` work in place).
    """
    B = bytes_per_element
    if optimizer == "adamw-foreach" or (optimizer == "adamw" and device == "cuda"):
        return pc.total * B
    if optimizer in ("adamw", "adamw-loop"):
        return pc.loop_step * B
    if optimizer == "sgd":
        return 0
    raise ValueError(f"no analytic optimizer step for {optimizer!r}: it is estimated by its simulation")
