"""A second memory meter on CPU: torch's allocator, as its profiler reports it, beside the live-storage tracker.

The tracker sees tensors through torch's dispatcher and sizes their storages; c10's CPU allocator sees
every allocation, whoever makes it.  Reading the allocator's events through the profiler gives a peak
that shares none of the tracker's code: agreement is evidence, a difference names what one of them
misses.  Expected difference: tensors made below the dispatcher (a kernel's scratch buffers, the RNG
state non-reentrant checkpoint saves per layer: ``torch.get_rng_state()`` is 5,056 bytes) count for
the allocator only.

The kernel's view (resident pages) was tried too and left out: glibc keeps small freed chunks resident
and only a process-wide mmap threshold makes pages follow tensors, which would slow the timed steps too.
"""

from __future__ import annotations

MARK = "ckptbench::"


class AllocatorMeter:
    """torch's CPU allocator as the profiler reports it: every allocation and free of the step, in order.

    ``torch.profiler`` with ``profile_memory=True`` receives a ``[memory]`` event from c10's CPU allocator
    for each allocation (+bytes) and free (−bytes), whoever asked for it: kernels' own scratch tensors and
    tensors made outside the dispatcher included.  The running sum's maximum is the step's allocator peak
    above its start.  Exact to the byte and blind to glibc and pages, so it is the meter the tracker must
    agree with.
    """

    kind = "torch.profiler profile_memory: peak of the running sum of CPU allocator events"

    def __init__(self, names: tuple[str, ...] = ()) -> None:
        self._prof = None
        self.growth: int | None = None
        self.events = 0
        self.names = dict.fromkeys(names, 0)  # how many profiler events whose name starts so the step ran
        self.at_marks: dict[str, int] = {}  # the running sum when each mark was made

    def mark(self, label: str) -> None:
        """A moment of the step (an empty profiler range): :meth:`result` gives the running sum there."""
        import torch

        with torch.profiler.record_function(MARK + label):
            pass

    def start(self) -> None:
        from torch.profiler import ProfilerActivity, profile

        self._prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
        self._prof.__enter__()

    def stop(self) -> None:
        prof, self._prof = self._prof, None
        if prof is None:
            return
        prof.__exit__(None, None, None)
        events = prof.profiler.kineto_results.events()
        changes = sorted((e.start_ns(), e.nbytes()) for e in events
                         if e.name() == "[memory]" and e.device_type().name == "CPU")
        for e in events if self.names else ():
            for name in self.names:
                self.names[name] += e.name().startswith(name)
        marks = sorted((e.start_ns(), e.name().removeprefix(MARK)) for e in events if e.name().startswith(MARK))
        for t, label in marks:
            self.at_marks[label] = sum(nbytes for when, nbytes in changes if when <= t)
        running = peak = 0
        for _, nbytes in changes:
            running += nbytes
            peak = max(peak, running)
        self.growth, self.events = peak, len(changes)

    def result(self) -> dict:
        return {"allocator_meter": self.kind if self.growth is not None else None,
                "allocator_growth_bytes": self.growth, "allocator_events": self.events,
                **({"allocator_at_marks_bytes": dict(self.at_marks)} if self.at_marks else {})}
