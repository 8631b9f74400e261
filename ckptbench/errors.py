"""Errors shared by the library and the command line.

:class:`UsageError` lives here, not in ``cli.py``, so library modules (``compare.py``, later the report)
can raise it without importing the CLI, which imports them: no import cycle, one exception the CLI turns
into a one-line message and exit status 2.
"""


class UsageError(Exception):
    """A user mistake the CLI reports in one line (exit 2)."""
