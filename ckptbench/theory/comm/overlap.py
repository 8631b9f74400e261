"""How much of a step's communication the step waits for: FSDP2's and DDP's overlap with compute.

Compute per micro-batch is described layer by layer (:class:`LayerCompute`): a decoder layer's forward and
backward, what recomputing a checkpointed layer adds to its backward, and the rest of the model (embedding,
final norm, LM head and loss) before and after the layers.  Collective times are per unit on the link
(:mod:`.network`).

**FSDP2** (``fully_shard`` on each decoder layer and the root, ``reshard_after_forward=True``, FSDP2's
one-unit prefetch).  Forward: layer i+1's all-gather runs while layer i computes; the root's and layer 0's
come first, with nothing to hide behind.  Backward: the last layer's all-gather runs during the LM head's
backward; during layer i's backward (with its recompute first, for a checkpointed layer: recompute lengthens
the backward it hides behind) run layer i−1's all-gather and layer i+1's reduce-scatter, which share the
link; layer 0's and the root's reduce-scatters come last::

    exposed = AG_root + AG + Σ_{i=1}^{L−1} max(0, AG − fwd) + max(0, AG − head_bwd)
              + Σ_{i=0}^{L−1} max(0, [i ≥ 1]·AG + [i ≤ L−2]·RS − bwd_i) + RS + RS_root

**DDP**: gradients all-reduced in buckets (``bucket_cap_mb``, the first 1 MiB) as the backward fills them,
the last bucket (the first parameters: the embedding) after the backward ends::

    exposed = max(T_last, T_all − backward)

**Local SGD** averages the parameters every K steps while the loop waits: all of it is exposed (1/K a step).
"""

from __future__ import annotations

from dataclasses import dataclass

DDP_BUCKET_CAP_BYTES = 25 * 2**20  # torch DDP's bucket_cap_mb default (25 MiB)
DDP_FIRST_BUCKET_BYTES = 1 * 2**20  # dist._DEFAULT_FIRST_BUCKET_BYTES


@dataclass(frozen=True)
class LayerCompute:
    """Seconds of one micro-batch's compute, by where it runs."""

    layers: int
    fwd: float  # one decoder layer's forward
    bwd: float  # one decoder layer's backward (no recompute)
    recompute: float  # added to a checkpointed layer's backward
    checkpointed: tuple[int, ...]
    head_fwd: float = 0.0  # embedding, final norm, LM head and loss: forward
    head_bwd: float = 0.0  # and their backward
    optimizer: float = 0.0  # once a step, nothing to overlap

    @property
    def backward(self) -> float:
        """The whole backward, recompute included."""
        return self.layers * self.bwd + len(self.checkpointed) * self.recompute + self.head_bwd

    @property
    def total(self) -> float:
        return self.layers * self.fwd + self.head_fwd + self.backward + self.optimizer


def fsdp_exposed(c: LayerCompute, ag: float, rs: float, ag_root: float, rs_root: float) -> float:
    """Seconds of FSDP2's collectives per micro-batch that compute does not hide (the module's formula):
    `ag`, `rs` one decoder layer's all-gather and reduce-scatter, `ag_root`, `rs_root` the root unit's."""
    L, ckpt = c.layers, set(c.checkpointed)
    exposed = ag_root + ag + rs + rs_root
    exposed += (L - 1) * max(0.0, ag - c.fwd) + max(0.0, ag - c.head_bwd)
    for i in range(L):
        comm = (ag if i >= 1 else 0.0) + (rs if i <= L - 2 else 0.0)
        exposed += max(0.0, comm - (c.bwd + (c.recompute if i in ckpt else 0.0)))
    return exposed


def ddp_buckets(param_bytes_in_order: list[int], cap: int = DDP_BUCKET_CAP_BYTES,
                first: int = DDP_FIRST_BUCKET_BYTES) -> list[int]:
    """Bucket sizes in the order DDP all-reduces them: parameters taken last-registered first (the order
    the backward produces their gradients), a bucket closed once it holds `cap` bytes (the first `first`)."""
    buckets, current, limit = [], 0, first
    for b in reversed(param_bytes_in_order):
        current += b
        if current >= limit:
            buckets.append(current)
            current, limit = 0, cap
    if current:
        buckets.append(current)
    return buckets


def ddp_exposed(backward_s: float, bucket_s: list[float]) -> float:
    """Seconds of DDP's all-reduces per optimizer step that the last backward does not hide:
    ``max(T_last, T_all − backward)``."""
    if not bucket_s:
        return 0.0
    return max(bucket_s[-1], sum(bucket_s) - backward_s)


def split_by_flops(step_s: float, layers: int, checkpointed: tuple[int, ...]) -> LayerCompute:
    """A step's compute split when the timer gives no phases: every layer alike, its forward a third of its
    FLOPs (backward two thirds, a recompute one forward again), the head and optimizer not apart."""
    f = step_s / (3 * layers + len(checkpointed)) if layers else 0.0
    return LayerCompute(layers, f, 2 * f, f, checkpointed)
