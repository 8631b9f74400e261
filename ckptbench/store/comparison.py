"""What ``compare`` hands back: thresholds in, deltas per point, one Comparison out (plain dataclasses).

Kept apart from the judging (:mod:`.compare`) so that the view (:mod:`ckptbench.report.compare`) and the
JSON read the same fields the judging fills.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from .machine_speed import MachineSpeed
from .points import QUANTITY_BY_KEY, Point

DEFAULT_MEMORY_THRESHOLD = 0.02
DEFAULT_TIME_THRESHOLD = 0.10


@dataclass(frozen=True)
class Thresholds:
    """Relative changes (0.02 = 2%) beyond which a quantity counts as a regression."""

    memory: float = DEFAULT_MEMORY_THRESHOLD
    time: float = DEFAULT_TIME_THRESHOLD
    drift: bool = True  # divide out the machine's speed change when the calibration kernel measured one

    def for_kind(self, kind: str) -> float:
        return self.memory if kind == "memory" else self.time


def parse_percent(text: str) -> float:
    """``"2%"``, ``"2"`` and ``"2.5%"`` are percentages; returns the fraction (0.02).

    A bare number means percent too, so ``--fail-time 10`` cannot silently mean 1000%.
    """
    s = text.strip()
    s = s[:-1] if s.endswith("%") else s
    try:
        value = float(s)
    except ValueError:
        raise ValueError(f"expected a percentage such as 2% or 2.5, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"a threshold must be a finite percentage >= 0, got {text!r}")
    return value / 100


@dataclass
class Delta:
    quantity: str  # Quantity.key
    label: str
    old: float | None
    new: float | None
    change: float | None  # (new - old) / old; inf when old is 0 and new is not
    regressed: bool = False
    improved: bool = False
    # time only: the one-sided Welch p-value on log times for the change's direction and the test it
    # came from, the medians' intervals with the coverage each really has, and the verdict: regression /
    # improvement / no change / noisy (beyond the threshold but not significant) / untested (no per-step
    # times: judged on the threshold alone)
    p_value: float | None = None
    test: str = ""
    old_ci: list | None = None
    new_ci: list | None = None
    old_ci_coverage: float | None = None
    new_ci_coverage: float | None = None
    verdict: str = ""
    judged_change: float | None = None  # the change judged: after the measured machine-speed change (time only)


@dataclass
class PointComparison:
    key: str
    label: str
    old_status: str
    new_status: str
    deltas: list[Delta] = field(default_factory=list)
    status_regressed: bool = False
    old_spread: float | None = None
    new_spread: float | None = None
    noisy: bool = False

    @property
    def regressed(self) -> bool:
        return self.status_regressed or any(d.regressed for d in self.deltas)

    def reasons(self, thresholds: Thresholds) -> list[str]:
        """Why this point regressed, one short phrase each (for the summary lines)."""
        out = [f"status {self.old_status} -> {self.new_status}"] if self.status_regressed else []
        for d in self.deltas:
            if d.regressed:
                q = QUANTITY_BY_KEY[d.quantity]
                out.append(f"{d.label} {format_change(d.change)} (threshold {thresholds.for_kind(q.kind):.0%})")
        return out


@dataclass
class Comparison:
    kind: str
    thresholds: Thresholds
    points: list[PointComparison]
    only_old: list[Point]
    only_new: list[Point]
    problems: list[str] = field(default_factory=list)
    env_changes: list[str] = field(default_factory=list)
    # the measured change of the machine's speed, and whether the new step times were divided by it
    machine_speed: MachineSpeed = field(default_factory=lambda: MachineSpeed("unknown", "no calibration readings"))
    # the median step-time change over the points ok on both sides (4 or more): stated, never divided out
    median_change: float | None = None

    @property
    def regressions(self) -> list[PointComparison]:
        return [p for p in self.points if p.regressed]

    @property
    def noisy(self) -> list[PointComparison]:
        return [p for p in self.points if p.noisy]

    @property
    def failed(self) -> bool:
        return bool(self.regressions)

    def to_dict(self) -> dict:
        out = asdict(self)
        for entry, point in zip(out["points"], self.points):
            entry["regressed"] = point.regressed
        out["failed"] = self.failed
        return out


def format_change(change: float | None) -> str:
    if change is None:
        return "-"
    if math.isinf(change):
        return "new (was 0)"
    return f"{change:+.1%}"
