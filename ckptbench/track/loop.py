"""Tracking a plain or Accelerate loop: the user frames each optimizer step, hooks mark what is inside it.

``t.step(batch)`` opens an optimizer step (closing the one before, if the loop did not use it as a ``with``
block).  Inside it, hooks on the user's own objects call the memory step's marks at the moments the sweep's
loops call them: the model's forward pre-hook (``forward_begin``), the backward asked for (``forward_end``:
the forward is over, its outputs dropped; ``torch.autograd.backward`` and ``Accelerator.backward`` patched
for the memory step only), the optimizer's step pre- and post-hooks (``optimizer_begin``,
``stop``, before ``zero_grad``).  Outside the memory step each hook returns at once; once the record is
written every hook is removed.  The number of forwards in the first step is the gradient accumulation (under
Accelerate's ``accumulate`` a ``t.step`` per micro-batch is one optimizer step until ``sync_gradients``
says it stepped: the step, its timing and its memory are the optimizer step's, as the sweep's); the
autocast a forward runs under (the plain loop's ``torch.autocast``, Accelerate's ``mixed_precision``) is
the run's precision.
"""

from __future__ import annotations

import sys

import torch

from .figures import figures_of
from .held import OutputWatch
from .inspect import causal_lm_refusal, unwrapped
from .out import TrackSetupError
from .session import Session, contained

AUTOCAST_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16"}


def batch_tensors(batch) -> list[torch.Tensor]:
    if isinstance(batch, torch.Tensor):
        return [batch]
    if isinstance(batch, dict) or hasattr(batch, "values"):
        return [v for v in batch.values() if isinstance(v, torch.Tensor)]
    if isinstance(batch, (list, tuple)):
        return [t for t in batch if isinstance(t, torch.Tensor)]
    return []


def loss_of(output):
    """The loss tensor of a model's output (a ModelOutput, a dict, or the loss itself), or None."""
    loss = getattr(output, "loss", None)
    if loss is None and isinstance(output, dict):
        loss = output.get("loss")
    if loss is None and isinstance(output, torch.Tensor) and output.dim() == 0:
        loss = output
    return loss if isinstance(loss, torch.Tensor) and loss.requires_grad else None


class _Step:
    def __init__(self, tracker: Tracker):
        self.tracker = tracker

    def __enter__(self) -> _Step:
        return self

    def __exit__(self, *exc) -> None:
        self.tracker.end_step()


class Tracker:
    """What ``with track(model, optimizer, out=...) as t`` gives: :meth:`step` around each optimizer step;
    :attr:`record` once written (see the module's text)."""

    def __init__(self, model, optimizer, out: str | None, *, name: str = "", loop: str | None = None,
                 train=None, echo: bool = True, accelerator=None, every: int | None = None, at=()):
        why = causal_lm_refusal(model)  # refused here, before the run: never a failure after it starts
        if why:
            raise TrackSetupError(f"ckptbench.track: model: {why}")
        inner = getattr(optimizer, "optimizer", optimizer)
        self.accelerator = accelerator  # its trackers (accelerator.log) receive each record's figures
        self.logged = 0  # the records whose figures went to them
        accelerated = type(optimizer).__module__.startswith("accelerate")
        self.loop = loop or ("accelerate" if accelerated else "manual")
        if train is None and isinstance(model, torch.nn.parallel.DistributedDataParallel):
            # DDP builds its gradient buckets in the forward after the first backward: the memory step comes
            # after that, as every later step of the run is (the buckets are DDP's state, as the optimizer's is)
            from ..point.training import TrainSpec

            train = TrainSpec(warmup_steps=2)
        self.session = Session(out, name=name, loop=self.loop, train=train, echo=echo, every=every, at=at)
        self.model, self.optimizer = model, optimizer
        self.autocast = ""
        if accelerated:
            precision = getattr(getattr(optimizer, "accelerator_state", None), "mixed_precision", "no")
            self.autocast = "" if precision in ("no", None) else str(precision)
        self.forwards = 0  # forwards in the current step
        self.batch = None
        self.loss = None
        self.open = False
        self._pending = False
        self._watch: OutputWatch | None = None
        self._local_sgd_restore = None
        self._restore: list = []
        self._watch_local_sgd()
        self._handles = [model.register_forward_pre_hook(self._forward_pre),
                         model.register_forward_hook(self._forward_post),
                         inner.register_step_pre_hook(self._optimizer_pre),
                         inner.register_step_post_hook(self._optimizer_post)]

    @property
    def record(self) -> dict | None:
        return self.session.record

    def __enter__(self) -> Tracker:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def abandon(self, exc: BaseException, where: str) -> None:
        """Tracking ends on ckptbench's own failure: said once, every hook and patch removed."""
        self.session.fail(exc, where)
        try:
            self._unpatch()
            self._unwatch_local_sgd()
        finally:
            for handle in self._handles:
                handle.remove()
            self._handles.clear()

    # ---------------------------------------------------------------- the user's calls
    @contained(default=lambda self: _Step(self))
    def step(self, batch) -> _Step:
        """Open an optimizer step on `batch` (a token tensor, or a mapping / sequence holding one); under
        Accelerate's ``accumulate``, a micro-batch that did not step the optimizer is continued instead."""
        if self.open:
            self.end_step()
        if self.open:  # the optimizer step is still accumulating: this micro-batch is more of it
            return _Step(self)
        self.open = True
        self.forwards = 0
        self.loss = None
        if not self.session.done:
            self.batch = batch
            self.session.begin(self.model, self.optimizer)
            self.session.note_batch(batch)
            if self.session.memory_step():
                self._patch_backward()
            self.session.start_memory(batch_tensors(batch))
        return _Step(self)

    def accumulating(self) -> bool:
        """Accelerate says the optimizer step is not over: ``accumulate`` set ``sync_gradients`` False for this
        micro-batch, so the optimizer's step and ``zero_grad`` did nothing."""
        state = getattr(self.optimizer, "gradient_state", None)
        return state is not None and state.sync_gradients is False

    @contained()
    def end_step(self, *, last: bool = False) -> None:
        if not self.open or (not last and self.accumulating()):
            return
        self.open = False
        session = self.session
        if session.done:
            return
        if session.seen is None and session.schedule is not None:
            session.see(self.batch, autocast=self.autocast, grad_accum=max(1, self.forwards))
        loss, self.loss, self.batch = self.loss, None, None
        if loss is not None and self.forwards > 1:
            loss = loss / self.forwards  # the optimizer step's loss: the mean of its micro-batches'
        self._unpatch()
        session.end(loss)
        self._log_records()
        if session.done:
            self.close()

    @contained()
    def close(self) -> dict | None:
        """End tracking: the open step ended, the record written (``skipped`` if the run was too short),
        every hook removed."""
        if self.open:
            self.end_step(last=True)
        self._unpatch()
        self._unwatch_local_sgd()
        record = self.session.finish()
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._log_records()
        self.accelerator = None
        return record

    def _log_records(self) -> None:
        """Each record's figures, once, to the accelerator's trackers (at the step the run had reached)."""
        accelerator, records = self.accelerator, self.session.records
        if accelerator is None or not getattr(accelerator, "trackers", None):
            return
        for record in records[self.logged:]:
            figures = figures_of(record)
            if figures:
                accelerator.log(figures, step=self.session.k)
        self.logged = len(records)

    # ---------------------------------------------------------------- hooks
    @contained()
    def _forward_pre(self, module, args):
        if not self.open or self.session.done:
            return
        self.forwards += 1
        if not self.autocast:
            device = next(module.parameters()).device.type
            if torch.is_autocast_enabled(device):
                self.autocast = AUTOCAST_NAMES.get(torch.get_autocast_dtype(device), "")
        if self.session.memory_step():
            self.session.marks.forward_begin()

    @contained()
    def _forward_post(self, module, args, output):
        if not self.open or self.session.done:
            return
        loss = loss_of(output)
        if loss is None:
            return
        memory = self.session.memory_step()
        if not memory:  # a clean step's loss, for the record's losses (a view: nothing allocated)
            self.loss = loss.detach() if self.loss is None else self.loss + loss.detach()
            return
        self._pending = True  # the forward is over: marked when the backward is asked for
        if self.session.marks.micro == 0:
            self._watch = OutputWatch(output, loss)  # does the loop keep it through the backward?

    @contained()
    def _backward_called(self) -> None:
        """The forward is over, its outputs dropped: a backward was asked for (before the loss is scaled)."""
        if self._pending and self.session.memory_step() and self.session.marks.active:
            self._pending = False
            if self._watch is not None:
                self.session.held_output_bytes, self._watch = self._watch.held(), None
            self.session.marks.forward_end()

    def _patch_backward(self) -> None:
        """For the memory step only: ``torch.autograd.backward`` (what ``loss.backward()`` calls) and, where
        Accelerate is loaded, ``Accelerator.backward`` (which divides the loss first) say when the backward
        is asked for; the originals run unchanged and are put back at the step's end."""
        tracker = self
        original = torch.autograd.backward

        def backward(*args, **kwargs):
            tracker._backward_called()
            return original(*args, **kwargs)

        torch.autograd.backward = backward
        self._restore.append(lambda: setattr(torch.autograd, "backward", original))
        accelerator = getattr(sys.modules.get("accelerate.accelerator"), "Accelerator", None)
        if accelerator is not None:
            original_acc = accelerator.backward

            def accelerate_backward(acc, loss, **kwargs):
                tracker._backward_called()
                return original_acc(acc, loss, **kwargs)

            accelerator.backward = accelerate_backward
            self._restore.append(lambda: setattr(accelerator, "backward", original_acc))

    def _watch_local_sgd(self) -> None:
        """Accelerate's ``LocalSGD`` over the tracked model says its K (``local_sgd_steps``) when it steps:
        its ``step`` is wrapped while the tracker lives (the original runs first, unchanged)."""
        if "accelerate" not in sys.modules:
            return
        from accelerate.local_sgd import LocalSGD

        tracker, original = self, LocalSGD.step

        def step(local_sgd, *args, **kwargs):
            result = original(local_sgd, *args, **kwargs)
            tracker._local_sgd_stepped(local_sgd)
            return result

        LocalSGD.step = step
        self._local_sgd_restore = lambda: setattr(LocalSGD, "step", original)

    @contained()
    def _local_sgd_stepped(self, local_sgd) -> None:
        model = getattr(local_sgd, "model", None)
        if getattr(local_sgd, "enabled", False) and model is not None and unwrapped(model) is unwrapped(self.model):
            self.session.local_sgd_steps = int(local_sgd.local_sgd_steps)

    def _unwatch_local_sgd(self) -> None:
        restore, self._local_sgd_restore = self._local_sgd_restore, None
        if restore is not None:
            restore()

    def _unpatch(self) -> None:
        while self._restore:
            self._restore.pop()()

    @contained()
    def _optimizer_pre(self, optimizer, args, kwargs):
        if self.open and self.session.memory_step() and self.session.marks.active:
            self.session.marks.optimizer_begin()

    @contained()
    def _optimizer_post(self, optimizer, args, kwargs):
        if self.open and self.session.memory_step():
            self.session.marks.stop()
            self._unpatch()  # before zero_grad: the CUDA probe sizes the gradients
