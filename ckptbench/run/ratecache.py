"""The measured op rates of one machine, kept on disk so nothing is timed twice.

One JSON file per machine, device and thread count (``op-rates-<id>.json``: the file's ``machine`` says
which: device, its name, torch's version, threads): each entry's seconds per call with the time it was
measured, the dispatcher's per-call time, and each architecture's framework time per op
(:mod:`.steptime`).  A sweep keeps its own beside its records (``<run>/op-rates/``); ``plan`` keeps one
under ``results/op-rates/``.  Workers running in parallel share a file: each reads, merges and replaces
it atomically under an exclusive lock, so no measurement is lost and none is torn.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import sys
import time

from ..finite import finite_number
from ..store.files import write_json_atomic

FORMAT = 1
DEFAULT_DIR = os.path.join("results", "op-rates")


def now() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S")


def machine_facts(device: str, threads: int) -> dict:
    """What a measurement belongs to: the device and its name, torch's version, the thread count."""
    import torch

    from ..env import cpu_model

    name = torch.cuda.get_device_name() if device == "cuda" else cpu_model()
    facts = {"device": device, "device_name": name, "torch": torch.__version__, "threads": threads}
    if device == "cuda":  # ops timed by their kernels alone (oprates.time_kernels): host-timed files not reused
        facts["op_timing"] = "kernels"
    else:  # matmuls timed with their operands beyond the caches (measure/coldoperands.py): older files not reused
        facts["matmul_operands"] = "cold"
    return facts


def cache_path(directory: str, machine: dict) -> str:
    digest = hashlib.sha1(json.dumps(machine, sort_keys=True).encode()).hexdigest()[:10]
    return os.path.join(directory, f"op-rates-{digest}.json")


@contextlib.contextmanager
def _locked(path: str):
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path + ".lock", "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _seconds(x, positive: bool = False) -> bool:
    """A measured figure: a finite number, never negative (positive where a zero would divide)."""
    return finite_number(x) and (x > 0 if positive else x >= 0)


def _stamped(value, positive: bool = False) -> bool:
    """``[figure, "when"]``, as :meth:`RateCache.add` writes an entry or a figure."""
    return (isinstance(value, list) and len(value) == 2 and _seconds(value[0], positive)
            and isinstance(value[1], str))


FRAMEWORK_NUMBERS = ("step_s", "kernel_s", "clean_per_op_s", "scrub_bytes")


def _probed(value) -> bool:
    """A framework figure as :func:`ckptbench.run.steptime.framework_time` keeps it: its time per op, when,
    and (where present) its other figures as numbers, its rounds as a list of them, its probe as text."""
    return (isinstance(value, dict) and _seconds(value.get("per_op_s")) and isinstance(value.get("at"), str)
            and all(_seconds(value[k]) for k in FRAMEWORK_NUMBERS if k in value)
            and isinstance(value.get("rounds_per_op_s", []), list)
            and all(map(finite_number, value.get("rounds_per_op_s", [])))
            and isinstance(value.get("probe", ""), str))


PARTS = {"entries": _stamped, "figures": lambda v: _stamped(v, positive=True), "framework": _probed}
_warned: set[str] = set()


def _read(path: str, machine: dict) -> dict:
    """The file's measurements for `machine`: none where it is unreadable, of another format or another
    machine's; within it, every entry, figure or framework figure that is not as this module writes it (a
    number that is negative, NaN or text, a part that is not a mapping) is left out, so it is measured again,
    and said once on stderr.  A rate prices every plan and prediction made from it, so the file is read as
    any file in a results folder is: as possibly damaged or hostile."""
    empty = {"format": FORMAT, "machine": machine, "entries": {}, "framework": {}, "figures": {}}
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError, RecursionError):
        return empty
    if not isinstance(data, dict) or data.get("format") != FORMAT or data.get("machine") != machine:
        return empty
    dropped = []
    for part, valid in PARTS.items():
        found = data.get(part, {})
        if not isinstance(found, dict):
            dropped.append(f"{part} (not a mapping)")
            continue
        good = {k: v for k, v in found.items() if valid(v)}
        if len(good) < len(found):
            bad = sorted(set(found) - set(good))
            dropped.append(f"{len(bad)} of {part} (e.g. {bad[0][:60]!r}: {str(found[bad[0]])[:40]})")
        empty[part] = good
    if dropped and path not in _warned:
        _warned.add(path)
        print(f"{path}: {'; '.join(dropped)} not well-formed (a measured figure is a finite number, never "
              "negative): left out and measured again", file=sys.stderr)
    return empty


class RateCache:
    """The rates measured so far on this machine (a file, or only this process when `directory` is None)."""

    def __init__(self, directory: str | None, machine: dict):
        self.machine = machine
        self.path = cache_path(directory, machine) if directory else None
        self.data = _read(self.path, machine) if self.path else _read("", machine)

    def entry(self, key: str) -> float | None:
        found = self.data["entries"].get(key)
        return found[0] if found else None

    def framework(self, arch: str) -> dict | None:
        return self.data["framework"].get(arch)

    def figure(self, name: str) -> float | None:
        found = self.data["figures"].get(name)
        return found[0] if found else None

    def measured_at(self, keys: list[str], arch: str | None = None) -> list[str]:
        """When the given entries (and the architecture's framework time) were measured, oldest first."""
        found = self.data["entries"]
        stamps = {found[k][1] for k in keys if k in found}
        if arch and arch in self.data["framework"]:
            stamps.add(self.data["framework"][arch]["at"])
        return sorted(stamps)

    def add(self, entries: dict[str, float | None], framework: dict[str, dict] | None = None,
            figures: dict[str, float] | None = None) -> None:
        """Record new measurements here and, merged with whatever other processes wrote since, on disk."""
        stamp = now()
        new = {"entries": {k: [v, stamp] for k, v in entries.items() if v is not None},
               "framework": {k: {**v, "at": stamp} for k, v in (framework or {}).items()},
               "figures": {k: [v, stamp] for k, v in (figures or {}).items() if v is not None}}
        for part, values in new.items():
            self.data[part].update(values)
        if not self.path or not any(new.values()):
            return
        with _locked(self.path):
            on_disk = _read(self.path, self.machine)
            for part, values in new.items():
                on_disk[part].update(values)
            write_json_atomic(self.path, on_disk)
            self.data = on_disk
