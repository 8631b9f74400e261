"""The plain training step, as every training loop writes it: forward, loss, backward, optimizer."""

from __future__ import annotations

import torch


def forward_loss(model, batch, grad_accum: int) -> torch.Tensor:
    return model(input_ids=batch, labels=batch).loss / grad_accum


def train_step(model, optimizer, batch, grad_accum: int) -> torch.Tensor:
    """One optimizer step; the loss stays a tensor so the step never waits for the device (no .item())."""
    total = None
    for _ in range(grad_accum):
        loss = forward_loss(model, batch, grad_accum)
        loss.backward()
        total = loss.detach() if total is None else total + loss.detach()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return total
