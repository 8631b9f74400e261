"""When a tracked run is measured again: ``every=`` steps and / or ``at=`` named optimizer steps.

A long run's memory and step time drift (the allocator fragments, a data loader's batches change, a
scheduler warms up): each later measurement is one warm-up step (in which the probes are put back: a
Trainer fetches a step's batches before its callbacks are called), a memory step and timed steps, and a
record of its own (``track.from_step``).
Measurements never overlap: a requested step an earlier measurement still covers is skipped.
"""

from __future__ import annotations

from collections.abc import Iterable

from .out import TrackSetupError


class Again:
    """The optimizer steps (0-based, as the run counts them) at which a measurement begins after the first."""

    def __init__(self, every: int | None = None, at: Iterable[int] = ()):
        for key, values in (("every", [] if every is None else [every]), ("at", list(at or ()))):
            for value in values:
                if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                    raise TrackSetupError(f"ckptbench.track: {key}: {value!r} is not a positive whole number "
                                          "of optimizer steps")
        self.every = every
        self.at = sorted(set(at or ()))

    def __bool__(self) -> bool:
        return bool(self.every or self.at)

    def after(self, k: int) -> int | None:
        """The first requested step at or after `k` (the step after a measurement's last), or None."""
        named = [s for s in self.at if s >= k]
        periodic = -(-k // self.every) * self.every if self.every else None
        candidates = [c for c in (named[0] if named else None, periodic) if c is not None and c > 0]
        return min(candidates) if candidates else None
