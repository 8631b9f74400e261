"""How one estimate check reads on the page: values in the unit of their quantity, tolerances in percent.

A check's record keeps bare numbers: ``tolerance: 0.05`` (a relative bound), ``difference: 17408`` (bytes
for a byte quantity, FLOPs for a FLOP count, a plain count for collectives).  The page shows them as
"±5 %" (or "exact" for a tolerance of 0: those checks pass only on equality), "+17.00 KiB" with the
exact integer kept in the cell's title (hover), and counts as integers.  Text and lists (the peak's
phase, which layers ran again) are shown as they are, lists joined.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .tables import fmt_bytes

FLOP_UNITS = (("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6), ("kFLOP", 1e3))


@dataclass(frozen=True)
class Cell:
    text: str
    title: str = ""  # the exact value, when the text rounds it


def unit(quantity) -> str:
    """``bytes`` | ``flops`` | ``count`` by the quantity's name (for numbers; text and lists are shown as
    they are)."""
    q = str(quantity)
    if q.endswith("_bytes") or q.startswith("peak_breakdown.") or q == "bytes":
        return "bytes"
    if q.endswith("_flops"):
        return "flops"
    return "count"


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)


def _sign(value: float, text: str, signed: bool) -> str:
    return ("+" if value > 0 else "") + text if signed else text


def _exact(value, suffix: str, signed: bool) -> str:
    text = f"{value:,.2f}".rstrip("0").rstrip(".")  # integers as integers; a fraction to 2 places
    return _sign(value, text, signed) + suffix


def _flops(value: float) -> str:
    for name, scale in FLOP_UNITS:
        if abs(value) >= scale:
            return f"{value / scale:.2f} {name}"
    return f"{value:.0f} FLOP"


def value_cell(value, quantity, signed: bool = False) -> Cell:
    """A measured, estimated or difference value of a check: rounded in its unit, exact in the title."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return Cell("–")
    if isinstance(value, (list, tuple)):
        return Cell(", ".join(map(str, value)) if value else "none")
    if not _number(value):
        return Cell(str(value))
    kind = unit(quantity)
    if kind == "bytes":
        text = _sign(value, fmt_bytes(value), signed)
        return Cell(text, "" if abs(value) < 1024 else _exact(value, " B", signed))
    if kind == "flops":
        text = _sign(value, _flops(value), signed)
        return Cell(text, "" if abs(value) < 1000 else _exact(value, " FLOP", signed))
    if float(value).is_integer():
        return Cell(_exact(value, "", signed))
    return Cell(_sign(value, f"{value:.4g}", signed), repr(value))


def difference_cell(value, quantity) -> Cell:
    """measured − estimated, signed, in the quantity's unit; an explanation (text) as it is."""
    return value_cell(value, quantity, signed=True)


def tolerance_text(tolerance) -> str:
    """A relative tolerance as "±5 %"; 0 as "exact" (equality decides); missing as "–"."""
    if not _number(tolerance):
        return "–"
    if tolerance == 0:
        return "exact"
    return f"±{100 * tolerance:.3g} %"


def ratio_text(ratio) -> str:
    """measured / estimated to four decimals, so 1.0003 does not read as 1."""
    return f"{ratio:.4f}" if _number(ratio) else "–"


def cells(check: dict) -> dict[str, Cell | str]:
    """Every cell of one row of the checks table."""
    q = check.get("quantity")
    return {"measured": value_cell(check.get("measured"), q), "estimated": value_cell(check.get("estimated"), q),
            "difference": difference_cell(check.get("difference"), q),
            "ratio": ratio_text(check.get("ratio")), "tolerance": tolerance_text(check.get("tolerance"))}


def tolerances_text(tolerances) -> str:
    """The tolerances one quantity was judged with across the run, each as :func:`tolerance_text`."""
    known = sorted({t for t in tolerances if _number(t)})
    return ", ".join(tolerance_text(t) for t in known) if known else "–"
