"""``ckptbench history RESULTS``: what each commit changed, from asv's results directory; ``ckptbench asv init``.

``history`` prints, per machine and environment, each commit whose training memory or time changed against
the commit measured before it, with the evidence (:mod:`ckptbench.history.series`), and writes the page
(``--html``).  Exit 1 when the newest commit of a series regressed, or asv recorded a ckptbench benchmark
failed on its machine's newest commit (what a CI job on that commit gates on), 0 otherwise, 2 on a usage
error or when there is no record to judge.  ``asv init`` writes an ``asv.conf.json`` (when there is none) and a benchmark
module measuring a suite, ready for ``asv run``.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict

from ..base.errors import UsageError

CONF = """{
    // asv measures training with ckptbench: `asv run --python=same --set-commit-hash HEAD` measures what is
    // checked out in this environment; `asv run HASHES` builds an environment per commit.
    "version": 1,
    "project": "%(project)s",
    "repo": ".",
    "branches": ["%(branch)s"],
    "environment_type": "virtualenv",
    "install_command": ["in-dir={env_dir} python -mpip install {wheel_file} ckptbench"],
    "benchmark_dir": "benchmarks",
    "results_dir": "results",
    "html_dir": "html"
}
"""

MODULE = '''"""Training memory and time per commit, measured by ckptbench (`ckptbench history results` judges them)."""

from ckptbench.history.benchmark import suite_benchmark

Training = suite_benchmark(%(suite)r)
'''


def cmd_asv_init(args) -> int:
    root = args.dir
    if not os.path.isdir(root):
        raise UsageError(f"{root}: not a directory")
    suite = os.path.relpath(os.path.abspath(args.suite), os.path.abspath(root))
    if not os.path.isfile(os.path.join(root, suite)):
        raise UsageError(f"--suite {args.suite}: no such file")
    from ..suite.parse import load_suite

    load_suite(os.path.join(root, suite))  # a bad suite is refused now, not at the first commit asv measures
    written = []
    conf = os.path.join(root, "asv.conf.json")
    if not os.path.exists(conf):
        with open(conf, "w", encoding="utf-8") as fh:
            fh.write(CONF % {"project": os.path.basename(os.path.abspath(root)), "branch": args.branch})
        written.append(conf)
    bench = os.path.join(root, "benchmarks")
    os.makedirs(bench, exist_ok=True)
    for name, text in (("__init__.py", ""), ("training.py", MODULE % {"suite": suite})):
        path = os.path.join(bench, name)
        if os.path.exists(path):
            print(f"{path}: kept as it is", file=sys.stderr)
            continue
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text)
        written.append(path)
    for path in written:
        print(f"wrote {path}")
    return 0


def _text(history, out) -> None:
    for line in history.problems + history.failed:
        print(f"warning: {line}", file=sys.stderr)
    for s in history.series:
        parts = ", ".join(f"{k} {v}" for k, v in s.parts.items())
        print(f"{s.machine} ({parts}) · {s.env}: {len(s.commits)} commits", file=out)
        for c in s.commits:
            for ch in c.changes:
                print(f"  {c.commit[:12]} {ch.direction:<11} {ch.label} · {ch.quantity}: {ch.evidence}", file=out)
            for note in c.notes:
                print(f"  {c.commit[:12]} note        {note}", file=out)
        if not any(c.changes for c in s.commits):
            print("  no change flagged", file=out)


def cmd_history(args) -> int:
    from ..history.page import render
    from ..history.series import build_history

    if not os.path.isdir(args.results):
        raise UsageError(f"{args.results}: not a directory (asv's results_dir)")
    history = build_history(args.results, args.fail_memory, args.fail_time)
    if not history.series:  # nothing was judged: neither a pass nor a fail is true
        raise UsageError(history.problems[-1] if history.problems else f"{args.results}: no ckptbench records")
    if args.json:
        print(json.dumps({"series": [asdict(s) for s in history.series], "problems": history.problems,
                          "failed": history.failed}, indent=1))
    else:
        _text(history, sys.stdout)
    if args.html:
        try:
            with open(args.html, "w", encoding="utf-8") as fh:
                fh.write(render(history))
        except OSError as exc:
            raise UsageError(f"--html {args.html}: cannot write ({exc.strerror or exc})") from None
    for line in history.newest_failed:
        print(f"failed on the newest commit: {line}", file=sys.stderr)
    return 1 if history.latest_regressed or history.newest_failed else 0


def add_parsers(sub) -> None:
    from .report import _percent

    p = sub.add_parser("history", help="what each commit changed in training memory and time, from asv's results "
                                       "(exit 1 when the newest commit regressed)", description=__doc__.split("\n\n")[1])
    p.add_argument("results", help="asv's results directory (asv.conf.json's results_dir)")
    p.add_argument("--html", metavar="FILE", help="also write the history as one HTML page")
    p.add_argument("--json", action="store_true", help="print the history as JSON")
    p.add_argument("--fail-memory", type=_percent, default=None, metavar="PCT",
                   help="flag memory grown by more than this (default: any growth on CPU, 2%% on CUDA)")
    p.add_argument("--fail-time", type=_percent, default=None, metavar="PCT",
                   help="flag a step slower by more than this and significant (default 10%%)")
    p.set_defaults(func=cmd_history)
    a = sub.add_parser("asv", help="asv set-up: `ckptbench asv init --suite S` writes asv.conf.json and a benchmark")
    actions = a.add_subparsers(dest="action", required=True)
    i = actions.add_parser("init", help="write asv.conf.json (if absent) and benchmarks/training.py over a suite")
    i.add_argument("--suite", required=True, help="the suite whose points each commit measures")
    i.add_argument("--dir", default=".", help="the repository's root (default: here)")
    i.add_argument("--branch", default="main", help="the branch asv walks (default main)")
    i.set_defaults(func=cmd_asv_init)
