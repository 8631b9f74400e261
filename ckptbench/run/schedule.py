"""Which optimizer step of a point is which (warm-up, memory, timed), and what runs around each.

Every training loop (:mod:`ckptbench.train.loops`) reports its steps to a :class:`StepSchedule`, so the
steps mean the same whatever loop ran them: the worker's points and the step-time model's framework probe
(:mod:`.steptime`) alike.
"""

from __future__ import annotations

import time

import torch

from ..measure.steps import step_probe_for
from ..measure.timing import StepStats, timer_for
from ..spec import Case
from .faults import Fault
from .memory_step import MemoryStepMarks


class StepSchedule:
    """Which optimizer step is which (warm-up, memory, timed) and what runs around each: the clean steps'
    probe (CUDA allocator peaks, window energy), the timer of the timed steps, an injected slowdown.

    Every loop (:mod:`ckptbench.train.loops`) reports its steps here, so the steps mean the same whatever
    loop ran them."""

    def __init__(self, case: Case, device: torch.device, layers: list, fault: Fault | None):
        t = case.train
        self.warmup, self.memory, self.timed = t.warmup_steps, t.memory_steps, t.steps
        self.total = self.warmup + self.memory + self.timed
        self.fault = fault
        self.marks = MemoryStepMarks(layers)
        self.steps = step_probe_for(device)  # CUDA: per-step allocator peaks, window energy; CPU: nothing
        self.timer = timer_for(device.type)
        self.losses: list = []
        self.mem: dict = {}
        self._window: str | None = None
        self.stats: StepStats | None = None

    def kind(self, k: int) -> str:
        return "warmup" if k < self.warmup else "memory" if k < self.warmup + self.memory else "timed"

    def begin(self, k: int) -> None:
        kind = self.kind(k)
        if kind != self._window:
            self._close()
            self._window = kind
            if kind != "memory":
                self.steps.begin(kind)
        if kind != "memory":
            self.steps.before_step()
        if kind == "timed":
            self.timer.start()
            self._t_step = time.perf_counter()

    def end(self, k: int, loss) -> None:
        kind = self.kind(k)
        if kind == "timed":
            fault = self.fault
            if fault is not None and fault.kind == "slow":
                time.sleep(fault.seconds)
            if fault is not None and fault.kind == "slower":  # this step, `fraction` longer (CPU: no sync needed)
                time.sleep(fault.fraction * (time.perf_counter() - self._t_step))
            self.timer.stop()
        if kind == "memory":
            self.mem = self.marks.result()
        else:
            self.steps.after_step()
            self.losses.append(loss)

    def _close(self) -> None:
        if self._window == "timed":
            self.stats = StepStats.of(self.timer.times())  # the window's one synchronise (CUDA)
        if self._window in ("warmup", "timed"):
            self.steps.end()

    def finish(self) -> StepStats:
        self._close()
        self._window = None
        return self.stats
