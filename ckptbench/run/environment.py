"""The machine in one flat dict: what ``ckptbench env --json`` prints and every record's ``env`` holds.

Two halves, gathered where each can be seen.  The host half needs no torch (versions from package
metadata, CPU, commit, torchrun, NVML's driver and devices), so the sweep's parent gathers it once.  The
torch half (:func:`ckptbench.train.environment.torch_environment`: the build and its CUDA, the devices
torch sees, pinned memory, the checkpointing method) comes from a process that has torch: each worker
adds it to its own record, and ``ckptbench env`` or the choice of a default suite asks a child
interpreter, because the sweep's parent never imports torch.
"""

from __future__ import annotations

import json
import subprocess
import sys

from ..base.env import host_environment
from ..measure.nvml import nvml_inventory
from .machine import Machine, gpu_problem

PROBE_TIMEOUT_S = 180  # importing torch and transformers cold on a busy machine


def host_part() -> dict:
    """What the sweep's parent can see without torch."""
    return {**host_environment(), **nvml_inventory()}


def probe_torch(timeout_s: float = PROBE_TIMEOUT_S) -> dict:
    """The torch half from a child interpreter, or ``{"torch_probe_error": why}`` when it could not run."""
    return _probe_result(_start_probe(), timeout_s)


def _start_probe():
    """The child that imports torch, started (the host half is gathered while it imports), or the error."""
    try:
        return subprocess.Popen([sys.executable, "-m", "ckptbench.train.environment"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    except OSError as exc:
        return exc


def _probe_result(proc, timeout_s: float = PROBE_TIMEOUT_S) -> dict:
    if isinstance(proc, OSError):
        return {"torch_probe_error": f"{type(proc).__name__}: {proc}"}
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        proc.kill()
        proc.communicate()
        return {"torch_probe_error": f"{type(exc).__name__}: {exc}"}
    try:
        return json.loads(stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        last = (stderr.strip().splitlines() or [f"exit status {proc.returncode}, no output"])[-1]
        return {"torch_probe_error": last}


def machine_environment(host: dict, torch_part: dict) -> dict:
    """Both halves, and (when torch was asked) why a GPU suite could not run here, or None."""
    env = {**host, **torch_part}
    if torch_part:
        env["gpu_problem"] = gpu_problem(Machine.from_environment(env, sys.executable))
    return env


def collect() -> dict:
    """The whole environment, the torch half asked of a child: ``ckptbench env`` and the default suite."""
    child = _start_probe()  # importing torch takes seconds: the host half is gathered meanwhile
    return machine_environment(host_part(), _probe_result(child))
