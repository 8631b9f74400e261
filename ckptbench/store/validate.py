"""The shape a line of ``records.jsonl`` must have to be read as a record.

A results directory may come from anywhere (copied, hand-edited, written by another version), and one
valid-JSON line of the wrong shape must not replace its Case's good record or crash a command that
reads it.  :func:`record_problem` says what is wrong with a parsed line, or None; the reader skips and
lists a line that has a problem, so it never wins over a valid one.
"""

from __future__ import annotations

import math
from numbers import Real

from ..spec import Case

STATUSES = ("ok", "unchecked", "oom", "over_budget", "timeout", "crash", "unsupported", "skipped")

# Top-level fields: the type each must have when present (None counts as absent).
OPTIONAL = {"reason": str, "stderr_tail": str, "strategy": str, "suite": str, "verdict": str,
            "finished_at": str, "measurement": dict, "estimate": dict, "env": dict, "placement": dict,
            "meters": dict, "host_memory": dict, "plan_prediction": dict, "gates": (dict, list),
            "checks": list, "repeats": (int, dict), "wall_s": Real, "projected_s": Real}
# Sweep axes of the case, which every command does arithmetic or formatting on.
CASE_INTS = ("batch_size", "seq_len", "every_n_layers", "local_sgd_steps", "grad_accum", "world_size")
# Measured figures that are numbers (or None) and lists of numbers, where present.
MEASURED_NUMBERS = ("step_time_median_s", "step_time_p90_s", "step_time_mean_s", "step_time_cv", "tokens_per_s",
                    "setup_s", "mfu", "hfu", "energy_per_step_j", "model_flops_per_step",
                    "hardware_flops_per_step", "ideal_recompute_ratio")
MEASURED_LISTS = ("step_times_s", "repeat_medians_s", "losses", "recomputed_layers")


def _number(value) -> bool:
    kind = type(value)
    if kind is float or kind is int:  # nearly every value; the abstract check below is slow
        return True
    return isinstance(value, Real) and not isinstance(value, bool)


def _int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _case_problem(case) -> str | None:
    if not isinstance(case, dict):
        return f"case is {type(case).__name__}, not a dict"
    try:
        Case.from_dict(case)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        return f"case is not a Case ({type(exc).__name__}: {exc})"
    for key in CASE_INTS:
        if key in case and not _int(case[key]):
            return f"case.{key} is {case[key]!r}, not an integer"
    if "device" in case and not isinstance(case["device"], str):
        return f"case.device is {case['device']!r}, not a string"
    return None


def _measurement_problem(m: dict) -> str | None:
    for key, value in m.items():
        if value is None:
            continue
        if (key.endswith("_bytes") or key in MEASURED_NUMBERS) and not _number(value):
            return f"measurement.{key} is {type(value).__name__}, not a number"
        if key in MEASURED_LISTS and not isinstance(value, list):
            return f"measurement.{key} is {type(value).__name__}, not a list"
    for key in ("step_times_s", "repeat_medians_s"):
        if any(not _number(t) or math.isinf(t) for t in m.get(key) or ()):
            return f"measurement.{key} holds something other than finite numbers"
    return None


def record_problem(record) -> str | None:
    """Why a parsed line is not a record (a short phrase), or None when it is one."""
    if not isinstance(record, dict):
        return f"a JSON {type(record).__name__}, not an object"
    case_id = record.get("case_id")
    if not isinstance(case_id, str) or not case_id:
        return "no case_id" if case_id is None else f"case_id {case_id!r} is not a string"
    status = record.get("status")
    if status not in STATUSES:
        return "no status" if status is None else f"unknown status {status!r}"
    if "repeat" in record and (not _int(record["repeat"]) or record["repeat"] < 0):
        return f"repeat {record['repeat']!r} is not a count"
    if "attempt" in record and (not _int(record["attempt"]) or record["attempt"] < 1):
        return f"attempt {record['attempt']!r} is not a positive count"
    if "case" not in record:
        return "no case"
    problem = _case_problem(record["case"])
    if problem:
        return problem
    for key, kind in OPTIONAL.items():
        value = record.get(key)
        if value is not None and (not isinstance(value, kind) or isinstance(value, bool)):
            return f"{key} is {type(value).__name__}, not {_name(kind)}"
    return _measurement_problem(record.get("measurement") or {})


def _name(kind) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join("a number" if k is Real else k.__name__ for k in kinds)
