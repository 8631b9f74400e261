"""``ckptbench status RUN``: done, running, waiting and missing points of a results directory.

Read from disk alone (:mod:`ckptbench.run.status`): the shards whose lock a live sweep holds, the
points each is running, the jobs submitted and what their files say, what no live sweep will run.
"""

from __future__ import annotations

import os
import time


def _ago(stamp: str | None) -> str:
    if not stamp:
        return ""
    try:
        then = time.mktime(time.strptime(stamp[:19], "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return f" since {stamp}"
    return f" for {max(0, time.time() - then) / 60:.1f} min"


def print_status(run_dir: str, console, list_missing: bool = False) -> None:
    from rich.markup import escape

    from ..run.status import run_status

    st = run_status(run_dir)
    done = sum(st.done.values())
    console.print(f"{run_dir}: suite {st.suite}, {st.runs} runs")
    statuses = ", ".join(f"{k} {v}" for k, v in sorted(st.done.items()))
    console.print(f"  done     {done:>6}" + (f"  ({statuses})" if statuses else ""))
    console.print(f"  running  {len(st.running):>6}")
    console.print(f"  waiting  {st.waiting:>6}  (planned by a sweep running now)")
    skipped = f", {st.skipped} of them recorded skipped" if st.skipped else ""
    console.print(f"  missing  {len(st.missing):>6}  (no sweep running will run them{skipped}; --resume does)")
    for p in st.running:
        job = f", job {p['job']}" if p.get("job") else ""
        console.print(f"    running {p['case_id']} repeat {p.get('repeat', 0)} on {p.get('where', '?')} "
                      f"(shard {p['shard'][0]}/{p['shard'][1]}{job}){_ago(p.get('since'))}")
    for s in st.shards:
        i, n = s.shard
        who = f"pid {s.info.get('pid', '?')} on {s.info.get('host', '?')}" + (
            f", job {s.info['job']}" if s.info.get("job") else "")
        if s.held:
            line = f"running ({who}){_ago(s.info.get('started_at'))}"
        elif s.info.get("running"):
            line = (f"its sweep ({who}) died while {len(s.info['running'])} point(s) ran: "
                    + ", ".join(p["case_id"] for p in s.info["running"]) + " (--resume runs them again)")
        else:
            line = f"not running (last: {who}, ended {s.info.get('ended_at', '?')})"
        console.print(f"  shard {i}/{n}: {line}")
    for job in st.jobs:
        console.print(f"  job {job.job_id} ({job.launcher}, shard {job.shard[0]}/{job.shard[1]}): {escape(job.state)}")  # text from files: no markup
    for problem in st.problems:
        console.print(f"[yellow]warning:[/yellow] {escape(problem)}", highlight=False, soft_wrap=True)
    if list_missing:
        for case, k in st.missing:
            console.print(f"    missing {case.id} repeat {k}  {case.strategy} b={case.batch_size} s={case.seq_len} "
                          f"world={case.world_size}")


def cmd_status(args) -> int:
    from rich.console import Console

    from ..base.errors import UsageError

    if not os.path.isdir(args.run):
        raise UsageError(f"{args.run}: not a results directory")
    print_status(args.run, Console(highlight=False), list_missing=args.list)
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("status", help="done / running / missing points of a results directory, across shards and jobs")
    p.add_argument("run", help="results directory (results/<run>)")
    p.add_argument("--list", action="store_true", help="also print every missing point")
    p.set_defaults(func=cmd_status)
