"""The framework probe's steps taken one at a time between a point's own timed steps.

The framework's time per op (:mod:`.steptime`) is measured on the point's architecture shrunk to no work.
Probed once, before or after the point, it samples another moment of a machine whose speed flips by 2×
within a second: six probes of one architecture, fifteen rounds each, gave medians from 4.6 to 7.0 µs an
op, and a step of 20 ms whose framework is a third of it then misses by a fifth.  So the probe runs beside
the point: its model and its own loop (the point's: manual, Accelerate or Trainer) live in a thread of
their own, parked at the start of each timed step, and each of the point's rate rounds
(:mod:`.raterounds`) lets it take one step, timed in that thread's CPU time, then times the ops that step
ran, once each, and parks it again.  Only one of the two threads ever runs: the point's thread waits
while the probe steps, and the probe waits while the point steps, so neither step shares the interpreter
with the other.  The random number generators the probe seeds are put back as the point left them.

Where the point's ops move data (its forward traffic, given), the round then hands the probe over once
more for a second step, each forward of its modules that run kernels preceded by a read of the point's
traffic (:mod:`ckptbench.measure.cachescrub`: the caches as the point's step leaves them for the
framework), the reads' time taken out.  A round gives the probe's steps and its ops' timings; the
framework's time is priced from them with the machine's figures in
:func:`.steptime.framework_from_rounds`.  CPU only, as the rate rounds are.
"""

from __future__ import annotations

import os
import random
import threading
import time
from contextlib import contextmanager, nullcontext

from ..measure.cachescrub import CacheScrub, scrub_bytes
from ..spec import Case
from .steptime import PROBE_WARMUP, _probe, _ProbeSchedule, probe_case

# the most rounds a probe plans, two steps each (a Trainer must be told in advance); rounds past it go without
MAX_STEPS = 400
WAIT_S = 300.0  # the longest the point waits for the probe to start or step (a loaded machine: minutes)


@contextmanager
def _generators_kept():
    """Put torch's, Python's and numpy's global generators back as they were: the probe seeds them."""
    import numpy as np
    import torch

    kept = torch.random.get_rng_state(), random.getstate(), np.random.get_state()
    try:
        yield
    finally:
        torch.random.set_rng_state(kept[0])
        random.setstate(kept[1])
        np.random.set_state(kept[2])


def current_cpu() -> int | None:
    """The core the calling thread runs on now (Linux), None where that cannot be asked."""
    try:
        import ctypes

        cpu = ctypes.CDLL(None).sched_getcpu()
    except (OSError, AttributeError):
        return None
    return cpu if cpu >= 0 else None


@contextmanager
def _one_core(probe_tid: int | None):
    """The point's thread and the probe's on the core the point's thread runs on, for one handover; the
    point's thread gets its own cores back after it.  A core that idles while the other thread runs
    elsewhere comes back slow for a while: in a loop of qwen2-tiny 1 × 512 steps (21 ms) that handed a
    helper thread 150 ms of work every fifth step, runs of steps took 30-35 ms after some handovers, and a
    probe-sized step in the helper took 0.92-1.12 of the same step on the point's thread (mean 1.035, five
    runs); with both threads on one core, 0.90-1.03 (mean 0.98).  One torch thread only (a pinned thread's
    OpenMP team would inherit its single core); nothing where the system cannot pin."""
    cpu = current_cpu()
    try:
        allowed = os.sched_getaffinity(0)
        if cpu is None or probe_tid is None or cpu not in allowed:
            raise OSError("no core to pin to")
        os.sched_setaffinity(probe_tid, {cpu})
        os.sched_setaffinity(0, {cpu})
    except (OSError, AttributeError):  # not Linux, or pinning refused: the handover as it was
        yield
        return
    try:
        yield
    finally:
        os.sched_setaffinity(0, allowed)


class _Parked(_ProbeSchedule):
    """The probe's schedule in its thread: warm-up steps and the recorded step run at once; every timed
    step waits at its start for the point's thread to call for it (:meth:`ProbeThread.step`)."""

    def __init__(self, layers: list, device, thread: ProbeThread):
        super().__init__(layers, device, price=None)
        self.total = PROBE_WARMUP + 1 + 2 * MAX_STEPS
        self.thread = thread
        self.timed: list[dict] = []  # each round's ops, key -> seconds per call
        # the point's traffic between the probe's modules (measure/cachescrub.py): each round's second step
        clock = time.thread_time if self.cpu else time.perf_counter
        self.scrub = CacheScrub(layers, clock, self.recorder.kernel_calls)
        self.scrub_calls = 0  # the probe's module calls a step (counted on its recorded step)
        self.scrub_nbytes = 0  # the read before each of them
        self.polluted: list[float] = []  # each round's step with the reads, their own time taken out

    def __iter__(self):
        k = 0
        while k < self.total and not self.done:
            yield k
            k += 1

    @property
    def done(self) -> bool:
        return self.thread.stopping

    def begin(self, k: int) -> None:
        if self.kind(k) == "recorded":
            self.scrub.counting()
        if self.kind(k) == "timed":
            self.thread.park()
            if self.done:
                return  # this step runs untimed, and the loop ends after it
            if self.thread.polluting:
                self.scrub.reading(self.scrub_nbytes)
        super().begin(k)

    def end(self, k: int, loss) -> None:
        if self.kind(k) == "recorded":
            self.scrub.off()
            self.scrub_calls = self.scrub.calls
            self.scrub_nbytes = scrub_bytes(self.thread.traffic, self.scrub_calls)
        if self.kind(k) != "timed":
            super().end(k, loss)
            return
        if self.done:
            return
        from ..measure.oprates import measure_entries

        self.timer.stop()
        step = (self.timer.cpu_times() if self.cpu else self.timer.times())[-1]
        if self.thread.polluting:
            self.scrub.off()
            self.polluted.append(step - self.scrub.spent_s)
            return
        self.steps.append(step)
        self.timed.append(measure_entries(self.recorder.trace(), self.thread.device, trials=1))


class ProbeThread:
    """The probe of `case`'s architecture in a thread, one step per :meth:`step` (see the module's text)."""

    def __init__(self, case: Case, traffic: int = 0):
        self.case = probe_case(case)
        self.traffic = traffic  # the point's forward traffic (measure/cachescrub.py): 0, no reads
        self.polluting = False  # the step handed over now is the round's second, with the reads
        self.device = case.device
        self.schedule: _Parked | None = None
        self.stopping = False
        self.error: str | None = None
        self._go, self._parked = threading.Event(), threading.Event()
        self._thread: threading.Thread | None = None
        self._ended = False

    # --- the probe's thread
    def _run(self, threads: int) -> None:
        import torch

        try:
            torch.set_num_threads(threads)  # a new thread starts with the process's default
            _probe(self.case, None, lambda layers, device, price: self._schedule(layers, device))
        except BaseException as exc:  # noqa: BLE001 (reported in the record; the point goes on without it)
            self.error = f"{type(exc).__name__}: {exc}"[:300]
        finally:
            self._ended = True
            self._parked.set()  # never leave the point's thread waiting

    def _schedule(self, layers: list, device) -> _Parked:
        self.schedule = _Parked(layers, device, self)
        return self.schedule

    def park(self) -> None:
        """In the probe's thread: hand the interpreter back and wait to be called for."""
        self._parked.set()
        self._go.wait()
        self._go.clear()

    # --- the point's thread
    def _wait(self) -> None:
        if not self._parked.wait(WAIT_S):  # never stepped again: it is left parked or running to its end
            self.error, self._ended = f"the probe did not step within {WAIT_S:.0f} s", True

    def _hand_over(self) -> None:
        import torch

        pin = _one_core(self._thread.native_id) if torch.get_num_threads() == 1 else nullcontext()
        with _generators_kept(), pin:
            self._parked.clear()
            self._go.set()
            self._wait()

    def step(self) -> bool:
        """Start the probe (its model, warm-up and recorded steps) the first time; then one timed step and
        its ops' timings.  False when the probe has failed or ended (:attr:`error` says why)."""
        import torch

        if self._thread is None:
            self._thread = threading.Thread(target=self._run, args=(torch.get_num_threads(),), daemon=True,
                                            name="framework-probe")
            with _generators_kept():
                self._thread.start()
                self._wait()
        if self._ended:
            return False
        self._hand_over()
        if not self._ended and self.schedule is not None and self.schedule.scrub_nbytes:
            self.polluting = True
            try:
                self._hand_over()  # the same step again, each module's forward after a read of the point's traffic
            finally:
                self.polluting = False
        return not self._ended or bool(self.schedule and self.schedule.steps)

    def close(self) -> None:
        """Let the probe's loop end (one last untimed step) and wait for its thread."""
        if self._thread is None or self.stopping:
            return
        self.stopping = True
        if not self._ended:
            self._hand_over()  # its last step, untimed; the loop ends after it
        self._thread.join(timeout=0.0 if self.error and self._thread.is_alive() else WAIT_S)

    def result(self) -> dict | None:
        """The probe's recorded step (its op trace), each round's step seconds and op timings; None
        without a round."""
        s = self.schedule
        if s is None or not s.steps:
            return None
        rounds = min(len(s.steps), len(s.timed))
        return {"trace": s.recorder.trace(), "steps_s": s.steps[:rounds], "timed": s.timed[:rounds],
                "polluted_s": s.polluted[:rounds], "scrub_bytes": s.scrub_nbytes, "scrub_calls": s.scrub_calls,
                "label": f"{self.case.model.label}, {self.case.strategy}, b=1 s={self.case.seq_len}"}
