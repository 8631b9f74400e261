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


class AllocatorMeter:
    """torch's CPU allocator as the profiler reports it: every allocation and free of the step, in order.

    ``torch.profiler`` with ``profile_memory=True`` receives a ``[memory]`` event from c10's CPU allocator
    for each allocation (+bytes) and free (−bytes), whoever asked for it: kernels' own scratch tensors and
    tensors made outside the dispatcher included.  The running sum's maximum is the step's allocator peak
    above its start.  Exact to the byte and blind to glibc and pages, so it is the meter the tracker must
    agree with.
    """

    kind = "torch.profiler profile_memory: peak of the running sum of CPU allocator events"

    def __init__(self) -> None:
        self._prof = None
        self.growth: int | None = None
        self.events = 0

    def start(self) -> None:
        from torch.profiler import ProfilerActivity, profile

        self._prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
        self._prof.__enter__()

    def stop(self) -> None:
        prof, self._prof = self._prof, None
        if prof is None:
            return
        prof.__exit__(None, None, None)
        changes = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
                         if e.name() == "[memory]" and e.device_type().name == "CPU")
        running = peak = 0
        for _, nbytes in changes:
            running += nbytes
            peak = max(peak, running)
        self.growth, self.events = peak, len(changes)

    def result(self) -> dict:
        return {"allocator_meter": self.kind if self.growth is not None else None,
                "allocator_growth_bytes": self.growth, "allocator_events": self.events}
