"""The calibration kernel's readings at a sweep's start and end, appended beside its records.

Each moment takes :data:`READINGS_PER_MOMENT` readings, each in a process of its own (a process's core
and neighbours are part of what a reading measures, as they are of a worker's step times): forked from
the fork server when the sweep has one (torch is imported there already, a reading costs a fifth of a
second), else a child interpreter.  The sweep's parent never imports torch.  A reading that cannot be
taken or written is a line saying why, never a failed sweep: ``compare`` then judges raw changes.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections import Counter

from ..base.errors import StorageError
from ..point.case import Case
from ..store.machine_speed import append_reading

READINGS_PER_MOMENT = 2
READING_TIMEOUT_S = 120


def kernel_setting(cases: list[Case]) -> tuple[str, int]:
    """(device, threads) the readings use: those of most of the points (a suite sets them once)."""
    return Counter(("cuda" if c.device == "cuda" else "cpu", c.train.threads) for c in cases).most_common(1)[0][0]


def _forked(device: str, threads: int) -> dict:
    from .forkserver import forked_call

    return forked_call("ckptbench.measure.speed", "time_kernel", (device, threads), READING_TIMEOUT_S,
                       "ckptbench-calibration")


def _child_interpreter(device: str, threads: int) -> dict:
    try:
        proc = subprocess.run([sys.executable, "-m", "ckptbench.measure.speed", device, str(threads)],
                              capture_output=True, text=True, timeout=READING_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    try:
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return {"error": (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}, no output"])[-1]}


def take_readings(run_dir: str, at: str, cases: list[Case], forked: bool, shard: str = "1/1",
                  job: str | None = None) -> list[str]:
    """Time the kernel READINGS_PER_MOMENT times and append each reading (`at`: start | end); returns
    what went wrong, one line each ([] when all went well)."""
    if not cases:
        return []
    device, threads = kernel_setting(cases)
    return append_readings(run_dir, at, device, threads, _forked if forked else _child_interpreter, shard, job)


def append_readings(run_dir: str, at: str, device: str, threads: int, read, shard: str = "1/1",
                    job: str | None = None) -> list[str]:
    """READINGS_PER_MOMENT readings by ``read(device, threads)`` (a dict, ``{"error": why}`` when it could
    not time the kernel), each appended with when and where it was taken; what went wrong, one line each."""
    problems = []
    for _ in range(READINGS_PER_MOMENT):
        reading = read(device, threads)
        reading.update(at=at, shard=shard, job=job, host=socket.gethostname(),
                       when=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
        if "error" in reading:
            reading.update(device=device, threads=threads)
            problems.append(f"calibration reading at the {at}: {reading['error']}")
        try:
            append_reading(run_dir, reading)
        except StorageError as exc:
            return problems + [f"calibration reading at the {at} not written: {exc}"]
    return problems
