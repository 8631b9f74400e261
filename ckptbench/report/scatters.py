"""The report's scatter figures: tokens/s and step time against peak memory with their Pareto fronts,
and measured against estimated bytes for every check.

A run of 20,000 points has 20,000 markers per figure and some 160,000 checked quantities; drawn one by
one they cost seconds and megabytes.  Past :data:`~.figures.DENSE` points in one axes, the markers are
thinned to one per occupied cell of a :data:`CELLS` grid over the axes (:func:`_thin`), a few pixels
each, less than half a marker, so the figure looks the same; the caption says how many points were drawn
as how many markers.  The Pareto fronts are computed from, and drawn with, every point.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..measure.interval import coverage_label
from .figures import (
    DENSE,
    MIB,
    STYLE,
    Figure,
    _colors,
    _dense,
    _encode,
    _grid,
    _line_style,
    _series,
    chosen,
    folded_series,
    panels_note,
    plt,
    shared_legend,
)
from .tables import pareto_mask

CELLS = (200, 150)  # past DENSE markers in one axes, one marker per occupied cell of this grid (:func:`_thin`)


def _thin(x: np.ndarray, y: np.ndarray, span: tuple[float, float, float, float]) -> np.ndarray:
    """Indices of the points to draw: all of them below DENSE, else the first point of each occupied cell
    of a CELLS grid over `span` (x0, x1, y0, y1), the axes' data range.  A cell is a few pixels of the
    drawn axes, less than half a marker's width, so the figure looks the same while drawing a few thousand
    markers instead of tens of thousands (the caption says so)."""
    if len(x) < DENSE:
        return np.arange(len(x))
    (x0, x1, y0, y1), (w, h) = span, CELLS
    cx = np.clip(((x - x0) / ((x1 - x0) or 1.0) * w).astype(np.int64), 0, w)
    cy = np.clip(((y - y0) / ((y1 - y0) or 1.0) * h).astype(np.int64), 0, h)
    return np.sort(np.unique(cx * (h + 1) + cy, return_index=True)[1])


def _span(x, y) -> tuple[float, float, float, float]:
    return float(np.min(x)), float(np.max(x)), float(np.min(y)), float(np.max(y))


def thinned_note(points: int, drawn: int) -> str:
    """The caption's word on a figure drawn by :func:`_thin` (empty when every point was drawn)."""
    if drawn >= points:
        return ""
    return (f" {points:,} points, drawn as one marker per occupied cell of a {CELLS[0]}×{CELLS[1]} grid over "
            f"the axes ({drawn:,} markers): points less than half a marker apart are drawn once.")


def pareto(t: pd.DataFrame) -> Figure | None:
    """Tokens/s against peak memory for every ok point, the Pareto front joined.  Tokens/s is the
    throughput measure that stays comparable across batch sizes and sequence lengths."""
    ok = t[t["ok"]].dropna(subset=["peak", "tok_s"]).copy()
    if ok.empty:
        return None
    ok["series"] = _series(ok)
    names, colors, lines_note = folded_series(ok)
    front = ok[pareto_mask(ok["peak"], ok["tok_s"], maximize_y=True)].sort_values("peak")
    with plt.rc_context(STYLE):
        fig, ax = plt.subplots(figsize=(7.5, 4.5))
        _dense(ax, len(ok))
        drawn = _scatter_front(ax, ok, names, colors, front, "tok_s", 1.0)
        ax.set_xlabel("peak memory (MiB)")
        ax.set_ylabel("tokens/s")
        ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False)
        uri = _encode(fig)
    return Figure("Tokens per second vs peak memory", uri, "tokens per second against peak memory with the "
                  "Pareto front", f"Circled points form the Pareto front: no other point has both lower peak "
                  f"memory and more tokens/s. {len(front)} of {len(ok)} points are on it."
                  f"{thinned_note(len(ok), drawn)}{lines_note}")


def _scatter_front(ax, ok, names, colors, front, y, scale) -> int:
    """Every point of `ok` by series (thinned past DENSE, :func:`_thin`), the front joined and circled;
    step times get their medians' intervals, on the front's points only when the points were thinned.
    Returns how many markers were drawn (the front's circles aside)."""
    thin = len(ok) >= DENSE
    span = _span(ok["peak"].to_numpy(float) / MIB, ok[y].to_numpy(float) * scale) if thin else None
    drawn = 0
    for name in names:
        s = ok[ok["series"] == name]
        style = _line_style(name)
        px, py = s["peak"].to_numpy(float) / MIB, s[y].to_numpy(float) * scale
        keep = _thin(px, py, span) if thin else np.arange(len(s))
        drawn += len(keep)
        ax.scatter(px[keep], py[keep], label=name, s=36, zorder=3, marker=style["marker"],
                   facecolors="none" if "markerfacecolor" in style else colors[name], edgecolors=colors[name])
        if y == "step_s" and "step_ci_lo" in s:  # the median's order-statistic interval, where there is one
            ci = (front[front["series"] == name] if thin else s).dropna(subset=["step_ci_lo", "step_ci_hi"])
            if not ci.empty:
                ax.errorbar(ci["peak"] / MIB, ci[y] * scale,
                            yerr=[((ci[y] - ci["step_ci_lo"]) * scale).clip(lower=0),
                                  ((ci["step_ci_hi"] - ci[y]) * scale).clip(lower=0)],
                            fmt="none", ecolor=colors[name], elinewidth=1, capsize=3, zorder=2)
    ax.plot(front["peak"] / MIB, front[y] * scale, color="black", linewidth=1, zorder=2, label="Pareto front")
    ax.scatter(front["peak"] / MIB, front[y] * scale, facecolors="none", edgecolors="black", s=110, zorder=4)
    return drawn


def step_time_pareto(t: pd.DataFrame) -> Figure | None:
    """Median step time against peak memory, a panel per (batch, seq): at a fixed amount of work, which
    strategies trade time for memory well (the front) and which are beaten on both."""
    ok = t[t["ok"]].dropna(subset=["peak", "step_s"]).copy()
    if ok.empty:
        return None
    ok["series"] = _series(ok)
    names, colors, lines_note = folded_series(ok)
    every = sorted(set(zip(ok["batch"], ok["seq"])))
    shapes = chosen(every)
    ncols, nrows = _grid(len(shapes))
    on_front = drawn = shown = 0
    thinned = False
    with plt.rc_context(STYLE):
        fig, axes = plt.subplots(nrows, ncols, figsize=(4.2 * ncols + 1.5, 3.4 * nrows), squeeze=False)
        for k, (b, sq) in enumerate(shapes):
            ax = axes[k // ncols][k % ncols]
            sub = ok[(ok["batch"] == b) & (ok["seq"] == sq)]
            front = sub[pareto_mask(sub["peak"], sub["step_s"])].sort_values("peak")
            on_front += len(front)
            _dense(ax, len(sub))
            thinned = thinned or len(sub) >= DENSE
            shown += len(sub)
            drawn += _scatter_front(ax, sub, [n for n in names if n in set(sub["series"])], colors, front,
                                    "step_s", 1e3)
            ax.set_title(f"batch {b:.0f}, seq {sq:.0f}")
            ax.set_xlabel("peak memory (MiB)")
            ax.set_ylabel("median step time (ms)")
        for k in range(len(shapes), nrows * ncols):
            axes[k // ncols][k % ncols].set_visible(False)
        shared_legend(fig)
        uri = _encode(fig)
    return Figure("Step time vs peak memory, per batch and sequence length", uri,
                  "median step time against peak memory per workload, with the Pareto front",
                  f"Within each panel the work per step is the same; circled points form that panel's Pareto "
                  f"front (no other strategy is both faster and smaller). {on_front} of {len(ok)} points are "
                  f"on a front. Error bars: order-statistic interval of each median over its timed steps "
                  f"(over one median per repeat from 3 repeats; none with fewer than 3), covering "
                  f"{_coverages(ok)}"
                  f"{f', on the front points of panels of {DENSE} points or more' if thinned else ''}."
                  f"{thinned_note(shown, drawn)}"
                  + panels_note(len(shapes), len(every), "(batch, sequence length) shapes") + lines_note)


def _coverages(ok: pd.DataFrame) -> str:
    """The coverage the error bars really have: one figure, or the range over the points."""
    cov = ok["step_ci_cov"].dropna() if "step_ci_cov" in ok else pd.Series(dtype=float)
    if cov.empty:
        return "a coverage the records do not state (records from before it was stated)"
    lo, hi = cov.min(), cov.max()
    return coverage_label(lo) if lo == hi else f"{coverage_label(lo)} to {coverage_label(hi)}, by the number of steps"


def estimate_vs_measured(rows: list[dict], title: str = "Measured vs estimate",
                         estimate_label: str = "estimate") -> Figure | None:
    """Measured against estimated (or simulated) for each check, per quantity, with the y = x line."""
    # byte quantities only: counts (syncs, collectives) and layer lists have no place on a MiB axis
    pts = [r for r in rows if "bytes" in str(r.get("quantity")) or str(r.get("quantity")).startswith("peak_")]
    pts = [r for r in pts if isinstance(r.get("measured"), (int, float))
           and isinstance(r.get("estimated"), (int, float))]
    if not pts:
        return None
    quantities = sorted({str(r["quantity"]) for r in pts})
    colors = _colors(quantities)
    by: dict[str, tuple[list, list]] = {q: ([], []) for q in quantities}
    for r in pts:
        est, meas = by[str(r["quantity"])]
        est.append(r["estimated"] / MIB)
        meas.append(r["measured"] / MIB)
    arrays = {q: (np.asarray(e, dtype=float), np.asarray(m, dtype=float)) for q, (e, m) in by.items()}
    lo = min(min(r["estimated"], r["measured"]) for r in pts) / MIB
    hi = max(max(r["estimated"], r["measured"]) for r in pts) / MIB
    drawn = 0
    with plt.rc_context(STYLE):
        fig, ax = plt.subplots(figsize=(6.5, 4.5))
        _dense(ax, len(pts))
        span = (lo, hi, lo, hi) if len(pts) >= DENSE else None
        for q in quantities:
            est, meas = arrays[q]
            keep = _thin(est, meas, span) if span else np.arange(len(est))
            drawn += len(keep)
            ax.scatter(est[keep], meas[keep], color=colors[q], label=q, s=24)
        ax.plot([lo, hi], [lo, hi], color="black", linewidth=0.8, linestyle=":",
                label=f"measured = {estimate_label}")
        ax.set_xlabel(f"{estimate_label} (MiB)")
        ax.set_ylabel("measured (MiB)")
        ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False, fontsize=8)
        uri = _encode(fig)
    return Figure(title, uri, f"measured against {estimate_label} bytes per checked quantity",
                  thinned_note(len(pts), drawn).strip())


