"""The one test every figure read back from a file passes before anything divides, sorts or plans by it."""

from __future__ import annotations

import math


def finite_number(value) -> bool:
    """A Python int or float that is finite: not a bool (JSON's true is no count), text, None, NaN or inf."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
