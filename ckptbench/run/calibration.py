"""Measure this machine's rates away from the sweep's parent, which never imports torch: in a process forked
from the fork server, or in a child interpreter where there is none."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

from ..base.errors import UsageError
from ..base.regularfile import open_regular
from ..point.case import Case
from ..theory.time.duration import Rates, rate_key

CALIBRATION_TIMEOUT_S = 120


def machine_rates(cases: list[Case], forked: bool = False) -> tuple[Rates | None, str]:
    """(rates for every (device, dtype, threads) the cases use, "") or (None, why they could not be had).
    Nothing is measured for points no FLOP formula describes: their duration is not projected anyway.

    `forked`: the sweep's fork server is running (it imported torch already), so the probes run in a
    process forked from it, a fraction of a second; else in a child interpreter, which pays torch's
    imports (seconds).  The sweep's parent never imports torch either way."""
    keys = sorted({rate_key(c) for c in cases if c.model.analytic})
    if not keys:
        return None, "no FLOP formula for the model type of any point"
    if forked:
        from .forkserver import forked_call

        answer = forked_call("ckptbench.measure.rates", "measure_rates", ([list(k) for k in keys],),
                             CALIBRATION_TIMEOUT_S, "ckptbench-rates")
        if "error" in answer:
            return None, f"calibration failed: {answer['error']}"
        return Rates.from_json(answer), ""
    try:
        proc = subprocess.run([sys.executable, "-m", "ckptbench.measure.rates", json.dumps(keys)],
                              capture_output=True, text=True, timeout=CALIBRATION_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"calibration did not finish: {exc}"
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return None, f"calibration failed: {last}"
    return Rates.from_json(json.loads(proc.stdout)), ""


# what plans and summaries divide by (a collective's: `calibrate --collective`, the ring the plan's ranks use)
RATES = ("h2d_bytes_per_s", "d2h_bytes_per_s", "matmul_flops_per_s", "collective_bus_bytes_per_s",
         "collective_latency_s")


def read_calibration(path: str | None, verify: bool = False, label: str = "--calibration ") -> dict:
    """A `calibrate` / `plan --verify` JSON, or {} when none is given (or, with --verify, which writes it,
    when it does not exist yet); UsageError naming `label` and the file, and the key, when it is not one
    ``calibrate`` writes (a rate that is not a positive number)."""
    if not path or (verify and not os.path.exists(path)):
        return {}
    try:
        with open_regular(path, "r", encoding="utf-8") as fh:
            data = json.load(fh)
    except OSError as exc:
        raise UsageError(f"{label}{path}: cannot read: {exc.strerror or exc}") from None
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise UsageError(f"{label}{path}: not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise UsageError(f"{label}{path}: not a calibration (a JSON object), got {type(data).__name__}")
    for key in RATES:
        value = data.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not math.isfinite(value) or value <= 0):
            raise UsageError(f"{label}{path}: {key}: must be a positive number, got {value!r}")
    return data


def calibrated_link(cal: dict) -> float | None:
    """The pinned host↔device link a calibration measured (the slower way), or None when it has none."""
    links = [cal[k] for k in ("h2d_bytes_per_s", "d2h_bytes_per_s") if cal.get(k)]
    return min(links) if links else None
