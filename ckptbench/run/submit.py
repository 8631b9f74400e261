"""Shards of one sweep as jobs: a Slurm job array through submitit, or submitit's local executor.

Each job runs :func:`~.sweep.run_sweep` for one shard (``i/N``) of the suite, with ``--resume``'s
rule, into the one results directory every job shares: records go through the store's locked appends,
and :mod:`.shards`' locks keep two live jobs off the same points.  A job is a
:class:`submitit.helpers.Checkpointable`, so submitit requeues it when its time runs out and the
requeued job runs what its shard still misses.  ``--launcher local`` takes the same path with
submitit's :class:`~submitit.LocalExecutor` (a job is a process on this machine, with its own time
limit and the same signals), which is how CI runs it.

Signals: submitit has Slurm send ``SIGUSR2`` 90 s before the time limit (``--signal``).  The job stops
its sweep on it; when submitit judges the job timed out, the points in flight are recorded ``timeout``
(a point that did not finish in the job's time is not run again by every requeued job), when it was
preempted they are dropped whole, to be run again.  Then submitit's own handler checkpoints and
requeues.  ``SIGTERM`` (``scancel``) stops the sweep the same way, dropping the points in flight.
A local job is submitit's controller process and, under it, the task that runs the sweep: the task
dies with the controller (``PR_SET_PDEATHSIG``), so a job killed however it is killed takes its sweep,
fork server and workers along rather than leaving them running under init while it is reported failed.
"""

from __future__ import annotations

import json
import math
import os
import signal
import time
from collections import Counter
from dataclasses import dataclass, replace

import submitit

from ..point.case import Suite
from .lifeline import die_with_parent
from .outcome import write_outcome
from .scheduler import Stopped, StopRequest
from .sweep import SweepOptions, run_sweep

JOBS_DIR = "jobs"  # under the results directory: submitit's pickles and each job's log
MANIFEST = "submitted.jsonl"  # under JOBS_DIR: one line per submission, the job id of every shard
SIGNAL_DELAY_S = 90  # Slurm's warning before the time limit (submitit's default)
LOCAL_TIME_MIN = 24 * 60  # the local executor's limit when none is given (submitit's own default is 2 min)
MAX_REQUEUES = 3  # times a job whose time ran out is requeued to finish its shard


@dataclass(frozen=True)
class SlurmSettings:
    """What each job asks the scheduler for: the suite's ``[slurm]`` table, overridden by flags."""

    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    time_min: float | None = None
    gpus_per_task: int | None = None
    cpus_per_task: int | None = None
    mem_gib: float | None = None
    jobs: int = 1
    array_parallelism: int | None = None
    setup: tuple[str, ...] = ()

    @classmethod
    def merged(cls, table: dict, flags: dict) -> SlurmSettings:
        """The suite's table (checked by the suite parser), each key replaced by a flag that was given."""
        values = {**table, **{k: v for k, v in flags.items() if v is not None}}
        values["setup"] = tuple(values.get("setup", ()))
        return cls(**values)


def slurm_parameters(settings: SlurmSettings, job_name: str) -> dict:
    """Keyword arguments for ``SlurmExecutor.update_parameters``: one task per job, one node."""
    params: dict = {"job_name": job_name, "nodes": 1, "ntasks_per_node": 1, "signal_delay_s": SIGNAL_DELAY_S}
    if settings.time_min is not None:
        params["time"] = math.ceil(settings.time_min)
    for key in ("partition", "account", "qos", "constraint", "gpus_per_task", "cpus_per_task",
                "array_parallelism"):
        if getattr(settings, key) is not None:
            params[key] = getattr(settings, key)
    if settings.mem_gib is not None:
        params["mem"] = f"{math.ceil(settings.mem_gib * 1024)}MB"
    if settings.setup:
        params["setup"] = list(settings.setup)
    return params


def local_parameters(settings: SlurmSettings) -> dict:
    """Keyword arguments for ``LocalExecutor.update_parameters``: the time limit, the GPUs a job sees.

    Never ``setup``: those lines are for a Slurm job's script on a node, and submitit's local executor
    would run them in a shell here, on the machine of whoever ran the sweep."""
    params: dict = {"timeout_min": settings.time_min or LOCAL_TIME_MIN, "signal_delay_s": SIGNAL_DELAY_S}
    if settings.gpus_per_task:
        params["gpus_per_node"] = settings.gpus_per_task
    return params


def make_executor(launcher: str, folder: str, settings: SlurmSettings, job_name: str):
    """submitit's executor for `launcher` (``slurm`` needs ``srun`` on PATH: a Slurm login node)."""
    if launcher == "slurm":
        executor = submitit.SlurmExecutor(folder=folder, max_num_timeout=MAX_REQUEUES)
        executor.update_parameters(**slurm_parameters(settings, job_name))
    elif launcher == "local":
        executor = submitit.LocalExecutor(folder=folder, max_num_timeout=MAX_REQUEUES)
        executor.update_parameters(**local_parameters(settings))
    else:
        raise ValueError(f"unknown launcher {launcher!r}")
    return executor


class ShardJob(submitit.helpers.Checkpointable):
    """What one job runs: one shard of the sweep; requeued whole (its state is what is on disk)."""

    def __init__(self, suite: Suite, options: SweepOptions):
        self.suite, self.options = suite, options

    def __call__(self) -> dict:
        """Run the shard, and note how it ended beside submitit's files (what ``status`` reads).

        A requeue exits (``SystemExit``) and notes nothing: the requeued job notes its own end.
        """
        env = submitit.JobEnvironment()
        if os.environ.get("SUBMITIT_EXECUTOR") == "local":
            _die_with_local_job()
        try:
            summary = self._run(env.job_id)
        except Exception as exc:
            write_outcome(str(env.paths.folder), env.job_id, exc)
            raise
        write_outcome(str(env.paths.folder), env.job_id, None)
        return summary

    def _run(self, job: str) -> dict:
        from ..theory.verdicts.annotate import annotate_record

        stop = StopRequest()
        warning = getattr(signal, "SIG" + os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2"))
        submitits = signal.getsignal(warning)  # checkpoint and requeue: called once the sweep has stopped
        warned = []

        def on_warning(signum, frame):
            warned.append(signum)
            judge = getattr(submitits, "__self__", None)
            if judge is None or not hasattr(judge, "has_timed_out") or judge.has_timed_out():
                stop.request(f"stopped with job {job} at its time limit ({signal.Signals(signum).name})", "timeout")
            else:
                stop.request(f"stopped with job {job}: preempted", None)

        signal.signal(warning, on_warning)
        signal.signal(signal.SIGTERM, lambda signum, frame: stop.request(
            f"stopped with job {job}: SIGTERM (scancel, or the job's end)", None))
        i, n = self.options.shard
        print(f"ckptbench: job {job} runs shard {i}/{n} of {self.suite.name} into {self.options.out_dir}", flush=True)
        try:
            result = run_sweep(self.suite, replace(self.options, job=job), annotate=annotate_record,
                               on_record=_log_record, stop=stop)
        except Stopped as exc:
            print(f"ckptbench: {exc}", flush=True)
            if warned and callable(submitits):
                submitits(warning, None)  # checkpoints and requeues (exits), or gives up (raises)
            raise
        statuses = Counter(r["status"] for r in result.records)
        return {"shard": [i, n], "job": job, "ran": len(result.records), "statuses": dict(statuses)}


def _die_with_local_job() -> None:
    """A local job's task: die with submitit's controller, the process whose pid is the job id (its
    parent; known before this process started, so a controller already gone is caught too)."""
    job = os.environ.get("SUBMITIT_LOCAL_JOB_ID", "")
    die_with_parent(int(job) if job.isdigit() and os.environ.get("SUBMITIT_LOCAL_WITH_SHELL") != "1" else None)


def _log_record(record: dict, k: int, total: int) -> None:
    c = record["case"]
    print(f"[{k}/{total}] {record['case_id']} {record['strategy']} b={c['batch_size']} s={c['seq_len']}: "
          f"{record['status']} {record.get('reason', '')[:200]}", flush=True)


def submit_shards(suite: Suite, options: SweepOptions, shards: list[int], n: int, executor, launcher: str) -> list:
    """Submit one job per shard ``i/n`` for i in `shards` (a job array on Slurm); note them on disk."""
    calls = [ShardJob(suite, replace(options, shard=(i, n), resume=True)) for i in shards]
    with executor.batch():
        jobs = [executor.submit(call) for call in calls]
    folder = os.path.join(options.out_dir, JOBS_DIR)
    os.makedirs(folder, exist_ok=True)
    line = {"submitted_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "launcher": launcher,
            "folder": os.path.abspath(str(executor.folder)),
            "jobs": [{"shard": [i, n], "job_id": str(job.job_id)} for i, job in zip(shards, jobs)]}
    with open(os.path.join(folder, MANIFEST), "a", encoding="utf-8") as fh:
        fh.write(json.dumps(line, sort_keys=True) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    return jobs
