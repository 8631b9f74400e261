"""Tracking a ``transformers.Trainer`` run: one callback, ``trainer.add_callback(TrainerTracker(out=...))``.

At ``on_train_begin`` the callback finds the Trainer that calls it and probes it exactly as the sweep's
Trainer loop does (:mod:`ckptbench.train.trainer_probes`: the same callback and the same three wrapped
methods), driven by the tracked run's schedule; it never stops the user's training.  The run's precision
is Trainer's (``bf16`` / ``fp16``), its gradient accumulation ``gradient_accumulation_steps``; checkpointing
is read from the model once Trainer has switched it on.
"""

from __future__ import annotations

import inspect as pyinspect

from transformers import Trainer, TrainerCallback

from ..point.training import TrainSpec
from ..train.trainer_probes import instrument, probes_callback
from .figures import figures_of
from .inspect import causal_lm_refusal
from .out import TrackSetupError
from .session import Session, contained


def calling_trainer() -> Trainer | None:
    """The Trainer whose method is calling this callback (its frame's ``self``), or None."""
    frame = pyinspect.currentframe()
    while frame is not None:
        candidate = frame.f_locals.get("self")
        if isinstance(candidate, Trainer):
            return candidate
        frame = frame.f_back
    return None


class TrainerTracker(TrainerCallback):
    """``trainer.add_callback(TrainerTracker(out="results/mine"))``: the run's record in ``out``."""

    def __init__(self, out: str = "results/track", name: str = "", train: TrainSpec | None = None,
                 echo: bool = True, every: int | None = None, at=()):
        self.session = Session(out, name=name, loop="trainer", train=train, echo=echo, every=every, at=at)
        self.probes = None
        self.losses: list = []
        self.fetched: list = []
        self.batches: list = []  # the update step's batches, as the collator made them
        self.args = None
        self._restore = None  # puts the Trainer's own methods back
        self.trainer = None
        self.reported = 0  # the records whose figures went to Trainer's logs

    def abandon(self, exc: BaseException, where: str) -> None:
        """Tracking ends on ckptbench's own failure: said once, the Trainer's methods its own again."""
        self.session.fail(exc, where)
        restore, self._restore = self._restore, None
        if restore is not None:
            restore()

    def _guard(self, probe, *args) -> None:
        """A probe inside the Trainer's wrapped methods, contained as the callbacks are."""
        if self.session.done:
            return
        try:
            probe(*args)
        except Exception as exc:  # noqa: BLE001 (the user's run goes on, whatever ckptbench hit)
            self.abandon(exc, getattr(probe, "__name__", "a probe"))

    @property
    def record(self) -> dict | None:
        return self.session.record

    @contained()
    def on_train_begin(self, args, state, control, **kw):
        trainer = calling_trainer()
        if trainer is None or self.probes is not None:
            return
        why = causal_lm_refusal(kw["model"])
        if why:  # the Trainer has its model only now: tracking ends in one warning line, training goes on
            raise TrackSetupError(f"model: {why}")
        self.args, self.trainer = args, trainer
        self.measure(kw["model"], kw["optimizer"])

    def measure(self, model, optimizer) -> None:
        """A measurement from this step: its schedule, the probes driven by it, the Trainer's methods wrapped."""
        self.session.model, self.session.optimizer = model, optimizer
        self.session.scheduled(model, optimizer)
        self.probes = probes_callback(self.session.schedule, self.args.gradient_accumulation_steps, self.losses,
                                      self.fetched, stop_when_done=False, holder=self.session)
        self._restore = instrument(self.trainer, self.session.schedule, self.losses, self.fetched,
                                   guard=self._guard, batches=self.batches)

    @contained()
    def on_step_begin(self, args, state, control, **kw):
        if self.probes is None or self.session.done:
            return
        self.session.k = state.global_step
        if self.session.waiting():
            return
        if self.session.schedule is None:  # measured again from this step
            self.measure(kw["model"], kw["optimizer"])
        if self.session.seen is None and self.fetched:
            autocast = "bf16" if args.bf16 else "fp16" if args.fp16 else ""
            self.session.see(self.fetched[0], autocast=autocast, grad_accum=args.gradient_accumulation_steps)
        if self.batches:
            self.session.note_batch(self.batches[0])
        self.probes.on_step_begin(args, state, control, **kw)

    @contained()
    def on_pre_optimizer_step(self, args, state, control, **kw):
        if self.probes is not None and not self.session.done:
            self.probes.on_pre_optimizer_step(args, state, control, **kw)

    @contained()
    def on_optimizer_step(self, args, state, control, **kw):
        if self.probes is not None and not self.session.done:
            self.probes.on_optimizer_step(args, state, control, **kw)

    @contained()
    def on_step_end(self, args, state, control, **kw):
        if self.probes is None or self.session.done or self.session.schedule is None:
            return
        self.probes.on_step_end(args, state, control, **kw)
        self.session.k = state.global_step
        if self.session.schedule.done:
            self.session.finish()
            self.report()

    @contained()
    def on_train_end(self, args, state, control, **kw):
        if self.probes is not None:
            if self.session.schedule is not None:
                self.session.schedule.marks.stop()
            self.session.finish()
            self.report()

    def report(self) -> None:
        """The record's figures through ``Trainer.log``: every ``report_to`` integration (TensorBoard, W&B,
        MLflow, trackio) receives them as it receives the loss; the Trainer's own methods put back."""
        restore, self._restore = self._restore, None
        if restore is not None:
            restore()
        self.fetched.clear()  # the last measured step's batch: not kept alive until the next measurement
        self.batches.clear()
        if self.trainer is None:
            return
        records, self.reported = self.session.records[self.reported:], len(self.session.records)
        for figures in filter(None, map(figures_of, records)):
            # Trainer's on_log clears the control's should_log: a measurement ending at a step the Trainer
            # is about to log must not take that step's loss out of the user's logs
            should_log = self.trainer.control.should_log
            self.trainer.log(figures)
            self.trainer.control.should_log = should_log
