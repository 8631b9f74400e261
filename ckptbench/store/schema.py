"""A record typed: what a line of ``records.jsonl`` that :func:`~.validate.record_problem` passed holds.

A reader takes ``Record.read(line)`` once and then reads attributes: every field a record may lack has
its absent value here, once (None for a figure, an empty tuple or mapping for a part), so no reader
carries a ``.get()`` chain with a default of its own.  The line itself stays the record on disk and in
the report's frame (``raw``): typing it never changes what is written or shown.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType

from ..point.case import Case
from ..theory.verdicts.checks import Check

_NONE: Mapping = MappingProxyType({})


def _none() -> Mapping:
    return _NONE


def _part(value) -> Mapping:
    return value if type(value) is dict else _NONE


def read_checks(entries) -> tuple[Check, ...]:
    """The checks of a list as written (:meth:`Check.to_dict`); an entry that is not an object is no check."""
    if not isinstance(entries, list):
        return ()
    return tuple(Check(**{f: c.get(f) for f in _CHECK_FIELDS}) for c in entries if type(c) is dict)


_CHECK_FIELDS = tuple(f.name for f in fields(Check))


@dataclass(frozen=True, slots=True)
class Measurement:
    """The figures of one measured point that more than one reader uses; every other one by name in
    ``figures`` (a point's measurement grows with what it ran: collectives, offload, a compiled step)."""

    peak_bytes: int | None = None
    peak_phase: str | None = None
    mem_after_forward_bytes: int | None = None
    offloaded_bytes: int | None = None
    checkpointed_input_bytes: int | None = None
    step_time_median_s: float | None = None
    step_time_ci95_s: list | None = None  # the median's interval, [low, high]
    tokens_per_s: float | None = None
    setup_s: float | None = None
    mfu: float | None = None
    hfu: float | None = None
    model_flops_per_step: float | None = None
    hardware_flops_per_step: float | None = None
    ideal_recompute_ratio: float | None = None
    energy_per_step_j: float | None = None
    threads: int | None = None
    checkpointed_layers: tuple[int, ...] = ()
    recomputed_layers: tuple[int, ...] = ()
    saved_bytes_per_layer: tuple[int, ...] = ()  # what each decoder layer keeps for backward
    offloaded_bytes_per_layer: tuple[int, ...] = ()  # of which on the host
    saved_outside_layers_bytes: int | None = None
    figures: Mapping = field(default_factory=_none)

    @classmethod
    def read(cls, m) -> Measurement:
        if type(m) is not dict or not m:
            return EMPTY
        return cls(**{f: m.get(f) for f in _NAMED}, **{f: tuple(m.get(f) or ()) for f in _LAYERS}, figures=m)


_LAYERS = ("checkpointed_layers", "recomputed_layers", "saved_bytes_per_layer", "offloaded_bytes_per_layer")
_NAMED = tuple(f.name for f in fields(Measurement) if f.name not in (*_LAYERS, "figures"))
EMPTY = Measurement()


@dataclass(frozen=True)
class Record:
    """One point's record: its Case, how it ended, what it measured and how that was judged.  The parts are
    typed when first read (a report of 20,000 records reads the checks of few of them this way)."""

    case_id: str
    status: str
    raw: Mapping  # the line as read: what a Case's twin is keyed by, what is written back
    strategy: str | None = None
    reason: str | None = None
    verdict: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def case_fields(self) -> Mapping:
        return self.raw["case"]

    @functools.cached_property
    def case(self) -> Case:
        return Case.from_dict(self.raw["case"])

    @functools.cached_property
    def measurement(self) -> Measurement:
        return Measurement.read(self.raw.get("measurement"))

    @functools.cached_property
    def checks(self) -> tuple[Check, ...]:
        return read_checks(self.raw.get("checks"))

    @functools.cached_property
    def meter_checks(self) -> tuple[Check, ...]:
        return read_checks(self.meters.get("checks"))

    # the parts that are objects: each as read, or an empty one when absent or not an object
    @property
    def estimate(self) -> Mapping:
        return _part(self.raw.get("estimate"))

    @property
    def meters(self) -> Mapping:
        return _part(self.raw.get("meters"))

    @property
    def gates(self) -> Mapping:
        return _part(self.raw.get("gates"))

    @property
    def env(self) -> Mapping:
        return _part(self.raw.get("env"))

    @property
    def track(self) -> Mapping:
        return _part(self.raw.get("track"))

    @property
    def plan_prediction(self) -> Mapping:
        """What ``plan --verify`` predicted of the point."""
        return _part(self.raw.get("plan_prediction"))

    @classmethod
    def read(cls, line: dict) -> Record:
        """The typed record of a line :func:`~.validate.record_problem` passed (a line it refuses may
        raise on reading a part: the store never hands one on)."""
        return cls(line["case_id"], line["status"], line, line.get("strategy"), line.get("reason"), line.get("verdict"))


def typed(records) -> list[Record]:
    """:meth:`Record.read` of each line, in order."""
    return [Record.read(r) for r in records]
