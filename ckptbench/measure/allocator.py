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
        self.held: frozenset[int] = frozenset()  # addresses of the blocks the step's accounting holds at start
        self.unlisted_frees = 0  # bytes freed in the step of blocks from before it that nobody listed

    def mark(self, label: str) -> None:
        """A moment of the step (an empty profiler range): :meth:`result` gives the running sum there."""
        import torch

        with torch.profiler.record_function(MARK + label):
            pass

    def start(self, held: frozenset[int] = frozenset()) -> None:
        """Start listening; `held` are the addresses of the blocks alive now that the step's accounting
        holds (its parameters, optimizer state, gradients and inputs): their frees count, and so do the
        frees of blocks the step allocates.  Any other free is of a block from before the step that the
        profiler happens to know (it was allocated in an earlier profiled window of this thread: another
        point's step in the same process): when it comes depends on what ran before, so it is left out
        of the sum and its bytes are reported as ``allocator_unlisted_frees_bytes``."""
        from torch.profiler import ProfilerActivity, profile

        from .quiet import Quiet

        self.held = held
        # the profiler's and the allocator's C++ lines go to descriptor 2, not to the user's terminal
        self._quiet = Quiet()
        self._quiet.start()
        self._prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
        self._prof.__enter__()

    def stop(self) -> None:
        prof, self._prof = self._prof, None
        if prof is None:
            return
        try:
            prof.__exit__(None, None, None)
        finally:
            self._quiet.stop()
        results = prof.profiler.kineto_results
        events = results.events()
        changes = self._changes(results)
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

    def _changes(self, results) -> list[tuple[int, int]]:
        """(time, bytes) of every CPU allocation and counted free, in the order they happened."""
        from torch._C._profiler import _EventType

        allocations = []
        stack = list(results.experimental_event_tree())
        while stack:
            e = stack.pop()
            stack.extend(e.children)
            if e.tag == _EventType.Allocation and e.extra_fields.device.type == "cpu":
                allocations.append((e.start_time_ns, e.extra_fields.ptr, e.extra_fields.alloc_size))
        allocations.sort(key=lambda a: (a[0], a[2]))  # in time; a tie (none seen) puts the free first
        live: set[int] = set()
        changes = []
        self.unlisted_frees = 0
        for t, ptr, nbytes in allocations:
            if nbytes > 0:
                live.add(ptr)
            elif ptr in live:
                live.discard(ptr)
            elif ptr not in self.held:
                self.unlisted_frees -= nbytes
                continue
            changes.append((t, nbytes))
        return changes

    def result(self) -> dict:
        return {"allocator_meter": self.kind if self.growth is not None else None,
                "allocator_growth_bytes": self.growth, "allocator_events": self.events,
                "allocator_unlisted_frees_bytes": self.unlisted_frees if self.growth is not None else None,
                **({"allocator_at_marks_bytes": dict(self.at_marks)} if self.at_marks else {})}
