"""A Case run N times becomes one record: every repeat's figures kept, the times pooled with an interval.

Steps timed in one worker share its conditions (a neighbour's burst, the core it ran on), so step times
within a worker agree far better than across workers: with 3 or more repeats the interval of the median,
and ``compare``'s test, use one median per repeat (``repeat_medians_s``) rather than every step.

Each repeat is its own line in ``records.jsonl`` (``repeat``: 0..N-1), appended when its worker ends, so a
kill loses one repeat, never the others.  Readers see one record per Case: the first repeat's record,
whose step times become all repeats' pooled (median, order-statistic interval, CV over every timed step),
with ``repeats`` listing each repeat's status, median, why its timing stopped and whether its memory figures
were the same.  On CPU
memory is counted exactly, so repeats must agree to the byte: a difference is a gate that fails the record.
"""

from __future__ import annotations

import copy

from .stats import median_cis, summary

MIN_REPEATS_AS_UNIT = 3  # from this many repeats on, intervals and tests use one median per worker

# Figures that must not move between repeats of one Case on CPU (counted, not sampled).
EXACT_KEYS = ("params_bytes", "optimizer_bytes", "mem_after_forward_bytes", "peak_bytes", "saved_bytes",
              "checkpointed_input_bytes", "offloaded_bytes", "allocator_growth_bytes", "peak_phase")


def time_samples(m: dict) -> list[float]:
    """What a time interval or a rank test is taken over: one median per repeat from
    MIN_REPEATS_AS_UNIT repeats on (steps of one worker share its conditions, where it ran and what else
    ran then, so the honest unit across workers is the worker), else every timed step."""
    def numbers(values):
        return [t for t in values or () if isinstance(t, (int, float)) and not isinstance(t, bool) and t == t]

    per_repeat = numbers(m.get("repeat_medians_s"))
    return per_repeat if len(per_repeat) >= MIN_REPEATS_AS_UNIT else numbers(m.get("step_times_s"))


def _needs_statistics(record: dict) -> bool:
    """Step times without the interval's method: a record from before the order-statistic interval (its
    interval, if it had one, is drawn again the way every interval now is) or from a multi-rank point."""
    m = record.get("measurement") or {}
    return bool(m.get("step_times_s")) and "step_time_ci_method" not in m


def with_time_statistics(record: dict) -> dict:
    """The record with its step times' median interval (a copy when anything is added)."""
    return single_records([record])[0]


def single_records(records: list[dict]) -> list[dict]:
    """:func:`with_time_statistics` of each record, the intervals drawn together (one sort per number of
    steps, not one per record: a run of 20,000 records loads in seconds)."""
    todo = [i for i, r in enumerate(records) if _needs_statistics(r)]
    cis = median_cis([records[i]["measurement"]["step_times_s"] for i in todo])
    out = list(records)
    for i, ci in zip(todo, cis):
        m = records[i]["measurement"]
        out[i] = {**records[i], "measurement": {**m, **summary(m["step_times_s"], ci=ci)}}
    return out


def merge_repeats(group: list[dict]) -> dict:
    """One record for the repeats of one Case (`group`: the last line of each repeat, any order)."""
    group = sorted(group, key=lambda r: r.get("repeat", 0))
    if len(group) == 1:
        return with_time_statistics(group[0])
    base = copy.deepcopy(group[0])
    ok = [r for r in group if r.get("status") == "ok"]
    bad = [r for r in group if r.get("status") != "ok"]
    if bad:
        first = bad[0]
        base["status"] = first["status"]
        base["reason"] = f"repeat {first.get('repeat', 0) + 1} of {len(group)}: {first.get('reason', '')}"
    measured = [r["measurement"] for r in ok]
    if measured:
        ref = measured[0]
        pooled = [t for m in measured for t in m.get("step_times_s") or []]
        medians = [m["step_time_median_s"] for m in measured if m.get("step_time_median_s")]
        times = {"step_times_s": pooled, "repeat_medians_s": medians}
        base["measurement"] = {**ref, **summary(pooled, ci_over=time_samples(times)), **times,
                               "timed_steps": len(pooled), "timing_stopped_by": _stopped_by(measured)}
        if len(medians) >= MIN_REPEATS_AS_UNIT:
            base["measurement"]["step_time_ci_unit"] = "repeat"
        if ref.get("tokens_per_s") and ref.get("step_time_median_s") and base["measurement"]["step_time_median_s"]:
            tokens_per_step = ref["tokens_per_s"] * ref["step_time_median_s"]
            base["measurement"]["tokens_per_s"] = tokens_per_step / base["measurement"]["step_time_median_s"]
    differing = sorted({k for m in measured[1:] for k in EXACT_KEYS if m.get(k) != measured[0].get(k)})
    base["repeats"] = {
        "n": len(group),
        "statuses": [r.get("status") for r in group],
        "step_time_medians_s": [(r.get("measurement") or {}).get("step_time_median_s") for r in group],
        "wall_s": [r.get("wall_s") for r in group],
        "timing_stopped_by": [(r.get("measurement") or {}).get("timing_stopped_by") for r in group],
        "memory_identical": not differing,
        "memory_differs": differing,
    }
    verdicts = [r.get("verdict") for r in group]
    if "fail" in verdicts:
        base["verdict"] = "fail"
    if base["case"].get("device") == "cpu" and differing and "gates" in base:
        base["gates"]["memory_differs_across_repeats"] = 1
        base["verdict"] = "fail"
    return base


def _stopped_by(measured: list[dict]) -> str | None:
    """Why the repeats' timing stopped, as one word: a cap when any repeat reached one (its interval is
    then not the precision asked for), "precision" when every repeat reached it."""
    reasons = [m.get("timing_stopped_by") for m in measured]
    for cap in ("max_time", "max_steps", "fixed"):
        if cap in reasons:
            return cap
    return "precision" if reasons and all(r == "precision" for r in reasons) else None
