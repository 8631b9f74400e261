"""What asv kept: one results file per machine, commit and environment, read as hostile input.

``<results_dir>/<machine>/<commit[:8]>-<environment>.json`` holds the commit's full hash, its date and each
benchmark's values (``null`` where the benchmark failed).  The history takes the commits' dates from here
(their order) and which ckptbench benchmarks asv saw fail; the figures it judges come from ckptbench's own
records (:mod:`.series`).  A file that is not asv's shape is one line in ``problems`` and is left out.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from ..base.regularfile import open_regular
from .benchmark import RECORDS_DIR

MAX_RESULT_BYTES = 64 * 2**20  # an asv results file is kilobytes; one larger than this is not one


@dataclass(frozen=True)
class AsvRun:
    """One asv results file: where it ran, on which commit, and the ckptbench benchmarks that failed there."""

    machine: str
    commit: str
    env: str
    date_ms: int | None
    failed: tuple[str, ...] = ()  # "<benchmark>(<point>)" asv recorded no value for


@dataclass
class AsvResults:
    runs: list[AsvRun] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def dates(self) -> dict[str, int]:
        """Commit -> its date in ms (asv writes the commit's date, not the run's)."""
        return {r.commit: r.date_ms for r in self.runs if r.date_ms is not None}


def _failed(results) -> tuple[str, ...]:
    """The ckptbench benchmarks (their names hold ``Training.track_``) with a null value, per point."""
    out = []
    if not isinstance(results, dict):
        return ()
    for name, entry in results.items():
        if "Training.track_" not in str(name) or not isinstance(entry, list) or not entry:
            continue
        values = entry[0]
        params = entry[1] if len(entry) > 1 and isinstance(entry[1], list) and entry[1] else [[None]]
        labels = params[0] if isinstance(params[0], list) else [None]
        if values is None:
            values = [None] * len(labels)
        if not isinstance(values, list):
            continue
        out += [f"{name}({label})" for label, value in zip(labels, values) if value is None]
    return tuple(out)


def _run(path: str, machine: str) -> AsvRun | str:
    try:
        with open_regular(path, "r", encoding="utf-8") as fh:
            text = fh.read(MAX_RESULT_BYTES + 1)
    except (OSError, UnicodeDecodeError) as exc:
        return f"{path}: cannot read ({exc.__class__.__name__}: {exc})"
    if len(text) > MAX_RESULT_BYTES:
        return f"{path}: over {MAX_RESULT_BYTES // 2**20} MiB, not an asv results file"
    try:
        data = json.loads(text)
    except ValueError as exc:
        return f"{path}: not JSON ({exc})"
    if not isinstance(data, dict):
        return f"{path}: not an asv results file (a {type(data).__name__}, not an object)"
    commit, env, date = data.get("commit_hash"), data.get("env_name"), data.get("date")
    if not isinstance(commit, str) or not commit or not isinstance(env, str):
        return f"{path}: key commit_hash/env_name: missing or not a string"
    if date is not None and (not isinstance(date, (int, float)) or isinstance(date, bool)):
        return f"{path}: key date: {date!r} is not a time in ms"
    return AsvRun(machine, commit, env, int(date) if date is not None else None, _failed(data.get("results")))


def read_asv_results(results_dir: str) -> AsvResults:
    """Every asv results file under `results_dir`, by machine folder (asv's own machines, kept apart)."""
    out = AsvResults()
    try:
        machines = sorted(os.listdir(results_dir))
    except OSError as exc:
        out.problems.append(f"{results_dir}: cannot list ({exc.strerror or exc})")
        return out
    for machine in machines:
        folder = os.path.join(results_dir, machine)
        if machine == RECORDS_DIR or not os.path.isdir(folder):
            continue
        for name in sorted(os.listdir(folder)):
            if not name.endswith(".json") or name == "machine.json":
                continue
            run = _run(os.path.join(folder, name), machine)
            if isinstance(run, str):
                out.problems.append(run)
            else:
                out.runs.append(run)
    return out
