"""The memory step's probes inside a real ``transformers.Trainer``: one callback and three wrapped methods.

Shared by the sweep's Trainer loop (:class:`ckptbench.train.loops.TrainerLoop`) and by a user's own Trainer
(:mod:`ckptbench.track`), so both mark the same moments: ``compute_loss`` is the forward (the loss out, the
model's outputs dropped), ``accelerator.clip_grad_norm_`` ends the backward, ``get_batch_samples`` yields the
update step's batches (counted as the manual loop's batch is), ``on_pre_optimizer_step`` and
``on_optimizer_step`` frame the optimizer.  Each wrapped method still does all it did.
"""

from __future__ import annotations

import torch


def probes_callback(schedule, grad_accum: int, losses: list, fetched: list, on_train_begin=None,
                    stop_when_done: bool = True, holder=None):
    """A ``TrainerCallback`` reporting each optimizer step to `schedule` (``begin`` / ``kind`` / ``end`` /
    ``marks`` / ``done``); `holder` (any object) gets the optimizer Trainer built as ``holder.optimizer``.
    With `stop_when_done`, training stops once the schedule has timed enough (the sweep's); a user's run
    is never stopped."""
    from transformers import TrainerCallback

    class Probes(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):
            if on_train_begin is not None:
                on_train_begin(args, state, control, **kw)

        def on_step_begin(self, args, state, control, **kw):
            k = state.global_step
            losses.clear()
            if schedule.done:
                return
            schedule.begin(k)
            if holder is not None:
                holder.optimizer = kw["optimizer"]
            if schedule.kind(k) == "memory":
                optimizer = kw["optimizer"]
                schedule.marks.start(kw["model"], getattr(optimizer, "optimizer", optimizer), list(fetched))

        def on_pre_optimizer_step(self, args, state, control, **kw):
            if schedule.marks.active:
                schedule.marks.optimizer_begin()

        def on_optimizer_step(self, args, state, control, **kw):
            schedule.marks.stop()

        def on_step_end(self, args, state, control, **kw):
            if schedule.done:
                return
            schedule.end(state.global_step - 1, sum(float(x) for x in losses) / grad_accum if losses else None)
            if schedule.done and stop_when_done:  # the timed steps reached their precision or a cap
                control.should_training_stop = True

    return Probes()


def _run(probe, *args) -> None:
    probe(*args)


def instrument(trainer, schedule, losses: list, fetched: list, guard=_run, batches: list | None = None):
    """Wrap `trainer`'s ``compute_loss``, ``get_batch_samples`` and ``accelerator.clip_grad_norm_`` so the
    memory step's marks are called at the forward's edges and the backward's end (see the module's text).
    Each probe runs through `guard` (a tracked run's contains what it raises; the sweep's raises); the
    Trainer's own methods always run, unchanged; `batches`, when given, gets the update step's batches as
    the collator made them.  Returns what puts the originals back."""
    original_fetch, original_clip = trainer.get_batch_samples, trainer.accelerator.clip_grad_norm_
    original_loss = trainer.compute_loss

    def compute_loss(*args, **kwargs):  # the forward, as the manual loop's: loss out, outputs dropped
        marks = schedule.marks
        if marks.active:
            guard(marks.forward_begin)
        loss = original_loss(*args, **kwargs)
        if not schedule.done:
            guard(losses.append, loss.detach())  # a view: the meter allocates nothing in the step
        if marks.active:
            guard(marks.forward_end)
        return loss

    def keep_fetched(samples, items) -> None:
        fetched[:] = [t for s in samples for t in s.values() if isinstance(t, torch.Tensor)]
        if batches is not None:
            batches[:] = list(samples)
        if isinstance(items, torch.Tensor):  # the token count the loss is divided by, also made here
            fetched.append(items)
        running = getattr(trainer, "_tr_loss", None)  # the running loss, made before the first step
        if isinstance(running, torch.Tensor):
            fetched.append(running)

    def get_batch_samples(*args, **kwargs):
        samples, items = original_fetch(*args, **kwargs)
        if not schedule.done:
            guard(keep_fetched, samples, items)
        return samples, items

    def clip_grad_norm_(*args, **kwargs):  # the backward is over once the gradients are clipped
        if schedule.marks.active:
            guard(schedule.marks.grad_clip_begin)
        return original_clip(*args, **kwargs)

    trainer.get_batch_samples = get_batch_samples
    trainer.compute_loss = compute_loss
    trainer.accelerator.clip_grad_norm_ = clip_grad_norm_

    def restore() -> None:
        trainer.get_batch_samples, trainer.compute_loss = original_fetch, original_loss
        trainer.accelerator.clip_grad_norm_ = original_clip

    return restore
