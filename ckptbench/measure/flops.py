"""FLOPs a step really ran, counted op by op with torch's own FLOP formulas: forward, backward, recompute.

``torch.utils.flop_counter`` knows the FLOPs of every matmul, convolution and fused attention kernel from
their shapes.  :class:`FlopCounter` applies those formulas to each op the step dispatches and files the
count under the phase the caller names (``forward`` / ``backward``).  Inside backward, an op that runs
with grad mode on is the forward of a checkpointed layer being recomputed (autograd runs backward
functions with grad mode off; non-reentrant checkpoint recomputes under ``enable_grad``), so it is filed
as ``recompute``: the recomputation is seen, including where it stops early, not assumed.

CPU's fused attention kernels (``_scaled_dot_product_flash_attention_for_cpu`` and its backward) are not
in torch's table; they are the same product of shapes as the CUDA flash kernels and are counted with
the same formulas.  torch before 2.13 counts attention only where the keys and values have as many heads as
the queries; grouped-query attention (each key/value head shared by a group of query heads: Llama 3,
Qwen2) does the arithmetic of the heads repeated, so there its kernels are counted on the shapes with the
key/value heads repeated (:func:`_grouped_heads`).  Like the memory tracker this slows every op, so it runs on the memory steps only.
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map
from torch.utils.flop_counter import flop_registry

PHASES = ("forward", "backward", "recompute", "optimizer")


def _grouped_heads(formula):
    """An attention kernel's formula that also counts grouped-query attention where torch's own refuses it
    (an AssertionError on key/value shapes with fewer heads than the query's, before torch 2.13): each
    4-D tensor that differs from the query's shape in one dimension alone, by a whole factor (the heads),
    is counted at the query's shape.  torch's formulas read shapes only, and take a shape where a tensor
    was."""

    def count(*args, out_val=None, **kwargs):
        try:
            return formula(*args, out_val=out_val, **kwargs)
        except AssertionError:
            four = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor) and t.dim() == 4]
            if not four:
                raise
            query = max(four, key=lambda t: t.numel()).shape

            def widened(x):
                if not (isinstance(x, torch.Tensor) and x.dim() == 4):
                    return x
                differ = [i for i in range(4) if x.shape[i] != query[i]]
                if len(differ) == 1 and query[differ[0]] % x.shape[differ[0]] == 0:
                    return query
                return x

            return formula(*tree_map(widened, args), out_val=out_val, **tree_map(widened, kwargs))

    return count


def _registry() -> dict:
    table = dict(flop_registry)
    aten = torch.ops.aten
    for cpu, cuda in (("_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention"),
                      ("_scaled_dot_product_flash_attention_for_cpu_backward",
                       "_scaled_dot_product_flash_attention_backward")):
        if hasattr(aten, cpu) and getattr(aten, cuda) in table:
            table[getattr(aten, cpu)] = table[getattr(aten, cuda)]
    for op in list(table):
        if "attention" in str(op):
            table[op] = _grouped_heads(table[op])
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
