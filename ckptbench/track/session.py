"""One tracked run: the steps of a user's own loop, scheduled and measured as a sweep point's are, and its
record written as the sweep writes one.

The first optimizer steps are warm-up (clean: they also create the optimizer state), the next is the memory
step (the exact tracker, the saved-tensor counter, the layer probe: the worker's
:class:`~ckptbench.run.memory_step.MemoryStepMarks`), then timed steps until the median's interval is within
its precision or a cap (:class:`~ckptbench.run.worker.StepSchedule`, the worker's own).  From then on the run
is left alone: no hook measures anything, and the record is written (:meth:`Session.finish`) through the
worker's :func:`~ckptbench.run.worker.measurement_of`, the sweep's :func:`~ckptbench.run.sweep.make_record`
and its checks (:mod:`.judge`), validated as every record is read.  A run
asked to be measured again (:mod:`.again`) is left alone until the next requested step, and measured anew.
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import sys
import threading
import time
import warnings
from dataclasses import replace

import torch

from ..measure.quiet import transformers_quiet
from ..point.case import Case, Suite
from ..point.training import TrainSpec
from ..run.environment import host_part
from ..run.sweep import make_record
from ..run.worker import StepSchedule, device_environment, measurement_of
from ..store.records import RecordStore
from ..store.validate import record_problem
from ..train.checkpointing import decoder_layers, pinned_memory_error
from .again import Again
from .figures import summary_line
from .inspect import Seen, batch_shape, padding_tokens, seen_run, unwrapped
from .judge import annotate, judge_run
from .mistakes import mistakes
from .out import notes_on_stderr, rank, rank_dir, writable_out

SUITE_PREFIX = "track"
log = logging.getLogger("ckptbench")


def contained(default=None):
    """A tracker hook that never raises into the user's run: anything it raises ends the tracking
    (:meth:`Session.fail`: one warning line, hooks removed, a ``failed`` record if one can be written) and
    the hook returns `default` (called with the tracker when callable).  KeyboardInterrupt and SystemExit
    pass: they are the run's, not ckptbench's."""
    def wrap(method):
        @functools.wraps(method)
        def hook(self, *args, **kwargs):
            try:
                return method(self, *args, **kwargs)
            except Exception as exc:  # noqa: BLE001 (the user's run goes on, whatever ckptbench hit)
                self.abandon(exc, method.__name__)
                return default(self) if callable(default) else default
        return hook
    return wrap


class _Loop:
    """What the worker's measurement reads of the loop that ran: the optimizer, the checkpointing call."""

    def __init__(self, optimizer, checkpointing_api: str | None):
        self.optimizer = optimizer
        self.checkpointing_api = checkpointing_api


class Session:
    """The schedule and record of one tracked run (see the module's text).  The loops' hooks call
    :meth:`begin` and :meth:`end` around each optimizer step; :attr:`marks` is the memory step's probes."""

    def __init__(self, out: str | None, *, name: str = "", loop: str = "manual", train: TrainSpec | None = None,
                 echo: bool = True, every: int | None = None, at=()):
        self.again = Again(every, at)
        self.out = out
        self.name = name or os.path.splitext(os.path.basename(sys.argv[0] or "run"))[0] or "run"
        self.loop = loop
        self.train = train or TrainSpec()
        self.echo = echo
        self.schedule: StepSchedule | None = None
        self.seen: Seen | None = None
        self.model = None
        self.optimizer = None
        self.record: dict | None = None  # the last measurement's
        self.records: list[dict] = []  # every measurement's, in order
        self.start = 0  # the optimizer step the current measurement began (or begins) at
        self.finished = False  # no measurement is to come
        self.failed: str = ""  # why tracking stopped before its record (the run itself goes on)
        self.interrupted: str = ""  # the signal that ended the run while it was measured
        self._previous: dict[int, object] = {}  # the handlers the run had before measuring began
        self.k = 0  # optimizer steps seen
        self.local_sgd_steps = 0  # K of an Accelerate LocalSGD over the tracked model, once it stepped
        self.clear()
        if out is not None:
            writable_out(out)
        if echo:
            notes_on_stderr()

    def clear(self) -> None:
        """What one measurement learns of its steps, from nothing."""
        self.held_output_bytes = 0  # the model's output the loop kept through the memory step's backward
        self.shapes: dict[str, int] = {}  # "BxS" of each optimizer step's batch -> the steps that had it
        self.memory_shape: tuple[int, int] | None = None  # the memory step's (batch, sequence)
        self.memory_padding: int | None = None  # tokens its attention_mask marks as padding (None: no mask)
        self.t0 = time.time()

    # ------------------------------------------------------------------ the steps
    @property
    def done(self) -> bool:
        """Nothing is measured any more: tracking failed, the last measurement is written, or its schedule
        has all it needs."""
        return bool(self.failed) or self.finished or (self.schedule is not None and self.schedule.done)

    def waiting(self) -> bool:
        """Between two measurements: the run's steps are counted, nothing else."""
        return self.schedule is None and self.k < self.start

    @property
    def marks(self):
        return self.schedule.marks

    def memory_step(self) -> bool:
        return self.schedule is not None and not self.done and self.schedule.kind(self.k) == "memory"

    def scheduled(self, model, optimizer) -> StepSchedule:
        """The measurement's schedule, made at its first step (what it reads of a Case: the train settings;
        a later measurement has one warm-up step, :mod:`.again`)."""
        if self.schedule is None:
            self.model, self.optimizer = model, optimizer
            device = next(model.parameters()).device
            train = replace(self.train, warmup_steps=1) if self.start else self.train
            provisional = Case(model=_placeholder(), train=train, batch_size=1, seq_len=1, device=device.type)
            self.schedule = StepSchedule(provisional, device, decoder_layers(model), None, None, model,
                                         start=self.start)
            self.arm()
        return self.schedule

    def next_measurement(self) -> None:
        """After a measurement's record: the next requested step, or nothing more to measure."""
        start = self.again.after(self.k) if self.again and not self.interrupted else None
        if start is None:
            self.finished = True
            return
        self.schedule, self.start = None, start
        self.clear()

    # ------------------------------------------------------------------ signals while measuring
    def arm(self) -> None:
        """While the run is measured, SIGTERM and SIGINT first write what was measured (:meth:`on_signal`),
        then go to the handlers the run had (the user's, Trainer's, Accelerate's, torchrun's or Python's).
        Only the main thread can install handlers; elsewhere nothing is installed."""
        if self.out is None or threading.current_thread() is not threading.main_thread():
            return
        for signum in (signal.SIGTERM, signal.SIGINT):
            try:
                self._previous[signum] = signal.signal(signum, self.on_signal)
            except (ValueError, OSError):  # not settable here: left as it is
                pass

    def disarm(self) -> None:
        previous, self._previous = self._previous, {}
        for signum, handler in previous.items():
            try:
                if signal.getsignal(signum) == self.on_signal:
                    signal.signal(signum, handler)
            except (ValueError, OSError, TypeError):
                pass

    def on_signal(self, signum, frame) -> None:
        """Write what was measured, put the run's handlers back, and pass the signal on to them."""
        previous = self._previous.get(signum, signal.SIG_DFL)
        try:
            self.interrupted = signal.Signals(signum).name
            if self.schedule is not None and self.schedule.marks.active:
                self.schedule.marks.stop()
            self.finish()
        except Exception as exc:  # noqa: BLE001 (the signal is passed on whatever happened here)
            log.warning("ckptbench.track: no record written on %s (%s: %s)", signal.Signals(signum).name,
                        type(exc).__name__, exc)
        self.disarm()
        if callable(previous):
            previous(signum, frame)
        elif previous == signal.SIG_DFL:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    def begin(self, model, optimizer) -> None:
        if not self.done and not self.waiting():
            self.scheduled(model, optimizer).begin(self.k)

    def start_memory(self, inputs: list[torch.Tensor]) -> None:
        if self.memory_step():
            inner = getattr(self.optimizer, "optimizer", self.optimizer)
            self.marks.start(self.model, inner, inputs)

    def end(self, loss) -> None:
        if self.waiting():
            self.k += 1
        if self.done or self.schedule is None:
            return
        if self.schedule.kind(self.k) == "memory":
            self.marks.stop()
            loss = None  # a memory step's loss is not reported (the worker's: nothing outlives the backward)
        self.schedule.end(self.k, loss)
        self.k += 1
        if self.schedule.done:
            self.finish()

    def see(self, batch, *, autocast: str = "", grad_accum: int = 1) -> None:
        """Read the run's Case from its objects (once, on a clean step: nothing is probed then)."""
        if self.seen is None:
            self.seen = seen_run(self.model, self.optimizer, batch, loop=self.loop, autocast=autocast,
                                 grad_accum=grad_accum, train=self.train)

    def note_batch(self, batch) -> None:
        """An optimizer step's (first) batch: its shape counted; the memory step's is the Case's, its
        attention mask's padding said (a run with dynamic padding has as many shapes as lengths)."""
        if self.done or self.schedule is None:
            return
        size, seq = batch_shape(batch)
        self.shapes[f"{size}x{seq}"] = self.shapes.get(f"{size}x{seq}", 0) + 1
        if self.memory_step():
            self.memory_shape, self.memory_padding = (size, seq), padding_tokens(batch)

    def case(self) -> Case:
        """The run's Case: as its objects said at the first step, at the memory step's batch shape, with the
        K of its LocalSGD (whose first step may come after that step's end)."""
        case = self.seen.case
        if self.memory_shape:
            case = replace(case, batch_size=self.memory_shape[0], seq_len=self.memory_shape[1])
        return replace(case, local_sgd_steps=self.local_sgd_steps) if self.local_sgd_steps else case

    def batch_facts(self) -> dict:
        """The record's ``track.batches`` and the lines of ``track.unknown`` the batches call for."""
        lines = []
        if len(self.shapes) > 1:
            lines.append(f"the steps' batches had {len(self.shapes)} shapes (dynamic padding): the Case and its "
                         "memory are the memory step's batch, the step time the median over all of them")
        memory = list(self.memory_shape) if self.memory_shape else None
        return {"batches": {"memory": memory, "shapes": dict(self.shapes)}, "unknown_batches": lines}

    def track_facts(self) -> dict:
        facts, batches = self.seen.facts(), self.batch_facts()
        facts["unknown"] = facts["unknown"] + batches["unknown_batches"]
        return {**facts, "batches": batches["batches"], "rank": rank(), "steps_seen": self.k,
                "from_step": self.start, "measurement": len(self.records)}

    # ------------------------------------------------------------------ when ckptbench fails
    def fail(self, exc: BaseException, where: str) -> None:
        """Stop tracking for good (the run itself goes on untouched): the probes stopped, one warning line
        through the ``ckptbench`` logger, and a ``failed`` record when the run's Case is known and the
        directory still takes it."""
        if self.failed or self.finished:
            return
        self.failed = f"{type(exc).__name__} in {where}: {str(exc).splitlines()[0] if str(exc) else ''}".rstrip(": ")
        self.disarm()
        try:
            if self.schedule is not None and self.schedule.marks.active:
                self.schedule.marks.stop()
        except Exception:  # noqa: BLE001 (a probe that cannot stop is dropped with the rest)
            pass
        log.warning("ckptbench.track: stopped measuring (%s); the training goes on untouched", self.failed)
        try:
            self._write_failed()
        except Exception as again:  # noqa: BLE001
            log.warning("ckptbench.track: no record written (%s: %s)", type(again).__name__, again)

    def _write_failed(self) -> None:
        if self.seen is None or self.out is None:
            return
        case = self.case()
        result = {"status": "failed", "reason": f"ckptbench.track stopped measuring: {self.failed}",
                  "device_env": device_environment(case.device), "wall_s": time.time() - self.t0}
        suite = Suite(name=f"{SUITE_PREFIX}:{self.name}", path="", cases=(case,))
        record = make_record(suite, case, result, host_part(), annotate)
        record.pop("harness_ratio", None)
        record.pop("harness_parts", None)
        record["track"] = {**self.track_facts(), "mistakes": []}
        if record_problem(record) is None:
            store = RecordStore(rank_dir(self.out))
            store.ensure()
            store.append(record)
            self.record = record
            self.records.append(record)

    # ------------------------------------------------------------------ the record
    def finish(self) -> dict | None:
        """Write the measurement's record (once): ``ok`` with its checks when the memory step and timed steps
        ran, else ``skipped`` saying how far the run got."""
        if self.finished or self.failed or self.seen is None or self.out is None or self.schedule is None:
            return self.record
        case = self.case()
        schedule = self.schedule
        schedule.finish()
        needed = schedule.warmup + schedule.memory + 1
        self.disarm()
        ended = f"{self.interrupted} ended the run" if self.interrupted else "the run ended"
        with transformers_quiet():  # the model copies built for the estimate and checks are ckptbench's
            if schedule.stats is None or not schedule.mem:
                result = {"status": "skipped", "reason": f"{ended} after {self.k - self.start} optimizer steps"
                          f"{f' from step {self.start}' if self.start else ''}: tracking needs {needed} "
                          f"({'warm-up, ' if schedule.warmup else ''}memory step, a timed step)"}
            else:
                api = "activation_checkpointing_enable" if case.checkpointed_layers else None
                measurement = measurement_of(case, schedule, unwrapped(self.model), _Loop(self.optimizer, api),
                                             api, self.offload_facts(case), {"spawn_s": None, "setup_s": None,
                                                                             "model_build_s": None},
                                             self.memory_padding)
                judge_run(case, measurement, self.model, self.held_output_bytes, self.memory_padding)
                result = {"status": "ok", "reason": "", "measurement": measurement}
            result["device_env"] = device_environment(case.device)
            result["wall_s"] = time.time() - self.t0
            suite = Suite(name=f"{SUITE_PREFIX}:{self.name}", path="", cases=(case,))
            record = make_record(suite, case, result, host_part(), annotate)
        record.pop("harness_ratio", None)  # the user's run is not the harness's: its wall is theirs
        record.pop("harness_parts", None)
        record["track"] = {**self.track_facts(),
                           "mistakes": mistakes(self.seen, record) if record["status"] == "ok" else [],
                           "interrupted_by": self.interrupted or None}
        problem = record_problem(record)
        if problem:  # never the user's training's end: said, and nothing written
            warnings.warn(f"ckptbench.track: the record does not validate ({problem}); not written", stacklevel=2)
            return None
        store = RecordStore(rank_dir(self.out))
        store.ensure()
        store.append(record)
        self.record = record
        self.records.append(record)
        self.next_measurement()
        if self.echo:
            for line in summary_line(record, store.path).splitlines():
                log.info("%s", line)
        return record

    def offload_facts(self, case: Case) -> dict:
        if not case.offload:
            return {"offload_kind": None, "offload_pinned": None, "offload_moved": None, "offload_note": ""}
        import transformers.modeling_utils as mu

        error = pinned_memory_error()
        unpinned = error is not None or getattr(mu.save_on_cpu, "__qualname__", "") != "save_on_cpu"
        return {"offload_kind": "transformers", "offload_pinned": not unpinned,
                "offload_moved": case.device == "cuda",
                "offload_note": f"no pinned host memory ({error})" if error else ""}


def _placeholder():
    from ..point.case import preset

    return preset("llama-tiny")
