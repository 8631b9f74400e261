"""The memory step of a compiled point: the probes that leave ``torch.compile``'s graphs running.

Under any ``TorchDispatchMode`` dynamo does not run a compiled frame: the model runs eagerly (the
live-storage tracker, the op recorder and the FLOP counter are all dispatch modes).  Measured on
llama-tiny, sdpa, seq 128, budget 1.0: under a dispatch mode the step dispatched ``aten.silu`` and
``aten.silu_backward`` (ops inductor fuses away), and the allocator's peak growth was the eager step's,
2,748,936 B against the compiled step's 2,374,676 B.  So the memory step of a compiled point keeps them
all off and measures with what does not change the program:

- CPU: the allocator meter alone (:class:`~ckptbench.measure.allocator.AllocatorMeter`: c10's CPU
  allocator events through the profiler, which sees inductor's buffers: they come from that allocator).
  Its growth plus the bytes live at the step's start (parameters, optimizer state, the batch, sized as the
  tracker sizes them, without entering it) is the peak.  There is no second meter: the record says so,
  and its memory is unchecked.  The profiler also counts the compiled regions the step ran, so the record
  shows the step ran the compiled graphs (``compiled_regions_run``, ``compiled_backward_run``);
- CUDA: the caching allocator's counters (:class:`~ckptbench.measure.memory.CudaMemoryProbe`, no mode).

Beside them, torch's saved-tensor hooks (not a dispatch mode: dynamo runs the compiled graph under them)
count the bytes the compiled forward saved for its backward (parameters apart): what the partitioner
chose to keep, at this budget.
"""

from __future__ import annotations

import gc

import torch

from ..measure.allocator import AllocatorMeter
from ..measure.memory import CudaMemoryProbe
from ..measure.storage import LiveStorageTracker, storage_key, track_training_state

COMPILED_EVENTS = ("Torch-Compiled Region", "CompiledFunctionBackward")
WHY_ONE_METER = ("torch.compile runs a frame eagerly under a TorchDispatchMode, so the live-storage tracker "
                 "would measure another program: the allocator meter alone measured this step")


class CompiledStepMarks:
    """The marks of :class:`~ckptbench.run.memory_step.MemoryStepMarks`, for a compiled model."""

    def __init__(self) -> None:
        self.active = False

    def allocations(self) -> None:
        """No heap-fault replay: a compiled step keeps no op trace, so its step time is not modelled."""
        return None

    def start(self, model, optimizer, inputs: list[torch.Tensor]) -> None:
        from torch._dynamo.utils import counters

        gc.collect()
        self.device = inputs[0].device
        self.frames = counters["frames"]["total"]
        self.param_keys = {storage_key(p) for p in model.parameters()}
        self.saved: dict[int, int] = {}
        self.hooks = None
        if self.device.type == "cuda":
            self.probe = CudaMemoryProbe(model, optimizer, inputs)
            self.probe.start()
        else:
            start = LiveStorageTracker()  # only sizes the storages live at the start: never entered
            track_training_state(start, model, optimizer)
            for p in model.parameters():
                if p.grad is not None:
                    start.track(p.grad, "grads")
            for t in inputs:
                start.track(t, "activations")
            self.start_bytes = start.total + start.host
            self.params_bytes, self.optimizer_bytes = start.by_category["params"], start.by_category["optimizer"]
            self.meter = AllocatorMeter(COMPILED_EVENTS)
            self.meter.start(frozenset(start.held_addresses))
        self.micro = 0
        self.active = True

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        key = storage_key(t)
        if key is not None and key not in self.param_keys:
            self.saved[key] = t.untyped_storage().nbytes()
        return t

    def forward_begin(self) -> None:
        if self.micro == 0:
            self.hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
            self.hooks.__enter__()

    def forward_end(self) -> None:
        if self.micro == 0 and self.hooks is not None:
            self.hooks.__exit__(None, None, None)
            self.hooks = None
            if self.device.type == "cpu":
                self.meter.mark("forward-end")
        self.micro += 1

    def backward_end(self) -> None:
        pass

    def grad_clip_begin(self) -> None:
        pass

    def optimizer_begin(self) -> None:
        pass

    def stop(self) -> None:
        if not self.active:
            return
        self.active = False
        if self.hooks is not None:
            self.hooks.__exit__(None, None, None)
            self.hooks = None
        if self.device.type == "cuda":
            self.probe.stop()
        else:
            self.meter.stop()

    def result(self) -> dict:
        from torch._dynamo.utils import counters

        out = {"compiled_saved_bytes": sum(self.saved.values()),
               "compiled_saved_tensors": len(self.saved),
               "memory_step_recompiles": counters["frames"]["total"] - self.frames,
               "flop_counter": "not run: a dispatch mode would make torch.compile run the model eagerly"}
        if self.device.type == "cuda":
            res = self.probe.result().to_dict()
            return {**res, "memory_probe": self.probe.kind, **out}
        meter = self.meter
        peak = None if meter.growth is None else self.start_bytes + meter.growth
        after_forward = meter.at_marks.get("forward-end")
        if after_forward is not None:  # the allocator's growth up to the forward's end, on the start's bytes
            after_forward += self.start_bytes
            out["mem_after_forward_bytes"] = after_forward
            out["activations_after_forward_bytes"] = after_forward - self.params_bytes - self.optimizer_bytes
        return {"params_bytes": self.params_bytes, "optimizer_bytes": self.optimizer_bytes,
                "peak_bytes": peak, "peak_breakdown": {"params": self.params_bytes, "optimizer": self.optimizer_bytes},
                "tracked_start_bytes": self.start_bytes, **meter.result(),
                "memory_probe": "cpu-allocator-only", "memory_note": WHY_ONE_METER,
                "compiled_regions_run": meter.names["Torch-Compiled Region"],
                "compiled_backward_run": meter.names["CompiledFunctionBackward"], **out}


def measured_only_flops(case, figures: dict) -> dict:
    """The FLOP formula's `figures`; for a compiled point only the model's FLOPs: what the partitioner
    chose to recompute is not known to the formula, and no counter ran (a dispatch mode would make the
    compiled model run eagerly), so its recompute FLOPs are not given."""
    if not case.compiled:
        return figures
    out = {k: v for k, v in figures.items()
           if k not in ("recompute_flops_per_step", "hardware_flops_per_step", "ideal_recompute_ratio", "hfu")}
    out["recompute_flops_note"] = ("compiled: the partitioner chose what backward recomputes; neither the formula "
                                   "nor a counter saw it, so recompute FLOPs are not given")
    return out
