"""Which k layers to checkpoint, for the counts ``every_n_layers`` cannot give.

``every_n_layers`` = 1…L checkpoints ⌈L/n⌉ layers, so of an L-layer model's counts it reaches only a few
(32 layers: 32, 16, 11, 8, 7, 6, 5, 4, 3, 2); a layer set reaches every k.  Which k layers, when the layers
are alike?  The estimate decides, per k, among three candidates: the first k (``0..k-1``), k spread evenly,
and the last k.  The FLOPs are the same for all three (k layers recomputed), so the set with the lowest
estimated peak is the better one; ties keep the first k.

What the estimate says about the choice (``tests/unit/test_layer_sets_plan.py``): while the peak is the
head's backward (a large vocabulary: llama-8b, llama-1b at their usual lengths) every set of k layers
peaks alike; where the peak falls inside the layers' backward (llama-small at 512 tokens), the first k
peak lowest.  Backward reaches the bottom layers last, after the top ones have freed theirs: a bottom
layer's recomputation happens when the least is alive, and a checkpointed bottom layer keeps only its input
through every moment above it, while a checkpointed top layer rebuilds all it keeps at the moment most is
alive (every layer below still holds its activations).
"""

from __future__ import annotations

from collections.abc import Callable

from ...point.strategy import checkpointed_layers


def every_n_counts(layers: int) -> set[int]:
    """How many layers some ``every_n_layers`` checkpoints: ⌈L/n⌉ for n = 1…L."""
    return {len(checkpointed_layers(layers, n)) for n in range(1, layers + 1)}


def candidates(layers: int, k: int) -> list[tuple[int, ...]]:
    """The first k layers, k spread evenly (``round(j·L/k)``), the last k: distinct, in that order."""
    out = [tuple(range(k)), tuple(sorted({round(j * layers / k) for j in range(k)})), tuple(range(layers - k, layers))]
    return list(dict.fromkeys(c for c in out if len(c) == k))


def best_set(layers: int, k: int, peak: Callable[[tuple[int, ...]], int]) -> tuple[int, ...]:
    """The candidate of `k` layers whose estimated `peak` is lowest (the first k on a tie)."""
    found = candidates(layers, k)
    peaks = [peak(c) for c in found]
    return found[peaks.index(min(peaks))]


def layer_set_strategies(layers: int, peak: Callable[[tuple[int, ...]], int]) -> list[tuple[int, ...]]:
    """For each count k in 1…L-1 that no ``every_n_layers`` gives, the best set of k layers (:func:`best_set`)."""
    reached = every_n_counts(layers)
    return [best_set(layers, k, peak) for k in range(1, layers) if k not in reached]
