"""Which layers are checkpointed, and what a checkpointed layer keeps: the strategy beyond every n-th layer.

transformers' ``activation_checkpointing_enable(every_n_layers=n)`` checkpoints the blocks ``i % n == 0``.
A :class:`Recompute` names what that rule cannot say:

- ``layers``: any set of block indices (``(0, 1, 2, 5)``), sorted and unique; empty means ``every_n_layers``
  decides.  The train side switches checkpointing on through transformers for the whole model, then sets
  each ``GradientCheckpointingLayer``'s flag the way transformers' own ``_set_gradient_checkpointing`` does,
  so the checkpoint call is still transformers' (non-reentrant, with offload where asked);
- ``sac``: selective activation checkpointing, a policy of :data:`SAC_POLICIES` handed to torch's
  non-reentrant checkpoint as ``context_fn`` (``create_selective_checkpoint_contexts``): inside each
  checkpointed layer the outputs of the named operators are kept in forward, every other operator runs
  again in backward.  "" is plain checkpointing (everything but the layer's input is recomputed);
- ``offload``: which offload runs where a Case offloads (``Case.offload``): "" is transformers' own
  (``save_on_cpu(pin_memory=True)`` around each checkpointed layer), ``"streamed"`` the saved inputs copied
  to pinned host memory on a side stream and prefetched one layer ahead in backward
  (:mod:`ckptbench.train.streamed`).  It means nothing without ``Case.offload``.
- ``compile_budget``: ``torch.compile`` of the whole model (inductor), with torch's
  ``_functorch.config.activation_memory_budget`` at this value (0: recompute all the partitioner can,
  1: save what its default saves).  The partitioner, not transformers, decides what backward runs again,
  so such a point checkpoints nothing through transformers (every_n_layers 0, no layer set, no SAC).

Nothing here imports torch (operators are named as ``str(op.overloadpacket)`` prints them), so the suite
validator, the estimate and the names stay importable without it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

# the fused attention kernels torch may run for sdpa (CPU flash, CUDA flash / memory-efficient / cuDNN)
SDPA_OPS = ("aten._scaled_dot_product_flash_attention_for_cpu", "aten._scaled_dot_product_flash_attention",
            "aten._scaled_dot_product_efficient_attention", "aten._scaled_dot_product_cudnn_attention")
# policy name -> the operators whose outputs a checkpointed layer keeps (every other one is recomputed)
SAC_POLICIES: dict[str, tuple[str, ...]] = {
    # every matmul and the attention kernel: backward recomputes only the cheap elementwise ops (norms,
    # RoPE, activations, residual adds), so no matmul FLOP is spent twice
    "save-matmuls": ("aten.mm", "aten.addmm", "aten.bmm", *SDPA_OPS),
    # the attention alone (sdpa's kernel; eager's two batched matmuls, the scores and the weighted values):
    # the projections and the MLP are recomputed
    "save-attention": ("aten.bmm", *SDPA_OPS),
    # nothing: what plain checkpointing recomputes, through torch's selective-checkpoint machinery
    "save-nothing": (),
}
# the offload kinds beside transformers' own ("" in Recompute.offload)
OFFLOAD_KINDS = ("streamed",)


@dataclass(frozen=True)
class Recompute:
    """What is checkpointed beyond ``every_n_layers``: an explicit layer set and a SAC policy (see the
    module's text).  At its defaults it adds nothing, and a Case's id leaves it out."""

    layers: tuple[int, ...] = ()
    sac: str = ""
    offload: str = ""  # "" transformers' offload (where Case.offload), or one of OFFLOAD_KINDS
    compile_budget: float | None = None  # torch.compile's activation memory budget; None: eager

    @classmethod
    def from_dict(cls, data: dict) -> Recompute:
        budget = data.get("compile_budget")
        return cls(layers=tuple(data.get("layers", ())), sac=data.get("sac", ""), offload=data.get("offload", ""),
                   compile_budget=None if budget is None else float(budget))

    def to_dict(self) -> dict:
        out = asdict(self)
        out["layers"] = list(self.layers)
        if not self.offload:
            del out["offload"]  # transformers' offload: the dict points had before there was a choice
        if self.compile_budget is None:
            del out["compile_budget"]  # eager points keep the ids they had before compile budgets
        return out


def checkpointed_layers(layers: int, every_n_layers: int) -> list[int]:
    """What ``every_n_layers`` means in transformers: layer i is checkpointed when i % n == 0; 0 is off.
    The one statement of that rule here: the estimate, the FLOP count and a Case all ask this function."""
    if every_n_layers <= 0:
        return []
    return [i for i in range(layers) if i % every_n_layers == 0]


def layer_set_name(layers) -> str:
    """``layers-0,1,2,5``; a run of four or more consecutive layers is written ``first…last``
    (``layers-0…20``), so a deep model's set stays a name."""
    parts: list[str] = []
    run: list[int] = []
    for i in [*layers, None]:
        if run and (i is None or i != run[-1] + 1):
            parts += [f"{run[0]}…{run[-1]}"] if len(run) >= 4 else [str(j) for j in run]
            run = []
        if i is not None:
            run.append(i)
    return "layers-" + ",".join(parts)


def checkpointing_name(every_n_layers: int, offload: bool, recompute: Recompute | None = None) -> str:
    """Short name of a checkpointing setting: none, full, every-2, layers-0,1,2,5, sac-save-matmuls,
    every-2+sac-save-attention, full+offload, full+offload-streamed, compile-budget-0.5 ..."""
    if recompute is not None and recompute.compile_budget is not None:
        return f"compile-budget-{recompute.compile_budget:g}"
    layers, sac = (recompute.layers, recompute.sac) if recompute else ((), "")
    kind = recompute.offload if recompute else ""
    name = ("none" if every_n_layers == 0 and not layers else layer_set_name(layers) if layers else
            "full" if every_n_layers == 1 else f"every-{every_n_layers}")
    if sac:
        name = f"sac-{sac}" if name == "full" else f"{name}+sac-{sac}"
    return name + offload_suffix(offload, kind)


def offload_suffix(offload: bool, kind: str = "") -> str:
    """What a name adds for its offload: ``+offload`` (transformers'), ``+offload-streamed``, or nothing."""
    return f"+offload-{kind}" if offload and kind else "+offload" if offload else ""


def layer_set_problem(value, depth: int) -> str:
    """Why `value` is not a layer set of a `depth`-layer model ("" when it is one): a non-empty list of
    integer block indices, each in ``0 .. depth-1``, unique, in increasing order."""
    if not isinstance(value, list) or not value:
        return f"each value must be a non-empty list of layer indices, got {value!r}"
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in value):
        return f"layer indices must be integers, got {value!r}"
    bad = [i for i in value if not 0 <= i < depth]
    if bad:
        return f"layer {bad[0]} is out of range: the model's layers are 0..{depth - 1}"
    if len(set(value)) != len(value):
        return f"{value!r} names a layer twice"
    if value != sorted(value):
        return f"{value!r} is not in increasing order (write {sorted(value)!r})"
    return ""


def compile_budget_problem(value) -> str:
    """Why `value` is not an activation memory budget ("" when it is one): a number in [0, 1]."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"each value must be a number in [0, 1], got {value!r}"
    if not 0 <= value <= 1:
        return f"{value!r} is outside [0, 1] (0: recompute all the partitioner can, 1: its default)"
    return ""
