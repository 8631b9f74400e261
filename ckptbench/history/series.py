"""The history: each machine's and environment's commits in order, each judged against the commit before.

The records the benchmarks kept (``<results_dir>/ckptbench/<machine>/<environment>/<commit>/``) are read as
any results directory is (hostile lines skipped and counted); commits are ordered by the date asv wrote for
them, else by when their records were written.  Each commit is compared with the last one measured before
it by ``compare``'s own rules (:func:`~ckptbench.store.compare.compare_runs`): time by the one-sided Welch
test on log step times beside the threshold, after the calibration kernel's machine-speed change when both
commits have its readings; memory exactly on CPU, where a step's bytes are the same every run, so any growth
is flagged with its byte count (on CUDA beyond the memory threshold, 2 %); a point ``ok`` before and not now
(oom, crash) is flagged by its status.  A commit whose benchmark failed before any record was kept is named
from asv's file and the history goes on from the commit before it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from ..measure.interval import coverage_label
from ..store.compare import compare_runs
from ..store.comparison import DEFAULT_MEMORY_THRESHOLD, DEFAULT_TIME_THRESHOLD, Thresholds
from ..store.machine_speed import load_readings
from ..store.points import QUANTITY_BY_KEY, record_label
from ..store.records import RECORDS, load_records
from ..store.schema import typed
from .asv_results import AsvResults, read_asv_results
from .benchmark import MACHINE_FILE, RECORDS_DIR

CHARTED = ("peak_bytes", "step_time_median_s")  # what each point's line shows across commits


@dataclass
class Change:
    """One flagged change at a commit, with its evidence."""

    case_id: str
    label: str
    quantity: str  # a Quantity key, or "status"
    old: float | str | None
    new: float | str | None
    change: float | None  # relative; None for a status
    direction: str  # regression | improvement
    evidence: str


@dataclass
class Commit:
    commit: str
    date_ms: int | None
    points: int  # records read
    changes: list[Change] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what the comparison could not do, machine speed, lines skipped

    @property
    def regressed(self) -> bool:
        return any(c.direction == "regression" for c in self.changes)


@dataclass
class Series:
    machine: str
    parts: dict  # what the machine key was made of
    env: str
    commits: list[Commit] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)  # case id -> label
    values: dict[str, dict[str, list]] = field(default_factory=dict)  # case id -> quantity -> value per commit


@dataclass
class History:
    series: list[Series] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)  # asv's runs with failed ckptbench benchmarks, one line each
    newest_failed: list[str] = field(default_factory=list)  # those of them on each asv machine's newest commit

    @property
    def latest_regressed(self) -> list[Series]:
        """The series whose newest commit regressed: what a CI job on that commit fails on."""
        return [s for s in self.series if s.commits and s.commits[-1].regressed]


def _bytes(value) -> str:
    return f"{value:,.0f} B" if isinstance(value, (int, float)) else "-"


def _evidence(delta, speed) -> str:
    q = QUANTITY_BY_KEY[delta.quantity]
    if q.kind == "memory":
        return f"{_bytes(delta.old)} -> {_bytes(delta.new)} ({delta.new - delta.old:+,.0f} B)"
    parts = [f"{delta.old:.4g} -> {delta.new:.4g} {q.unit}"] if delta.old is not None and delta.new is not None else []
    if delta.p_value is not None:
        parts.append(f"one-sided Welch on log times p={delta.p_value:.2g} ({delta.test})")
    else:
        parts.append("untested (no per-step times)")
    for side, ci, cov in (("before", delta.old_ci, delta.old_ci_coverage), ("after", delta.new_ci, delta.new_ci_coverage)):
        if ci:
            parts.append(f"{side} [{ci[0]:.4g}, {ci[1]:.4g}] ({coverage_label(cov)} coverage)")
    if speed.state == "corrected":
        parts.append(f"the machine's speed change divided out (kernel ×{speed.ratio:.3f}, p={speed.p_value:.2g})")
    return "; ".join(parts)


def _changes(comparison) -> list[Change]:
    out = []
    speed = comparison.machine_speed
    for pc in comparison.points:
        if pc.status_regressed:
            out.append(Change(pc.key, pc.label, "status", pc.old_status, pc.new_status, None, "regression",
                              f"status {pc.old_status} -> {pc.new_status}"))
        for d in pc.deltas:
            if d.regressed or d.improved:
                out.append(Change(pc.key, pc.label, d.quantity, d.old, d.new, d.change,
                                  "regression" if d.regressed else "improvement",
                                  _evidence(d, speed)))
    return out


def _on_cpu(records: list[dict]) -> bool:
    return bool(records) and all(str((r.get("case") or {}).get("device", "cpu")).startswith("cpu") for r in records)


def _when(path: str, dates: dict[str, int], commit: str) -> tuple:
    if commit in dates:
        return (0, dates[commit], commit)
    try:
        return (1, int(os.stat(os.path.join(path, RECORDS)).st_mtime * 1000), commit)
    except OSError:
        return (2, 0, commit)


def _machine_parts(folder: str) -> dict:
    try:
        with open(os.path.join(folder, MACHINE_FILE), encoding="utf-8") as fh:
            parts = json.load(fh)
    except (OSError, ValueError):
        return {}
    return parts if isinstance(parts, dict) else {}


def _foreign(record: dict, parts: dict) -> str | None:
    """Why a record was made on another machine than its folder's, or None."""
    env = record.get("env") or {}
    for key in ("cpu", "cpu_count"):
        if key in parts and key in env and env[key] != parts[key]:
            return f"env.{key} is {env[key]!r}, this machine's is {parts[key]!r}"
    return None


def _series(folder: str, machine: str, env: str, asv: AsvResults, limits: tuple[float | None, float | None],
            problems: list[str]) -> Series:
    parts = _machine_parts(os.path.dirname(folder))
    series = Series(machine, parts, env)
    dates = asv.dates()
    commits = [c for c in os.listdir(folder) if not c.startswith(".") and os.path.isdir(os.path.join(folder, c))]
    commits.sort(key=lambda c: _when(os.path.join(folder, c), dates, c))
    before: tuple[list[dict], list[dict]] | None = None
    for index, commit in enumerate(commits):
        path = os.path.join(folder, commit)
        loaded = load_records(path)
        records = []
        for r in loaded.records:
            why = _foreign(r, parts)
            if why:
                problems.append(f"{os.path.join(path, RECORDS)}: case {r.get('case_id')}: {why}; left out")
            else:
                records.append(r)
        entry = Commit(commit, dates.get(commit), len(records), notes=list(loaded.notes()))
        for r in typed(records):
            series.labels.setdefault(r.case_id, record_label(r.raw))
            for key in CHARTED:
                line = series.values.setdefault(r.case_id, {}).setdefault(key, [None] * len(commits))
                line[index] = getattr(r.measurement, key) if r.ok else None
        readings = load_readings(path)
        if not records:
            entry.notes.append("no record could be read: compared with nothing")
        elif before is not None:
            memory, time = limits
            exact = _on_cpu(records) and _on_cpu(before[0])
            thresholds = Thresholds(memory=(0.0 if exact else DEFAULT_MEMORY_THRESHOLD) if memory is None else memory,
                                    time=DEFAULT_TIME_THRESHOLD if time is None else time)
            comparison = compare_runs(before[0], records, thresholds, before[1], readings)
            if not comparison.points:
                entry.notes.append("no point in common with the commit before: the suite or the steps changed")
            entry.changes = _changes(comparison)
            entry.notes += [f"new point: {p.label}" for p in comparison.only_new]
            entry.notes += [f"point gone: {p.label}" for p in comparison.only_old]
            entry.notes += comparison.problems
            speed = comparison.machine_speed
            if speed.state == "corrected":
                entry.notes.append(f"the calibration kernel ran ×{speed.ratio:.3f} as long (p={speed.p_value:.2g}): "
                                   "step times divided by it before they were judged")
        if records:
            before = (records, readings)
        series.commits.append(entry)
    return series


def build_history(results_dir: str, memory: float | None = None, time: float | None = None) -> History:
    """The history of every machine and environment under asv's `results_dir`; `memory` / `time`: the
    thresholds (relative) instead of the defaults (memory: any growth on CPU, 2 % on CUDA; time 10 %)."""
    asv = read_asv_results(results_dir)
    history = History(problems=list(asv.problems))
    newest = {}
    for run in asv.runs:
        if run.date_ms is not None and run.date_ms >= newest.get((run.machine, run.env), (-1,))[0]:
            newest[(run.machine, run.env)] = (run.date_ms, run.commit)
    for run in asv.runs:
        if run.failed:
            shown = ", ".join(run.failed[:3]) + (f" and {len(run.failed) - 3} more" if len(run.failed) > 3 else "")
            line = f"{run.machine} {run.commit[:12]} {run.env}: asv recorded no value for {shown}"
            history.failed.append(line)
            if newest.get((run.machine, run.env), (None, None))[1] == run.commit:
                history.newest_failed.append(line)
    root = os.path.join(results_dir, RECORDS_DIR)
    if not os.path.isdir(root):
        history.problems.append(f"{root}: no ckptbench records (run asv with ckptbench's benchmarks first)")
        return history
    for machine in sorted(os.listdir(root)):
        machine_dir = os.path.join(root, machine)
        if not os.path.isdir(machine_dir):
            continue
        for env in sorted(os.listdir(machine_dir)):
            folder = os.path.join(machine_dir, env)
            if os.path.isdir(folder) and not env.startswith("."):
                history.series.append(_series(folder, machine, env, asv, (memory, time), history.problems))
    return history
