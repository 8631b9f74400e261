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
  (default 10%) *and* the times say so: a one-sided Welch t-test on the logarithms of the two runs' time
  samples gives p < 0.05.  A run's samples are one median per repeat when it has 3 or more repeats
  (steps of one worker share its conditions, so they are not independent samples), else every timed
  step.  Logarithms, because step times are skewed and a slowdown multiplies them; a t-test, because a
  rank test cannot reach significance with what a default run has (Mann–Whitney over 3 samples against
  3 never gives p below 0.05, so a doubled step time read "noisy").  A change beyond the threshold that
  is not significant is *noisy* (run more steps, or ``--repeat``), never a regression.  Records without
  per-step times (older files, benchmark JSON without ``data``) are judged on the threshold alone and
  marked *untested*.  What this rule costs and finds, simulated with step noise fitted to the reference
  run and a 5% machine factor per run (``docs/compare-statistics.md``, ``scripts/compare_statistics.py``),
  per point: with calibration readings on both sides (and a kernel that feels the machine's state as the
  steps do; the document has the cases where it does not), 0.8% false alarms at 1 run × 3 steps and 0.0% at
  3 repeats; a 2× slowdown found 99.7% / 100% of the time, a 20% one 74% / 96%, a uniform 30% one 83% /
  98%.  Without readings (older runs) false alarms rise to 8.6% / 9.8%: the machine's state in each run
  is shared by all its steps, and no test within a run can see it.  Over 20 points at 1 × 3, 15% of
  comparisons of two unchanged runs flag at least one point (0.6% at 3 repeats): gate CI on ``--repeat 3``.
- **Machine speed**: each sweep times a fixed fp32 matmul at its start and at its end, two readings each
  (``calibration.jsonl`` beside the records).  When the kernel's new/old time ratio is beyond its readings'
  noise (a two-sided Welch t-test on the log of each reading's median, p < 0.05), the new times are
  divided by that ratio before they are judged (the test's variance includes the ratio's), and a line
  says so; otherwise, or without readings on both sides (runs from before them, pytest-benchmark files),
  raw changes are judged and the line says that.  A change that slows every point alike while the kernel
  stays the same is a regression of every point.  ``--no-drift-correction`` judges raw changes always.
  The median change over all points is stated too, never divided out.
- **Intervals**: each time delta carries its p-value, the test it came from, and both medians' intervals
  (``--json``), order-statistic intervals each labelled with the coverage it really has (95% or more
  from 6 samples on; over 3 samples the interval is their range, which holds the median 75% of the time).
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
from dataclasses import dataclass, replace

from ..base.errors import UsageError
from .comparison import (
    DEFAULT_MEMORY_THRESHOLD,
    DEFAULT_TIME_THRESHOLD,
    Comparison,
    Delta,
    PointComparison,
    Thresholds,
    format_change,
    parse_percent,
)
from .machine_speed import MachineSpeed, load_readings, machine_speed
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
from .records import RECORDS, no_cycle_collection
from .significance import p_values, verdict
from .stats import median_cis

__all__ = ["BENCHMARK", "DEFAULT_MEMORY_THRESHOLD", "DEFAULT_TIME_THRESHOLD", "QUANTITIES", "QUANTITY_BY_KEY",
           "SWEEP", "Comparison", "Delta", "Point", "PointComparison", "Quantity", "Thresholds", "compare_paths",
           "compare_points", "compare_runs", "format_change", "load_side", "parse_percent", "record_label"]

HELP = __doc__.split("\n\nFor other code")[0]  # the docstring without its note for programmers
NO_READINGS = "no calibration readings"


# --------------------------------------------------------------------------------------------- judging

MIN_POINTS_FOR_MEDIAN = 4


def median_change(pairs: list[tuple[Point, Point]]) -> float | None:
    """The median of the new/old step-time ratios of the points ok on both sides, minus 1 (None with
    fewer than 4): how much the points moved together.  Stated, never divided out: from two runs alone a
    slower machine and a change that slows every point alike look the same, and only the calibration
    kernel (:mod:`.machine_speed`) tells them apart."""
    ratios = sorted(n.values["step_time_median_s"] / o.values["step_time_median_s"] for o, n in pairs
                    if o.status == n.status == "ok" and o.values.get("step_time_median_s")
                    and n.values.get("step_time_median_s"))
    if len(ratios) < MIN_POINTS_FOR_MEDIAN:
        return None
    mid = len(ratios) // 2
    median = ratios[mid] if len(ratios) % 2 else (ratios[mid - 1] + ratios[mid]) / 2
    return median - 1


@dataclass
class _Pending:
    """A time delta waiting for its test: every test of a comparison runs in one batch."""

    delta: Delta
    gates: bool
    limit: float
    worse: float
    old: list
    new: list


def _delta(q: Quantity, o: Point, n: Point, thresholds: Thresholds, speed: MachineSpeed, cis: dict,
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
    return _time_delta(q, o, n, change, limit, speed, cis, pending)


def _test_name(o: Point, n: Point) -> str:
    if not o.samples or not n.samples:
        return ""
    sizes = (f"{len(o.samples)} vs {len(n.samples)} {o.unit}" if o.unit == n.unit
             else f"{len(o.samples)} {o.unit} vs {len(n.samples)} {n.unit}")
    return f"one-sided Welch t on log times, {sizes}"


def _time_delta(q: Quantity, o: Point, n: Point, change: float, limit: float, speed: MachineSpeed, cis: dict,
                pending: list[_Pending]) -> Delta:
    """A time change counts only when it is beyond the threshold *and* significant (a one-sided Welch
    t-test on the log times of the two runs, :mod:`.significance`).  Both are judged after dividing the
    new step times by the machine's measured speed change, when there is one beyond noise.  The test
    itself runs later, with every other of the comparison (:func:`_judge_time`)."""
    old, new = o.values[q.key], n.values[q.key]
    old_ci, old_cov = cis[id(o)]
    new_ci, new_cov = cis[id(n)]
    d = Delta(q.key, q.label, old, new, change, test=_test_name(o, n),
              old_ci=list(old_ci) if old_ci else None, new_ci=list(new_ci) if new_ci else None,
              old_ci_coverage=old_cov if old_ci else None, new_ci_coverage=new_cov if new_ci else None)
    factor = speed.factor  # new/old time of the calibration kernel, when beyond its noise; else 1
    adjusted = new / factor if q.higher_is_worse else new * factor
    d.judged_change = (adjusted - old) / abs(old) if old else change
    worse = d.judged_change if q.higher_is_worse else -d.judged_change
    pending.append(_Pending(d, q.gates, limit, worse, list(o.samples), list(n.samples)))
    return d


def _judge_time(pending: list[_Pending], speed: MachineSpeed) -> None:
    """Run the tests of every pending time delta at once and give each its verdict."""
    shift = math.log(speed.factor)
    extra = (speed.log_var, speed.df) if speed.factor != 1.0 else (0.0, math.inf)
    # step time: higher is worse; tokens/s is its inverse, so "worse" means slower steps either way
    tests = p_values([(p.old, p.new, "slower" if p.worse > 0 else "faster") for p in pending],
                     [shift] * len(pending), [extra] * len(pending))
    for p, p_value in zip(pending, tests):
        d = p.delta
        d.p_value = p_value
        d.verdict = verdict(p.worse, p_value, p.limit)
        if d.verdict == "untested":
            d.regressed, d.improved = p.gates and p.worse > p.limit, -p.worse > p.limit
        else:
            d.regressed, d.improved = d.verdict == "regression" and p.gates, d.verdict == "improvement"


def compare_points(old: list[Point], new: list[Point], thresholds: Thresholds = Thresholds(),
                   kind: str = SWEEP, speed: MachineSpeed | None = None) -> Comparison:
    """Match by key and judge each pair; keys on one side only are kept in ``only_old`` / ``only_new``.
    `speed`: the runs' calibration readings compared (:func:`~.machine_speed.machine_speed`); without
    it raw changes are judged.

    Linear in the number of points: pairs are matched through dicts, and the order-statistic intervals and
    tests of all pairs are drawn in batches (:func:`~.stats.median_cis`, :func:`~.significance.p_values`)."""
    speed = speed or MachineSpeed("unknown", NO_READINGS)
    if speed.state == "corrected" and not thresholds.drift:
        speed = replace(speed, state="not corrected")
    # a point recorded as skipped (a sweep's deadline) was never measured: it counts as absent there
    old_by = {p.key: p for p in old if p.status != "skipped"}
    new_by = {p.key: p for p in new if p.status != "skipped"}
    pairs = [(o, new_by[k]) for k, o in old_by.items() if k in new_by]
    sides = [p for pair in pairs for p in pair if p.ci is None]
    cis = {id(p): (ci, ci.coverage if ci else None)
           for p, ci in zip(sides, median_cis([list(p.samples) for p in sides]))}
    cis.update((id(p), (p.ci, p.ci_coverage)) for pair in pairs for p in pair if p.ci is not None)
    points, pending = [], []
    for o, n in pairs:
        pc = PointComparison(o.key, n.label or o.label, o.status, n.status,
                             status_regressed=o.status == "ok" and n.status != "ok",
                             old_spread=o.spread, new_spread=n.spread)
        pc.deltas = [_delta(q, o, n, thresholds, speed, cis, pending) for q in QUANTITIES
                     if o.values.get(q.key) is not None or n.values.get(q.key) is not None]
        points.append(pc)
    _judge_time(pending, speed)
    for pc, (o, n) in zip(points, pairs):
        tested = any(d.verdict not in ("", "untested") for d in pc.deltas)
        # noisy: a time change beyond the threshold that the step times cannot back; without per-step
        # times, a spread wider than the threshold on either side
        pc.noisy = (any(d.verdict == "noisy" for d in pc.deltas) if tested
                    else any(s is not None and s > thresholds.time for s in (o.spread, n.spread)))
    return Comparison(kind, thresholds, points,
                      only_old=[p for k, p in old_by.items() if k not in new_by],
                      only_new=[p for k, p in new_by.items() if k not in old_by], machine_speed=speed,
                      median_change=median_change(pairs))


def compare_runs(old_records: list[dict], new_records: list[dict], thresholds: Thresholds = Thresholds(),
                 old_readings: list[dict] | None = None, new_readings: list[dict] | None = None) -> Comparison:
    """Compare two lists of sweep records (as :func:`ckptbench.store.records.load_records` returns them),
    with the runs' calibration readings (:func:`~.machine_speed.load_readings`) when there are any."""
    old, old_problems = points_from_records(old_records)
    new, new_problems = points_from_records(new_records)
    speed = machine_speed(old_readings or [], new_readings or [], thresholds.drift)
    comparison = compare_points(old, new, thresholds, SWEEP, speed)
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
    speed = (machine_speed(load_readings(old_path), load_readings(new_path), thresholds.drift) if old.kind == SWEEP
             else MachineSpeed("unknown", "pytest-benchmark files carry no calibration reading"))
    with no_cycle_collection():  # tens of thousands of points and deltas, none of them in a cycle
        comparison = compare_points(old.points, new.points, thresholds, old.kind, speed)
    comparison.problems += [f"old: {p}" for p in old.problems] + [f"new: {p}" for p in new.problems]
    comparison.env_changes = env_changes(old.env, new.env)
    return comparison
