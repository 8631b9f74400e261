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
  (default 10%).  Medians, because one slow step (a page fault, a neighbour) should not decide.  Short
  CPU runs scatter by several percent, so a tighter default would cry wolf.  When the spread of the
  step times on either side (p90/median - 1, or the coefficient of variation, whichever is wider) is
  wider than the time threshold, the point is marked a *noisy comparison*: the verdict still counts,
  since a median shift beyond the threshold is the best evidence there is, but the reader is told to
  run more steps before trusting it.
- **Status**: a point that was ``ok`` and now is not (oom, timeout, crash, ...) is a regression.
- **One-sided points** (in OLD only or NEW only) are listed, never dropped, but do not by themselves fail
  the comparison: adding or retiring points is how suites evolve, and a removed point cannot hide a
  regression because every point present on both sides is still judged.  A comparison with no point in
  common is reported as such.

For other code: :func:`compare_runs` (records in, :class:`Comparison` out) is the entry point, e.g. for
the HTML report; :func:`load_side` reads a path; :mod:`ckptbench.report.compare` draws the table.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field

from ..errors import UsageError
from ..measure.timing import nearest_rank
from .records import RECORDS, latest_per_case, load_records

DEFAULT_MEMORY_THRESHOLD = 0.02
DEFAULT_TIME_THRESHOLD = 0.10
SWEEP, BENCHMARK = "sweep", "pytest-benchmark"
HELP = __doc__.split("\n\nFor other code")[0]  # the docstring without its note for programmers


@dataclass(frozen=True)
class Quantity:
    """A compared number: where it lives in a measurement, and which direction is worse."""

    key: str
    label: str
    kind: str  # memory | time
    unit: str  # bytes | s | 1/s
    higher_is_worse: bool = True
    gates: bool = True  # False: shown for context, never fails the comparison


QUANTITIES = (
    Quantity("peak_bytes", "peak memory", "memory", "bytes"),
    Quantity("mem_after_forward_bytes", "after-forward memory", "memory", "bytes"),
    Quantity("saved_bytes", "saved activations", "memory", "bytes"),
    Quantity("checkpointed_input_bytes", "checkpointed inputs", "memory", "bytes", gates=False),
    Quantity("step_time_median_s", "step time (median)", "time", "s"),
    Quantity("tokens_per_s", "tokens/s", "time", "1/s", higher_is_worse=False),
)
QUANTITY_BY_KEY = {q.key: q for q in QUANTITIES}


@dataclass(frozen=True)
class Thresholds:
    """Relative changes (0.02 = 2%) beyond which a quantity counts as a regression."""

    memory: float = DEFAULT_MEMORY_THRESHOLD
    time: float = DEFAULT_TIME_THRESHOLD

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


@dataclass(frozen=True)
class Point:
    """One side of a matched pair, reduced to the numbers compare looks at."""

    key: str  # Case id, or a benchmark's fullname
    label: str
    status: str
    values: dict  # quantity key -> float | None
    spread: float | None = None  # relative spread of the step times (see module docstring)


@dataclass
class Delta:
    quantity: str  # Quantity.key
    label: str
    old: float | None
    new: float | None
    change: float | None  # (new - old) / old; inf when old is 0 and new is not
    regressed: bool = False
    improved: bool = False


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

def _delta(q: Quantity, old: float | None, new: float | None, thresholds: Thresholds) -> Delta:
    if old is None or new is None:
        return Delta(q.key, q.label, old, new, None)
    if old == 0:
        change = 0.0 if new == 0 else math.inf
    else:
        change = (new - old) / abs(old)
    worse = change if q.higher_is_worse else -change
    limit = thresholds.for_kind(q.kind)
    return Delta(q.key, q.label, old, new, change, regressed=q.gates and worse > limit, improved=-worse > limit)


def compare_points(old: list[Point], new: list[Point], thresholds: Thresholds = Thresholds(),
                   kind: str = SWEEP) -> Comparison:
    """Match by key and judge each pair; keys on one side only are kept in ``only_old`` / ``only_new``."""
    # a point recorded as skipped (a sweep's deadline) was never measured: it counts as absent there
    old_by = {p.key: p for p in old if p.status != "skipped"}
    new_by = {p.key: p for p in new if p.status != "skipped"}
    points = []
    for key, o in old_by.items():
        n = new_by.get(key)
        if n is None:
            continue
        pc = PointComparison(key, n.label or o.label, o.status, n.status,
                             status_regressed=o.status == "ok" and n.status != "ok",
                             old_spread=o.spread, new_spread=n.spread)
        pc.deltas = [_delta(q, o.values.get(q.key), n.values.get(q.key), thresholds) for q in QUANTITIES
                     if o.values.get(q.key) is not None or n.values.get(q.key) is not None]
        pc.noisy = any(s is not None and s > thresholds.time for s in (o.spread, n.spread))
        points.append(pc)
    return Comparison(kind, thresholds, points,
                      only_old=[p for k, p in old_by.items() if k not in new_by],
                      only_new=[p for k, p in new_by.items() if k not in old_by])


def compare_runs(old_records: list[dict], new_records: list[dict],
                 thresholds: Thresholds = Thresholds()) -> Comparison:
    """Compare two lists of sweep records (as :func:`ckptbench.store.records.load_records` returns them)."""
    old, old_problems = points_from_records(old_records)
    new, new_problems = points_from_records(new_records)
    comparison = compare_points(old, new, thresholds, SWEEP)
    comparison.problems += [f"old: {p}" for p in old_problems] + [f"new: {p}" for p in new_problems]
    comparison.env_changes = env_changes(_first_env(old_records), _first_env(new_records))
    return comparison


# --------------------------------------------------------------------------------------------- reading

def _spread(median, p90, cv) -> float | None:
    """The wider of p90/median - 1 and the coefficient of variation; None when neither is known."""
    candidates = []
    if median and p90 is not None and median > 0:
        candidates.append(p90 / median - 1)
    if cv is not None and not math.isnan(cv):
        candidates.append(cv)
    return max(candidates) if candidates else None


def _number(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        return None
    return float(value)


def record_label(record: dict) -> str:
    c = record.get("case") or {}
    model = (c.get("model") or {}).get("name") or (c.get("model") or {}).get("family", "?")
    label = f"{model} {record.get('strategy', '?')} b={c.get('batch_size', '?')} s={c.get('seq_len', '?')}"
    for key, short in (("grad_accum", "accum"), ("local_sgd_steps", "K"), ("world_size", "world")):
        if c.get(key) not in (None, 0, 1):
            label += f" {short}={c[key]}"
    return label


def points_from_records(records: list[dict]) -> tuple[list[Point], list[str]]:
    """Sweep records to Points; a Case id recorded twice (a rerun into the same directory) keeps the last."""
    latest = latest_per_case(records)
    problems = []
    if len(latest) < len(records):
        problems.append(f"{len(records) - len(latest)} duplicate record(s) of the same Case; the last one is used")
    points = []
    for r in latest:
        case_id = r["case_id"]
        m = r.get("measurement") or {}
        values = {q.key: _number(m.get(q.key)) for q in QUANTITIES}
        spread = _spread(m.get("step_time_median_s"), m.get("step_time_p90_s"), m.get("step_time_cv"))
        points.append(Point(case_id, record_label(r), r.get("status", "?"), values, spread))
    return points, problems


def points_from_benchmark_json(data: dict) -> tuple[list[Point], list[str]]:
    """pytest-benchmark JSON to Points: time from ``stats`` (median of rounds), memory from ``extra_info``."""
    problems, by_name = [], {}
    for bench in data.get("benchmarks", []):
        name = bench.get("fullname") or bench.get("name")
        stats = bench.get("stats") or {}
        if not name or not stats:
            problems.append(f"benchmark entry without fullname or stats ignored: {bench.get('name')!r}")
            continue
        extra = bench.get("extra_info") or {}
        values = {q.key: _number(extra.get(q.key)) for q in QUANTITIES if q.kind == "memory"}
        values["step_time_median_s"] = _number(stats.get("median"))
        values["tokens_per_s"] = _number(extra.get("tokens_per_s"))
        data_points = sorted(stats.get("data") or [])
        p90 = nearest_rank(data_points, 0.9) if data_points else None
        mean, stddev = stats.get("mean"), stats.get("stddev")
        cv = stddev / mean if mean and stddev is not None else None
        label = bench.get("name") or name
        by_name[name] = Point(name, label, extra.get("status", "ok"), values, _spread(stats.get("median"), p90, cv))
    return list(by_name.values()), problems


def _first_env(records: list[dict]) -> dict:
    return next((r.get("env") or {} for r in records if r.get("env")), {})


ENV_KEYS = ("torch_version", "transformers_version", "cpu", "device_name", "driver", "python")


def _env_value(value):
    """pytest-benchmark's machine_info keeps the CPU as a dict; its brand name is what a reader needs."""
    return (value.get("brand_raw") or str(value)) if isinstance(value, dict) else value


def env_changes(old: dict, new: dict) -> list[str]:
    """Differences in the versions and hardware that most often explain a change."""
    out = []
    for k in ENV_KEYS:
        a, b = _env_value(old.get(k)), _env_value(new.get(k))
        if (a or b) and a != b:
            out.append(f"{k}: {a} -> {b}")
    return out


@dataclass
class Side:
    """One input of ``compare``: its kind, its points, and what could not be read."""

    path: str
    kind: str
    points: list[Point]
    problems: list[str]
    env: dict


def load_side(path: str) -> Side:
    """Read a results directory, a records.jsonl or a pytest-benchmark JSON file; UsageError otherwise."""
    if not os.path.exists(path):
        raise UsageError(f"{path}: no such file or directory")
    if os.path.isdir(path) or path.endswith(".jsonl"):
        return _load_sweep(path)
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except OSError as exc:
        raise UsageError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise UsageError(f"{path}: not JSON; expected a results directory or a pytest-benchmark JSON file") from None
    if not isinstance(data, dict) or not isinstance(data.get("benchmarks"), list):
        raise UsageError(f"{path}: not a pytest-benchmark JSON file (no 'benchmarks' list)")
    points, problems = points_from_benchmark_json(data)
    env = {**(data.get("machine_info") or {})}
    return Side(path, BENCHMARK, points, problems, env)


def _load_sweep(path: str) -> Side:
    records_path = os.path.join(path, RECORDS) if os.path.isdir(path) else path
    if not os.path.exists(records_path):
        raise UsageError(f"{path}: not a results directory (no {RECORDS})")
    try:
        loaded = load_records(records_path)
    except OSError as exc:
        raise UsageError(f"{records_path}: cannot read: {exc.strerror or exc}") from None
    if not loaded.records:
        detail = f" ({loaded.problems[0]})" if loaded.problems else ""
        raise UsageError(f"{records_path}: no readable records{detail}")
    points, problems = points_from_records(loaded.records)
    return Side(path, SWEEP, points, loaded.problems + problems, _first_env(loaded.records))


def compare_paths(old_path: str, new_path: str, thresholds: Thresholds = Thresholds()) -> Comparison:
    """Load both sides, refuse mixed kinds, and compare."""
    old, new = load_side(old_path), load_side(new_path)
    if old.kind != new.kind:
        raise UsageError(f"cannot compare a {old.kind} input ({old_path}) with a {new.kind} input ({new_path})")
    comparison = compare_points(old.points, new.points, thresholds, old.kind)
    comparison.problems += [f"old: {p}" for p in old.problems] + [f"new: {p}" for p in new.problems]
    comparison.env_changes = env_changes(old.env, new.env)
    return comparison
