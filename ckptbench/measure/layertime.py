"""Each decoder layer's forward, timed in place during the steps a point times.

The step-time model (:mod:`ckptbench.theory.time.steptime`) predicts a setting's step from a measured step of
the same workload: what checkpointing adds is the recomputed layers' forward, so the forward of every
layer is what a point's steps must show.  :class:`LayerClock` puts a forward pre- and post-hook on each
decoder layer and, between :meth:`~LayerClock.start` and :meth:`~LayerClock.stop` (the schedule's timed
steps), marks both ends of each layer's forward:

- on a CPU with the wall clock (``time.perf_counter``): the step runs on the calling thread, so a layer's
  forward is the time between its two hooks;
- on a GPU with a pair of CUDA events on the current stream, read once the timed steps are over (the
  schedule's timer has synchronised by then): the kernels' time, whatever the host ran ahead.

Only the forward that runs outside autograd's engine is timed (a hook that fires while the engine runs a
backward would be a recomputation: transformers' checkpoint calls the layer's function without its
module hooks, so none fires today).  A step with several micro-batches sums each layer's forwards.  The
hooks cost two clock reads (or two event records) per layer and step, beside forwards of milliseconds.
"""

from __future__ import annotations

import statistics
import time

import torch


def _in_backward() -> bool:
    return torch._C._current_graph_task_id() != -1


class LayerClock:
    """Forward times of `layers` (decoder blocks, in transformers' order) over the steps it is started for."""

    def __init__(self, layers: list, device: torch.device, model: torch.nn.Module | None = None):
        self.cuda = device.type == "cuda"
        self.active = False
        self.steps: list[list[list]] = []  # per step, per layer: the (start, end) marks of its forwards
        self.model_steps: list[list] = []  # per step: the (start, end) marks of the whole model's forwards
        self._open: dict[int, object] = {}
        self.handles = []
        for i, layer in enumerate(layers):
            self.handles.append(layer.register_forward_pre_hook(self._pre(i)))
            self.handles.append(layer.register_forward_hook(self._post(i)))
        self.layers = len(layers)
        if model is not None:
            self.handles.append(model.register_forward_pre_hook(self._pre(-1)))
            self.handles.append(model.register_forward_hook(self._post(-1)))

    def _mark(self):
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def _pre(self, i: int):
        def hook(module, args):
            if self.active and not _in_backward():
                self._open[i] = self._mark()
        return hook

    def _post(self, i: int):
        def hook(module, args, output):
            start = self._open.pop(i, None)
            if self.active and start is not None:
                pairs = self.model_steps[-1] if i < 0 else self.steps[-1][i]
                pairs.append((start, self._mark()))
        return hook

    def start(self) -> None:
        """A timed step begins."""
        self.steps.append([[] for _ in range(self.layers)])
        self.model_steps.append([])
        self.active = True

    def stop(self) -> None:
        """The timed step ended."""
        self.active = False
        self._open.clear()

    def close(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []

    def _seconds(self, pairs: list) -> float:
        if self.cuda:
            return sum(start.elapsed_time(end) / 1e3 for start, end in pairs)
        return sum(end - start for start, end in pairs)

    def result(self) -> dict:
        """The record's ``layer_times``: each layer's median forward over the timed steps (seconds), the
        whole model's, the clock and the steps it saw.  Empty when no timed step ran."""
        if not self.steps:
            return {}
        if self.cuda:
            torch.cuda.synchronize()
        per_step = [[self._seconds(pairs) for pairs in step] for step in self.steps]
        forward = [statistics.median(step[i] for step in per_step) for i in range(self.layers)]
        model = [self._seconds(pairs) for pairs in self.model_steps if pairs]
        return {"clock": "cuda_events" if self.cuda else "wall", "steps": len(per_step),
                "forward_s": forward, "layers_forward_s": statistics.median(sum(s) for s in per_step),
                "model_forward_s": statistics.median(model) if model else None}
