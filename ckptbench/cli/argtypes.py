"""Argument types the command-line flags share: each turns a bad value into argparse's one-line error."""

from __future__ import annotations

import argparse
import math


def shard(text: str) -> tuple[int, int]:
    """'i/n' -> (i, n) with 1 <= i <= n."""
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--shard takes i/n (e.g. 1/2), got {text!r}") from None
    if not 1 <= i <= n:
        raise argparse.ArgumentTypeError(f"--shard i/n needs 1 <= i <= n, got {text!r}")
    return i, n


def positive(text: str) -> float:
    """A finite number > 0 (seconds, minutes, GiB)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text!r}")
    return value


def _whole(text: str, low: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"must be >= {low}, got {text!r}")
    return value


def at_least_one(text: str) -> int:
    """A whole number >= 1 (repeats, slots, jobs, cores)."""
    return _whole(text, 1)


def at_least_zero(text: str) -> int:
    """A whole number >= 0 (0 meaning off: local SGD steps)."""
    return _whole(text, 0)


def statuses(text: str) -> tuple[str, ...]:
    """'crash,timeout' -> ('crash', 'timeout'): statuses --resume runs again (each one --retry may name)."""
    from ..run.sweep import RETRYABLE

    values = tuple(dict.fromkeys(v.strip() for v in text.split(",") if v.strip()))
    wrong = [v for v in values if v not in RETRYABLE]
    if wrong or not values:
        raise argparse.ArgumentTypeError(f"--retry takes statuses among {','.join(RETRYABLE)}, got {text!r}")
    return values


def devices(text: str) -> tuple[int, ...]:
    """'0,1,2' -> (0, 1, 2): device indices as the process sees them."""
    try:
        values = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--devices takes device indices such as 0,1,2,3, got {text!r}") from None
    if any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"device indices are >= 0, got {text!r}")
    return values
