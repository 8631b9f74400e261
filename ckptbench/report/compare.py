"""Drawing a :class:`~ckptbench.store.compare.Comparison` for a terminal.

Kept apart from :mod:`ckptbench.store.compare` so the judging logic stays importable and testable without rich, and so
the HTML report can reuse the Comparison without this view.  The table is for reading; the plain lines
after it (regressions, one-sided points, noisy points) are stable text that scripts and tests can grep.
"""

from __future__ import annotations

from ..measure.interval import coverage_label
from ..store.compare import QUANTITY_BY_KEY, Comparison, PointComparison, format_change
from ..store.machine_speed import MachineSpeed


def format_value(quantity: str, value: float | None) -> str:
    if value is None:
        return "-"
    unit = QUANTITY_BY_KEY[quantity].unit
    if unit == "bytes":
        return f"{value / 2**20:.3f} MiB" if abs(value) >= 2**20 else f"{value / 2**10:.1f} KiB"
    if unit == "s":
        return f"{value * 1e3:.2f} ms"
    return f"{value:,.0f}"


def _verdict(delta) -> str:
    judged = "" if delta.judged_change is None or delta.change is None or \
        abs(delta.judged_change - delta.change) < 0.0005 else f" {format_change(delta.judged_change)} at equal machine speed"
    p = f"{judged} (p={delta.p_value:.2g})" if delta.p_value is not None else judged
    if delta.regressed:
        return f"[bold red]REGRESSED[/bold red]{p}"
    if delta.improved:
        return f"[green]improved[/green]{p}"
    if delta.change is None:
        return "n/a"
    if delta.verdict == "noisy":
        return f"[yellow]noisy[/yellow]{p}"
    return delta.verdict if delta.verdict in ("untested",) else ""


def _spread_note(point: PointComparison) -> str:
    def pct(value):
        return "?" if value is None else f"{value:.0%}"

    return f"old {pct(point.old_spread)}, new {pct(point.new_spread)}"


def len_note(point: PointComparison) -> str:
    """Both medians' intervals, each labelled with the coverage it really has."""
    d = next((d for d in point.deltas if d.old_ci), None)
    if d is None or not d.new_ci:
        return "intervals unknown"
    return (f"old median in [{d.old_ci[0] * 1e3:.2f}, {d.old_ci[1] * 1e3:.2f}] ms ({_cover(d.old_ci_coverage)}), "
            f"new in [{d.new_ci[0] * 1e3:.2f}, {d.new_ci[1] * 1e3:.2f}] ms ({_cover(d.new_ci_coverage)})")


def speed_line(speed: MachineSpeed) -> str:
    """The machine's measured speed change between the runs, and what compare did with it: one line."""
    if speed.state == "unknown":
        return (f"machine speed: not measured on both sides ({speed.why}); raw changes are judged, so a machine "
                "slower today reads as a slowdown of every point")
    measured = (f"the calibration kernel ({speed.kernel}) took {format_change(speed.ratio - 1)} in new "
                f"({speed.old_s * 1e3:.2f} -> {speed.new_s * 1e3:.2f} ms, {speed.readings[0]} vs {speed.readings[1]} "
                f"readings, two-sided Welch p={speed.p_value:.2g} over {speed.unit})")
    if speed.state == "corrected":
        return (f"machine speed: {measured}: beyond its noise, so new times are divided by {speed.ratio:.3f} "
                "before they are judged (--no-drift-correction: raw)")
    if speed.state == "not corrected":
        return f"machine speed: {measured}: beyond its noise, but --no-drift-correction: raw changes are judged"
    return f"machine speed: {measured}: within its noise, so raw changes are judged"


def _cover(value) -> str:
    return f"{coverage_label(value)} interval" if value is not None else "interval of unstated coverage"


def _name(point) -> str:
    """Key, then label unless the key already says it (a benchmark's name is part of its fullname)."""
    return point.key if not point.label or point.label in point.key else f"{point.key} {point.label}"


TABLE_POINTS = 100  # beyond this many compared points the table lists only the points that moved


def notable(point: PointComparison) -> bool:
    """Whether a point has something to say: a status change, a verdict either way, or a noisy time."""
    return (point.old_status != point.new_status or point.old_status != "ok" or point.noisy
            or any(d.regressed or d.improved for d in point.deltas))


def _priority(point: PointComparison) -> int:
    if point.regressed:
        return 0
    if point.old_status != point.new_status or point.old_status != "ok":
        return 1
    return 2 if point.noisy else 3


def shown_points(comparison: Comparison, limit: int = TABLE_POINTS) -> list[PointComparison]:
    """The points the table draws: all of them up to `limit`; past it the :func:`notable` ones, at most
    `limit`, regressions first, then status changes, noisy points and improvements (a table of 20,000
    rows is unreadable and takes minutes to lay out; the lines after it name every regression and
    ``--json`` holds every point)."""
    if len(comparison.points) <= limit:
        return comparison.points
    return sorted((p for p in comparison.points if notable(p)), key=_priority)[:limit]


def comparison_table(comparison: Comparison, old_name: str, new_name: str, limit: int = TABLE_POINTS):
    from rich.markup import escape
    from rich.table import Table

    t = comparison.thresholds
    points = shown_points(comparison, limit)
    hidden = len(comparison.points) - len(points)
    table = Table(title=f"ckptbench compare ({comparison.kind}): {escape(old_name)} -> {escape(new_name)}  "
                        f"[fail: memory > {t.memory:.1%}, time > {t.time:.1%}]",
                  caption=f"{len(points)} of {len(comparison.points)} points drawn, regressions first; the lines "
                          "below name every regression, --json lists every point" if hidden else None)
    for col in ("point", "quantity", "old", "new", "change", "verdict"):
        table.add_column(col, justify="right" if col in ("old", "new", "change") else "left",
                         overflow="fold")
    for point in points:
        # Benchmark names carry [params]: escaped, or rich would read them as markup and drop them.
        name = escape(point.label) if point.label in ("", point.key) else \
            f"{escape(point.label)}\n[dim]{escape(point.key)}[/dim]"
        rows = []
        if point.old_status != "ok" or point.new_status != "ok":
            rows.append(("status", point.old_status, point.new_status, "",
                         "[bold red]REGRESSED[/bold red]" if point.status_regressed else ""))
        for d in point.deltas:
            noisy = point.noisy and QUANTITY_BY_KEY[d.quantity].kind == "time"
            label = d.label + (" [yellow](noisy)[/yellow]" if noisy else "")
            rows.append((label, format_value(d.quantity, d.old), format_value(d.quantity, d.new),
                         format_change(d.change), _verdict(d)))
        for k, row in enumerate(rows):
            table.add_row(name if k == 0 else "", *row, end_section=k == len(rows) - 1)
    return table


def _capped(lines: list[str], limit: int | None, what: str) -> list[str]:
    """At most `limit` of one kind of line, then how many more there are (``--json`` lists every one)."""
    if limit is None or len(lines) <= limit:
        return lines
    return lines[:limit] + [f"... and {len(lines) - limit:,} more {what} (--json lists every one)"]


def summary_lines(comparison: Comparison, limit: int | None = None) -> list[str]:
    """Plain lines: regressions with their reasons, one-sided points, noisy points, the verdict; with
    `limit`, at most that many lines of each kind (regressions: four times as many) and their counts."""
    t = comparison.thresholds
    lines = [f"note: {p}" for p in comparison.problems]
    if comparison.env_changes:
        lines.append("environment changed: " + "; ".join(comparison.env_changes))
    lines.append(speed_line(comparison.machine_speed))
    moved = comparison.median_change
    if moved is not None:
        lines.append(f"median step-time change over the points: {moved:+.1%} (stated, never divided out: only the "
                     "calibration kernel's measured speed is)")
    noisy, one_sided, regressed = [], [], []
    for p in comparison.noisy:
        tested = [d for d in p.deltas if d.verdict == "noisy"]
        if tested:
            d = tested[0]
            noisy.append(f"noisy comparison: {_name(p)}: {d.label} {format_change(d.change)} is beyond the "
                         f"{t.time:.0%} threshold but not significant (Welch p={d.p_value:.2g}, "
                         f"{len_note(p)}); run more steps or --repeat before trusting it")
        else:
            noisy.append(f"noisy comparison: {_name(p)}: step-time spread ({_spread_note(p)}) is wider "
                         f"than the {t.time:.0%} time threshold; run more steps before trusting its time verdict")
    for side, points in (("old", comparison.only_old), ("new", comparison.only_new)):
        for p in points:
            one_sided.append(f"only in {side}: {_name(p)} ({p.status}); not compared, does not fail")
    lines += _capped(noisy, limit, "noisy points") + _capped(one_sided, limit, "points on one side only")
    if not comparison.points:
        lines.append("no point in common: Case ids hash every setting (model, steps, seed, ...), "
                     "so runs of different suites share no points")
    for p in comparison.regressions:
        regressed.append(f"REGRESSION {_name(p)}: " + "; ".join(p.reasons(t)))
    lines += _capped(regressed, None if limit is None else 4 * limit, "regressions")
    n = len(comparison.regressions)
    lines.append(f"{n} of {len(comparison.points)} compared points regressed" if n else
                 f"no regression among {len(comparison.points)} compared points "
                 f"(memory {t.memory:.1%}, time {t.time:.1%})")
    return lines
