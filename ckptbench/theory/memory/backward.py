"""What a decoder layer's backward holds beyond what the layer saved: its moments, term by term (CPU).

The analytic estimate walks backward layer by layer (:mod:`.estimate`).  When layer k's backward starts,
what is alive is what every layer below k still keeps, this layer's saved tensors (recomputed first if
the layer is checkpointed), the head's leftovers and the gradient flowing in.  Inside the layer the
total rises and falls op by op; the peak of the step is reached at one of a few *moments*:

* the MLP's backward: the gradient of the down projection's input (N·i) while its weight gradient
  (h·i, an activation until autograd accumulates it into ``.grad``) is computed, then the gradients of
  both SwiGLU (or gelu) inputs side by side;
* eager attention's backward: once the MLP and the post-attention norm have freed what they saved, the
  gradient of the attention probabilities and the softmax-backward output (two a·N·s tensors, in fp32
  for Llama's fp32 softmax) live beside the saved probabilities.  This is the a·s² term that grows
  fastest with the sequence; sdpa's CPU flash kernel keeps none;
* GPT-2's fused qkv weight gradient (h·3h) at the end of the attention backward;
* for a checkpointed layer, the same moments after the recomputation has rebuilt what the layer saves
  (non-reentrant checkpoint stops before the layer's last op), plus its transient forward buffers.

Each moment is a linear form in the shapes below with exact byte coefficients.  They were derived from
the allocation sequence of the real transformers layer on fake tensors (FakeTensorMode, CPU kernels,
torch 2.13 / transformers 5.23), where every allocation of a layer's backward is the same op for every
shape, so each moment is fitted exactly (zero residual) over models with unrelated h, i, a, kv and
shapes; ``scripts/derive_backward_moments.py`` regenerates this table and says if any moment changed.
Only the moments that are the largest for some realistic shape are kept.  Known residue: at
batch 1, GPT-2's eager attention makes one B·N·h copy more than at the batch >= 2 the table is derived
at (0.1 % of the peaks in the test grid).  Qwen2 runs Llama's code (its
q/k/v biases add a few h-sized buffers, below one part in a thousand); fp16 sizes as bf16.

``bf16-mixed`` rows (autocast over fp32 weights) are derived per family, Llama and Qwen2, because there
Qwen2's bias copies are exact terms too; their moments include the bf16 weight copies a layer's backward
still holds and, for a checkpointed layer, those its recomputation casts again.

Keys are ``family/precision/attention/(kept|ckpt)``; values are (the gradient flowing in at the
layer's start, the moments: (activation bytes above that start, this layer's parameter gradients
accumulated by then)).  The gradients are exact too: at the MLP's moments only the down projection's
weight has its gradient, at attention's the whole MLP and norm.  Feature names: N = batch·seq tokens, h hidden,
i intermediate, kv = kv_heads·head_dim, a heads, s seq, b batch.
"""

from __future__ import annotations

from ...point.case import ModelSpec

Form = dict[str, float]

MOMENTS: dict[str, tuple[Form, tuple[tuple[Form, Form], ...]]] = {
    "llama/fp32/eager/kept": (
        {'N*h': 4},
        (
            ({'N*i': 8}, {'h*i': 4}),
            ({'N*h': 8, 'N*i': -12, 'h*i': 4}, {'h*i': 8}),
            ({'N*h': -16, 'N*i': -16, 'a*N*s': 8, 'N': -4}, {'h*i': 12, 'h*h': 4, 'h': 4}),
            ({'N*h': -16, 'N*i': -16, 'a*N*s': -4, 'N': -4, 'h*h': 4}, {'h*i': 12, 'h*h': 4, 'h*kv': 8, 'h': 4}),
        ),
    ),
    "llama/fp32/eager/ckpt": (
        {'N*h': 4},
        (
            ({'N*h': 36, 'N*i': 24, 'a*N*s': 4, 'N': 8}, {'h*i': 4}),
            ({'N*h': 44, 'N*i': 4, 'a*N*s': 4, 'N': 8, 'h*i': 4}, {'h*i': 8}),
            ({'N*h': 20, 'a*N*s': 12, 'N': 4}, {'h*i': 12, 'h*h': 4, 'h': 4}),
            ({'N*h': 20, 'N': 4, 'h*h': 4}, {'h*i': 12, 'h*h': 4, 'h*kv': 8, 'h': 4}),
        ),
    ),
    "llama/fp32/sdpa/kept": (
        {'N*h': 4},
        (
            ({'N*i': 8}, {'h*i': 4}),
            ({'N*h': 8, 'N*i': -12, 'h*i': 4}, {'h*i': 8}),
            ({'N*h': -8, 'N*i': -16, 'N*kv': -8, 'a*N': -4, 'N': -4, 'h*h': 4}, {'h*i': 12, 'h*h': 4, 'h*kv': 8, 'h': 4}),
        ),
    ),
    "llama/fp32/sdpa/ckpt": (
        {'N*h': 4},
        (
            ({'N*h': 28, 'N*i': 24, 'N*kv': 8, 'a*N': 4, 'N': 8}, {'h*i': 4}),
            ({'N*h': 36, 'N*i': 4, 'N*kv': 8, 'a*N': 4, 'N': 8, 'h*i': 4}, {'h*i': 8}),
            ({'N*h': 20, 'N': 4, 'h*h': 4}, {'h*i': 12, 'h*h': 4, 'h*kv': 8, 'h': 4}),
        ),
    ),
    "llama/bf16/eager/kept": (
        {'N*h': 2},
        (
            ({'N*i': 4}, {'h*i': 2}),
            ({'N*h': 16, 'N*i': -8, 'N': -4}, {'h*i': 6, 'h': 2}),
            ({'N*h': -10, 'N*i': -8, 'a*N*s': 6, 'N': -4}, {'h*i': 6, 'h*h': 2, 'h': 2}),
            ({'N*i': -8, 'a*N*s': -6, 'N': -8}, {'h*i': 6, 'h*h': 4, 'h*kv': 4, 'h': 4}),
        ),
    ),
    "llama/bf16/eager/ckpt": (
        {'N*h': 2},
        (
            ({'N*h': 24, 'N*i': 12, 'a*N*s': 6, 'N': 8}, {'h*i': 2}),
            ({'N*h': 40, 'a*N*s': 6, 'N': 4}, {'h*i': 6, 'h': 2}),
            ({'N*h': 14, 'a*N*s': 12, 'N': 4}, {'h*i': 6, 'h*h': 2, 'h': 2}),
            ({'N*h': 24}, {'h*i': 6, 'h*h': 4, 'h*kv': 4, 'h': 4}),
        ),
    ),
    "llama/bf16/sdpa/kept": (
        {'N*h': 2},
        (
            ({'N*i': 4}, {'h*i': 2}),
            ({'N*h': 16, 'N*i': -8, 'N': -4}, {'h*i': 6, 'h': 2}),
            ({'N*h': 4, 'N*i': -8, 'N*kv': -4, 'a*N': -4, 'N': -8}, {'h*i': 6, 'h*h': 4, 'h*kv': 4, 'h': 4}),
        ),
    ),
    "llama/bf16/sdpa/ckpt": (
        {'N*h': 2},
        (
            ({'N*h': 20, 'N*i': 12, 'N*kv': 4, 'a*N': 4, 'N': 8}, {'h*i': 2}),
            ({'N*h': 36, 'N*kv': 4, 'a*N': 4, 'N': 4}, {'h*i': 6, 'h': 2}),
            ({'N*h': 24}, {'h*i': 6, 'h*h': 4, 'h*kv': 4, 'h': 4}),
        ),
    ),
    "gpt2/fp32/eager/kept": (
        {'N*h': 4},
        (
            ({'N*i': 8}, {'h*i': 4, 'h': 4}),
            ({'N*h': -12, 'N*i': -20, 'a*N*s': 8, 'N': -8}, {'h*i': 8, 'h*h': 4, 'h': 16, 'i': 4}),
            ({'N*h': -8, 'N*i': -20, 'a*N*s': -4, 'N': -8, 'h*h': 12, 'h': 12}, {'h*i': 8, 'h*h': 4, 'h': 16, 'i': 4}),
        ),
    ),
    "gpt2/fp32/eager/ckpt": (
        {'N*h': 4},
        (
            ({'N*h': 28, 'N*i': 28, 'a*N*s': 4, 'N': 16}, {'h*i': 4, 'h': 4}),
            ({'N*h': 16, 'a*N*s': 12, 'N': 8}, {'h*i': 8, 'h*h': 4, 'h': 16, 'i': 4}),
            ({'N*h': 20, 'N': 8, 'h*h': 12}, {'h*i': 8, 'h*h': 4, 'h': 16, 'i': 4}),
        ),
    ),
    "gpt2/fp32/sdpa/kept": (
        {'N*h': 4},
        (
            ({'N*i': 8}, {'h*i': 4, 'h': 4}),
            ({'N*h': -8, 'N*i': -20, 'a*N': -4, 'N': -8, 'h*h': 12, 'h': 12}, {'h*i': 8, 'h*h': 4, 'h': 16, 'i': 4}),
        ),
    ),
    "gpt2/fp32/sdpa/ckpt": (
        {'N*h': 4},
        (
            ({'N*h': 28, 'N*i': 28, 'a*N': 4, 'N': 16}, {'h*i': 4, 'h': 4}),
            ({'N*h': 20, 'N': 8, 'h*h': 12}, {'h*i': 8, 'h*h': 4, 'h': 16, 'i': 4}),
        ),
    ),
    "gpt2/bf16/eager/kept": (
        {'N*h': 2},
        (
            ({'N*i': 4}, {'h*i': 2, 'h': 2}),
            ({'N*h': -6, 'N*i': -10, 'a*N*s': 4, 'N': -4}, {'h*i': 4, 'h*h': 2, 'h': 8, 'i': 2}),
            ({'N*h': -4, 'N*i': -10, 'a*N*s': -2, 'N': -4, 'h*h': 6, 'h': 6}, {'h*i': 4, 'h*h': 2, 'h': 8, 'i': 2}),
        ),
    ),
    "gpt2/bf16/eager/ckpt": (
        {'N*h': 2},
        (
            ({'N*h': 14, 'N*i': 14, 'a*N*s': 2, 'N': 8}, {'h*i': 2, 'h': 2}),
            ({'N*h': 8, 'a*N*s': 6, 'N': 4}, {'h*i': 4, 'h*h': 2, 'h': 8, 'i': 2}),
            ({'N*h': 10, 'N': 4, 'h*h': 6}, {'h*i': 4, 'h*h': 2, 'h': 8, 'i': 2}),
        ),
    ),
    "gpt2/bf16/sdpa/kept": (
        {'N*h': 2},
        (
            ({'N*i': 4}, {'h*i': 2, 'h': 2}),
            ({'N*h': -4, 'N*i': -10, 'a*N': -4, 'N': -4, 'h*h': 6, 'h': 6}, {'h*i': 4, 'h*h': 2, 'h': 8, 'i': 2}),
        ),
    ),
    "gpt2/bf16/sdpa/ckpt": (
        {'N*h': 2},
        (
            ({'N*h': 14, 'N*i': 14, 'a*N': 4, 'N': 8}, {'h*i': 2, 'h': 2}),
            ({'N*h': 10, 'N': 4, 'h*h': 6}, {'h*i': 4, 'h*h': 2, 'h': 8, 'i': 2}),
        ),
    ),
    "llama/bf16-mixed/eager/kept": (
        {'N*h': 4},
        (
            ({'N*i': 4, 'h*i': -2}, {'h*i': 4}),
            ({'N*h': 2, 'N*i': -4, 'h*i': 2}, {'h*i': 4}),
            ({'N*i': -8}, {'h*i': 8}),
            ({'N*h': -14, 'N*i': -8, 'a*N*s': 6, 'N': -4, 'h*i': -6, 'h*h': -2}, {'h*i': 12, 'h*h': 4, 'h': 4}),
            ({'N*h': -22, 'N*i': -8, 'a*N*s': -6, 'N': -4, 'h*i': -6, 'h*h': 2, 'h*kv': -4}, {'h*i': 12, 'h*h': 4, 'h*kv': 8, 'h': 4}),
        ),
    ),
    "llama/bf16-mixed/eager/ckpt": (
        {'N*h': 4},
        (
            ({'N*h': 30, 'N*i': 12, 'a*N*s': 6, 'N': 8, 'h*i': 4, 'h*h': 4, 'h*kv': 4}, {'h*i': 4}),
            ({'N*h': 32, 'N*i': 4, 'a*N*s': 6, 'N': 8, 'h*i': 8, 'h*h': 4, 'h*kv': 4}, {'h*i': 4}),
            ({'N*h': 30, 'a*N*s': 6, 'N': 8, 'h*i': 6, 'h*h': 4, 'h*kv': 4}, {'h*i': 8}),
            ({'N*h': 16, 'a*N*s': 12, 'N': 4, 'h*h': 2, 'h*kv': 4}, {'h*i': 12, 'h*h': 4, 'h': 4}),
            ({'N*h': 8, 'N': 4, 'h*h': 6}, {'h*i': 12, 'h*h': 4, 'h*kv': 8, 'h': 4}),
        ),
    ),
    "llama/bf16-mixed/sdpa/kept": (
        {'N*h': 4},
        (
            ({'N*i': 4, 'h*i': -2}, {'h*i': 4}),
            ({'N*h': 2, 'N*i': -4, 'h*i': 2}, {'h*i': 4}),
            ({'N*i': -8}, {'h*i': 8}),
            ({'N*h': -18, 'N*i': -8, 'N*kv': -4, 'a*N': -4, 'N': -4, 'h*i': -6, 'h*h': 2, 'h*kv': -4}, {'h*i': 12, 'h*h': 4, 'h*kv': 8, 'h': 4}),
        ),
    ),
    "llama/bf16-mixed/sdpa/ckpt": (
        {'N*h': 4},
        (
            ({'N*h': 26, 'N*i': 12, 'N*kv': 4, 'a*N': 4, 'N': 8, 'h*i': 4, 'h*h': 4, 'h*kv': 4}, {'h*i': 4}),
            ({'N*h': 28, 'N*i': 4, 'N*kv': 4, 'a*N': 4, 'N': 8, 'h*i': 8, 'h*h': 4, 'h*kv': 4}, {'h*i': 4}),
            ({'N*h': 26, 'N*kv': 4, 'a*N': 4, 'N': 8, 'h*i': 6, 'h*h': 4, 'h*kv': 4}, {'h*i': 8}),
            ({'N*h': 8, 'N': 4, 'h*h': 6}, {'h*i': 12, 'h*h': 4, 'h*kv': 8, 'h': 4}),
        ),
    ),
    "qwen2/bf16-mixed/eager/kept": (
        {'N*h': 4},
        (
            ({'N*i': 4, 'h*i': -2}, {'h*i': 4}),
            ({'N*h': 2, 'N*i': -4, 'h*i': 2}, {'h*i': 4}),
            ({'N*i': -8}, {'h*i': 8}),
            ({'N*h': -14, 'N*i': -8, 'a*N*s': 6, 'N': -4, 'h*i': -6, 'h*h': -2}, {'h*i': 12, 'h*h': 4, 'h': 4}),
            ({'N*h': -22, 'N*i': -8, 'a*N*s': -6, 'N': -4, 'h*i': -6, 'h*h': 2, 'h*kv': -4, 'h': 2}, {'h*i': 12, 'h*h': 4, 'h*kv': 8, 'h': 4, 'kv': 8}),
        ),
    ),
    "qwen2/bf16-mixed/eager/ckpt": (
        {'N*h': 4},
        (
            ({'N*h': 30, 'N*i': 12, 'a*N*s': 6, 'N': 8, 'h*i': 4, 'h*h': 4, 'h*kv': 4}, {'h*i': 4}),
            ({'N*h': 32, 'N*i': 4, 'a*N*s': 6, 'N': 8, 'h*i': 8, 'h*h': 4, 'h*kv': 4}, {'h*i': 4}),
            ({'N*h': 30, 'a*N*s': 6, 'N': 8, 'h*i': 6, 'h*h': 4, 'h*kv': 4}, {'h*i': 8}),
            ({'N*h': 16, 'a*N*s': 12, 'N': 4, 'h*h': 2, 'h*kv': 4}, {'h*i': 12, 'h*h': 4, 'h': 4}),
            ({'N*h': 8, 'N': 4, 'h*h': 6, 'h': 2}, {'h*i': 12, 'h*h': 4, 'h*kv': 8, 'h': 4, 'kv': 8}),
        ),
    ),
    "qwen2/bf16-mixed/sdpa/kept": (
        {'N*h': 4},
        (
            ({'N*i': 4, 'h*i': -2}, {'h*i': 4}),
            ({'N*h': 2, 'N*i': -4, 'h*i': 2}, {'h*i': 4}),
            ({'N*i': -8}, {'h*i': 8}),
            ({'N*h': -18, 'N*i': -8, 'N*kv': -4, 'a*N': -4, 'N': -4, 'h*i': -6, 'h*h': 2, 'h*kv': -4, 'h': 2}, {'h*i': 12, 'h*h': 4, 'h*kv': 8, 'h': 4, 'kv': 8}),
        ),
    ),
    "qwen2/bf16-mixed/sdpa/ckpt": (
        {'N*h': 4},
        (
            ({'N*h': 26, 'N*i': 12, 'N*kv': 4, 'a*N': 4, 'N': 8, 'h*i': 4, 'h*h': 4, 'h*kv': 4}, {'h*i': 4}),
            ({'N*h': 28, 'N*i': 4, 'N*kv': 4, 'a*N': 4, 'N': 8, 'h*i': 8, 'h*h': 4, 'h*kv': 4}, {'h*i': 4}),
            ({'N*h': 26, 'N*kv': 4, 'a*N': 4, 'N': 8, 'h*i': 6, 'h*h': 4, 'h*kv': 4}, {'h*i': 8}),
            ({'N*h': 8, 'N': 4, 'h*h': 6, 'h': 2}, {'h*i': 12, 'h*h': 4, 'h*kv': 8, 'h': 4, 'kv': 8}),
        ),
    ),
}


def features(spec: ModelSpec, batch: int, seq: int) -> dict[str, int]:
    """The products the moments are linear in."""
    n = batch * seq
    h, i, a = spec.hidden, spec.intermediate, spec.heads
    kv = spec.kv_heads * spec.head_dim
    return {"N*h": n * h, "N*i": n * i, "N*kv": n * kv, "a*N*s": a * n * seq, "a*N": a * n, "N": n,
            "b*s*s": batch * seq * seq, "h*i": h * i, "h*h": h * h, "h*kv": h * kv, "h": h, "kv": kv, "i": i}


def table_key(spec: ModelSpec, checkpointed: bool, autocast: str = "") -> str:
    family = "gpt2" if spec.family == "gpt2" else "llama"
    precision = "fp32" if spec.bytes_per_element == 4 else "bf16"
    if autocast:
        family, precision = spec.family, f"{autocast}-mixed"
    return f"{family}/{precision}/{spec.attn}/{'ckpt' if checkpointed else 'kept'}"


def evaluate(form: Form, values: dict[str, int]) -> int:
    return int(sum(coef * values[name] for name, coef in form.items()))


def layer_moments(spec: ModelSpec, batch: int, seq: int, checkpointed: bool,
                  autocast: str = "") -> tuple[int, list[tuple[int, int]]]:
    """(bytes flowing in at the layer's start, [(activations above that start, the layer's gradients
    accumulated so far)] for each moment) of one layer's backward."""
    start, moments = MOMENTS[table_key(spec, checkpointed, autocast)]
    values = features(spec, batch, seq)
    return evaluate(start, values), [(evaluate(m, values), evaluate(g, values)) for m, g in moments]
