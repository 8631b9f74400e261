"""``ckptbench sweep``: run a suite with a progress bar, then the summary tables (and the report)."""

from __future__ import annotations

import functools
import json
import os
import signal
import sys
import time
from collections import Counter

from ..suite.parse import load_suite
from . import argtypes
from .nodes import from_args as nodes_from

# A sweep larger than this runs only when asked twice: a typo in an axis multiplies the plan.
MAX_POINTS = 10_000
EXIT_SIGTERM = 143  # 128 + SIGTERM, as a shell reports it: the sweep stopped on SIGTERM, records kept


def _fmt_mib(value) -> str:
    return "-" if value is None else f"{value / 2**20:.2f}"


def _progress():
    from .progress import sweep_progress

    return sweep_progress()


def summary_table(records: list[dict]):
    from rich.table import Table

    from ..store.schema import typed

    table = Table(title="ckptbench sweep", show_lines=False)
    for col in ("strategy", "batch", "seq", "status", "after fwd MiB", "peak MiB", "ckpt inputs MiB",
                "recomputed", "step ms", "tok/s", "setup s", "estimate"):
        table.add_column(col, justify="right" if col not in ("strategy", "status") else "left")
    for r in typed(records):
        m, c = r.measurement, r.case
        median = m.step_time_median_s
        table.add_row(
            r.strategy, str(c.batch_size), str(c.seq_len), r.status, _fmt_mib(m.mem_after_forward_bytes),
            _fmt_mib(m.peak_bytes), _fmt_mib(m.checkpointed_input_bytes), ",".join(map(str, m.recomputed_layers)) or "-",
            f"{median * 1e3:.1f}" if median else "-", f"{m.tokens_per_s:.0f}" if m.tokens_per_s else "-",
            f"{m.setup_s:.2f}" if m.setup_s else "-", r.verdict or "-")
    return table


def comm_table(records: list[dict]):
    """Multi-rank points: what local SGD saves in bytes and what it costs in loss."""
    from rich.table import Table

    from ..store.schema import typed

    table = Table(title="ckptbench sweep: data-parallel points (per rank, per optimizer step)")
    for col in ("strategy", "world", "K", "status", "all-reduce KiB/step", "collectives/step", "syncs",
                "sync ms", "step ms", "final loss", "estimate"):
        table.add_column(col, justify="left" if col in ("strategy", "status") else "right")
    for r in typed(records):
        m, c = r.measurement.figures, r.case

        def num(key, fmt, scale=1.0, m=m):
            return "-" if m.get(key) is None else format(m[key] * scale, fmt)

        table.add_row(r.strategy, str(c.world_size), str(c.local_sgd_steps), r.status,
                      num("comm_payload_bytes_per_step", ".1f", 1 / 1024), num("collectives_per_step", ".1f"),
                      num("syncs", ".0f"), num("sync_time_s", ".1f", 1e3), num("step_time_median_s", ".1f", 1e3),
                      num("final_loss", ".4f"), r.verdict or "-")
    return table


def _cap(args) -> int | None:
    return int(args.memory_gib * 2**30) if args.memory_gib else None


def _projection(cases, measured):
    """(Projection or None, the line that states it); `measured` is ``machine_rates``' answer."""
    from ..theory.time.duration import project

    rates, why = measured
    if rates is None:
        return None, f"duration not projected: {why}"
    projection = project(cases, rates)
    return projection, projection.text()


def _still_to_run(cases, out: str, options):
    """The Cases a sweep into `out` would run, once per repeat (what the projection gate must weigh)."""
    from ..run.sweep import pending
    from ..store.records import load_records

    path = os.path.join(out, "records.jsonl")
    recorded = load_records(path, merged=False).records if os.path.isfile(path) else []
    return [case for case, _ in pending(cases, recorded, options.resume, options.repeats, options.retry,
                                        options.max_attempts)[0]]


def _memory_line(cases, cap: int | None) -> str:
    """How many points the sweep would not start because their estimate exceeds the memory here now."""
    if len(cases) > MAX_POINTS:
        return (f"memory: estimates not checked for more than {MAX_POINTS:,} points here; the sweep checks each "
                "point before it starts")
    from ..measure.nvml import nvml_total_bytes
    from ..run.fits import too_big
    from ..run.hostmem import read_host_memory

    host = read_host_memory()
    cuda = [c for c in cases if c.device == "cuda"]
    device_bytes = functools.cache(lambda: nvml_total_bytes(0))
    if cuda and device_bytes() is None:
        return (f"memory: {len(cuda)} CUDA points not checked (no CUDA device visible to NVML here); the sweep "
                "checks each point before it starts")
    over = [c for c in cases if too_big(c, cap, host, device_bytes)]
    unestimated = sum(1 for c in cases if not c.analytic)
    if unestimated:
        return (f"memory: {unestimated} points have no analytic estimate to check before they start (their "
                f"simulation runs in the worker){f'; {len(over)} more would be skipped' if over else ''}")
    if not over:
        return "memory: every point's estimated peak fits in the memory available now"
    return (f"memory: {len(over)} points estimated above the memory available now would be recorded skipped "
            f"(--force runs them), e.g. {over[0].id}: {too_big(over[0], cap, host)}")


def _plan_file(path: str | None) -> str | None:
    """The text of a `plan --json` output given with --plan, checked before anything runs."""
    if not path:
        return None
    from ..base.errors import UsageError
    from ..base.regularfile import open_regular

    try:
        with open_regular(path, "r", encoding="utf-8") as fh:
            text = fh.read()
        plan = json.loads(text)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UsageError(f"--plan {path}: {exc}") from None
    if not isinstance(plan, dict) or not isinstance(plan.get("options"), list) or not plan.get("seq_len"):
        raise UsageError(f"--plan {path}: not a `ckptbench plan --json` output (no options or seq_len)")
    return text


def _with_projection(annotate, plan_state: dict):
    """Each record keeps the time projected for its point, so a finished sweep shows how close it came."""
    from ..theory.time.duration import point_seconds

    def both(case, record):
        annotate(case, record)
        projection = plan_state.get("projection")
        seconds = point_seconds(case, projection.rates) if projection is not None else None
        if seconds is not None:
            record["projected_s"] = round(seconds, 3)
    return both


def _took(records: list[dict], elapsed_s: float) -> str:
    """The sweep's time beside the projection for the points it ran (the sweep's own start included:
    :func:`~ckptbench.theory.time.duration.start_seconds`)."""
    from ..theory.time.duration import start_seconds

    ran = [r for r in records if r.get("projected_s") is not None]
    if not ran:
        return f"the sweep took {elapsed_s:.1f} s"
    start = start_seconds(any(r["case"]["world_size"] == 1 and r.get("wall_s") for r in ran),
                          any(r["case"].get("device") == "cuda" for r in ran))
    projected = start + sum(r["projected_s"] for r in ran)
    return f"the sweep took {elapsed_s:.1f} s; projected {projected:.1f} s for the points it ran"


def _suite(args):
    """The suite file, or the suite the quick flags describe (--model ...)."""
    from ..base.errors import UsageError
    from ..suite.parse import parse_suite

    if args.suite and args.model:
        raise UsageError("give --suite FILE, or --model NAME with the quick flags (--seq, --batch, ...), not both")
    if args.suite:
        return load_suite(args.suite)
    from ..suite.keys import SuiteError
    from .quick import model_flag, suite_text

    try:
        return parse_suite(suite_text(args), model_flag(args.model))
    except SuiteError as exc:  # a one-layer model has no "every other layer": none and full
        if exc.key != "sweep.every_n_layers" or args.every_n_layers:
            raise
        return parse_suite(suite_text(args, [0, 1]), model_flag(args.model))


def cmd_sweep(args) -> int:
    if not args.suite and not args.model:  # the default suite for this machine: what `make bench` runs
        from .default_suite import default_sweep

        return default_sweep(args, cmd_sweep, args.flag_defaults)
    from rich.console import Console

    from ..run.calibration import machine_rates
    from ..run.scheduler import Interrupted, Stopped, StopRequest
    from ..run.sweep import SweepOptions, plan, run_sweep

    suite = _suite(args)
    from ..base.env import unsupported_transformers
    from ..base.errors import UsageError

    problem = unsupported_transformers()
    if problem and not args.dry_run:
        raise UsageError(problem)  # one line now, not a TypeError in every point
    out = args.out or os.path.join("results", f"{suite.name}-{time.strftime('%Y%m%d-%H%M%S')}")
    if args.model and not args.report:  # a quick sweep ends with its report, as `make bench` does
        args.report = os.path.join(out, "report.html")
    console = Console(stderr=True, width=None if sys.stderr.isatty() else 160)
    cases = plan(suite, args.shard)
    if args.dry_run or args.list:
        if args.list:
            for c in cases:
                print(f"{c.id}  {c.model.label}  {c.strategy:<16} batch={c.batch_size} seq={c.seq_len} "
                      f"K={c.local_sgd_steps} accum={c.grad_accum} world={c.world_size} device={c.device}")
        else:
            for strategy, n in sorted(Counter(c.strategy for c in cases).items()):
                print(f"{n:>9}  {strategy}")
        print(f"{len(cases)} cases (of {len(suite.cases)} in {suite.path}); nothing was run"
              + ("" if args.list else "; --list prints each"))
        print(_projection(cases, machine_rates(cases))[1])
        if suite.attn_note:
            print(f"attention: {suite.attn_note}", file=sys.stderr)  # stdout stays the plan's lines
        print(_memory_line(cases, _cap(args)))
        return 0
    if len(cases) > MAX_POINTS and not args.yes:
        raise UsageError(f"{len(cases)} points to run (more than {MAX_POINTS:,}): look at them with --dry-run, "
                         "then pass --yes to run them")
    repeats = args.repeat or suite.repeats
    if args.retry and not args.resume:
        raise UsageError("--retry reruns recorded points: it goes with --resume")
    nodes = nodes_from(args, [c.world_size for c in cases])
    options = SweepOptions(nodes=nodes, out_dir=out, resume=args.resume, shard=args.shard, timeout_s=args.timeout,
                           max_minutes=args.max_minutes, memory_cap=_cap(args), force=args.force, repeats=repeats,
                           parallel=args.parallel, devices=args.devices, retry=args.retry or (),
                           max_attempts=args.max_attempts)
    measured: list = []

    def rates(forked: bool = False):  # measured once, only when it is needed
        if not measured:
            measured.append(machine_rates(cases, forked))
        return measured[0]

    if args.max_minutes and not args.yes:
        projection = _projection(_still_to_run(cases, out, options), rates())[0]
        if projection is not None and projection.seconds > 60 * args.max_minutes:
            raise UsageError(f"projected {projection.seconds / 60:.1f} min > --max-minutes {args.max_minutes:g}: "
                             "points not started by then would be recorded skipped; pass --yes to start anyway, "
                             "or plan less")
    from .distribute import check_flags, launch

    check_flags(args, cases)
    if args.launcher:
        return launch(args, suite, options, console)
    plan_text = _plan_file(args.plan)
    plan_state: dict = {}

    def on_start(todo, forked):  # the directory was accepted: say what will run and how long it should take
        if todo:
            plan_state["projection"], line = _projection([case for case, _ in todo], rates(forked))
            times = f" ({len({c.id for c, _ in todo})} points, up to {repeats} times each)" if repeats > 1 else ""
            console.print(f"{len(todo)} runs to do{times}; {line}")
            if suite.attn_note:  # said once the directory is accepted: an error stays one line
                console.print(f"attention: {suite.attn_note}")
    from ..theory.verdicts.annotate import annotate_record
    from .progress import slot_lines

    with _progress() as progress:
        task = progress.add_task(suite.name, total=len(cases) * repeats, last="")

        def on_record(record, k, total):
            m = record.get("measurement") or {}
            peak = _fmt_mib(m.get("peak_bytes"))
            progress.update(task, completed=len(cases) * repeats - total + k,
                            last=f"{record['strategy']} b={record['case']['batch_size']} "
                                 f"s={record['case']['seq_len']}: {record['status']} peak {peak} MiB")

        started = time.monotonic()
        stop = StopRequest()
        previous = signal.signal(signal.SIGTERM, lambda signum, frame: stop.request("SIGTERM", None))
        try:
            result = run_sweep(suite, options, on_record=on_record, annotate=_with_projection(annotate_record, plan_state), on_start=on_start,
                               on_running=slot_lines(progress), stop=stop)
        except Interrupted as exc:
            progress.stop()
            console.print(f"[yellow]{exc}[/yellow]; finished records are in {out}. Resume with:\n"
                          f"  python -m ckptbench sweep --suite {args.suite or os.path.join(out, 'suite.toml')} "
                          f"--out {out} --resume")
            return 130
        except Stopped as exc:  # SIGTERM: the points in flight were dropped whole, every record kept
            progress.stop()
            print(f"interrupted by SIGTERM: {exc.done} points done, resume with --resume", file=sys.stderr)
            return EXIT_SIGTERM
        finally:
            signal.signal(signal.SIGTERM, previous)
        progress.update(task, completed=len(cases) * repeats)
    if plan_text:  # the report sets each point the plan predicted beside its prediction
        from ..store.files import write_text_atomic

        write_text_atomic(os.path.join(out, "plan.json"), plan_text)
    if result.skipped_ids:
        console.print(f"resume: {len(result.skipped_ids)} cases already in {out} were skipped")
    console.print(_took(result.records, time.monotonic() - started))
    from ..store.records import load_records

    loaded = load_records(out)
    from rich.markup import escape

    from ..store.load import warning as load_warning

    for problem in loaded.notes() + result.notes + [w for w in map(load_warning, result.records) if w]:
        console.print(f"[yellow]warning:[/yellow] {escape(problem)}", highlight=False, soft_wrap=True)
    from ..store.records import latest_per_case

    shown = latest_per_case(result.records)  # a Case run several times is one row, its times pooled
    single = [r for r in shown if r["case"]["world_size"] == 1]
    multi = [r for r in shown if r["case"]["world_size"] > 1]
    if single or not multi:
        console.print(summary_table(single))
    if multi:
        console.print(comm_table(multi))
    from ..report.headline import budgets_of, summary_lines

    for line in summary_lines(loaded.records, budgets_of(suite.budgets_gib)):  # named only where intervals say so
        console.print(escape(line), highlight=False, soft_wrap=True)
    console.print(f"records: {os.path.join(out, 'records.jsonl')}")
    if args.csv:
        from ..store.records import export_csv

        console.print(f"csv: {export_csv(out)}")
    if args.report:
        from .report import render

        return render(out, args.report, console)
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("sweep", help="run a suite: one isolated worker per point, records appended as they end")
    p.add_argument("--suite", help="suite file (suites/*.toml); or describe one with --model and the quick flags; "
                                   "neither: the default suite for this machine (GPU or CPU)")
    p.add_argument("--out", help="results directory (default results/<suite>-<time>)")
    p.add_argument("--resume", action="store_true", help="skip Cases already recorded in --out")
    p.add_argument("--retry", type=argtypes.statuses, metavar="STATUSES",
                   help="with --resume: also run again the points last recorded with one of these statuses "
                        "(e.g. crash,timeout,oom: a full disk, a kill, a loaded machine), each record counting its "
                        "`attempt`")
    p.add_argument("--max-attempts", type=argtypes.at_least_one, default=3, metavar="N",
                   help="--retry runs a point again only while it has had fewer than N runs (default 3)")
    p.add_argument("--dry-run", action="store_true", help="count the Cases per strategy and exit without running")
    p.add_argument("--list", action="store_true", help="with --dry-run: print every Case and its id")
    p.add_argument("--yes", action="store_true", help=f"run a sweep of more than {MAX_POINTS:,} points")
    p.add_argument("--shard", type=argtypes.shard, default=(1, 1), metavar="I/N", help="run every N-th Case from I")
    p.add_argument("--timeout", type=argtypes.positive, help="per-Case timeout in seconds (overrides the suite)")
    p.add_argument("--max-minutes", type=argtypes.positive, metavar="M",
                   help="start no Case after M minutes; the rest are recorded as skipped (--resume runs them)")
    p.add_argument("--memory-gib", type=argtypes.positive, metavar="G",
                   help="the most memory a worker may hold (resident, torch included): a worker holding more is "
                        "stopped and recorded oom, a point estimated above it is not started")
    p.add_argument("--force", action="store_true",
                   help="start points whose estimated peak exceeds the memory available (recorded skipped otherwise)")
    p.add_argument("--repeat", type=argtypes.at_least_one, metavar="N",
                   help="run each point N times in fresh workers, interleaved (A B C A B C ...); times are pooled, "
                        "their interval over one median per repeat from 3 repeats (default: the suite's repeats, "
                        "else 1)")
    p.add_argument("--csv", action="store_true", help="also write records.csv")
    p.add_argument("--report", metavar="HTML", help="render an HTML report when the sweep ends")
    p.add_argument("--plan", metavar="JSON",
                   help="a `ckptbench plan --json` output: kept with the results, so the report sets each point "
                        "the plan predicted beside its prediction")
    from . import distribute
    from . import nodes as nodes_flags
    from .quick import add_arguments

    add_arguments(p)
    nodes_flags.add_arguments(p)
    distribute.add_arguments(p)
    p.set_defaults(func=cmd_sweep)
    p.set_defaults(flag_defaults=vars(p.parse_args([])))  # "not given", for the flags the default suite refuses
