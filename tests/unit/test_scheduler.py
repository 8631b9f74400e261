"""The slot scheduler: points start in plan order as their slots free up; a stop records or drops what runs.

The points here are threads that wait to be released (or stopped), so the order is decided by the test,
not by timing; the scheduler under test is the real one.
"""

from __future__ import annotations

import threading

import pytest

from ckptbench.point.case import Case, preset
from ckptbench.point.training import TrainSpec
from ckptbench.run.scheduler import Interrupted, Stopped, StopRequest, run_on_slots
from ckptbench.run.slots import cpu_slots


def point(batch: int, world_size: int = 1) -> Case:
    return Case(model=preset("llama-tiny"), train=TrainSpec(), batch_size=batch, seq_len=8, world_size=world_size)


class Points:
    """Each point runs until the test releases it (or the scheduler stops it); what happened, in order."""

    def __init__(self) -> None:
        self.events: list[tuple] = []
        self.release: dict[str, threading.Event] = {}
        self.started = threading.Condition()

    def start(self, case, repeat, placement, running):
        gate = self.release.setdefault(case.id, threading.Event())
        running.register(gate.set)
        with self.started:
            self.events.append(("start", case.batch_size, placement.cores))
            self.started.notify_all()
        gate.wait(30)
        return {"status": "ok"}

    def finish(self, case, repeat, placement, result):
        self.events.append(("record", case.batch_size, result["status"]))

    def wait_started(self, n: int) -> None:
        with self.started:
            assert self.started.wait_for(lambda: sum(e[0] == "start" for e in self.events) >= n, 30)

    def let_go(self, case: Case) -> None:
        self.release.setdefault(case.id, threading.Event()).set()


def run_in_background(todo, slots, points, stop=None):
    box = {}

    def target():
        try:
            box["n"] = run_on_slots(todo, slots, points.start, points.finish, lambda case: None, stop=stop)
        except Exception as exc:
            box["error"] = exc
    thread = threading.Thread(target=target)
    thread.start()
    return thread, box


def test_points_share_the_slots_and_a_group_waits_for_as_many_as_its_ranks():
    a, b, group, c = point(1), point(2), point(3, world_size=2), point(4)
    points = Points()
    thread, box = run_in_background([(a, 0), (b, 0), (group, 0), (c, 0)], cpu_slots(2, 1, [0, 1]), points)
    points.wait_started(2)
    assert points.events == [("start", 1, (0,)), ("start", 2, (1,))]
    points.let_go(a)
    points.let_go(b)
    points.wait_started(3)  # the group needed both slots; c, behind it in the plan, waited too
    assert points.events[2:] == [("record", 1, "ok"), ("record", 2, "ok"), ("start", 3, (0, 1))] or \
        points.events[2:] == [("record", 2, "ok"), ("record", 1, "ok"), ("start", 3, (0, 1))]
    points.let_go(group)
    points.wait_started(4)
    points.let_go(c)
    thread.join(30)
    assert box == {"n": 4}
    assert [e[1] for e in points.events if e[0] == "record"][-2:] == [3, 4]


@pytest.mark.parametrize("status", ["timeout", None])
def test_a_stop_records_the_points_in_flight_as_asked_and_starts_nothing_more(status):
    a, b, c = point(1), point(2), point(3)
    points, stop = Points(), StopRequest()
    thread, box = run_in_background([(a, 0), (b, 0), (c, 0)], cpu_slots(2, 1, [0, 1]), points, stop)
    points.wait_started(2)
    stop.request("stopped with job 7 at its time limit", status)
    thread.join(30)
    assert isinstance(box["error"], Stopped)
    records = [e for e in points.events if e[0] == "record"]
    if status is None:  # dropped whole: --resume or the requeued job runs them again
        assert records == [] and box["error"].remaining == 3
    else:
        assert sorted(records) == [("record", 1, "timeout"), ("record", 2, "timeout")]
        assert box["error"].done == 2 and box["error"].remaining == 1
    assert ("start", 3, (0,)) not in points.events and ("start", 3, (1,)) not in points.events


def test_ctrl_c_stops_the_points_in_flight_and_keeps_what_finished():
    a, b, c = point(1), point(2), point(3)
    points = Points()
    points.let_go(a)

    def ctrl_c_when_c_is_due(case):
        if case is c:  # a has ended and is recorded, b runs on the other slot
            points.wait_started(2)
            raise KeyboardInterrupt
        return None

    with pytest.raises(Interrupted, match="interrupted after 1 points, 2 not run"):
        run_on_slots([(a, 0), (b, 0), (c, 0)], cpu_slots(2, 1, [0, 1]), points.start, points.finish,
                     ctrl_c_when_c_is_due)
    assert [e for e in points.events if e[0] == "record"] == [("record", 1, "ok")]
    assert points.release[b.id].is_set()  # b's process was stopped, not left running
