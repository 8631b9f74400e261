"""Command line: ``ckptbench sweep | status | env | models | plan | report | compare | estimate | calibrate | simulate-suite | gpu-summary``.

Each command lives in its own module here (:mod:`.sweep`, :mod:`.report`, :mod:`.estimate`, :mod:`.gpu`)
and registers its parser; this module only dispatches.

User errors (a bad suite, a missing results directory) are one line on stderr and exit status 2; a
traceback means a bug in ckptbench.
"""

from __future__ import annotations

import argparse
import sys

from ..errors import UsageError
from ..suite import SuiteError

EXIT_USAGE = 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ckptbench", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    from . import environment, estimate, gpu, models, plan, report, status, sweep

    sweep.add_parser(sub)
    environment.add_parser(sub)
    models.add_parser(sub)
    plan.add_parser(sub)
    report.add_parsers(sub)
    estimate.add_parser(sub)
    gpu.add_parsers(sub)
    status.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except SuiteError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
