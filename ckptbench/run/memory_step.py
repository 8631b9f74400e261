"""The probes of one memory step, as marks any training loop can call at the same moments.

The manual and Accelerate loops call the marks from their own step code; under ``Trainer`` a callback and
two module hooks call them (:mod:`ckptbench.train.loops`).  Whatever the loop, the memory step means the
same: the memory probe over the whole step (its phases named, its timeline marked by phase and layer), the
saved-tensor counter over the first micro-batch's forward (what each decoder layer keeps for backward),
the layer probe (what was checkpointed and recomputed, when backward reached each layer) and the FLOP
counter.  The probes only observe; nothing here changes what the step does.
"""

from __future__ import annotations

import torch

from ..measure.flops import FlopCounter
from ..measure.memory import probe_for
from ..measure.saved import LayerProbe, SavedTensorCounter
from ..measure.storage import StorageSerials


class MemoryStepMarks:
    """``start`` · (``forward_begin`` · ``forward_end`` · ``backward_end``) per micro-batch ·
    [``grad_clip_begin``] · ``optimizer_begin`` · ``stop`` · ``result``."""

    def __init__(self, layers: list[torch.nn.Module]):
        self.layers = layers
        self.active = False

    def start(self, model, optimizer, inputs: list[torch.Tensor]) -> None:
        device = inputs[0].device
        self.probe = probe_for(device, model, optimizer, inputs, timeline=True)
        serials = StorageSerials()
        param_keys = {serials(p) for p in model.parameters()}
        self.layer_probe = LayerProbe(serials, self.layers, on_phase=self.probe.set_phase, on_mark=self.probe.mark)
        self.counter = SavedTensorCounter(serials, param_keys, layer_of=lambda: self.layer_probe.current)
        self.flops = FlopCounter()  # FLOPs per phase, recomputation included
        self.micro = 0
        self.layer_probe.__enter__()
        self.probe.start()
        self.flops.__enter__()
        self.active = True

    def forward_begin(self) -> None:
        self.backward_end()  # a loop that cannot mark it: the next forward starts after the backward
        self.probe.set_phase("forward")
        self.flops.phase = "forward"
        if self.micro == 0:
            self.counter.__enter__()

    def forward_end(self) -> None:
        if self.micro == 0:
            self.counter.__exit__(None, None, None)
            self.probe.mark_after_forward()
        self.probe.set_phase("backward-head")
        self.flops.phase = "backward"
        self.layer_probe.in_backward = True

    def backward_end(self) -> None:
        """Idempotent: a loop may mark it itself, or leave it to the next forward or the optimizer."""
        if self.layer_probe.in_backward:
            self.layer_probe.in_backward = False
            self.micro += 1

    def grad_clip_begin(self) -> None:
        """A loop that clips its gradients (Trainer) does so between the backward and the optimizer."""
        self.backward_end()
        self.probe.set_phase("grad-clip")

    def optimizer_begin(self) -> None:
        self.backward_end()
        self.probe.set_phase("optimizer")
        self.flops.phase = "optimizer"

    def stop(self) -> None:
        """Before ``zero_grad``: the CUDA probe reads the gradients it sizes."""
        if not self.active:
            return
        self.active = False
        try:
            self.flops.__exit__(None, None, None)
        finally:
            try:
                self.probe.stop()
            finally:
                self.layer_probe.__exit__(None, None, None)

    def result(self) -> dict:
        out = self.probe.result().to_dict()
        out["memory_probe"] = self.probe.kind
        # what torch's checkpoint really packed, layer by layer: never what the setting says it should
        checkpointed = sorted(self.counter.checkpoint_layers)
        out.update(self.counter.summary(self.layer_probe.keys_of(checkpointed)))
        out.update(self.counter.per_layer(len(self.layers), self.layer_probe.input_keys))
        out["checkpointed_layers"] = checkpointed
        out["recomputed_layers"] = sorted(self.layer_probe.recomputed)
        out.update(self.flops.result())
        return out
