"""The shape a line of ``records.jsonl`` must have to be read as a record.

A results directory may come from anywhere (copied, hand-edited, written by another version), and one
valid-JSON line of the wrong shape must not replace its Case's good record or crash a command that
reads it.  :func:`record_problem` says what is wrong with a parsed line, or None; the reader skips and
lists a line that has a problem, so it never wins over a valid one.
"""

from __future__ import annotations

import functools
import math
from dataclasses import MISSING, fields
from numbers import Real

from ..point.case import Case, DataSpec, ModelSpec
from ..point.setup import Setup
from ..point.strategy import OFFLOAD_KINDS, Recompute, compile_budget_problem
from ..point.training import Timing, TrainSpec

STATUSES = ("ok", "unchecked", "oom", "over_budget", "timeout", "crash", "unsupported", "skipped")

# Top-level fields: the type each must have when present (None counts as absent).
OPTIONAL = {"reason": str, "stderr_tail": str, "strategy": str, "suite": str, "verdict": str,
            "finished_at": str, "measurement": dict, "estimate": dict, "env": dict, "placement": dict,
            "meters": dict, "host_memory": dict, "plan_prediction": dict, "gates": (dict, list),
            "checks": list, "repeats": (int, dict), "wall_s": Real, "projected_s": Real, "load": dict}
# Sweep axes of the case, which every command does arithmetic or formatting on.
CASE_INTS = ("batch_size", "seq_len", "every_n_layers", "local_sgd_steps", "grad_accum", "world_size")
# Measured figures that are numbers (or None) and lists of numbers, where present.
MEASURED_NUMBERS = ("step_time_median_s", "step_time_p90_s", "step_time_mean_s", "step_time_cv", "tokens_per_s",
                    "setup_s", "mfu", "hfu", "energy_per_step_j", "model_flops_per_step",
                    "hardware_flops_per_step", "ideal_recompute_ratio", "step_time_ci_coverage", "timed_steps",
                    "timing_window_s")
MEASURED_LISTS = ("step_times_s", "step_cpu_times_s", "repeat_medians_s", "losses", "recomputed_layers",
                  "cuda_step_max_allocated_bytes", "cuda_step_max_reserved_bytes")
# lists of byte counts (the CUDA allocator's peak in each timed step), never below zero
BYTE_LISTS = ("cuda_step_max_allocated_bytes", "cuda_step_max_reserved_bytes")
# byte counts that are never below zero (a difference such as activations_after_forward_bytes may be)
COUNTS = ("peak_bytes", "mem_after_forward_bytes", "params_bytes", "optimizer_bytes")
# timings and rates that every ranking, comparison and chart divides or sorts by: finite and never below zero
TIMINGS = ("step_time_median_s", "step_time_p90_s", "step_time_mean_s", "tokens_per_s", "timing_window_s")
# a step's seconds beyond this are no step a sweep timed (its timing caps are seconds to minutes): a damaged
# or planted value, which overflows the statistics and charts that square or divide it (1e308 did)
MAX_STEP_S = 1e6
STEP_SECONDS = ("step_time_median_s", "step_time_p90_s", "step_time_mean_s", "timing_window_s")
# bytes by name, not a number (a compiled point's allocator meter: its running sum at each mark)
MEASURED_DICTS = ("allocator_at_marks_bytes",)


def _number(value) -> bool:
    kind = type(value)
    if kind is float or kind is int:  # nearly every value; the abstract check below is slow
        return True
    return isinstance(value, Real) and not isinstance(value, bool)


def _int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@functools.cache
def _case_shape() -> tuple | None:
    """What :meth:`Case.from_dict` needs of a dict to build a Case, or None when a part of it checks its
    own fields (a ``__post_init__``), which only building it can tell: (the Case's own fields, its
    required ones, then for each nested part its key, its fields, its required fields, whether it may be
    absent or empty)."""
    def names(cls) -> tuple[frozenset, frozenset]:
        own = fields(cls)
        required = {f.name for f in own if f.default is MISSING and f.default_factory is MISSING}
        return frozenset(f.name for f in own), frozenset(required)

    hints = {f.name: f.type for f in fields(Case)}
    parts = []
    for key, optional in (("model", False), ("train", False), ("data", True), ("setup", True), ("recompute", True)):
        cls = {"model": ModelSpec, "train": TrainSpec, "data": DataSpec, "setup": Setup, "recompute": Recompute}[key]
        if hasattr(cls, "__post_init__") or cls.__name__ not in str(hints[key]):
            return None
        known, required = names(cls)
        if cls is TrainSpec:  # records written before the optimizer moved to the setup name it here
            known |= {"optimizer"}
        parts.append((key, known, required, optional))
    if hasattr(Case, "__post_init__"):
        return None
    return (*names(Case), tuple(parts))


def _builds_a_case(case: dict) -> bool:
    """A cheap proof that ``Case.from_dict(case)`` succeeds: its parts are dicts of known keys holding
    every required one (dataclasses check nothing else).  False means only "not proven": the caller then
    builds the Case, which names what is wrong."""
    shape = _case_shape()
    if shape is None:
        return False
    _, required, parts = shape
    if not required <= case.keys():
        return False
    for key, known, needed, optional in parts:
        part = case.get(key)
        if optional and not part:
            continue
        if type(part) is not dict or not part.keys() <= known or not needed <= part.keys():
            return False
    if (case.get("setup") or {}).get("lora"):
        return False  # a part inside a part: building the Case tells
    timing = (case.get("train") or {}).get("timing")
    return not timing or (type(timing) is dict and timing.keys() <= _timing_fields())


@functools.cache
def _timing_fields() -> frozenset:
    """The keys ``Timing.from_dict`` takes (it checks nothing else)."""
    return frozenset(f.name for f in fields(Timing))


def _case_problem(case) -> str | None:
    if not isinstance(case, dict):
        return f"case is {type(case).__name__}, not a dict"
    try:
        _builds_a_case(case) or Case.from_dict(case)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        return f"case is not a Case ({type(exc).__name__}: {exc})"
    for key in CASE_INTS:
        if key in case and not _int(case[key]):
            return f"case.{key} is {case[key]!r}, not an integer"
    if "device" in case and not isinstance(case["device"], str):
        return f"case.device is {case['device']!r}, not a string"
    recompute = case.get("recompute") or {}
    if not isinstance(recompute.get("layers", []), list) or not all(_int(i) for i in recompute.get("layers", [])):
        return f"case.recompute.layers is {recompute.get('layers')!r}, not a list of layer indices"
    if not isinstance(recompute.get("sac", ""), str):
        return f"case.recompute.sac is {recompute['sac']!r}, not a string"
    kind = recompute.get("offload", "")
    if kind and (kind not in OFFLOAD_KINDS or case.get("offload") is not True):
        return (f"case.recompute.offload is {kind!r}, not one of {', '.join(OFFLOAD_KINDS)}"
                if kind not in OFFLOAD_KINDS else f"case.recompute.offload is {kind!r} but case.offload is not true")
    budget = recompute.get("compile_budget")
    if budget is not None and (problem := compile_budget_problem(budget)):
        return f"case.recompute.compile_budget: {problem}"
    return None


_NUMBER, _LIST = 1, 2
_RULES: dict[str, int] = {}  # measurement key -> what its value must be (0: anything), decided once per key


def _rule(key: str) -> int:
    rule = _RULES.get(key)
    if rule is None:
        rule = _RULES[key] = ((_NUMBER if (key.endswith("_bytes") and key not in MEASURED_DICTS
                                            and key not in BYTE_LISTS) or key in MEASURED_NUMBERS else 0)
                              | (_LIST if key in MEASURED_LISTS else 0))
    return rule


_PLANS: dict[tuple, tuple[tuple[str, int], ...]] = {}  # a measurement's keys, in order -> the keys with a rule


def _plan(keys: tuple) -> tuple[tuple[str, int], ...]:
    plan = _PLANS.get(keys)
    if plan is None:
        if len(_PLANS) > 4096:  # hostile files with ever-new key sets: keep the cache bounded
            _PLANS.clear()
        plan = _PLANS[keys] = tuple((key, rule) for key in keys if (rule := _rule(key)))
    return plan


def _finite_numbers(values) -> bool:
    """Whether every element is a finite number: a list of floats whose sum is finite is (the common case,
    decided in C); anything else is looked at element by element."""
    if type(values) is list and set(map(type, values)) <= {float} and math.isfinite(sum(values)):
        return True
    return all(_number(t) and math.isfinite(t) for t in values)


def _measurement_problem(m: dict) -> str | None:
    # the records of one run share their measurement's keys: the keys that have a rule are found once
    for key, rule in _plan(tuple(m)):
        value = m[key]
        if value is None:
            continue
        if rule & _NUMBER and not _number(value):
            return f"measurement.{key} is {type(value).__name__}, not a number"
        if rule & _NUMBER and key.endswith("_bytes") and (not math.isfinite(value) or (value < 0 and key in COUNTS)):
            return f"measurement.{key} is {value!r}, not a byte count"
        if rule & _NUMBER and key in TIMINGS and (not math.isfinite(value) or value < 0):
            return f"measurement.{key} is {value!r}, not a time or a rate"
        if rule & _NUMBER and key in STEP_SECONDS and value > MAX_STEP_S:
            return f"measurement.{key} is {value!r}, over {MAX_STEP_S:g} s: not a step's time"
        if rule & _LIST and not isinstance(value, list):
            return f"measurement.{key} is {type(value).__name__}, not a list"
    for key in ("step_times_s", "repeat_medians_s"):
        values = m.get(key)
        if values and not _finite_numbers(values):
            return f"measurement.{key} holds something other than finite numbers"
        if values and max(values) > MAX_STEP_S:
            return f"measurement.{key} holds {max(values)!r}, over {MAX_STEP_S:g} s: not a step's time"
    for key in BYTE_LISTS:
        values = m.get(key)
        if values and not (_finite_numbers(values) and min(values) >= 0):
            return f"measurement.{key} holds something other than byte counts"
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
