"""Points on slots: each starts, in plan order, as soon as the slots it needs are free.

A thread per point in flight waits on its process (a forked worker, a torchrun group) and hands the
result back through a queue.  The sweep's main thread alone starts points, writes records and stops
processes, so the records have one writer (appended in the order points end), and Ctrl-C or a job
manager's signal lands in the thread that can act on it.  With one slot this is the serial sweep.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from ..point.case import Case
from .slots import Placement, Slot, place

POLL_S = 0.1  # how often the main thread looks up from waiting (a stop request is seen this fast)
JOIN_S = 5.0  # how long a stopped point's thread is given to reap its process


class Interrupted(Exception):
    """Ctrl-C during a sweep: the workers in flight were stopped, every finished record is kept."""

    def __init__(self, done: int, remaining: int):
        self.done, self.remaining = done, remaining
        super().__init__(f"interrupted after {done} points, {remaining} not run")


class Stopped(Exception):
    """The sweep ended early on a :class:`StopRequest` (a job manager's signal)."""

    def __init__(self, reason: str, done: int, remaining: int):
        self.reason, self.done, self.remaining = reason, done, remaining
        super().__init__(f"stopped after {done} points, {remaining} not run: {reason}")


class StopRequest:
    """Set from a signal handler, read by the main loop between two looks at its workers.

    `status` says what becomes of the points in flight: ``"timeout"`` records each of them so (the job
    reached its time limit, and a point that did not finish in it must not be run again and again by
    each requeued job); None drops them whole, for ``--resume`` or a requeued job to run again
    (preemption, cancellation: not the point's doing).
    """

    def __init__(self) -> None:
        self.reason: str | None = None
        self.status: str | None = None
        self.at = 0.0  # time.time() of the request

    def request(self, reason: str, status: str | None) -> None:
        if self.reason is None:
            self.reason, self.status, self.at = reason, status, time.time()


@dataclass
class Running:
    """A point in flight: where it runs, since when, and how to stop its process."""

    case: Case
    repeat: int
    placement: Placement
    since: float = field(default_factory=time.time)
    thread: threading.Thread | None = None
    _killer: Callable[[], None] | None = None
    _cancelled: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def register(self, killer: Callable[[], None]) -> None:
        """The point's thread says how to stop its process; stopped at once if that was asked already."""
        with self._lock:
            self._killer = killer
            cancelled = self._cancelled
        if cancelled:
            killer()

    def cancel(self) -> None:
        with self._lock:
            self._cancelled = True
            killer = self._killer
        if killer is not None:
            killer()

    def to_dict(self) -> dict:
        return {"case_id": self.case.id, "repeat": self.repeat, "slots": [s + 1 for s in self.placement.slots],
                "where": self.placement.label(), "since": time.strftime("%Y-%m-%dT%H:%M:%S%z",
                                                                         time.localtime(self.since))}


Start = Callable[[Case, int, Placement, Running], dict]  # runs one point in its thread, returns its result
Finish = Callable[[Case, int, "Placement | None", dict], None]  # records a result (main thread)


def run_on_slots(todo: list[tuple[Case, int]], slots: tuple[Slot, ...], start: Start, finish: Finish,
                 not_started: Callable[[Case], dict | None],
                 on_running: Callable[[list[Running]], None] | None = None,
                 stop: StopRequest | None = None) -> int:
    """Run every (Case, repeat) of `todo`; returns how many were recorded.

    `not_started` gives a result for a point that must not start (a deadline passed, too big for the
    memory), asked when the slots it would take are free.
    """
    pending = deque(todo)
    running: dict[int, Running] = {}
    results: queue.Queue = queue.Queue()
    free = set(range(len(slots)))
    recorded = 0
    try:
        while pending or running:
            if stop is not None and stop.reason is not None:
                recorded += _stop(running, stop, finish)
                raise Stopped(stop.reason, recorded, len(todo) - recorded)
            changed = False
            while pending and (placement := place(pending[0][0], slots, free)) is not None:
                case, repeat = pending.popleft()
                result = not_started(case)
                if result is not None:
                    finish(case, repeat, None, result)
                    recorded += 1
                    continue
                free -= set(placement.slots)
                point = Running(case, repeat, placement)
                running[id(point)] = point
                point.thread = threading.Thread(target=_work, args=(point, start, results), daemon=True,
                                                name=f"ckptbench-slot-{placement.slots[0] + 1}")
                point.thread.start()
                changed = True
            if changed and on_running is not None:
                on_running(list(running.values()))
            try:
                key, result = results.get(timeout=POLL_S)
            except queue.Empty:
                continue
            if stop is not None and stop.reason is not None:
                results.put((key, result))  # it ended as the sweep was stopped, likely by the same signal:
                continue  # left in flight for the stop to record as it records the others
            point = running.pop(key)
            free |= set(point.placement.slots)
            finish(point.case, point.repeat, point.placement, result)
            recorded += 1
            if on_running is not None:
                on_running(list(running.values()))
    except KeyboardInterrupt:
        # Wherever Ctrl-C lands, the points in flight are dropped whole: their workers are killed and
        # their records, not yet appended, will be run again by --resume.
        _kill(running)
        raise Interrupted(recorded, len(todo) - recorded) from None
    except Exception:
        _kill(running)  # a record that could not be written (a full disk) ends the sweep: nothing left running
        raise
    return recorded


def _work(point: Running, start: Start, results: queue.Queue) -> None:
    try:
        result = start(point.case, point.repeat, point.placement, point)
    except Exception as exc:  # a bug in the sweep itself, not in the point: still one result, never a hang
        result = {"status": "crash", "reason": f"the sweep failed to run this point: {type(exc).__name__}: {exc}"}
    results.put((id(point), result))


def _kill(running: dict[int, Running]) -> None:
    for point in running.values():
        point.cancel()
    deadline = time.monotonic() + JOIN_S
    for point in running.values():
        if point.thread is not None:
            point.thread.join(max(0.0, deadline - time.monotonic()))


def _stop(running: dict[int, Running], stop: StopRequest, finish: Finish) -> int:
    """Stop every point in flight; record each as `stop.status` says (or not at all). Returns how many."""
    _kill(running)
    if stop.status is None:
        return 0
    for point in running.values():
        ran = max(0.0, stop.at - point.since)
        finish(point.case, point.repeat, point.placement,
               {"status": stop.status, "reason": f"{stop.reason}, {ran:.0f} s after the sweep started the point; "
                                                 "its worker was killed", "wall_s": ran})
    return len(running)
