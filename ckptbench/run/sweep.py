"""Run a suite: each Case in its own process, each result appended as a record as soon as it ends.

Single-process Cases run in workers forked from a preloaded fork server (:mod:`.forkserver`); Cases
with ``world_size > 1`` are process groups and go through torchrun instead (:mod:`.launch`).  Points
run one at a time, or side by side on slots of cores or GPUs (:mod:`.slots`, :mod:`.scheduler`).  The
parent never imports torch.
"""

from __future__ import annotations

import functools
import hashlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..base.errors import StorageError, UsageError
from ..measure.nvml import nvml_total_bytes
from ..point.case import Case, Suite
from ..store.files import write_text_atomic
from ..store.load import record_load
from ..store.records import RecordStore
from .environment import host_part, machine_environment
from .fits import WORKER_BASELINE_BYTES, too_big
from .forkserver import IsolatedRunner, start_fork_server
from .nodes import Nodes
from .scheduler import Running, StopRequest, run_on_slots
from .shards import SweepLock
from .slots import Placement, sweep_slots
from .speed_reading import take_readings

# Variables that set a math library's thread count behind torch's back.
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
# Statuses --retry may name: a failure that may be the machine's at the time (a full disk, a kill, a loaded
# machine's timeout), not the point's own answer.  `ok` is an answer; `skipped` is always run by --resume.
RETRYABLE = ("crash", "timeout", "oom", "over_budget", "unsupported")
MAX_ATTEMPTS = 3


@dataclass(frozen=True)
class SweepOptions:
    out_dir: str
    resume: bool = False
    shard: tuple[int, int] = (1, 1)  # (i, n): this process runs every n-th planned Case starting at i
    timeout_s: float | None = None  # overrides the suite's per-Case timeout
    max_minutes: float | None = None  # Cases not started this long after the sweep began are recorded as skipped
    memory_cap: int | None = None  # --memory-gib: a worker holding more is stopped (oom); no point estimated above starts
    force: bool = False  # start points whose estimated peak exceeds the memory available
    repeats: int | None = None  # runs per Case (None: the suite's `repeats`)
    parallel: int | None = None  # --parallel N: CPU points side by side, each pinned to its own cores
    devices: tuple[int, ...] | None = None  # --devices: CUDA points side by side, one device each
    job: str | None = None  # the job manager's id for this sweep (a Slurm array task), kept in each record
    nodes: Nodes = Nodes()  # --nnodes ...: multi-rank points spread over hosts (torchrun's c10d rendezvous)
    retry: tuple[str, ...] = ()  # --retry: statuses --resume runs again, until a point has had max_attempts runs
    max_attempts: int = MAX_ATTEMPTS
    faults: dict = field(default_factory=dict)  # case id -> Fault (every repeat); tests only
    calibrate: bool = True  # time the calibration kernel at the start and the end (what compare divides by)


@dataclass
class SweepResult:
    run_dir: str
    planned: list[Case]
    skipped_ids: list[str]
    records: list[dict]
    notes: list[str] = field(default_factory=list)  # what went wrong beside the points (a calibration reading)


def plan(suite: Suite, shard: tuple[int, int] = (1, 1)) -> list[Case]:
    """The Cases this process is responsible for, in suite order."""
    i, n = shard
    return [c for k, c in enumerate(suite.cases) if k % n == i - 1]


def pending(planned: list[Case], recorded: list[dict], resume: bool, repeats: int = 1, retry: tuple[str, ...] = (),
            max_attempts: int = MAX_ATTEMPTS) -> tuple[list[tuple[Case, int]], list[str]]:
    """(the (Case, repeat) runs still to do, the ids of Cases --resume passes over entirely).

    Repeats are interleaved, every Case once and then every Case again (A B C A B C ...), so a slow drift
    of the machine spreads over all Cases instead of landing on the last ones.  A run recorded as
    skipped (deadline, or too big for the memory then available) was never run: --resume runs it.  A
    run whose last record has a status in `retry` runs again while it has had fewer than `max_attempts`.
    """
    done = ({key for key, r in _last_records(recorded).items() if not _to_rerun(r, retry, max_attempts)}
            if resume else set())
    todo = [(c, k) for k in range(repeats) for c in planned if (c.id, k) not in done]
    passed = [c.id for c in planned if all((c.id, k) in done for k in range(repeats))]
    return todo, passed


def _last_records(recorded: list[dict]) -> dict[tuple[str, int], dict]:
    return {(r["case_id"], r.get("repeat", 0)): r for r in recorded}  # a later line replaces an earlier one


def _to_rerun(record: dict, retry: tuple[str, ...], max_attempts: int) -> bool:
    status = record.get("status")
    return status == "skipped" or (status in retry and record.get("attempt", 1) < max_attempts)


def next_attempts(recorded: list[dict]) -> dict[tuple[str, int], int]:
    """The `attempt` the next record of each recorded (Case, repeat) carries: one more than its last run's,
    the same as a ``skipped`` record's (a point not started was not an attempt).  Unrecorded: 1."""
    return {key: r.get("attempt", 1) + (r.get("status") != "skipped") for key, r in _last_records(recorded).items()}


def _run_group(case: Case, work_dir: str, timeout: float, repeat: int, placement: Placement,
               point: Running, nodes: Nodes = Nodes()) -> dict:
    """A multi-rank Case: one torchrun group of its own, its rank-0 result in the common shape."""
    from ..train.support import refusal
    from .launch import flatten_measurement, kill_tree, run_distributed_case

    reason = refusal(case)
    if reason:  # nothing started: the setup is not run here as asked
        return {"status": "unsupported", "reason": reason, "stderr_tail": "", "wall_s": 0.0, "measurement": {}}
    name = case.id if repeat == 0 else f"{case.id}-{repeat}"
    where = {"cores": list(placement.cores), "env": placement.env()}
    result = run_distributed_case(case, os.path.join(work_dir, name), timeout, sync_impl=case.sync_impl,
                                  where=where, on_start=lambda proc: point.register(lambda: kill_tree(proc)),
                                  nodes=nodes)
    if result["status"] == "ok":
        result["measurement"] = flatten_measurement(case, result["measurement"])
    return result


def _judge_budget(result: dict, budget: int | None) -> None:
    """On CPU there is no OOM to catch: a suite's memory budget turns an over-budget peak into a result."""
    m = result.get("measurement") or {}
    if budget and result["status"] == "ok" and m.get("peak_bytes", 0) > budget:
        result["status"] = "over_budget"
        result["reason"] = f"peak {m['peak_bytes'] / 2**20:.1f} MiB > budget {budget / 2**20:.1f} MiB"


def _keep_suite_text(suite: Suite, run_dir: str, recorded_ids: set[str]) -> None:
    """Store the suite file beside the records, so a report shows exactly what was asked for.

    The records of a directory always belong to the suite stored there.  Another suite may write into
    it only if every point already recorded is one of its own points (a suite grown by more axis
    values, resumed to add them); the stored file is then replaced by the new one.  Anything else would
    mix two experiments under one suite file, and is refused.
    """
    path = os.path.join(run_dir, "suite.toml")
    if os.path.exists(path):
        with open(path, encoding="utf-8") as fh:
            if fh.read() == suite.text:
                return
        foreign = recorded_ids - {c.id for c in suite.cases}
        if foreign:
            raise UsageError(f"{run_dir} holds {len(foreign)} points of another suite (its suite.toml differs "
                             f"from {suite.path}); write to another --out")
    if suite.text:
        write_text_atomic(path, suite.text)


def _load_now(result: dict) -> dict:
    """What else ran on the machine (load average as the point ended) and the threads the point used."""
    env = {"load_average": " ".join(f"{x:.2f}" for x in os.getloadavg())}
    threads = (result.get("measurement") or {}).get("threads")
    if threads is not None:
        env["torch_threads"] = threads
    set_vars = [f"{k}={os.environ[k]}" for k in THREAD_VARS if k in os.environ]
    env["thread_env"] = " ".join(set_vars) or "unset"
    return env


def run_link(out_dir: str) -> float | None:
    """The pinned link a calibration in the run's directory measured (``calibration.json``, as ``ckptbench
    calibrate`` writes it; a CUDA run's offload copies are priced at it), or None (the model's assumed link)."""
    from .calibration import calibrated_link, read_calibration

    try:
        return calibrated_link(read_calibration(os.path.join(out_dir, "calibration.json"), verify=True))
    except UsageError:
        return None


def step_time_prediction(case: Case, measured: list, link: float | None) -> dict:
    """The step-time model's prediction for a point that ran (:func:`ckptbench.theory.time.steptime.predict_from`),
    from the baselines of the run's points recorded before it, offload's copies at `link` on CUDA."""
    from ..theory.time.steptime import predict_from

    try:
        return predict_from(case, measured, link if case.device == "cuda" else None)
    except Exception as exc:  # the prediction never costs the point its record
        return {"error": f"{type(exc).__name__}: {exc}"[:500]}


def make_record(suite: Suite, case: Case, result: dict, host_env: dict, annotate=None, repeat: int = 0,
                repeats: int = 1) -> dict:
    record = {
        "case_id": case.id,
        "repeat": repeat,
        "repeats": repeats,
        "suite": suite.name,
        "case": case.to_dict(),
        "strategy": case.strategy,
        "status": result["status"],
        "reason": result.get("reason", ""),
        "measurement": result.get("measurement") or {},
        "stderr_tail": result.get("stderr_tail", ""),
        "wall_s": result.get("wall_s"),
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "env": {**machine_environment(host_env, result.get("device_env", {})), **_load_now(result)},
    }
    walls = record["measurement"].get("steps_wall_s") or {}
    steps = walls.values()
    if record["wall_s"] and sum(steps) > 0:  # the whole point (fork, build, probes, record) over its steps
        record["harness_ratio"] = record["wall_s"] / sum(steps)
        record["harness_parts"] = harness_parts(record["wall_s"], walls, record["measurement"].get("timed_steps"),
                                                case.train.memory_steps)
    if result.get("host_memory"):
        record["host_memory"] = result["host_memory"]  # what the sweep saw of a worker that was stopped or killed
    if annotate is not None:
        annotate(case, record)
    return record


def harness_parts(wall_s: float, walls: dict, timed_steps: int | None, memory_steps: int) -> dict:
    """`harness_ratio` in its parts: the point's wall over its timed steps alone, the memory step's time
    (all its probes) over one timed step's, and the warm-up's seconds."""
    timed = walls.get("timed") or 0.0
    per_timed = timed / timed_steps if timed and timed_steps else None
    memory = walls.get("memory") or 0.0
    return {"wall_over_timed": wall_s / timed if timed else None,
            "memory_step_over_timed_step": (memory / memory_steps / per_timed) if per_timed and memory_steps
            else None,
            "warmup_s": walls.get("warmup")}


def run_sweep(suite: Suite, options: SweepOptions, on_record: Callable[[dict, int, int], None] | None = None,
              annotate: Callable[[Case, dict], None] | None = None,
              on_start: Callable[[list[tuple[Case, int]], bool], None] | None = None,
              on_running: Callable[[list[Running]], None] | None = None,
              stop: StopRequest | None = None) -> SweepResult:
    """Run the planned Cases not yet in the store; append one record per Case as soon as it ends.

    `on_start` sees the (Case, repeat) runs about to start once the directory has been accepted (lock held, no
    duplicates), so what the CLI says will run is what runs, and whether the fork server is running;
    `on_running` sees the points in flight whenever one starts or ends; `stop`, set from a signal handler,
    ends the sweep early (:class:`Stopped`).
    """
    if os.path.exists(options.out_dir) and not os.path.isdir(options.out_dir):
        raise UsageError(f"--out {options.out_dir} is a file, not a results directory")
    planned = plan(suite, options.shard)
    slots = sweep_slots(planned, options.parallel, options.devices, visible=os.environ.get("CUDA_VISIBLE_DEVICES"))
    store = RecordStore(options.out_dir)
    store.ensure()
    with SweepLock(options.out_dir, options.shard, len(suite.cases), options.job, suite_digest(suite),
                   suite.name) as lock:
        def running(points: list[Running]) -> None:
            lock.running([p.to_dict() for p in points])
            if on_running is not None:
                on_running(points)
        return _run_locked(suite, options, store, slots, on_record, annotate, on_start, running, stop)


def suite_digest(suite: Suite) -> str:
    """What tells one suite from another: its text, or where it has none, its points in order."""
    text = suite.text or "\n".join(c.id for c in suite.cases)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def accept_directory(suite: Suite, options: SweepOptions, recorded: list[dict]) -> None:
    """Refuse a directory that holds another suite's points, or (without --resume) some of this shard's."""
    recorded_ids = {r["case_id"] for r in recorded}
    _keep_suite_text(suite, options.out_dir, recorded_ids)
    planned = plan(suite, options.shard)
    if not options.resume:
        again = [c for c in planned if c.id in recorded_ids]
        if again:
            raise UsageError(f"{options.out_dir} already holds {len(again)} of the {len(planned)} points this sweep "
                             "would run; add --resume to run only the missing ones, or choose another --out")


def _run_locked(suite: Suite, options: SweepOptions, store: RecordStore, slots, on_record, annotate,
                on_start, on_running, stop) -> SweepResult:
    recorded = store.load().records
    accept_directory(suite, options, recorded)
    work_dir = os.path.join(options.out_dir, "work")
    try:
        os.makedirs(work_dir, exist_ok=True)
    except OSError as exc:
        raise StorageError(work_dir, exc, "creating") from exc
    planned = plan(suite, options.shard)
    repeats = options.repeats or suite.repeats
    todo, skipped = pending(planned, recorded, options.resume, repeats, options.retry, options.max_attempts)
    attempts = next_attempts(recorded)
    forked = any(case.world_size == 1 for case, _ in todo)
    if forked:  # first, so that on_start can measure the projection's rates in a process forked from it;
        start_fork_server()  # here, in the sweep's main thread, so that it dies with the sweep
    if on_start is not None:
        on_start(todo, forked)
    timeout = options.timeout_s or suite.timeout_s
    host_env = host_part()  # the worker adds the torch half: together, what `ckptbench env --json` prints
    device_bytes = functools.cache(lambda: nvml_total_bytes(0))  # asked once, and only for a CUDA point
    records: list[dict] = []
    deadline = time.monotonic() + 60 * options.max_minutes if options.max_minutes is not None else None
    shard = f"{options.shard[0]}/{options.shard[1]}"
    baseline = [WORKER_BASELINE_BYTES]  # a worker's resident memory before its step: measured by each worker
    from ..theory.time.steptime import Baseline, baselines

    measured = baselines(recorded)  # the step-time model's baselines, each record read once
    link = run_link(options.out_dir)

    def not_started(case: Case) -> dict | None:
        if deadline is not None and time.monotonic() >= deadline:
            return {"status": "skipped", "reason": f"not started: the sweep's --max-minutes "
                    f"{options.max_minutes:g} deadline had passed"}
        if not options.force and (why := too_big(case, options.memory_cap, device_bytes=device_bytes,
                                                  baseline=baseline[0])):
            return {"status": "skipped", "reason": why}
        return None

    def start(case: Case, repeat: int, placement: Placement, point: Running) -> dict:
        if case.world_size > 1:
            return _run_group(case, work_dir, timeout, repeat, placement, point, options.nodes)
        runner = IsolatedRunner()
        point.register(runner.kill_current)
        return runner.run(case, work_dir, timeout, options.faults.get(case.id), options.memory_cap, placement, repeat)

    def finish(case: Case, repeat: int, placement: Placement | None, result: dict) -> None:
        if result.get("baseline_rss_bytes"):
            baseline[0] = max(baseline[0], result["baseline_rss_bytes"])
        _judge_budget(result, suite.memory_budget_bytes)
        if result.get("status") == "ok" and case.world_size == 1:  # from the run's other points, never its own
            result["measurement"]["step_time_model"] = step_time_prediction(case, measured, link)
        record = make_record(suite, case, result, host_env, annotate, repeat, repeats)
        record["attempt"] = attempts.get((case.id, repeat), 1)
        record["placement"] = {**(placement.to_dict() if placement else {}), "shard": shard, "job": options.job}
        if "cores_seen" in result:
            record["placement"]["cores_seen"] = result["cores_seen"]
        if record["status"] == "ok":  # was the machine loaded, and did the point's threads fight for its cores
            record["load"] = record_load(record)
        store.append(record)
        records.append(record)
        if (base := Baseline.of(record)) is not None:  # read once, for the points after it
            measured.append(base)
        if on_record is not None:
            on_record(record, len(records), len(todo))


    def calibration(at: str) -> list[str]:  # the machine's speed now: what compare tells drift from change by
        return take_readings(options.out_dir, at, [c for c, _ in todo], forked, shard, options.job) \
            if options.calibrate else []

    notes = calibration("start")
    run_on_slots(todo, slots, start, finish, not_started, on_running, stop)
    notes += calibration("end")
    return SweepResult(options.out_dir, planned, skipped, records, notes)
