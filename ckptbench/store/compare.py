"""What got better or worse between two runs: ``ckptbench compare OLD NEW``.

OLD and NEW are both sweep results (a ``results/<run>/`` directory or its ``records.jsonl``) or both
pytest-benchmark JSON files (``make perf`` writes ``results/perf-<time>.json``); the kind is detected,
and mixing kinds is a usage error.  Points are matched by Case id for sweeps (a hash of every setting,
so a changed setting is a different point, never a silently different baseline) and by the benchmark's
``fullname`` for pytest-benchmark files, whose memory numbers come from ``extra_info``.

Verdicts, and why the defaults are what they are:

- **Memory** (peak, after forward, saved activations) regresses when it grows by more than
  ``--fail-memory`` (default 2%).  On CPU peak and after-forward memory are exact counts of live
  storages, identical run to run, and CUDA's allocator counters move by little more than block
  rounding, so a couple of percent is a real change, not noise.
  Checkpointed-input bytes are shown but do not gate: a change there also moves saved activations.
- **Time** regresses when the median step time grows, or tokens/s drops, by more than ``--fail-time``
  (default 10%) *and* the step times say so: a one-sided Mann–Whitney U test gives p < 0.05, over one
  median per repeat when both runs have 3 or more repeats (steps of one worker share its conditions,
  so they are not independent samples), else over every timed step.  Medians, because one slow step (a page fault, a
  neighbour) should not decide; a rank test, because step times are not normal.  A change beyond the
  threshold that is not significant is *noisy* (run more steps, or ``--repeat``), never a regression: a
  run of 3 steps cannot prove anything about a 10% shift, and saying so is the honest answer.  Each
  time delta carries its p-value and both medians' order-statistic intervals with the coverage each
  really has (95 % from 6 samples on, 75 % for 3) (``--json``).  Records
  without per-step times (older files, benchmark JSON without ``data``) are judged on the threshold
  alone and marked *untested*.
- **Common shift**: with 4 or more points on both sides, the median of their step-time ratios is the
  shift every point shares (a slower machine today moves all of them); time is judged relative to it,
  and the shift itself is stated on its own line, flagged when beyond the threshold, without failing:
  from two runs alone a slower machine and a change that slows every point alike cannot be told apart.
  ``--no-drift-correction`` judges the raw change instead.
- **Status**: a point that was ``ok`` and now is not (oom, timeout, crash, ...) is a regression.
- **One-sided points** (in OLD only or NEW only) are listed, never dropped, but do not by themselves fail
  the comparison: adding or retiring points is how suites evolve, and a removed point cannot hide a
  regression because every point present on both sides is still judged.  Two runs with no point in
  common are refused (exit 2, one line): nothing was compared, so neither a pass nor a fail is true.

For other code: :func:`compare_runs` (records in, :class:`Comparison` out) is the entry point, e.g. for
the HTML report; :func:`load_side` reads a path; :mod:`ckptbench.report.compare` draws the table.
"""

from __future__ import annotations

import math
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field

from ..errors import UsageError
from .points import (
    BENCHMARK,
    QUANTITIES,
    QUANTITY_BY_KEY,
    SWEEP,
    Point,
    Quantity,
    Side,
    env_changes,
    first_env,
    load_side,
    points_from_records,
    record_label,
)
from .records import RECORDS
from .stats import ALPHA, median_cis, p_values

__all__ = ["BENCHMARK", "QUANTITIES", "QUANTITY_BY_KEY", "SWEEP", "Comparison", "Delta", "Point", "PointComparison",
           "Quantity", "Thresholds", "compare_paths", "compare_points", "compare_runs", "format_change", "load_side",
           "parse_percent", "record_label"]

DEFAULT_MEMORY_THRESHOLD = 0.02
DEFAULT_TIME_THRESHOLD = 0.10
HELP = __doc__.split("\n\nFor other code")[0]  # the docstring without its note for programmers


@dataclass(frozen=True)
class Thresholds:
    """Relative changes (0.02 = 2%) beyond which a quantity counts as a regression."""

    memory: float = DEFAULT_MEMORY_THRESHOLD
    time: float = DEFAULT_TIME_THRESHOLD
    drift: bool = True  # judge time relative to the shift every point shares (see common_shift)

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
    # time only: one-sided Mann-Whitney U p-value for the change's direction, the medians' order-statistic
    # intervals and their real coverage, and the verdict: regression / improvement / no change / noisy
    # (beyond the threshold but not significant) / untested (no per-step times: judged on the threshold alone)
    p_value: float | None = None
    old_ci: list | None = None
    new_ci: list | None = None
    old_ci_coverage: float | None = None
    new_ci_coverage: float | None = None
    verdict: str = ""
    judged_change: float | None = None  # the change judged: relative to the runs' common shift (time only)


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
    common_shift: float | None = None  # median step-time ratio new/old over the common points, minus 1

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


# --------------------------------------------------------------------------------------------- judging

MIN_POINTS_FOR_SHIFT = 4


def common_shift(pairs: list[tuple[Point, Point]]) -> float | None:
    """How much every point's step time moved together: the median of the new/old ratios of medians,
    minus 1, over the points ok on both sides (None with fewer than 4).

    A machine that runs 10 % slower today (a neighbour, thermal state, another VM on the host) moves every
    point; a code change that slows one setting moves one.  Judging each point relative to the shared
    move keeps the first from being called a regression of every point.  A change that slows every point
    alike is then this shift, stated on its own line rather than blamed on each point.
    """
    ratios = sorted(n.values["step_time_median_s"] / o.values["step_time_median_s"] for o, n in pairs
                    if o.status == n.status == "ok" and o.values.get("step_time_median_s")
                    and n.values.get("step_time_median_s"))
    if len(ratios) < MIN_POINTS_FOR_SHIFT:
        return None
    mid = len(ratios) // 2
    median = ratios[mid] if len(ratios) % 2 else (ratios[mid - 1] + ratios[mid]) / 2
    return median - 1


@dataclass
class _Pending:
    """A time delta waiting for its rank test: every test of a comparison runs in one batch."""

    delta: Delta
    gates: bool
    limit: float
    worse: float
    old: list
    new: list


def _delta(q: Quantity, o: Point, n: Point, thresholds: Thresholds, shift: float, cis: dict,
           pending: list[_Pending]) -> Delta:
    old, new = o.values.get(q.key), n.values.get(q.key)
    if old is None or new is None:
        return Delta(q.key, q.label, old, new, None)
    if old == 0:
        change = 0.0 if new == 0 else math.inf
    else:
        change = (new - old) / abs(old)
    worse = change if q.higher_is_worse else -change
    limit = thresholds.for_kind(q.kind)
    if q.kind != "time":
        return Delta(q.key, q.label, old, new, change, regressed=q.gates and worse > limit, improved=-worse > limit)
    return _time_delta(q, o, n, change, limit, shift, cis, pending)


def _time_delta(q: Quantity, o: Point, n: Point, change: float, limit: float, shift: float, cis: dict,
                pending: list[_Pending]) -> Delta:
    """A time change counts only when it is beyond the threshold *and* significant: the step times of the
    two runs, ranked together, say the new ones are slower (faster) with p < ALPHA.  Both are judged after
    taking out the runs' common shift (the new step times divided by 1 + shift).  The test itself runs
    later, with every other of the comparison (:func:`_judge_time`)."""
    old, new = o.values[q.key], n.values[q.key]
    (old_ci, old_cov), (new_ci, new_cov) = cis[id(o)], cis[id(n)]
    d = Delta(q.key, q.label, old, new, change, old_ci=list(old_ci) if old_ci else None,
              new_ci=list(new_ci) if new_ci else None, old_ci_coverage=old_cov if old_ci else None,
              new_ci_coverage=new_cov if new_ci else None)
    factor = 1 + shift  # step time new/old that every point shares
    adjusted = new / factor if q.higher_is_worse else new * factor
    d.judged_change = (adjusted - old) / abs(old) if old else change
    worse = d.judged_change if q.higher_is_worse else -d.judged_change
    pending.append(_Pending(d, q.gates, limit, worse, list(o.samples), [t / factor for t in n.samples]))
    return d


def _judge_time(pending: list[_Pending]) -> None:
    """Run the rank tests of every pending time delta at once and give each its verdict."""
    # step time: higher is worse; tokens/s is its inverse, so "worse" means slower steps either way
    tests = p_values([(p.old, p.new, "slower" if p.worse > 0 else "faster") for p in pending])
    for p, p_value in zip(pending, tests):
        d, worse, limit = p.delta, p.worse, p.limit
        d.p_value = p_value
        if p_value is None:
            # no per-step times (an old record, a benchmark file without data), or no scipy to test them
            d.verdict = "untested"
            d.regressed, d.improved = p.gates and worse > limit, -worse > limit
        elif abs(worse) <= limit:
            d.verdict = "no change"
        elif p_value >= ALPHA:
            d.verdict = "noisy"
        elif worse > 0:
            d.verdict, d.regressed = "regression", p.gates
        else:
            d.verdict, d.improved = "improvement", True


def compare_points(old: list[Point], new: list[Point], thresholds: Thresholds = Thresholds(),
                   kind: str = SWEEP) -> Comparison:
    """Match by key and judge each pair; keys on one side only are kept in ``only_old`` / ``only_new``.

    Linear in the number of points: pairs are matched through dicts, and the intervals and rank tests of
    all pairs are drawn in batches (:func:`~.stats.median_cis`, :func:`~.stats.p_values`)."""
    # a point recorded as skipped (a sweep's deadline) was never measured: it counts as absent there
    old_by = {p.key: p for p in old if p.status != "skipped"}
    new_by = {p.key: p for p in new if p.status != "skipped"}
    pairs = [(o, new_by[k]) for k, o in old_by.items() if k in new_by]
    shift = common_shift(pairs) if thresholds.drift else None
    sides = [p for pair in pairs for p in pair if p.ci is None]
    cis = {id(p): (ci, ci.coverage if ci else None)
           for p, ci in zip(sides, median_cis([list(p.samples) for p in sides]))}
    cis.update((id(p), (p.ci, p.ci_coverage)) for pair in pairs for p in pair if p.ci is not None)
    points, pending = [], []
    for o, n in pairs:
        pc = PointComparison(o.key, n.label or o.label, o.status, n.status,
                             status_regressed=o.status == "ok" and n.status != "ok",
                             old_spread=o.spread, new_spread=n.spread)
        pc.deltas = [_delta(q, o, n, thresholds, shift or 0.0, cis, pending) for q in QUANTITIES
                     if o.values.get(q.key) is not None or n.values.get(q.key) is not None]
        points.append(pc)
    _judge_time(pending)
    for pc, (o, n) in zip(points, pairs):
        tested = any(d.verdict not in ("", "untested") for d in pc.deltas)
        # noisy: a time change beyond the threshold that the step times cannot back; without per-step
        # times, a spread wider than the threshold on either side
        pc.noisy = (any(d.verdict == "noisy" for d in pc.deltas) if tested
                    else any(s is not None and s > thresholds.time for s in (o.spread, n.spread)))
    return Comparison(kind, thresholds, points,
                      only_old=[p for k, p in old_by.items() if k not in new_by],
                      only_new=[p for k, p in new_by.items() if k not in old_by], common_shift=shift)


def compare_runs(old_records: list[dict], new_records: list[dict],
                 thresholds: Thresholds = Thresholds()) -> Comparison:
    """Compare two lists of sweep records (as :func:`ckptbench.store.records.load_records` returns them)."""
    old, old_problems = points_from_records(old_records)
    new, new_problems = points_from_records(new_records)
    comparison = compare_points(old, new, thresholds, SWEEP)
    comparison.problems += [f"old: {p}" for p in old_problems] + [f"new: {p}" for p in new_problems]
    comparison.env_changes = env_changes(first_env(old_records), first_env(new_records))
    return comparison


PARALLEL_BYTES = 16 * 2**20  # a records file this large on both sides: the old side is read in a second process


def _records_bytes(path: str) -> int:
    try:
        return os.path.getsize(os.path.join(path, RECORDS) if os.path.isdir(path) else path)
    except OSError:
        return 0


def load_sides(old_path: str, new_path: str) -> tuple[Side, Side]:
    """Both sides of a comparison.  Two large runs are read at once, the old one in a forked process, when
    the machine has a second core: parsing is most of a comparison's time, and only the points (not the
    records) come back from the child.  An error is the one reading them in turn would raise first."""
    if not (min(_records_bytes(old_path), _records_bytes(new_path)) >= PARALLEL_BYTES
            and len(os.sched_getaffinity(0)) > 1 and "fork" in multiprocessing.get_all_start_methods()):
        return load_side(old_path), load_side(new_path)
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("fork")) as pool:
        old = pool.submit(load_side, old_path)
        try:
            new = load_side(new_path)
        except Exception:  # noqa: BLE001 - the old side's error, if it has one, is the one to show
            old.result()
            raise
        return old.result(), new


def compare_paths(old_path: str, new_path: str, thresholds: Thresholds = Thresholds()) -> Comparison:
    """Load both sides, refuse mixed kinds, and compare."""
    old, new = load_sides(old_path, new_path)
    if old.kind != new.kind:
        raise UsageError(f"cannot compare a {old.kind} input ({old_path}) with a {new.kind} input ({new_path})")
    comparison = compare_points(old.points, new.points, thresholds, old.kind)
    comparison.problems += [f"old: {p}" for p in old.problems] + [f"new: {p}" for p in new.problems]
    comparison.env_changes = env_changes(old.env, new.env)
    return comparison
