"""The headline as a picture: per sequence length, every setting as a point of peak memory against tokens/s
(with its interval), the frontier of settings nothing beats on both, the budgets as vertical lines and each
budget's answer starred.  "Fastest within X" is where the budget's line meets the frontier's staircase:
left of the line, the highest step is the answer.

The same drawing serves ``plan``: predicted points (each strategy at its largest batch), the card's memory
as the budget, the recommendation starred, and the measured points of ``--verify`` beside their predictions.

A run with more groups than :data:`~.figures.MAX_PANELS` shows that many, evenly spaced over the sorted
groups (the caption says which); a panel with :data:`~.figures.DENSE` points or more is thinned
(:func:`.scatters._thin`) and says so.  The frontier is computed from every point.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass, field, replace

import numpy as np

from ..base.finite import finite_number
from .answers_table import budget_name, short_question
from .figures import DENSE, STYLE, Figure, _colors, _dense, _encode, _grid, chosen, plt, shared_legend
from .headline import GroupAnswers, candidate
from .scatters import _thin, thinned_note

GIB = 2**30
MIB = 2**20
WIDE = 3.0  # a budget more than this many times the largest peak is named in the caption, not drawn


@dataclass(frozen=True)
class Point:
    name: str  # "every-2 · batch 4"
    series: str  # colour: the strategy
    peak: float  # bytes
    tok_s: float
    low: float | None = None  # tokens/s interval
    high: float | None = None


@dataclass
class Panel:
    title: str
    points: list[Point]
    budgets: list[tuple[str, float]] = field(default_factory=list)  # (label, bytes)
    marks: dict[str, list[str]] = field(default_factory=dict)  # point name -> the questions it answers
    overlay: list[Point] = field(default_factory=list)  # measured beside predicted (plan --verify)


def family(strategy: str) -> str:
    """"every-16…31+offload (16 settings)" -> "every-n+offload": the colour when strategies are too many."""
    return re.sub(r"every-[\d…]+( \(\d+ settings\))?", "every-n", strategy).replace(" (", "(").split("(")[0].strip()


def front(points: list[Point]) -> list[Point]:
    """The points no other point beats on both peak (lower) and tokens/s (higher), by peak."""
    out, best = [], -np.inf
    for p in sorted(points, key=lambda p: (p.peak, -p.tok_s)):
        if p.tok_s > best:
            out.append(p)
            best = p.tok_s
    return out


def _unit(panels: list[Panel]) -> tuple[float, str]:
    top = max((p.peak for panel in panels for p in panel.points), default=0.0)
    return (GIB, "GiB") if top >= GIB else (MIB, "MiB")


def _draw(ax, panel: Panel, colors: dict, unit: tuple[float, str]) -> tuple[int, list[str]]:
    """One panel; returns (markers drawn, budgets too wide to draw)."""
    scale, uname = unit
    pts = panel.points
    x = np.array([p.peak for p in pts], float) / scale
    y = np.array([p.tok_s for p in pts], float)
    thin = len(pts) >= DENSE
    _dense(ax, len(pts))
    keep = _thin(x, y, (x.min(), x.max(), y.min(), y.max())) if thin else np.arange(len(pts))
    edge = front(pts)
    on_front = {id(p) for p in edge}
    drawn = 0
    for name in colors:
        idx = [i for i in keep if pts[i].series == name]
        if not idx:
            continue
        drawn += len(idx)
        ax.scatter(x[idx], y[idx], s=30, color=colors[name], zorder=3, label=name)
        bars = [i for i in idx if pts[i].low is not None and (not thin or id(pts[i]) in on_front)]
        if bars:
            ax.errorbar(x[bars], y[bars], yerr=[np.clip(y[bars] - [pts[i].low for i in bars], 0, None),
                                                np.clip(np.array([pts[i].high for i in bars]) - y[bars], 0, None)],
                        fmt="none", ecolor=colors[name], elinewidth=1, capsize=2, zorder=2)
    top = max(x.max(), max((b / scale for _, b in panel.budgets if b / scale <= WIDE * x.max()), default=0))
    fx = [p.peak / scale for p in edge] + [top * 1.04]
    fy = [p.tok_s for p in edge] + [edge[-1].tok_s]
    ax.step(fx, fy, where="post", color="black", linewidth=1, zorder=2, label="frontier")
    wide = []
    for label, limit in panel.budgets:
        if limit / scale > WIDE * x.max():
            wide.append(label)
            continue
        ax.axvline(limit / scale, color="#555", linestyle="--", linewidth=1, zorder=1)
        ax.annotate(label, (limit / scale, 1.0), xycoords=("data", "axes fraction"), rotation=90, fontsize=7,
                    ha="right", va="top", color="#555")
    by_name = {p.name: p for p in pts}
    key = []
    for name, questions in panel.marks.items():
        p = by_name.get(name)
        if p is None:
            continue
        k = len(key) + 1
        ax.scatter([p.peak / scale], [p.tok_s], marker="*", s=260, facecolor="gold", edgecolor="black",
                   linewidth=0.8, zorder=5, label="answer (starred, numbered)")
        ax.annotate(str(k), (p.peak / scale, p.tok_s), xytext=(5, 5), textcoords="offset points", fontsize=8,
                    fontweight="bold", zorder=6)
        key.append(f"{k}: {name} — {', '.join(short_question(q) for q in questions)}")
    if key:  # the answers under the panel, not over its points
        ax.text(0.0, -0.2, "\n".join(key), transform=ax.transAxes, fontsize=8, va="top", ha="left")
    for m in panel.overlay:
        ax.scatter([m.peak / scale], [m.tok_s], marker="x", s=50, color="black", zorder=5, label="measured")
        p = by_name.get(m.name)
        if p is not None:
            ax.plot([p.peak / scale, m.peak / scale], [p.tok_s, m.tok_s], color="black", linewidth=0.6,
                    linestyle=":", zorder=4)
    ax.set_xlim(0, top * 1.06)
    ax.set_ylim(bottom=0)
    ax.set_title(textwrap.fill(panel.title, 60))
    ax.set_xlabel(f"peak memory ({uname})")
    ax.set_ylabel("tokens/s")
    return drawn, wide


def figure(panels: list[Panel], title: str, alt: str, caption: str) -> Figure | None:
    """The panels as one figure (a grid of up to three columns), one legend for all."""
    panels = [p for p in panels if p.points]
    if not panels:
        return None
    if len({p.series for panel in panels for p in panel.points}) > 10:  # colours would repeat: by family
        panels = [Panel(pl.title, [replace(p, series=family(p.series)) for p in pl.points], pl.budgets, pl.marks,
                        pl.overlay) for pl in panels]
    names = sorted({p.series for panel in panels for p in panel.points})
    colors = _colors(names)
    unit = _unit(panels)
    ncols, nrows = _grid(len(panels))
    shown = drawn = 0
    wide: list[str] = []
    with plt.rc_context(STYLE):
        fig, axes = plt.subplots(nrows, ncols, figsize=(3.8 * ncols + 1.8, 4.1 * nrows), squeeze=False)
        for k, panel in enumerate(panels):
            n, w = _draw(axes[k // ncols][k % ncols], panel, colors, unit)
            drawn, shown = drawn + n, shown + len(panel.points)
            wide += [b for b in w if b not in wide]
        for k in range(len(panels), nrows * ncols):
            axes[k // ncols][k % ncols].set_visible(False)
        shared_legend(fig)
        uri = _encode(fig)
    if wide:
        caption += (f" A budget more than {WIDE:g}× a panel's largest peak is left out of that panel (every point "
                    f"fits it): {', '.join(wide)}.")
    return Figure(title, uri, alt, caption + thinned_note(shown, drawn))


def _measured_panel(g: GroupAnswers) -> Panel:
    pts = []
    for r in g.rows:
        c = candidate(r, g.name(r))
        if c is not None and finite_number(r.get("peak")):
            pts.append(Point(c.name, str(r.get("strategy")), float(r["peak"]), c.tok_s, c.low, c.high))
    marks: dict[str, list[str]] = {}
    for label, _, answer in g.fastest:
        if answer.best is not None:
            word = budget_name(label) + (" (tied)" if answer.kind == "tied" else "")
            marks.setdefault(answer.best.name, []).append(word)
    budgets = [(label.removeprefix(" within "), limit) for label, limit, _ in g.fastest if limit is not None]
    return Panel(g.where, pts, budgets, marks)


def headline_figure(groups: list[GroupAnswers]) -> Figure | None:
    """The report's headline figure from :func:`.headline.group_answers`."""
    picked = chosen(groups)
    panels = [_measured_panel(g) for g in picked]
    if not any(p.points for p in panels):
        return None
    answers = "; ".join(f"{p.title}: " + ", ".join(f"{q} {n}" for n, qs in p.marks.items() for q in qs)
                        for p in panels if p.marks)
    alt = (f"Tokens/s against peak memory, one panel per sequence length ({', '.join(p.title for p in panels)}): "
           "each measured setting a point with its interval, the frontier as a staircase, the budgets as dashed "
           f"vertical lines, each question's answer starred. {answers}")
    if len(alt) > 900:
        alt = alt[:897] + "…"
    some = (f" {len(picked)} of {len(groups)} groups (variant, sequence length) drawn, evenly spaced over them; "
            "the table below and the answers CSV hold every group." if len(picked) < len(groups) else "")
    caption = ("Each point is one measured setting (tokens/s with its order-statistic interval); the staircase "
               "is the frontier: left of any memory line, its highest step is the fastest setting that fits. "
               "Dashed lines are the suite's budgets; a star marks each question's answer (\"(tied)\": the best "
               "median of settings tied within noise)." + some)
    return figure(panels, "Fastest setting per memory budget", alt, caption)
