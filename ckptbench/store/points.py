"""Reading the two sides of ``compare``: sweep records or pytest-benchmark JSON, reduced to Points.

Each Point carries the numbers compare judges, the spread of its step times, and its samples for the
significance test: one median per repeat when a Case ran 3 or more times (a worker's steps share its
conditions), else every timed step.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass

from ..base.errors import UsageError
from ..base.regularfile import open_regular
from ..measure.timing import nearest_rank
from .records import RECORDS, latest_lines, load_records, merged_cases, no_cycle_collection
from .repeats import time_samples

SWEEP, BENCHMARK = "sweep", "pytest-benchmark"


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
class Point:
    """One side of a matched pair, reduced to the numbers compare looks at."""

    key: str  # Case id, or a benchmark's fullname
    label: str
    status: str
    values: dict  # quantity key -> float | None
    spread: float | None = None  # relative spread of the step times (see module docstring)
    samples: tuple[float, ...] = ()  # what significance is tested on: every timed step, or one median per repeat (`unit`)
    ci: tuple[float, float] | None = None  # the median's order-statistic interval over `samples`, when drawn
    ci_coverage: float | None = None  # how often that interval covers the median, when the record says
    unit: str = "steps"  # what one of `samples` is: steps, repeat medians, rounds (pytest-benchmark)


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


def _coverage(value) -> float | None:
    """A record's ``step_time_ci_coverage``: a fraction (0.75), or a percentage (75) from another writer."""
    value = _number(value)
    if value is None or value <= 0:
        return None
    value = value / 100 if value > 1 else value
    return value if value <= 1 else None


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
    lines = latest_lines(records)  # one pass: the duplicates are counted from what it kept
    problems = []
    if len(lines) < len(records):
        problems.append(f"{len(records) - len(lines)} duplicate record(s) of the same Case; the last one is used")
    latest = merged_cases(lines)
    points = []
    for r in latest:
        case_id = r["case_id"]
        m = r.get("measurement") or {}
        values = {q.key: _number(m.get(q.key)) for q in QUANTITIES}
        spread = _spread(m.get("step_time_median_s"), m.get("step_time_p90_s"), m.get("step_time_cv"))
        # the loader drew the interval over these very samples (repeats.time_samples); not drawn twice
        ci = m.get("step_time_ci95_s")
        ci = tuple(ci) if isinstance(ci, list) and len(ci) == 2 else None
        samples = tuple(time_samples(m))
        unit = "repeat medians" if samples and list(samples) == m.get("repeat_medians_s") else "steps"
        points.append(Point(case_id, record_label(r), r.get("status", "?"), values, spread, samples, ci,
                            _coverage(m.get("step_time_ci_coverage")), unit))
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
        by_name[name] = Point(name, label, extra.get("status", "ok"), values, _spread(stats.get("median"), p90, cv),
                              tuple(data_points), unit="rounds")
    return list(by_name.values()), problems


def first_env(records: list[dict]) -> dict:
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
        with open_regular(path, "r", encoding="utf-8") as fh:
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
        loaded = load_records(records_path, merged=False)  # points_from_records merges repeats, once
    except OSError as exc:
        raise UsageError(f"{records_path}: cannot read: {exc.strerror or exc}") from None
    if not loaded.records:
        detail = f" ({loaded.problems[0]})" if loaded.problems else ""
        raise UsageError(f"{records_path}: no readable records{detail}")
    with no_cycle_collection():
        points, problems = points_from_records(loaded.records)
    return Side(path, SWEEP, points, loaded.notes() + problems, first_env(loaded.records))
