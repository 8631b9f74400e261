"""FLOPs a step really ran, counted op by op with torch's own FLOP formulas: forward, backward, recompute.

``torch.utils.flop_counter`` knows the FLOPs of every matmul, convolution and fused attention kernel from
their shapes.  :class:`FlopCounter` applies those formulas to each op the step dispatches and files the
count under the phase the caller names (``forward`` / ``backward``).  Inside backward, an op that runs
with grad mode on is the forward of a checkpointed layer being recomputed (autograd runs backward
functions with grad mode off; non-reentrant checkpoint recomputes under ``enable_grad``), so it is filed
as ``recompute``: the recomputation is seen, including where it stops early, not assumed.

CPU's fused attention kernels (``_scaled_dot_product_flash_attention_for_cpu`` and its backward) are not
in torch's table; they are the same product of shapes as the CUDA flash kernels and are counted with
the same formulas.  Like the memory tracker this slows every op, so it runs on the memory steps only.
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry

PHASES = ("forward", "backward", "recompute", "optimizer")


def _registry() -> dict:
    table = dict(flop_registry)
    aten = torch.ops.aten
    for cpu, cuda in (("_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention"),
                      ("_scaled_dot_product_flash_attention_for_cpu_backward",
                       "_scaled_dot_product_flash_attention_backward")):
        if hasattr(aten, cpu) and getattr(aten, cuda) in table:
            table[getattr(aten, cpu)] = table[getattr(aten, cuda)]
    return table


class FlopCounter(TorchDispatchMode):
    """Counts FLOPs per phase; ``phase`` is set by the step loop (``forward``, ``backward``, ``optimizer``)."""

    def __init__(self) -> None:
        super().__init__()
        self.registry = _registry()
        self.phase = "forward"
        self.flops = dict.fromkeys(PHASES, 0)
        self.by_op: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        formula = self.registry.get(func._overloadpacket)
        if formula is not None:
            count = int(formula(*args, **kwargs, out_val=out))
            phase = "recompute" if self.phase == "backward" and torch.is_grad_enabled() else self.phase
            self.flops[phase] += count
            name = str(func._overloadpacket).removeprefix("aten.")
            self.by_op[name] = self.by_op.get(name, 0) + count
        return out

    def attention_kernels(self) -> list[str]:
        """The fused attention kernels that ran (empty: attention ran as separate matmuls, eager or
        sdpa's math fallback)."""
        return sorted(op for op in self.by_op if op.startswith("_scaled_dot_product_") and "backward" not in op)

    def result(self) -> dict:
        return {"counted_flops": dict(self.flops), "counted_flops_by_op": dict(self.by_op),
                "attention_kernels": self.attention_kernels(),
                "flop_counter": "torch.utils.flop_counter formulas per dispatched op"}
