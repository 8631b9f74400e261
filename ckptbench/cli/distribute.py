"""``sweep --parallel / --devices / --launcher``: a sweep spread over slots of one machine, or over jobs.

The flags, and the front of ``--launcher``: it checks the directory
as a sweep would, submits one job per shard that still misses points (all of them the first time),
and waits for them (``local``; ``slurm`` with ``--wait``) or says how to follow them.
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import replace

from . import argtypes

LAUNCHERS = ("local", "slurm")
SLURM_FLAGS = ("partition", "account", "qos", "time_min", "gpus_per_task", "cpus_per_task", "jobs")


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("more than one point at a time")
    g.add_argument("--parallel", type=argtypes.at_least_one, metavar="N",
                   help="CPU: run N points side by side, each pinned to its own `threads` cores")
    g.add_argument("--devices", type=argtypes.devices, metavar="0,1,...",
                   help="CUDA: run one point per device (CUDA_VISIBLE_DEVICES); a multi-rank point takes "
                        "as many devices as its world size")
    g.add_argument("--launcher", choices=LAUNCHERS,
                   help="submit the shards as jobs through submitit: slurm (a job array) or local (processes "
                        "here); every job appends to --out")
    g.add_argument("--jobs", type=argtypes.at_least_one, metavar="N", help="with --launcher: N shards, one job each "
                                                            "(default: [slurm] jobs, else 1)")
    g.add_argument("--partition", help="Slurm partition (default: [slurm] partition)")
    g.add_argument("--account", help="Slurm account")
    g.add_argument("--qos", help="Slurm quality of service")
    g.add_argument("--time-limit", dest="time_min", type=argtypes.positive, metavar="MIN",
                   help="each job's time limit in minutes (slurm: required here or as [slurm] time_min)")
    g.add_argument("--gpus-per-task", type=int, metavar="G", help="GPUs each job asks for")
    g.add_argument("--cpus-per-task", type=argtypes.at_least_one, metavar="C", help="CPU cores each job asks for")
    g.add_argument("--wait", action="store_true", help="with --launcher slurm: wait for the jobs to end")


def check_flags(args, cases) -> None:
    """Before anything starts: the job flags mean nothing without --launcher (say so rather than run here
    as if they were heard), and the slots asked for must exist here (a job checks its own)."""
    from ..base.errors import UsageError
    from ..run.slots import sweep_slots

    given = [f"--{k.replace('_', '-') if k != 'time_min' else 'time-limit'}" for k in (*SLURM_FLAGS, "wait")
             if getattr(args, k)]
    if given and not args.launcher:
        raise UsageError(f"{', '.join(given)} only mean something with --launcher local|slurm")
    if not args.launcher:
        sweep_slots(cases, args.parallel, args.devices, visible=os.environ.get("CUDA_VISIBLE_DEVICES"))


def launch(args, suite, options, console) -> int:
    """Submit the shards that miss points as jobs; wait for them where that was asked."""
    from ..base.errors import UsageError
    from ..run.shards import overlapping, shard_states
    from ..run.submit import JOBS_DIR, SlurmSettings, make_executor, submit_shards
    from ..run.sweep import accept_directory, pending, plan
    from ..store.records import RecordStore

    if args.shard != (1, 1):
        raise UsageError("--shard and --launcher do not go together: --jobs N cuts the suite into N shards")
    settings = SlurmSettings.merged(suite.slurm, {k: getattr(args, k) for k in SLURM_FLAGS})
    if args.launcher == "local" and settings.setup:  # Slurm's job script runs them; a local job does not
        console.print("[slurm] setup ignored under --launcher local", markup=False)
    if args.launcher == "slurm" and settings.time_min is None:
        raise UsageError("--launcher slurm needs each job's time limit: --time-limit MIN, or time_min in the "
                         "suite's [slurm] table")
    folder = os.path.abspath(os.path.join(options.out_dir, JOBS_DIR))
    try:
        executor = make_executor(args.launcher, folder, settings, f"ckptbench-{suite.name}")
    except RuntimeError as exc:  # submitit: no srun here
        raise UsageError(f"--launcher slurm: {exc}") from None
    store = RecordStore(options.out_dir)
    store.ensure()
    recorded = store.load().records
    accept_directory(suite, replace(options, shard=(1, 1)), recorded)
    n = settings.jobs
    live = [s.shard for s in shard_states(options.out_dir) if s.held]
    repeats = options.repeats or suite.repeats
    todo = {i: len(pending(plan(suite, (i, n)), recorded, True, repeats, options.retry, options.max_attempts)[0])
            for i in range(1, n + 1)}
    busy = {i: [s for s in live if overlapping((i, n), s, len(suite.cases))] for i in todo}
    shards = [i for i, k in todo.items() if k and not busy[i]]
    for i in sorted(i for i, k in todo.items() if k and busy[i]):
        held = ", ".join(f"{a}/{b}" for a, b in busy[i])
        console.print(f"shard {i}/{n} not submitted: a sweep running now (shard {held}) holds some of its points")
    if not shards:
        console.print(f"nothing to submit: every point of {suite.name} is recorded in {options.out_dir} or running")
        return 0
    jobs = submit_shards(suite, options, shards, n, executor, args.launcher)
    runs = sum(todo[i] for i in shards)
    console.print(f"submitted {len(jobs)} job{'s' * (len(jobs) > 1)} ({runs} runs) through {args.launcher}: "
                  + ", ".join(f"{job.job_id} (shard {i}/{n})" for i, job in zip(shards, jobs)))
    if args.launcher == "slurm" and not args.wait:
        console.print(f"follow them with: python -m ckptbench status {options.out_dir}"
                      + ("; --csv and --report wait for --wait (or run `ckptbench report` later)"
                         if args.csv or args.report else ""))
        return 0
    code = _wait(jobs, shards, n, options.out_dir, console)
    if code == 130:
        return code
    if args.csv:
        from ..store.records import export_csv

        console.print(f"csv: {export_csv(options.out_dir)}")
    if args.report:
        from .report import render

        return render(options.out_dir, args.report, console) or code
    return code


def _wait(jobs, shards, n, out_dir, console) -> int:
    from .status import print_status

    try:
        while not all(job.done() for job in jobs):
            time.sleep(1.0)
    except KeyboardInterrupt:
        for job in jobs:
            job.cancel()
        console.print(f"interrupted: the jobs were cancelled; finished records are in {out_dir}, and "
                      "--resume submits what is missing")
        return 130
    failed = 0
    for i, job in zip(shards, jobs):
        try:
            job.result()
        except Exception as exc:  # submitit's FailedJobError carries the job's traceback
            failed += 1
            last = [ln for ln in str(exc).strip().splitlines() if ln.strip()]
            console.print(f"[red]job {job.job_id} (shard {i}/{n}) failed:[/red] {last[-1] if last else exc}")
    print_status(out_dir, console)
    return 1 if failed else 0
