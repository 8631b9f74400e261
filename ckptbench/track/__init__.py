"""Measure your own training: a Trainer callback, a context for Accelerate and plain loops, a pytest fixture.

Three forms over one measurement, each writing the record a sweep writes for the same Case (same schema,
validated; ``report``, ``compare``, ``--csv`` read it unchanged):

- ``trainer.add_callback(TrainerTracker(out="results/mine"))`` (:mod:`.trainer`);
- ``with track(model, optimizer, out="results/mine") as t:`` then ``with t.step(batch):`` around each
  optimizer step of an Accelerate or plain loop, under ``torchrun`` one record per rank (:mod:`.loop`);
- the pytest fixture ``ckptbench_step`` (:mod:`.plugin`, registered as a pytest plugin), which measures a
  training step inside a test and fails it past a stated budget or a stored baseline.

What the run is (model, precision, checkpointing, adapters, optimizer, batch, world size) is read from the
objects themselves (:mod:`.inspect`), the steps are scheduled and measured by the sweep's own worker code
(:mod:`.session`), and the mistakes users make with checkpointing and offload are named (:mod:`.mistakes`).
"""

from __future__ import annotations

from ..point.training import Timing, TrainSpec

# a measured step's schedule when none is given (the fixture's, the history benchmarks'): enough timed steps
# for compare's test, few enough for a test suite
FIXTURE_TRAIN = TrainSpec(warmup_steps=1, steps=5, timing=Timing(max_steps=10, max_time_s=10.0))


def track(model, optimizer, out: str | None = "results/track", *, name: str = "", loop: str | None = None,
          train=None, echo: bool = True, accelerator=None, every: int | None = None, at=()):
    """A :class:`~ckptbench.track.loop.Tracker` on `model` and `optimizer` (an Accelerate-prepared one or a
    plain ``torch.optim`` one), writing its record under `out`; use it as a context manager and frame each
    optimizer step with ``t.step(batch)``.  `train` (a :class:`~ckptbench.point.training.TrainSpec`) sets the
    warm-up steps and the timed steps' precision and caps; `name` the record's suite name (``track:<name>``,
    default the script's name); `accelerator`: an ``accelerate.Accelerator`` whose trackers
    (``init_trackers``) receive each record's figures through ``accelerator.log`` (keys under ``ckptbench/``);
    `every` / `at`: measure the run again every so many optimizer steps / at these steps, a record each
    (:mod:`.again`)."""
    from .loop import Tracker

    return Tracker(model, optimizer, out, name=name, loop=loop, train=train, echo=echo, accelerator=accelerator,
                   every=every, at=at)


def TrainerTracker(out: str = "results/track", name: str = "", train=None, echo: bool = True,  # noqa: N802
                   every: int | None = None, at=()):
    """The ``transformers.TrainerCallback`` that tracks a Trainer run (:class:`.trainer.TrainerTracker`)."""
    from .trainer import TrainerTracker as Callback

    return Callback(out=out, name=name, train=train, echo=echo, every=every, at=at)


def measure_step(model, optimizer, batch, step, *, out: str, name: str = "", train=None,
                 max_steps: int = 100) -> dict | None:
    """Run `step` (one optimizer step on `batch`, no arguments) as a tracked run until its record is written
    (at most `max_steps` calls): the record, or None when the run ended first.  What the ``ckptbench_step``
    fixture and the history benchmarks measure; `train` defaults to the fixture's steps (one warm-up, the
    memory step, at most 10 timed steps or 10 s)."""
    with track(model, optimizer, out=out, name=name, train=train or FIXTURE_TRAIN, echo=False) as t:
        for _ in range(max_steps):
            with t.step(batch):
                step()
            if t.record is not None:
                break
    return t.record
