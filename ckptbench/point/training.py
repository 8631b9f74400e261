"""The ``[train]`` settings every point of a suite shares, and how long its steps are timed.

:class:`Timing` is the stopping rule of the timed steps (:mod:`ckptbench.measure.stopping`): a point times
at least ``steps`` steps, then until the 95 % interval of its median step time is within ±``precision``
of it, or ``max_steps`` timed steps or ``max_time_s`` seconds of them are reached.  At its defaults it
stays out of a Case's id (:meth:`TrainSpec.id_fields`), so points stored before it existed keep theirs.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields


@dataclass(frozen=True)
class Timing:
    """How long a point's timed steps go on: ``[train] time_precision``, ``max_steps``, ``max_time_s``."""

    precision: float = 0.02  # relative half-width of the median's 95 % interval (0.02: within ±2 %)
    max_steps: int = 50  # timed steps at most (never fewer than TrainSpec.steps)
    max_time_s: float = 20.0  # seconds of timed steps after which no further step starts

    @classmethod
    def from_dict(cls, data: dict | None) -> Timing:
        return cls(**data) if data else cls()


@dataclass(frozen=True)
class TrainSpec:
    """Fixed training settings of a suite: identical for every point so points are comparable.
    ``steps`` is the fewest timed steps; :class:`Timing` says how many more."""

    lr: float = 1e-4
    warmup_steps: int = 1
    steps: int = 3
    memory_steps: int = 1
    seed: int = 0
    threads: int = 1
    timing: Timing = Timing()

    def id_fields(self) -> dict:
        """The fields a Case's id hashes: the timing only when it is not the default."""
        out = asdict(self)
        if self.timing == Timing():
            del out["timing"]
        return out

    @classmethod
    def from_dict(cls, data: dict) -> TrainSpec:
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        values["timing"] = Timing.from_dict(values.get("timing"))
        return cls(**values)
