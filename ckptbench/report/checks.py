"""The estimate checks of a run: a summary per quantity, the failing checks in full, every check in a CSV.

A run of 20,000 points holds some 300,000 checks; one table row each made a 100 MiB page nobody can
read.  The page shows, per checked quantity, how many passed, failed and were skipped with the spread and
the worst of the measured/estimated ratios; every failing check row by row; and every check only while
there are few (:data:`INLINE_CHECKS`).  The whole table is written beside the HTML as a CSV
(:func:`write_checks_csv`), one row per (record, quantity), so nothing is lost by leaving it off the page.
"""

from __future__ import annotations

import csv
import math
import operator
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import pandas as pd

from ..store.files import atomic_writer
from .check_format import tolerances_text
from .columns import CHECK_FIELDS, strategy_order

INLINE_CHECKS = 400  # up to this many checks the page lists every one; past it, the failing ones only
MAX_FAILING_ROWS = 5000  # a run failing everywhere still renders: the CSV holds the rest
VERDICT_ORDER = {"fail": 0, "off": 1, "skip": 2, "agrees": 3, "pass": 4}
CSV_FIELDS = ("verdict", "quantity", "setting", "strategy", "case_id", *(f for f in CHECK_FIELDS
                                                                        if f not in ("verdict", "quantity")))


def settings(t: pd.DataFrame) -> list[str]:
    """:func:`~.tables.setting` of every row, built column-wise (one string per point, no row objects),
    with the seed when the run holds more than one (its points are otherwise named alike)."""
    names = [f"{v} · {s} · batch {b:.0f} · seq {q:.0f}"
             for v, s, b, q in zip(t["variant"], t["strategy"], t["batch"], t["seq"])]
    if "seed" in t.columns and t["seed"].nunique() > 1:
        names = [n if seed != seed else f"{n} · seed {seed:.0f}" for n, seed in zip(names, t["seed"])]
    return names


def iter_checks(t: pd.DataFrame) -> Iterator[dict]:
    """One dict per (record, checked quantity), in record order."""
    for name, strat, cid, checks in zip(settings(t), t["strategy"], t["case_id"], t["checks"]):
        if not isinstance(checks, list):
            continue
        for check in checks:
            if isinstance(check, dict):
                row = {f: check.get(f) for f in CHECK_FIELDS}
                row.update(setting=name, strategy=strat, case_id=cid)
                yield row


def _sort_key(c: dict):
    return VERDICT_ORDER.get(str(c["verdict"]), 3), str(c["quantity"]), strategy_order(c["strategy"])


def check_rows(t: pd.DataFrame) -> list[dict]:
    """Every check as a row, failures first, then skips, then passes."""
    return sorted(iter_checks(t), key=_sort_key)


def _ratio(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        return None
    return float(value)


def _badness(ratio: float) -> float:
    """How far a measured/estimated ratio is from 1, either way (0.5 and 2 are as bad)."""
    return math.inf if ratio <= 0 else max(ratio, 1 / ratio)


def _count(by: dict[str, dict], c: dict) -> None:
    """Add one check to the per-quantity counts of :func:`check_summary`."""
    quantity = str(c.get("quantity"))
    q = by.get(quantity)
    if q is None:
        q = by[quantity] = {"quantity": quantity, "pass": 0, "fail": 0, "skip": 0, "agrees": 0, "off": 0,
                            "lo": math.inf, "hi": -math.inf, "tolerances": set()}
    verdict = str(c.get("verdict"))
    q[verdict if verdict in ("pass", "fail", "skip", "agrees", "off") else "skip"] += 1  # agrees/off: predictions
    tolerance = c.get("tolerance")
    if isinstance(tolerance, (int, float)):
        q["tolerances"].add(tolerance)
    ratio = _ratio(c.get("ratio"))
    if ratio is not None:
        if ratio < q["lo"]:
            q["lo"] = ratio
        if ratio > q["hi"]:
            q["hi"] = ratio


def _summarise(by: dict[str, dict]) -> list[dict]:
    out = []
    for q in sorted(by.values(), key=lambda q: (-q["fail"], q["quantity"])):
        lo, hi = q.pop("lo"), q.pop("hi")
        known = lo <= hi
        q["ratio_range"] = f"{lo:.3f} … {hi:.3f}" if known else "–"
        q["worst"] = (f"{lo:.3f}" if _badness(lo) > _badness(hi) else f"{hi:.3f}") if known else "–"
        q["tolerance"] = tolerances_text(q.pop("tolerances"))
        out.append(q)
    return out


def check_summary(rows: Iterable[dict]) -> list[dict]:
    """One row per checked quantity: verdict counts, the spread of measured/estimated ratios and the
    worst of them (farthest from 1 either way), failing quantities first."""
    by: dict[str, dict] = {}
    for c in rows:
        _count(by, c)
    return _summarise(by)


@dataclass
class CheckTable:
    """What the page shows of the checks: the summary, the rows listed, and how many there are in all."""

    summary: list[dict] = field(default_factory=list)
    rows: list[dict] = field(default_factory=list)  # every check (few), else the failing ones
    total: int = 0
    failing: int = 0
    all_listed: bool = True
    points: list[dict] = field(default_factory=list)  # numeric checks for the measured-vs-estimate figure


def check_table(t: pd.DataFrame, inline: int = INLINE_CHECKS) -> CheckTable:
    """One pass over the checks: counts per quantity, the failing rows, the figure's points; every row
    kept only while there are at most `inline` of them.  A row dict is built only for a check that is
    listed: a run of 20,000 records has some 300,000 checks, nearly all passing and only counted."""
    out = CheckTable()
    kept, failing, by = [], [], {}
    for name, strat, cid, checks in zip(settings(t), t["strategy"], t["case_id"], t["checks"]):
        if not isinstance(checks, list):
            continue
        for check in checks:
            if not isinstance(check, dict):
                continue
            _count(by, check)
            out.total += 1
            fail = str(check.get("verdict")) == "fail"
            if fail:
                out.failing += 1
            if out.total <= inline or (fail and len(failing) < MAX_FAILING_ROWS):
                listed = {f: check.get(f) for f in CHECK_FIELDS}
                listed.update(setting=name, strategy=strat, case_id=cid)
                if out.total <= inline:
                    kept.append(listed)
                if fail and len(failing) < MAX_FAILING_ROWS:
                    failing.append(listed)
            if _plotted(check):
                out.points.append({"quantity": check.get("quantity"), "measured": check.get("measured"),
                                   "estimated": check.get("estimated")})
    out.summary = _summarise(by)  # every check counted; the rows themselves not kept past the limit
    out.all_listed = out.total <= inline
    out.rows = sorted(kept if out.all_listed else failing, key=_sort_key)
    return out


def _plotted(row: dict) -> bool:
    """Byte quantities with numbers on both sides: what the measured-vs-estimate figure draws."""
    q = str(row.get("quantity"))
    return (("bytes" in q or q.startswith("peak_")) and isinstance(row.get("measured"), (int, float))
            and isinstance(row.get("estimated"), (int, float)))


def csv_path(html_path: str) -> str:
    """Where the checks of a report go: beside the HTML, ``<report>.checks.csv``."""
    stem = html_path[:-5] if html_path.endswith(".html") else html_path
    return stem + ".checks.csv"


def _csv_rows(t: pd.DataFrame, failing: bool) -> Iterator[tuple]:
    """The CSV's rows, the failing checks (`failing`) or the others, in record order, as plain tuples."""
    fields = ("verdict", "quantity", *CSV_FIELDS[5:])
    whole = operator.itemgetter(*fields)  # a check holding every field: one C call for the lot
    for name, strat, cid, checks in zip(settings(t), t["strategy"], t["case_id"], t["checks"]):
        if not isinstance(checks, list):
            continue
        for c in checks:
            if not isinstance(c, dict) or (str(c.get("verdict")) == "fail") != failing:
                continue
            try:
                values = whole(c)
            except KeyError:
                values = tuple(c.get(f) for f in fields)
            if list in map(type, values[2:]) or tuple in map(type, values[2:]):  # None is "" to csv too
                values = (*values[:2], *(_cell(v) for v in values[2:]))
            yield (*values[:2], name, strat, cid, *values[2:])


def write_checks_csv(t: pd.DataFrame, path: str) -> int:
    """Every check of the run, one row per (record, quantity), the failing ones first, then the others
    in record order; written atomically.  Returns the number of rows."""
    n = 0
    with atomic_writer(path, newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(CSV_FIELDS)
        for failing in (True, False):
            rows = list(_csv_rows(t, failing))
            writer.writerows(rows)
            n += len(rows)
    return n


def _cell(value):
    """Lists (checkpointed layers) as one readable cell; numbers and text as they are."""
    if isinstance(value, (list, tuple)):
        return " ".join(str(v) for v in value)
    return "" if value is None else value
