"""What a training loop does around the model in one step, as the simulation runs it.

The three loops (:mod:`ckptbench.train.loops`) run the same model, but not the same step around it; the
differences are real tensors, so the simulation runs them too, each the way its library does:

- ``manual``: ``model(input_ids=x, labels=x).loss / grad_accum`` inside the forward (the undivided loss
  is freed), ``backward``, one AdamW parameter group;
- ``accelerate``: the loop keeps the model's loss and ``Accelerator.backward`` divides it by the
  accumulation steps inside the backward: one fp32 scalar more through the whole backward and the
  optimizer step;
- ``trainer``: as ``accelerate``, and besides: the collator's ``labels`` is a tensor of its own (8·b·s
  bytes beside ``input_ids``); the loss is summed and divided by ``num_items_in_batch`` (an fp32 tensor the
  Trainer counts before the step, which the division saves for backward), then scaled in place by the number of processes (autograd keeps
  one fp32 scalar more for that); the gradients are clipped to ``max_grad_norm`` (torch's
  ``clip_grad_norm_``, which accelerate calls); the optimizer (whichever it is) gets two parameter
  groups, those with weight decay and those without (transformers' own ``get_decay_parameter_names``);
  the step's loss and the clipped gradient norm stay alive through the optimizer step, as does the running loss (a scalar made before the
  step); and because the single-tensor
  AdamW frees a parameter's ``denom`` only when the next parameter's replaces it, the parameter before
  the largest one *in its group* adds its size to the optimizer's peak.

With gradient accumulation the simulation runs each micro-batch; between them the manual loop keeps
nothing of a loss (it was divided in the forward and freed), Accelerate's and the Trainer's loops a
detached view of it (the loss they report is of every micro-batch); the Trainer fetches every
micro-batch's ``input_ids`` and ``labels`` before the step's first forward.
"""

from __future__ import annotations

import torch

from ...point.setup import Setup
from ...train.optimizers import build_optimizer


class LoopStep:
    def __init__(self, setup: Setup | None = None, device: str = "cpu", grad_accum: int = 1):
        setup = setup or Setup()
        self.loop = setup.loop
        self.grad_accum = grad_accum
        # torch's own AdamW picks its foreach kernels for parameters on CUDA: the simulation's parameters are
        # fake CPU tensors, so a CUDA point's plain ``adamw`` is simulated with the choice torch makes there
        self.optimizer_name = "adamw-foreach" if (setup.optimizer, device) == ("adamw", "cuda") else setup.optimizer

    def optimizer(self, model: torch.nn.Module, lr: float) -> torch.optim.Optimizer:
        """The loop's optimizer (:func:`ckptbench.train.optimizers.build_optimizer`): one parameter group,
        or, under the Trainer, its two."""
        if self.loop != "trainer":
            return build_optimizer(self.optimizer_name, model, lr)
        from transformers import Trainer

        decay = set(Trainer.get_decay_parameter_names(None, model))
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        groups = [{"params": [p for n, p in named if n in decay], "weight_decay": 0.0},
                  {"params": [p for n, p in named if n not in decay], "weight_decay": 0.0}]
        return build_optimizer(self.optimizer_name, groups, lr)

    def inputs(self, ids: torch.Tensor, padded: int | None = None) -> tuple[dict, list[torch.Tensor]]:
        """The model's keyword arguments, and the tensors of the batch that exist before the step.  With
        `padded`, the batch has an ``attention_mask`` (int64, as a tokenizer's) whose last `padded` tokens
        are padding.  One that pads nothing exists but is not passed: transformers skips a mask of all ones
        (its sdpa path reads the values, which fake tensors do not have; its eager mask is the same either
        way)."""
        if padded is not None:
            mask = torch.ones_like(ids)
            args, tensors = self.inputs(ids)
            if not padded:
                return args, [*tensors, mask]
            mask.view(-1)[-padded:] = 0
            return {**args, "attention_mask": mask}, [*tensors, mask]
        if self.loop != "trainer":
            return {"input_ids": ids, "labels": ids}, [ids]
        labels = ids.clone()
        # the shifted labels' count, divided by the ranks sharing the batch: an fp32 tensor, as the Trainer has it
        items = torch.tensor(ids.shape[0] * (ids.shape[1] - 1), dtype=torch.int64) / 1
        running = torch.zeros((), dtype=torch.float32)  # the running loss the Trainer adds each step to
        # the Trainer fetches every micro-batch of the optimizer step before its first forward
        later = [t for _ in range(self.grad_accum - 1) for t in (ids.clone(), ids.clone())]
        return ({"input_ids": ids, "labels": labels, "num_items_in_batch": items},
                [ids, labels, items, running, *later])

    def loss(self, output_loss: torch.Tensor) -> torch.Tensor:
        """What the loop keeps of the forward.  Trainer's ``compute_loss`` scales the loss by the processes that
        averaged the token count (``average_tokens_across_devices``), in place: one process here."""
        if self.loop == "trainer":
            output_loss *= 1
        return output_loss

    def backward(self, loss: torch.Tensor, scaler=None) -> None:
        scaled = loss if self.loop == "manual" else loss / 1  # accelerate's division by the accumulation steps
        (scaler.scale(scaled) if scaler is not None else scaled).backward()

    def between_micro_batches(self, loss: torch.Tensor) -> list:
        """What the loop keeps of a micro-batch's loss once its backward is done and the next begins."""
        return [] if self.loop == "manual" else [loss.detach()]

    def before_optimizer(self, model: torch.nn.Module, loss: torch.Tensor, scaler=None, optimizer=None) -> list:
        """What the loop still holds while the optimizer steps: Accelerate's loop its loss (the variable of
        ``loss = model(...).loss``), the Trainer its step's loss and the gradient norm it clipped to (both
        logged after the step); the manual loop nothing (its loss was divided in the forward and freed)."""
        if self.loop == "manual":
            return []
        if self.loop == "accelerate":
            return [loss]
        if scaler is not None:
            scaler.unscale_(optimizer)
        return [loss.detach(), torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)]
