"""The plain training step, as every training loop writes it: forward, loss, backward, optimizer.

Mixed precision as the PyTorch AMP recipe writes it: the forward and its loss under autocast, the
backward and the optimizer outside it, through :class:`~.precision.Amp` (a no-op for pure dtypes).
"""

from __future__ import annotations

import torch

from .precision import Amp


def forward_loss(model, batch, grad_accum: int, amp: Amp | None = None) -> torch.Tensor:
    with (amp or Amp()).autocast():
        return model(input_ids=batch, labels=batch).loss / grad_accum


def train_step(model, optimizer, batch, grad_accum: int, amp: Amp | None = None) -> torch.Tensor:
    """One optimizer step; the loss stays a tensor so the step never waits for the device (no .item())."""
    amp = amp or Amp()
    total = None
    for _ in range(grad_accum):
        loss = forward_loss(model, batch, grad_accum, amp)
        amp.backward(loss)
        total = loss.detach() if total is None else total + loss.detach()
    amp.step(optimizer)
    optimizer.zero_grad(set_to_none=True)
    return total
