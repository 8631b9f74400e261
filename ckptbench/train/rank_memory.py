"""One rank's memory step in a data-parallel loop: the worker's exact probe around one optimizer step.

The same probes as a one-process point (:func:`ckptbench.measure.memory.probe_for`: the exact live-storage
tracker on CPU, the allocator's counters on CUDA; :class:`~ckptbench.measure.saved.LayerProbe` naming the
moment of the peak), framed by the loop's own calls: :meth:`RankMemoryStep.forward` before each
micro-batch's forward, :meth:`RankMemoryStep.backward` after it, :meth:`RankMemoryStep.optimizer` before
the optimizer step and :meth:`RankMemoryStep.stop` after ``zero_grad``.

The step measured is one every later step repeats: :func:`memory_step_index` puts it after two optimizer
steps (AdamW's state exists; DDP has rebuilt its buckets in the forward after the first backward).
"""

from __future__ import annotations

import torch

from ..measure.memory import probe_for
from ..measure.saved import LayerProbe
from ..measure.storage import StorageSerials
from .checkpointing import decoder_layers

STEADY_AFTER = 2  # optimizer steps before the memory step


def memory_step_index(optimizer_steps: int, memory_steps: int) -> int:
    """The first metered optimizer step: after STEADY_AFTER steps where the run has them, else the first."""
    return STEADY_AFTER if optimizer_steps >= STEADY_AFTER + memory_steps else 0


class RankMemoryStep:
    """The probes of one metered optimizer step (see the module's text)."""

    def __init__(self, device: torch.device, model: torch.nn.Module, module: torch.nn.Module, optimizer,
                 inputs: list[torch.Tensor]):
        inner = getattr(optimizer, "optimizer", optimizer)  # accelerate's wrapper holds torch's optimizer
        self.probe = probe_for(device, model, inner, inputs)
        self.layers = LayerProbe(StorageSerials(), decoder_layers(module), self.probe.set_phase)
        self.layers.__enter__()
        self.probe.start()

    def forward(self) -> None:
        self.probe.set_phase("forward")
        self.layers.in_backward = False

    def backward(self, last_micro_batch: bool) -> None:
        if last_micro_batch:
            self.probe.mark_after_forward()
        self.probe.set_phase("backward-head")
        self.layers.in_backward = True

    def optimizer(self) -> None:
        self.probe.set_phase("optimizer")

    def stop(self) -> dict:
        self.probe.stop()
        self.layers.__exit__(None, None, None)
        return self.probe.result().to_dict()
