"""The machine's speed in two runs, measured: the readings of a fixed kernel beside each run's records.

A sweep times a fixed fp32 matmul (:mod:`ckptbench.measure.speed`) at its start and at its end, two
readings each time (two processes: a process's core and neighbours are part of what it measures), and
appends them to ``calibration.jsonl`` beside ``records.jsonl``.  ``compare`` divides the new run's step
times by the kernel's time ratio (new / old) only when that ratio is beyond the readings' own noise: a
two-sided Welch t-test on the log of each reading's median time (the reading, not the repetition, is
the unit: repetitions in one process share its conditions) gives p < 0.05.  Otherwise, or without
readings on both sides (a run from before readings were taken), raw changes are judged, and ``compare``
says which.  Readings of different kernels, threads, devices or torch builds are not compared: the
kernel's time then measures the library as well as the machine.
"""

from __future__ import annotations

import json
import math
import os
import statistics
from dataclasses import dataclass

import numpy as np

from ..base.finite import finite_number
from ..base.regularfile import open_regular
from .jsonl import append_line
from .significance import ALPHA, log_moments, upper_p, welch

READINGS = "calibration.jsonl"
KEY_FIELDS = ("kernel", "device", "dtype", "threads", "torch", "device_name")


def readings_path(path: str) -> str:
    """The readings file of a results directory, or of the directory holding a records file."""
    return os.path.join(path if os.path.isdir(path) else os.path.dirname(path) or ".", READINGS)


def append_reading(run_dir: str, reading: dict) -> None:
    """One line, appended as records are (:func:`~.jsonl.append_line`: under an exclusive lock, since shards
    share a directory; a torn tail repaired first, a failed write cut back); StorageError on failure."""
    append_line(os.path.join(run_dir, READINGS), reading)


def load_readings(path: str) -> list[dict]:
    """The readings beside a results directory or records file ([] when there are none); a line that is
    not a JSON object is skipped (a torn last line)."""
    try:
        with open_regular(readings_path(path), "r", encoding="utf-8") as fh:
            lines = fh.read().splitlines()
    except (OSError, UnicodeDecodeError):
        return []
    out = []
    for line in lines:
        try:
            value = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict):
            out.append(value)
    return out


# what a timing of a calibration kernel can be: eight matmuls under a microsecond would be petaflops on a
# CPU's 512 × 512, and one over an hour is not a timing; a line beyond these is damaged or planted, and its
# value is left out (an infinite one had compare divide the new run's times by inf, 1e308 overflowed)
READING_BOUNDS_S = (1e-6, 3600.0)


def _times(reading: dict) -> list[float]:
    times = reading.get("times_s")
    if not isinstance(times, list):
        return []
    low, high = READING_BOUNDS_S
    return [float(t) for t in times if finite_number(t) and low <= t <= high]


def _key(reading: dict) -> tuple:
    return tuple(reading.get(k) for k in KEY_FIELDS)


@dataclass
class MachineSpeed:
    """What the kernel said about the machine between two runs, and whether compare divides it out."""

    state: str  # corrected | within noise | not corrected (--no-drift-correction) | unknown
    why: str = ""  # unknown: why there is nothing to compare
    kernel: str = ""
    old_s: float | None = None  # geometric mean of the readings' median times
    new_s: float | None = None
    ratio: float | None = None  # new / old
    p_value: float | None = None  # two-sided: is the ratio beyond the readings' noise
    log_var: float = 0.0  # variance of log(ratio), and its degrees of freedom
    df: float = math.inf
    readings: tuple[int, int] = (0, 0)
    unit: str = ""  # readings | repetitions

    @property
    def factor(self) -> float:
        """What the new run's step times are divided by before they are judged."""
        return self.ratio if self.state == "corrected" and self.ratio else 1.0


def speed_test(old_logs: np.ndarray, new_logs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(log ratio, its variance, its df, two-sided p) of rows of log kernel times (k, a) and (k, b)."""
    mo, vo, _ = log_moments(old_logs)
    mn, vn, _ = log_moments(new_logs)
    t, df = welch(old_logs, new_logs)
    return mn - mo, vo + vn, df, np.minimum(1.0, 2 * upper_p(np.abs(t), df))


def _units(readings: list[dict], by_reading: bool) -> list[float]:
    if by_reading:
        return [statistics.median(_times(r)) for r in readings]
    return [t for r in readings for t in _times(r)]


def _unknown(old: list[dict], new: list[dict]) -> str:
    for side, readings in (("old", old), ("new", new)):
        if not any(_times(r) for r in readings):
            errors = [r["error"] for r in readings if isinstance(r.get("error"), str)]
            if errors:
                return f"the {side} run's calibration failed ({errors[-1]})"
            if any(isinstance(r.get("times_s"), list) and r["times_s"] for r in readings):
                low, high = READING_BOUNDS_S
                return (f"the {side} run's calibration readings hold no timing (a finite number of seconds "
                        f"from {low:g} to {high:g}): damaged or not written by a sweep")
            return f"no calibration reading in the {side} run (a run from before readings were taken)"
    o = max({_key(r) for r in old if _times(r)}, key=str)
    n = max({_key(r) for r in new if _times(r)}, key=str)
    diff = [f"{k} {a} -> {b}" for k, a, b in zip(KEY_FIELDS, o, n) if a != b]
    return "the runs timed different calibration kernels (" + "; ".join(diff) + ")"


def machine_speed(old: list[dict], new: list[dict], correct: bool = True) -> MachineSpeed:
    """Compare two runs' readings: the kernel's time ratio, and whether it is beyond their noise."""
    by_key: dict[tuple, tuple[list, list]] = {}
    for side, readings in ((0, old), (1, new)):
        for r in readings:
            if _times(r):
                by_key.setdefault(_key(r), ([], []))[side].append(r)
    common = [(k, pair) for k, pair in by_key.items() if pair[0] and pair[1]]
    if not common:
        return MachineSpeed("unknown", _unknown(old, new))
    key, (o, n) = max(common, key=lambda item: min(len(item[1][0]), len(item[1][1])))
    by_reading = len(o) >= 2 and len(n) >= 2
    uo, un = _units(o, by_reading), _units(n, by_reading)
    if len(uo) < 2 or len(un) < 2:
        return MachineSpeed("unknown", "one repetition of the calibration kernel per run: nothing to tell its noise by")
    try:
        log_ratio, var, df, p = (float(x[0]) for x in speed_test(np.log([uo]), np.log([un])))
    except ImportError:  # scipy, for the t distribution: not on every GPU image
        return MachineSpeed("unknown", "without scipy the kernel's ratio cannot be told from its noise")
    state = ("corrected" if correct else "not corrected") if p < ALPHA else "within noise"
    return MachineSpeed(state, kernel=f"{key[0]}, {key[3]} thread{'s' if key[3] != 1 else ''} ({key[1]})",
                        old_s=math.exp(float(np.mean(np.log(uo)))), new_s=math.exp(float(np.mean(np.log(un)))),
                        ratio=math.exp(log_ratio), p_value=p, log_var=var, df=df, readings=(len(o), len(n)),
                        unit="readings" if by_reading else "repetitions")


__all__ = ["READINGS", "MachineSpeed", "append_reading", "load_readings", "machine_speed",
           "readings_path", "speed_test"]
