"""The training loops a point can run, each the way its users write it, all probed at the same moments.

- ``manual``: the plain loop of :mod:`.step` (forward under autocast when mixed, backward, optimizer).
- ``accelerate``: ``Accelerator(mixed_precision=..., gradient_accumulation_steps=...)``, ``prepare``,
  ``accumulate``, ``backward``, the prepared optimizer's ``step`` and ``zero_grad``: the Accelerate course's
  loop.  ``prepare`` wraps the model's forward in autocast and converts its outputs to fp32.
- ``trainer``: a real ``transformers.Trainer.train()`` with the point's ``TrainingArguments``
  (activation checkpointing with ``every_n_layers`` / ``offload``, gradient accumulation, bf16 / fp16,
  the point's optimizer as Trainer users ask for it (:func:`.optimizers.trainer_choice`), a constant
  learning rate, no evaluation, saving or logging).  The probes hook in through
  a ``TrainerCallback`` and by wrapping three of the instance's own methods, each still doing all it did:
  ``compute_loss`` (the forward: the loss out, the model's outputs dropped, as the manual loop's
  ``forward_loss``), ``accelerator.clip_grad_norm_`` (the backward is over) and ``get_batch_samples``
  (the update step's batches, which the probe counts as it counts the manual loop's batch).

Every loop runs the optimizer steps its *schedule* yields (``for k in schedule``: warm-up, memory, then
timed steps until the schedule has timed enough) and reports each to it (the worker's: ``kind(k)``,
``begin(k)``, ``end(k, loss)``, ``done``, and ``marks``, the memory step's probes, see
:class:`ckptbench.run.memory_step.MemoryStepMarks`).  The loop decides nothing about measuring.
"""

from __future__ import annotations

import tempfile

import torch

from ..point.case import Case
from .checkpointing import checkpoint_kwargs, enable_checkpointing, select_layers
from .compiled import CompiledModel
from .optimizers import build_optimizer, trainer_choice
from .precision import Amp
from .step import forward_loss, train_step
from .trainer_probes import instrument, probes_callback


def memory_step(model, optimizer, batch, grad_accum: int, amp: Amp, marks) -> None:
    """The manual loop's step with the memory step's marks called between its parts.  Its loss is not
    kept (a memory step's loss is not reported), so nothing the meters add outlives the backward."""
    marks.start(model, optimizer, [batch])
    try:
        for _ in range(grad_accum):
            marks.forward_begin()
            loss = forward_loss(model, batch, grad_accum, amp)
            marks.forward_end()
            amp.backward(loss)
            marks.backward_end()
            del loss
        marks.optimizer_begin()
        amp.step(optimizer)
    finally:
        marks.stop()
    optimizer.zero_grad(set_to_none=True)


class ManualLoop:
    """The plain loop; the memory step is the same step with the marks called between its parts."""

    name = "manual"

    def __init__(self, case: Case, model: torch.nn.Module, batch: torch.Tensor):
        self.case, self.model, self.batch = case, model, batch
        self.checkpointing_api = enable_checkpointing(model, case.every_n_layers, case.offload, case.recompute)
        self.optimizer = build_optimizer(case.setup, model, case.train.lr)
        self.amp = Amp.of(case)
        self.compiled = None  # a compile budget: the steps run torch.compile's module (train/compiled.py)
        if case.compiled:
            self.compiled = CompiledModel(model, case.recompute.compile_budget)
            self.model = self.compiled.module
            self.checkpointing_api = "torch.compile"

    def _step(self, memory: bool, marks):
        if memory:
            return memory_step(self.model, self.optimizer, self.batch, self.case.grad_accum, self.amp, marks)
        return train_step(self.model, self.optimizer, self.batch, self.case.grad_accum, self.amp)

    def run(self, schedule) -> None:
        for k in schedule:
            schedule.begin(k)
            memory = schedule.kind(k) == "memory"
            if self.compiled is None:
                loss = self._step(memory, schedule.marks)
            else:
                loss = self.compiled.step(lambda: self._step(memory, schedule.marks))  # noqa: B023 (run now)
            schedule.end(k, loss)

    def facts(self) -> dict:
        """What the record adds for this loop: a compiled point's account of compiling."""
        return self.compiled.facts() if self.compiled is not None else {}

ACCELERATE_PRECISION = {"": "no", "bf16": "bf16", "fp16": "fp16"}


class AccelerateLoop:
    """The Accelerate course's loop on one process."""

    name = "accelerate"

    def __init__(self, case: Case, model: torch.nn.Module, batch: torch.Tensor):
        from accelerate import Accelerator

        self.case, self.batch = case, batch
        self.checkpointing_api = enable_checkpointing(model, case.every_n_layers, case.offload, case.recompute)
        self.accelerator = Accelerator(mixed_precision=ACCELERATE_PRECISION[case.setup.autocast],
                                       gradient_accumulation_steps=case.grad_accum, cpu=case.device == "cpu")
        optimizer = build_optimizer(case.setup, model, case.train.lr)
        self.model, self.optimizer = self.accelerator.prepare(model, optimizer)

    def _micro(self, marks=None) -> torch.Tensor:
        acc = self.accelerator
        with acc.accumulate(self.model):
            if marks:
                marks.forward_begin()
            loss = self.model(input_ids=self.batch, labels=self.batch).loss
            if marks:
                marks.forward_end()
            acc.backward(loss)
            if marks:
                marks.backward_end()
                if acc.sync_gradients:
                    marks.optimizer_begin()
            self.optimizer.step()
            if marks and acc.sync_gradients:
                marks.stop()
            self.optimizer.zero_grad()
        return loss.detach()

    def run(self, schedule) -> None:
        for k in schedule:
            schedule.begin(k)
            marks = schedule.marks if schedule.kind(k) == "memory" else None
            if marks:
                marks.start(self.model, self.optimizer.optimizer, [self.batch])
            try:
                losses = [self._micro(marks) for _ in range(self.case.grad_accum)]
            finally:
                if marks:
                    marks.stop()
            schedule.end(k, sum(losses) / len(losses))


class _Rows(torch.utils.data.Dataset):
    """The point's token rows, as a dataset of ``{input_ids, labels}`` (what a causal-LM collator gives)."""

    def __init__(self, batch: torch.Tensor, length: int):
        self.rows = batch.cpu()
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> dict:
        row = self.rows[i % len(self.rows)]
        return {"input_ids": row, "labels": row}


def training_arguments(case: Case, output_dir: str, max_steps: int):
    """The ``TrainingArguments`` a user writes for this point (only what ckptbench must fix is set)."""
    from transformers import TrainingArguments

    mixed, layers = case.setup.autocast, case.recompute.layers
    # a layer set: every block through Trainer's call, then the set (TrainerLoop's on_train_begin)
    n = 1 if layers else case.every_n_layers
    optim, _ = trainer_choice(case.setup, case.train.lr)
    return TrainingArguments(
        output_dir=output_dir, max_steps=max_steps, per_device_train_batch_size=case.batch_size,
        gradient_accumulation_steps=case.grad_accum, learning_rate=case.train.lr, lr_scheduler_type="constant",
        **optim, bf16=mixed == "bf16", fp16=mixed == "fp16", seed=case.train.seed,
        activation_checkpointing=n > 0,
        activation_checkpointing_kwargs={**checkpoint_kwargs(case.recompute.sac), "every_n_layers": n,
                                         "offload": case.offload} if n > 0 else None,
        use_cpu=case.device == "cpu", eval_strategy="no", save_strategy="no", logging_strategy="no",
        report_to="none", disable_tqdm=True, dataloader_pin_memory=False, dataloader_num_workers=0,
    )


class TrainerLoop:
    """``Trainer.train()`` for the schedule's steps (``max_steps`` its most, stopped early once it is done),
    probed through a callback and hooks."""

    name = "trainer"

    def __init__(self, case: Case, model: torch.nn.Module, batch: torch.Tensor):
        self.case, self.model, self.batch = case, model, batch
        self.checkpointing_api = "activation_checkpointing_enable" if case.checkpointed_layers else None
        self.optimizer = None  # the one Trainer builds, seen by the probes

    def run(self, schedule) -> None:
        from transformers import Trainer

        case = self.case
        rows = schedule.total * case.grad_accum * case.batch_size
        fetched: list[torch.Tensor] = []
        losses: list[torch.Tensor] = []

        def on_train_begin(args, state, control, **kw):
            if case.recompute.layers:  # Trainer has switched every block on: keep the set
                select_layers(kw["model"], case.recompute.layers)

        probes = probes_callback(schedule, case.grad_accum, losses, fetched, on_train_begin, holder=self)
        with tempfile.TemporaryDirectory(prefix="ckptbench-trainer-") as out:
            _, cls_and_kwargs = trainer_choice(case.setup, case.train.lr)
            trainer = Trainer(model=self.model, args=training_arguments(case, out, schedule.total),
                              train_dataset=_Rows(self.batch, rows), callbacks=[probes],
                              optimizer_cls_and_kwargs=cls_and_kwargs)
            instrument(trainer, schedule, losses, fetched)
            try:
                trainer.train()
            finally:
                schedule.marks.stop()


LOOPS = {"manual": ManualLoop, "accelerate": AccelerateLoop, "trainer": TrainerLoop}


def loop_for(case: Case, model: torch.nn.Module, batch: torch.Tensor):
    return LOOPS[case.setup.loop](case, model, batch)
