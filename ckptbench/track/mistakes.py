"""The mistakes users make with checkpointing and offload, named in one line each from their run's record.

Each is read from what the run did (the memory step's probes) or from the settings the objects hold, never
from what ckptbench expected of them:

- ``nothing-recomputed``: checkpointing is on for some blocks, yet backward ran some or all of them not
  again (with reentrant checkpointing, when no input of a block requires grad, torch skips the block's
  backward altogether: under LoRA, inputs not made to require grad);
- ``reentrant-frozen-embeddings``: ``use_reentrant=True`` with frozen input embeddings and nothing making
  the embeddings' output require grad: the checkpointed blocks' parameters get no gradient;
- ``peak-in-optimizer``: checkpointing is on, but the step's peak is the optimizer's, where no activation is
  live: checkpointing cannot lower it (it only costs recomputation);
- ``offload-unpinned``: offload is on without pinned host memory: each copy is a synchronous pageable one;
- ``output-held``: the loop keeps the model's output (its logits) through the backward (:mod:`.held`).
"""

from __future__ import annotations

from .inspect import Seen

MIB = 2**20


def mistakes(seen: Seen, record: dict) -> list[dict]:
    """``[{"name", "line"}]``, one per mistake the run shows (none: [])."""
    case = seen.case
    m = record.get("measurement") or {}
    out: list[dict] = []
    layers = case.checkpointed_layers
    missing = sorted(set(layers) - set(m.get("recomputed_layers") or []))
    if missing:
        which = "none of them" if len(missing) == len(layers) else f"not layers {missing}"
        out.append({"name": "nothing-recomputed", "line": (
            f"checkpointing is on for layers {layers} but backward recomputed {which}: those layers' "
            "parameters got no gradient"
            + (" (use_reentrant=True and their inputs do not require grad: call "
               "model.enable_input_require_grads() or pass use_reentrant=False)" if seen.use_reentrant else ""))})
    if seen.use_reentrant and seen.frozen_embeddings and not seen.inputs_require_grad_hook:
        out.append({"name": "reentrant-frozen-embeddings", "line": (
            "use_reentrant=True with frozen input embeddings: the checkpointed layers' inputs do not require "
            "grad, so their parameters get no gradient; use gradient_checkpointing_kwargs="
            "{'use_reentrant': False} or model.enable_input_require_grads()")})
    if layers and m.get("peak_phase") == "optimizer":
        out.append({"name": "peak-in-optimizer", "line": (
            f"checkpointing is on but the step's peak ({m['peak_bytes'] / MIB:.2f} MiB) is in the optimizer "
            "step, where no activation is live: checkpointing cannot lower it, only costs recomputation")})
    if case.offload and m.get("offload_pinned") is False:
        out.append({"name": "offload-unpinned", "line": (
            "offload is on without pinned host memory: every copy to and from the host is a synchronous "
            f"pageable copy{' (' + m['offload_note'] + ')' if m.get('offload_note') else ''}")})
    held = m.get("loop_held_output_bytes")
    if held:
        out.append({"name": "output-held", "line": (
            f"the loop keeps the model's output through the backward ({held / MIB:.2f} MiB, its logits): "
            "take the loss alone (loss = model(**batch).loss) or del the output before the backward")})
    return out
