"""``ckptbench report`` and ``ckptbench compare``: re-render a run, or judge one run against another."""

from __future__ import annotations

import argparse
import gc
import os
import sys

from ..base.errors import UsageError


def render(run_dir: str, out_path: str, console, baseline: str | None = None, loaded=None) -> int:
    from ..report.checks import csv_path
    from ..report.render import render_report

    path = render_report(run_dir, out_path, baseline_dir=baseline, loaded=loaded)
    console.print(f"report: {path}")
    if os.path.exists(csv_path(path)):
        console.print(f"estimate checks (CSV): {csv_path(path)}")
    return 0


def require_records(run: str, what: str):
    """A command about a run refuses a run with nothing to say, in one line (a partly readable run is
    fine: the page lists the lines it skipped)."""
    from ..store.records import load_records

    loaded = load_records(run)
    if not loaded.records:
        why = loaded.problems[0] if loaded.problems else "the records file is empty"
        raise UsageError(f"{run}: no readable records ({why}); nothing to {what}")
    gc.freeze()  # the records live until the command ends: the cycle collector need not walk them again
    return loaded


def cmd_report(args) -> int:
    from ..store.records import no_cycle_collection

    # a large run's records, its frame and its checks are tens of millions of objects in no cycle: the
    # cyclic collector would walk them again and again while the page is drawn (the figures' cycles wait
    # for the command's end)
    with no_cycle_collection():
        return _report(args)


def _report(args) -> int:
    from rich.console import Console
    from rich.markup import escape

    if not os.path.exists(args.run):
        raise UsageError(f"{args.run}: no such results directory")
    out = args.output or os.path.join("reports", os.path.basename(os.path.normpath(args.run)) + ".html")
    if args.baseline and not os.path.exists(args.baseline):
        raise UsageError(f"{args.baseline}: no such baseline results directory")
    if os.path.isdir(out):
        raise UsageError(f"-o {out} is a directory; give the HTML file's path")
    exports = {"--csv": args.csv, "--parquet": args.parquet}
    for flag, path in exports.items():
        if path and os.path.isdir(path):
            raise UsageError(f"{flag} {path} is a directory; give the file's path")
    loaded = require_records(args.run, "report")
    console = Console(stderr=True)
    for note in loaded.notes():
        console.print(f"[yellow]warning:[/yellow] {escape(note)}", highlight=False, soft_wrap=True)
    if any(exports.values()):
        from ..report.export import write_exports

        for path in write_exports(loaded.records, csv=args.csv, parquet=args.parquet):
            console.print(f"table: {path}")
        if not args.output:  # an export alone: the page is drawn only when -o asks for it too
            return 0
    return render(args.run, out, console, args.baseline, loaded)


def _percent(text: str) -> float:
    from ..store.compare import parse_percent

    try:
        return parse_percent(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


SUMMARY_LINES = 50  # noisy and one-sided points each; regressions four times as many


def cmd_compare(args) -> int:
    import json

    from rich.console import Console

    from ..report.compare import comparison_table, summary_lines
    from ..store.compare import Thresholds, compare_paths
    from ..store.records import no_cycle_collection

    # nothing read or built here is in a reference cycle: the cyclic collector would only walk the millions
    # of dicts of a large run again and again (a tenth of the command); the comparison then lives until the
    # command ends, so drawing it need not walk it either
    with no_cycle_collection():
        comparison = compare_paths(args.old, args.new, Thresholds(memory=args.fail_memory, time=args.fail_time,
                                                                  drift=not args.no_drift_correction))
        gc.freeze()
    if not comparison.points:  # nothing was judged: a pass would be a lie, a table an empty one
        raise UsageError(f"{args.old} and {args.new} have no point in common ({len(comparison.only_old)} only in old, "
                         f"{len(comparison.only_new)} only in new): nothing was compared; Case ids hash every "
                         "setting (model, steps, seed, ...), so runs of different suites share no points")
    if args.json:
        print(json.dumps(comparison.to_dict(), indent=2, default=str))
    else:
        console = Console(width=None if sys.stdout.isatty() else 160)
        console.print(comparison_table(comparison, args.old, args.new))
        # a terminal's worth of each kind of line, and how many more (--json has every one): one print
        lines = summary_lines(comparison, limit=SUMMARY_LINES)
        if lines:
            console.print("\n".join(lines), markup=False, highlight=False, soft_wrap=True)
    return 1 if comparison.failed else 0


def compare_help() -> str:
    """``compare --help``: :mod:`ckptbench.store.compare`'s docstring up to its note for programmers, read
    from the source, because importing the module (numpy, the record store) would make every command's
    parser, ``ckptbench models`` included, pay for it."""
    import ast
    import importlib.util

    spec = importlib.util.find_spec("ckptbench.store.compare")
    with open(spec.origin, encoding="utf-8") as fh:
        doc = ast.get_docstring(ast.parse(fh.read()), clean=False) or ""
    return plain_text(doc.split("\n\nFor other code")[0])


def plain_text(doc: str) -> str:
    """A docstring as a terminal shows it: ``code``, *emphasis*, **strong** and :role:`~.name` markup
    reduced to the words themselves."""
    import re

    doc = re.sub(r":[a-z]+:`~?\.?([^`]+)`", r"\1", doc)
    doc = re.sub(r"``([^`]+)``", r"\1", doc)
    return re.sub(r"\*{1,2}([^*\s][^*]*?)\*{1,2}", r"\1", doc)


def add_parsers(sub) -> None:
    p = sub.add_parser("report", help="render the HTML report of a results directory")
    p.add_argument("run", help="results directory")
    p.add_argument("-o", "--output", help="HTML file (default reports/<run>.html)")
    p.add_argument("--baseline", metavar="OLD_RUN", help="show changes against an earlier results directory")
    p.add_argument("--csv", metavar="FILE", help="write the report's table (one row per point) as CSV; "
                                                 "with --csv or --parquet alone no HTML is drawn unless -o is given")
    p.add_argument("--parquet", metavar="FILE", help="the same table as Parquet (column types kept)")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("compare", help="what got better or worse between two runs (exit 1 on a regression)",
                       description=compare_help(), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("old", help="baseline: results directory, records.jsonl or pytest-benchmark JSON")
    p.add_argument("new", help="candidate, of the same kind as OLD")
    p.add_argument("--fail-memory", type=_percent, default="2%", metavar="PCT",
                   help="fail when peak / after-forward / saved-activation memory grows by more (default 2%%)")
    p.add_argument("--no-drift-correction", action="store_true",
                   help="judge raw time changes even when the runs' calibration kernel measured a change of the "
                        "machine's speed beyond its noise")
    p.add_argument("--fail-time", type=_percent, default="10%", metavar="PCT",
                   help="fail when median step time grows or tokens/s drops by more (default 10%%)")
    p.add_argument("--json", action="store_true", help="print the comparison as JSON instead of a table")
    p.set_defaults(func=cmd_compare)
