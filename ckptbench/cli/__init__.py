"""Command line: ckptbench sweep | status | env | models | plan | report | compare | estimate | calibrate | simulate-suite | gpu-summary | history | asv.

Each command lives in its own module here (:mod:`.sweep`, :mod:`.report`, :mod:`.estimate`, :mod:`.gpu`)
and registers its parser; this module only dispatches.

User errors (a bad suite, a missing results directory, an output folder that cannot be written) are one
line on stderr and exit status 2; a disk that fills under a run is one line naming the file, exit status 4
(what was written before is kept: free space, then ``sweep --resume``); a traceback means a bug in
ckptbench.
"""

from __future__ import annotations

import argparse
import errno
import sys

from ..base.errors import StorageError, UsageError
from ..suite.keys import SuiteError

EXIT_USAGE = 2
EXIT_STORAGE = 4  # the disk filled (or failed) while a command wrote: nothing written before was changed
# An OSError with one of these and a file name is the storage's answer, not a bug: one line, no traceback.
STORAGE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO)


def build_parser() -> argparse.ArgumentParser:
    from .. import __version__

    parser = argparse.ArgumentParser(prog="ckptbench", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"ckptbench {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    from . import environment, estimate, gpu, history, models, optimize, report, status, sweep

    sweep.add_parser(sub)
    environment.add_parser(sub)
    models.add_parser(sub)
    optimize.add_parser(sub)  # plan's parser, with --optimize and its flags
    report.add_parsers(sub)
    estimate.add_parser(sub)
    gpu.add_parsers(sub)
    status.add_parser(sub)
    history.add_parsers(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except BrokenPipeError:  # `ckptbench models | head`: the reader left, nothing is wrong
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except SuiteError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as exc:
        if not isinstance(exc, StorageError):
            if exc.errno not in STORAGE_ERRNOS or not exc.filename:
                raise
            exc = StorageError(str(exc.filename), exc)
        return _storage_failed(exc)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def _storage_failed(exc: StorageError) -> int:
    if exc.unwritable:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(f"error: {exc}; what was written before is kept: free space, then run again (a sweep with --resume)",
          file=sys.stderr)
    return EXIT_STORAGE


if __name__ == "__main__":
    sys.exit(main())
