"""Mixed precision as ``Trainer(bf16=True / fp16=True)`` and ``Accelerator(mixed_precision=...)`` set it up.

The model keeps fp32 master weights (its gradients and the optimizer state follow them); the forward,
loss included, runs under ``torch.autocast`` in the compute dtype, whose cast cache keeps a 16-bit copy of
each weight while the forward runs.  The backward runs outside autocast, as it does in both libraries
(non-reentrant checkpoint's recomputation re-enters autocast with the state the forward had).  fp16 adds
the gradient scaler: the loss is scaled before ``backward``, the gradients are unscaled and checked for
inf/NaN before the optimizer steps.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch

from ..point.case import Case

AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


class Amp:
    """The precision half of a step: an autocast context for the forward and, for fp16, the scaler."""

    def __init__(self, autocast: str = "", device_type: str = "cpu"):
        self.dtype = AUTOCAST_DTYPES.get(autocast)
        self.device_type = device_type
        self.scaler = torch.amp.GradScaler(device_type) if autocast == "fp16" else None

    @classmethod
    def of(cls, case: Case) -> Amp:
        return cls(case.setup.autocast, torch.device(case.device).type)

    def autocast(self):
        if self.dtype is None:
            return nullcontext()
        return torch.autocast(device_type=self.device_type, dtype=self.dtype)

    def backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        if self.scaler is None:
            optimizer.step()
            return
        self.scaler.step(optimizer)
        self.scaler.update()
