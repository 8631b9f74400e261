"""Stacks whose decoder layers are not all alike.

Gemma-2 alternates sliding-window and global attention layers, Gemma-3 has five sliding ones to each
global one, SmolLM3 leaves rotary embeddings out of every fourth layer, Qwen2/Qwen3 may slide above
``max_window_layers``.  transformers says which layer is which in per-layer config lists (``layer_types``,
``no_rope_layers``, ``mlp_layer_types``) and lists of layer indices (``mlp_only_layers``, ``moe_layers``),
which the config class derives from the depth when the config gives none.  A layer's *kind* is what those
lists say of it.

:mod:`.extrapolate` fits 3- and 5-layer copies, which are the stack's first layers: Gemma-3's first five
all slide, so its copies never hold a global layer, its masks or its rotary tables, and a fit of them
misses all of that.  Such a stack is refused there, with its pattern (:func:`pattern`) in the reason.
"""

from __future__ import annotations

import functools

from ...point.case import ModelSpec
from ...sources.configs import LAYER_INDEX_KEYS, PER_LAYER_KEYS


def _lists(spec: ModelSpec) -> dict[str, list]:
    """Per-layer key -> its value for each of the spec's layers, as transformers' config class has it."""
    from ...train.models import hf_config

    cfg = hf_config(spec)
    out = {}
    for key in PER_LAYER_KEYS:
        value = getattr(cfg, key, None)
        if isinstance(value, (list, tuple)) and len(value) == spec.layers:
            out[key] = list(value)
    for key in LAYER_INDEX_KEYS:
        value = getattr(cfg, key, None)
        if isinstance(value, (list, tuple)) and value:
            members = set(value)
            out[key] = [i in members for i in range(spec.layers)]
    return out


@functools.lru_cache(maxsize=64)
def layer_kinds(spec: ModelSpec) -> tuple[str, ...]:
    """Each decoder layer's kind, named by the per-layer keys whose values differ between layers
    (``layer_types=sliding_attention``); all alike: one kind, ``""``."""
    lists = _lists(spec)
    varying = [k for k, v in lists.items() if len(set(map(str, v))) > 1]
    return tuple(",".join(f"{k}={lists[k][i]}" for k in varying) for i in range(spec.layers))


def pattern(kinds: tuple[str, ...]) -> str:
    """The stack's layers in words, runs collapsed: ``5 x layer_types=sliding_attention, 1 x ...``."""
    runs: list[list] = []
    for k in kinds:
        if runs and runs[-1][1] == k:
            runs[-1][0] += 1
        else:
            runs.append([1, k])
    text = ", ".join(f"{n} x {k}" for n, k in runs[:6])
    return text + (f", ... ({len(kinds)} layers)" if len(runs) > 6 else "")
