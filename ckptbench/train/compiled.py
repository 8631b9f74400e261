"""``torch.compile`` of a point's model at an activation memory budget (``Recompute.compile_budget``).

The budget is ``torch._functorch.config.activation_memory_budget``, read by the min-cut partitioner when
AOTAutograd splits the joint graph into forward and backward: at compile time, i.e. during the first step
(the backward graph too is lowered there).  It is therefore held in force around every step the loop
runs, so a recompilation, should one happen, would see the same budget.  Graphs compiled at another
budget are never reused: dynamo's in-process caches are reset before the model is compiled, and the
on-disk caches (inductor's FX graph cache, AOTAutograd's cache) key their entries on the functorch config,
budget included (``AOTAutogradCacheDetails.autograd_config``).  Each sweep point also runs in its own
worker process.

What compiling cost is recorded apart from the step times: the first step's wall time (compile + run),
dynamo's own count of compile seconds (``calculate_time_spent``: frame and backward compilation), the
graphs, graph breaks and recompilations dynamo counted, and whether the on-disk caches answered.  The
timed steps come after the memory step; a recompilation anywhere after the first step is counted.
"""

from __future__ import annotations

import time

import torch


def budget_in_force(budget: float):
    """The partitioner's activation memory budget for the steps run inside."""
    return torch._functorch.config.patch(activation_memory_budget=float(budget))


class CompiledModel:
    """The compiled module of `model` and the account of its compilation.  ``step(fn)`` runs one step
    (``fn()``) under the budget, timing the first."""

    def __init__(self, model: torch.nn.Module, budget: float):
        from torch._dynamo.utils import counters

        torch._dynamo.reset()  # nothing compiled earlier in this process (another budget) is reused
        counters.clear()
        self.budget = float(budget)
        # one shape per point (the batch is fixed): static shapes, so no dynamic-shape recompilation
        self.module = torch.compile(model, dynamic=False)
        self.first_step_s: float | None = None
        self._after_first: dict | None = None

    def step(self, fn):
        with budget_in_force(self.budget):
            if self.first_step_s is not None:
                return fn()
            t0 = time.perf_counter()
            out = fn()
            self.first_step_s = time.perf_counter() - t0
            self._after_first = dynamo_counts()
            return out

    def facts(self) -> dict:
        """The record's account of compiling (see the module's text)."""
        from torch._dynamo.utils import calculate_time_spent

        now = dynamo_counts()
        first = self._after_first or now
        spent = calculate_time_spent()
        return {
            "compile_budget": self.budget,
            "compile_backend": "inductor",
            "compile_first_step_s": self.first_step_s,
            "compile_time_s": spent.get("total_wall_time"),
            "compile_time_breakdown_s": {k: v for k, v in spent.items() if k != "total_wall_time"},
            "compile_graphs": now["unique_graphs"],
            "compile_graph_breaks": now["graph_breaks"],
            # frames dynamo converted after the first step: a recompilation (0 when every later step,
            # the memory step included, ran the graphs the first step compiled)
            "compile_recompiles": now["frames"] - first["frames"],
            "compile_caches": now["caches"],
        }


def dynamo_counts() -> dict:
    from torch._dynamo.utils import counters

    caches = {f"{table}.{key}": n for table in ("inductor", "aot_autograd") for key, n in counters[table].items()
              if "cache" in key}
    return {"frames": counters["frames"]["total"], "unique_graphs": counters["stats"]["unique_graphs"],
            "graph_breaks": sum(counters["graph_break"].values()), "caches": caches}
