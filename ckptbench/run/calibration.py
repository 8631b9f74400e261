"""Measure this machine's rates in a child interpreter, so the sweep's parent never imports torch."""

from __future__ import annotations

import json
import subprocess
import sys

from ..spec import Case
from ..theory.duration import Rates, rate_key

CALIBRATION_TIMEOUT_S = 120


def machine_rates(cases: list[Case]) -> tuple[Rates | None, str]:
    """(rates for every (device, dtype, threads) the cases use, "") or (None, why they could not be had)."""
    keys = sorted({rate_key(c) for c in cases})
    try:
        proc = subprocess.run([sys.executable, "-m", "ckptbench.measure.rates", json.dumps(keys)],
                              capture_output=True, text=True, timeout=CALIBRATION_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"calibration did not finish: {exc}"
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return None, f"calibration failed: {last}"
    return Rates.from_json(json.loads(proc.stdout)), ""
