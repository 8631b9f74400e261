"""A memory timeline of the memory step: live bytes after every change, the step's phases and layers marked.

On CPU the live-storage tracker (:mod:`.storage`) appends its device total after every allocation, free,
offload or resize while a :class:`Timeline` is attached, so the samples are the exact running total
whose maximum the tracker reports as the peak.  On CUDA the caching allocator's own history
(``torch.cuda.memory._record_memory_history``) is replayed instead (:class:`CudaHistory`).

Marks name what the step was doing from a sample on: the phases the memory step names (``forward``,
``backward-head``, ``backward-layer-3``, ``optimizer`` ...) and the decoder layers (``forward-layer-3``
when a layer's forward begins, ``forward-layer-3-end`` when it returns, ``recompute-layer-3`` when
backward runs it again).

A record keeps at most :data:`MAX_SAMPLES` samples: past that the series is cut into buckets and each
bucket keeps its lowest and its highest sample (first and last sample kept too), so the timeline's
maximum is always the exact peak and no dip or spike disappears, only the shape between them.
"""

from __future__ import annotations

from array import array

MAX_SAMPLES = 2000
MAX_MARKS = 1000  # a step of many layers and micro-batches drops the rest (counted in marks_dropped)


class Marks:
    """(event, label) pairs, at most :data:`MAX_MARKS` (the rest counted); a label repeated is no new mark."""

    def __init__(self) -> None:
        self.kept: list[tuple[int, str]] = []
        self.dropped = 0
        self._last: str | None = None

    def add(self, event: int, label: str) -> None:
        if label == self._last:
            return
        self._last = label
        if len(self.kept) >= MAX_MARKS:
            self.dropped += 1
        else:
            self.kept.append((event, label))


class Timeline:
    """The running total after every change (sample 0: the total when the step began) and the marks."""

    def __init__(self, start_bytes: int) -> None:
        self.values = array("q", [start_bytes])
        self.marks = Marks()

    def mark(self, label: str) -> None:
        """From the latest sample on, the step does `label`."""
        self.marks.add(len(self.values) - 1, label)

    def result(self, meter: str, unit: str, max_samples: int | None = None) -> dict:
        return compact(self.values, self.marks.kept, meter, unit, self.marks.dropped, max_samples or MAX_SAMPLES)


def downsample(values, max_samples: int = MAX_SAMPLES) -> tuple[list[int], list[int]]:
    """(event indices, values) of at most `max_samples` samples of `values`: every sample when they fit,
    else the first, the last, and the lowest and highest of each of ``(max_samples - 2) // 2`` buckets
    of the samples between them, in order.  The maximum and minimum of `values` are always kept."""
    import numpy as np

    n = len(values)
    if n <= max_samples:
        return list(range(n)), [int(v) for v in values]
    if max_samples < 4:
        raise ValueError(f"max_samples must be at least 4, not {max_samples}")
    a = np.frombuffer(values, dtype=np.int64) if isinstance(values, array) else np.asarray(values, dtype=np.int64)
    buckets = (max_samples - 2) // 2
    edges = np.linspace(1, n - 1, buckets + 1).astype(np.int64)
    keep = [0]
    for lo, hi in zip(edges[:-1], edges[1:]):
        if hi <= lo:
            continue
        part = a[lo:hi]
        low, high = int(lo + part.argmin()), int(lo + part.argmax())
        keep.extend(sorted({low, high}))
    keep.append(n - 1)
    return keep, [int(a[i]) for i in keep]


def compact(values, marks, meter: str, unit: str, marks_dropped: int = 0, max_samples: int = MAX_SAMPLES) -> dict:
    """What a record stores: parallel lists ``event`` (index of the change, 0 = the step's start) and
    ``bytes``, the marks as ``[event, label]``, and the exact peak's event."""
    import numpy as np

    events, kept = downsample(values, max_samples)
    peak_event = int(np.argmax(np.asarray(values, dtype=np.int64))) if len(values) else 0  # the first at the peak
    return {"meter": meter, "unit": unit, "events": len(values) - 1, "event": events, "bytes": kept,
            "peak_event": peak_event, "marks": [[e, label] for e, label in marks],
            "marks_dropped": marks_dropped, "max_samples": max_samples}


# -- CUDA: the caching allocator's history --------------------------------------------------------------
HISTORY_ENTRIES = 2_000_000  # the allocator's ring buffer; a step that fills it has no timeline


class CudaHistory:
    """The caching allocator's alloc/free history over the memory step, replayed into a timeline.

    The history sizes each block by the bytes requested (before the allocator rounds it to its block
    size), and its running sum (``alloc`` +size, ``free_completed`` −size) is exactly the allocator's
    ``requested_bytes`` counter: the timeline's maximum is ``requested_bytes.all.peak`` (recorded as
    ``cuda_max_requested_bytes``), a little under ``max_memory_allocated``, which counts whole blocks.
    A mark is placed at the number of history events so far, read from the allocator's own counters of
    blocks made active and released (``active.all.allocated`` + ``active.all.freed``): no clock, no sync.
    """

    meter = "cuda-allocator-history"
    unit = "requested bytes (the allocator's history: block sizes before rounding)"

    def __init__(self, device) -> None:
        self.device = device
        self.marks = Marks()
        self.error: str | None = None
        self.snapshot: dict | None = None

    def _counts(self) -> tuple[int, int]:
        import torch

        s = torch.cuda.memory_stats(self.device)
        return s.get("active.all.allocated", 0) + s.get("active.all.freed", 0), s.get("requested_bytes.all.current", 0)

    def start(self) -> None:
        import torch

        try:
            torch.cuda.memory._record_memory_history("all", context=None, stacks="python",
                                                     max_entries=HISTORY_ENTRIES, device=self.device,
                                                     clear_history=True)
        except (RuntimeError, TypeError, AttributeError) as exc:  # a torch without it, or an allocator that has none
            self.error = f"{type(exc).__name__}: {exc}"[:300]
            return
        self.events0, self.start_bytes = self._counts()

    def mark(self, label: str) -> None:
        if self.error is None and label != self.marks._last:
            self.marks.add(self._counts()[0] - self.events0, label)

    def stop(self) -> None:
        import torch

        if self.error is not None:
            return
        try:
            self.snapshot = torch.cuda.memory._snapshot()
        except RuntimeError as exc:  # the measurement stands without its timeline
            self.error = f"{type(exc).__name__}: {exc}"[:300]
        finally:
            try:
                torch.cuda.memory._record_memory_history(None)
            except RuntimeError:
                pass

    def result(self, index: int, max_samples: int | None = None) -> tuple[dict | None, str | None]:
        """(timeline, None), or (None, why there is none)."""
        if self.error is not None:
            return None, self.error
        traces = (self.snapshot or {}).get("device_traces") or []
        trace = traces[index] if index < len(traces) else []
        if len(trace) >= HISTORY_ENTRIES:
            return None, f"the allocator's history filled its {HISTORY_ENTRIES:,} entries: the step's start is lost"
        values = replay(trace, self.start_bytes)
        marks = [(min(e, len(values) - 1), label) for e, label in self.marks.kept]
        return compact(values, marks, self.meter, self.unit, self.marks.dropped, max_samples or MAX_SAMPLES), None


def replay(trace: list[dict], start_bytes: int) -> array:
    """The running requested bytes after each ``alloc`` and ``free_completed`` of an allocator history."""
    values = array("q", [start_bytes])
    total = start_bytes
    for entry in trace:
        action = entry.get("action")
        if action == "alloc":
            total += entry["size"]
        elif action == "free_completed":
            total -= entry["size"]
        else:
            continue
        values.append(total)
    return values
