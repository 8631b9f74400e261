"""Where a results directory stands, read from disk alone: done, running, waiting and missing points.

Everything a sweep leaves says something: ``suite.toml`` what was asked for, ``records.jsonl`` what is
done, each shard's lock whether a sweep holds it now and its state file what that sweep is running,
and ``jobs/submitted.jsonl`` with each job's outcome file what became of each job.  Nothing is asked
of a scheduler, so the answer is the same on a login node, a laptop holding a copy, or in CI.  Nothing
here unpickles: a results directory may come from anyone, and a pickle runs what it says
(:mod:`.outcome`).
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass, field

from ..base.errors import UsageError
from ..base.regularfile import open_regular
from ..point.case import Case
from ..store.records import load_records
from ..suite.parse import load_suite
from .outcome import job_outcome
from .shards import ShardState, shard_states
from .sweep import plan

JOBS_MANIFEST = os.path.join("jobs", "submitted.jsonl")


@dataclass
class JobState:
    shard: tuple[int, int]
    job_id: str
    launcher: str
    state: str  # running | finished | failed: why | no result yet


@dataclass
class RunStatus:
    run_dir: str
    suite: str
    runs: int  # planned (Case, repeat) runs
    done: Counter = field(default_factory=Counter)  # status -> runs recorded
    running: list[dict] = field(default_factory=list)  # in flight now, from the state files of held shards
    waiting: int = 0  # planned by a shard a sweep holds now, not yet started
    missing: list[tuple[Case, int]] = field(default_factory=list)  # no live sweep will run them
    skipped: int = 0  # of the missing: recorded skipped (deadline, too big), which --resume runs
    shards: list[ShardState] = field(default_factory=list)
    jobs: list[JobState] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def run_status(run_dir: str) -> RunStatus:
    path = os.path.join(run_dir, "suite.toml")
    if not os.path.lexists(path):
        raise UsageError(f"{run_dir}: no suite.toml here; status reads a results directory a sweep wrote")
    if not os.path.isfile(path):
        raise UsageError(f"{path}: not a regular file; status reads a results directory a sweep wrote")
    suite = load_suite(path)
    loaded = load_records(run_dir, merged=False)
    recorded = loaded.records
    repeats = max([suite.repeats, *(r.get("repeats", 1) for r in recorded)])
    last = {(r["case_id"], r.get("repeat", 0)): r for r in recorded}
    out = RunStatus(run_dir, suite.name, len(suite.cases) * repeats,
                    problems=[p for p in loaded.notes() if "no records file" not in p])
    out.shards = shard_states(run_dir)
    live = [s for s in out.shards if s.held]
    in_flight = {(p["case_id"], p.get("repeat", 0)) for s in live for p in s.info.get("running", [])}
    for s in live:
        out.running += [{**p, "shard": s.shard, "job": s.info.get("job")} for p in s.info.get("running", [])]
    planned_live = {c.id for s in live for c in plan(suite, s.shard)}
    for k in range(repeats):
        for case in suite.cases:
            record = last.get((case.id, k))
            if record is not None and record.get("status") != "skipped":
                out.done[record["status"]] += 1
            elif (case.id, k) in in_flight:
                continue
            elif case.id in planned_live:
                out.waiting += 1
            else:
                out.missing.append((case, k))
                out.skipped += record is not None
    out.jobs = _jobs(run_dir, out.shards)
    return out


def _jobs(run_dir: str, shards: list[ShardState]) -> list[JobState]:
    """The latest job submitted for each shard, and what its files say became of it.

    Read from this run's ``jobs/`` alone, not from the folder the manifest names: that is where the
    jobs wrote when they were submitted from here, and it stays right when the run is copied or moved.
    """
    path = os.path.join(run_dir, JOBS_MANIFEST)
    folder = os.path.dirname(path)
    latest: dict[tuple[int, int], tuple[str, str]] = {}
    try:
        with open_regular(path, "rb") as fh:
            for line in fh:
                try:
                    entry = json.loads(line)
                except (ValueError, RecursionError):  # not JSON, not UTF-8
                    continue
                jobs = entry.get("jobs") if isinstance(entry, dict) else None
                for job in jobs if isinstance(jobs, list) else []:
                    shard = job.get("shard") if isinstance(job, dict) else None
                    if (isinstance(shard, list) and len(shard) == 2 and all(type(k) is int for k in shard)
                            and "job_id" in job):  # a line of another shape says nothing of a job
                        latest[tuple(shard)] = (str(job["job_id"]), str(entry.get("launcher", "?")))
    except OSError:
        return []
    holding = {s.info.get("job"): s for s in shards if s.held}
    out = []
    for shard, (job_id, launcher) in sorted(latest.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        state = "running" if job_id in holding else job_outcome(folder, job_id)
        out.append(JobState(shard, job_id, launcher, state))
    return out

