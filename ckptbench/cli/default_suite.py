"""``ckptbench sweep`` without ``--suite`` (what ``make bench`` runs): the default suite for this machine.

The machine is asked first (:func:`ckptbench.run.environment.collect`: NVML here, torch in a child), and
the choice is the first line printed, with what is wrong when an NVIDIA GPU is there but this torch
cannot use it.  CUDA available: the small GPU suite, run the way ``make gpu-check`` runs it
(``scripts/gpu_check.sh``: calibration, a sweep time-boxed by ``--max-minutes``, the report and the GPU
summary), into ``--out``.  Otherwise the CPU suite, swept as ``--suite suites/cpu.toml`` would be.
Either way the report is written (``--report``, default ``reports/<run>.html``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from ..base.errors import UsageError
from ..run.environment import collect
from ..run.machine import Machine, SuiteChoice, choose_suite

ROOT = Path(__file__).resolve().parents[2]  # the repository: suites/ and scripts/ live there
GPU_CHECK = "scripts/gpu_check.sh"
# The sweep flags scripts/gpu_check.sh honours; any other one needs the suite named (--suite).
GPU_CHECK_FLAGS = ("out", "report", "max_minutes", "yes", "resume")  # it always resumes into --out


def _in_repository(relative: str) -> str:
    """A file of the repository, as the user would type it from here."""
    path = ROOT / relative
    if not path.exists():
        raise UsageError(f"no {relative} beside this ckptbench ({ROOT}): the default suite needs a checkout of "
                         "the repository; give --suite FILE")
    return os.path.relpath(path) if path.is_relative_to(Path.cwd()) else str(path)


def announce(machine: Machine | None = None) -> SuiteChoice:
    """Ask the machine (unless told what it is), print the choice first, and any reason its GPU cannot
    be used."""
    choice = choose_suite(machine or Machine.from_environment(collect(), sys.executable))
    print(choice.why, file=sys.stderr, flush=True)
    if choice.problem:
        print(f"warning: {choice.problem}", file=sys.stderr, flush=True)
    return choice


def default_sweep(args, sweep, defaults: dict, machine: Machine | None = None) -> int:
    """Run the default suite with `args` (a sweep's parsed flags); `sweep` runs a named suite, `defaults`
    holds every flag's value when not given, `machine` stands for this machine's probe in tests."""
    choice = announce(machine)
    suite = _in_repository(choice.suite)
    if choice.gpu and not (args.dry_run or args.list):
        given = sorted(k for k, v in vars(args).items() if k in defaults and v != defaults[k]
                       and k not in GPU_CHECK_FLAGS)
        if given:
            flags = ", ".join("--" + k.replace("_", "-") for k in given)
            raise UsageError(f"the GPU default runs {GPU_CHECK}, which takes --out, --report and --max-minutes only; "
                             f"for {flags} name the suite: --suite {suite}")
        return gpu_check(args, suite)
    args.suite = suite
    if args.report is None and not (args.dry_run or args.list):
        run = os.path.basename(os.path.normpath(args.out)) if args.out else \
            f"{Path(suite).stem}-{time.strftime('%Y%m%d-%H%M%S')}"
        args.out = args.out or os.path.join("results", run)
        args.report = os.path.join("reports", f"{run}.html")
    return sweep(args)


def gpu_check(args, suite: str) -> int:
    """The GPU suite through scripts/gpu_check.sh, with this interpreter; its report copied to --report."""
    run = f"{Path(suite).stem}-{time.strftime('%Y%m%d-%H%M%S')}"
    out = args.out or os.path.join("results", run)
    report = args.report or os.path.join("reports", f"{os.path.basename(os.path.normpath(out))}.html")
    env = {**os.environ, "PYTHON": sys.executable, "SUITE": str(ROOT / suite)}
    if args.max_minutes:
        env["MAX_MINUTES"] = f"{args.max_minutes:g}"
    status = subprocess.run(["bash", _in_repository(GPU_CHECK), os.path.abspath(out)], env=env).returncode
    if os.path.exists(os.path.join(out, "report.html")):
        os.makedirs(os.path.dirname(report) or ".", exist_ok=True)
        shutil.copyfile(os.path.join(out, "report.html"), report)
        print(f"report: {report}; records: {os.path.join(out, 'run', 'records.jsonl')}; GPU summary: "
              f"{os.path.join(out, 'run', 'summary.json')}; log: {os.path.join(out, 'gpu_check.log')}")
    return status
