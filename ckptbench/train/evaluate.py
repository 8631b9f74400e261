"""Held-out loss of the model the ranks would agree on now: the average of their parameters.

Between averagings, local-SGD ranks hold different models; the model a run produces is their average
(what the next averaging makes, and what DiLoCo-style papers evaluate).  So an evaluation averages the
parameters into the ranks' models with one flat all-reduce, runs the held-out batches (each rank its
share, losses summed with a second all-reduce), then puts every rank's own parameters back, bit for
bit: training goes on exactly as if nothing had been evaluated.  Under DDP the ranks agree already and
the average changes nothing.  Both all-reduces are the evaluator's, not training traffic: the caller
pauses the collective recorder around this call.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def averaged_held_out_loss(model: torch.nn.Module, batches: list[torch.Tensor], total_batches: int,
                           world: int) -> float:
    """Mean causal-LM loss over `total_batches` held-out batches (this rank runs `batches`, its share)
    of the parameter average over `world` ranks; every rank returns the same number."""
    params = list(model.parameters())
    with torch.no_grad():
        own = [p.detach().clone() for p in params]
        flat = torch.cat([p.detach().reshape(-1) for p in params])
        dist.all_reduce(flat)
        flat /= world
        offset = 0
        for p in params:
            p.copy_(flat[offset:offset + p.numel()].view_as(p))
            offset += p.numel()
        loss_sum = torch.zeros(1, dtype=torch.float64, device=flat.device)  # NCCL reduces device tensors
        for batch in batches:
            loss_sum += model(input_ids=batch, labels=batch).loss.double()
        dist.all_reduce(loss_sum)
        for p, mine in zip(params, own):
            p.copy_(mine)
    return loss_sum.item() / total_batches
