"""Figures of the report, drawn with matplotlib's Agg backend and embedded as base64 SVG data URIs.

The report must open offline and stay one file, so nothing is referenced: text is drawn as paths
(``svg.fonttype = "path"``, no font files) and each figure is an ``<img src="data:image/svg+xml;...">``.
Output is deterministic (fixed hash salt, no date) so two renders of the same records are identical.
Each function returns None when the run lacks the data for it; the report then leaves the figure out.
"""

from __future__ import annotations

import base64
import io
import math
from dataclasses import dataclass

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from .columns import strategy_order  # noqa: E402

MIB = 2**20
MAX_PANELS = 6
LINE_POINTS = 120  # past this many distinct values on a line's axis, the line is drawn over log-spaced bins
WIDTH_IN = 15.0  # a figure's width in inches at most: wider ones are shrunk below readable on a laptop
LINE_PANELS = 3  # memory-vs-axis panels side by side: more would not fit a laptop's width
MARKED = 40  # lines of more points are drawn without markers
TICKED = 12  # past this many distinct values, the axis's own ticks instead of one per value
MAX_VARIANTS = 6  # models and settings one figure draws the lines of; past it, evenly spaced, the rest said
DENSE = 200  # from this many markers in one axes on, they are drawn as one embedded image, not as paths
STYLE = {"svg.fonttype": "path", "svg.hashsalt": "ckptbench", "font.size": 9, "axes.grid": True,
         "grid.alpha": 0.3, "figure.dpi": 100}


@dataclass(frozen=True)
class Figure:
    title: str
    uri: str
    alt: str
    caption: str = ""


def _dense(ax, n: int) -> None:
    """Past DENSE markers, rasterize what lies below the front's circles (zorder < 3.5) into an image
    inside the SVG: 20,000 points as paths are megabytes and seconds; as pixels, tens of kilobytes."""
    if n >= DENSE:
        ax.set_rasterization_zorder(3.5)


def _encode(fig) -> str:
    """Lay the figure out, close it, and return it as an inline SVG data URI (no file, no network)."""
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None}, dpi=120)
    plt.close(fig)
    return "data:image/svg+xml;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _bar_pairs(ax, left, right, left_label: str, right_label: str) -> range:
    """Two bars per x position (left and right of the tick); a right series of all-NaN is not drawn."""
    x = range(len(left))
    ax.bar([i - 0.2 for i in x], list(left), 0.4, label=left_label)
    if any(not math.isnan(v) for v in right):
        ax.bar([i + 0.2 for i in x], list(right), 0.4, label=right_label)
    return x


def chosen(values: list, limit: int = MAX_PANELS) -> list:
    """All of `values` up to `limit`, else `limit` of them evenly spaced over the sorted list (first and
    last included): a finely stepped sweep's panels show its range, not its first few values."""
    if len(values) <= limit:
        return list(values)
    return [values[int(i)] for i in np.unique(np.linspace(0, len(values) - 1, limit).round())]


def panels_note(shown: int, total: int, what: str) -> str:
    """The caption's word on panels left out (empty when every one is drawn)."""
    if shown >= total:
        return ""
    return f" {shown} of {total} {what} drawn, evenly spaced over them; every point is in the CSV export."


def shared_legend(fig) -> None:
    """One legend beside the figure for all its panels, each label once (panels repeat their series)."""
    handles, labels = [], []
    for ax in fig.axes:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False)


def _colors(names: list[str]) -> dict[str, tuple]:
    cmap = plt.get_cmap("tab10")
    return {n: cmap(i % 10) for i, n in enumerate(names)}


def _series(t: pd.DataFrame) -> pd.Series:
    """Line label: the strategy, prefixed by the variant when the run mixes models or settings."""
    if t["variant"].nunique() > 1:
        return t["variant"] + " · " + t["strategy"]
    return t["strategy"]


def _series_names(t: pd.DataFrame) -> list[str]:
    labels = _series(t)
    pairs = sorted(set(zip(t["variant"], t["strategy"], labels)), key=lambda p: (p[0], strategy_order(p[1])))
    return [p[2] for p in pairs]


def shown_series(ok: pd.DataFrame) -> tuple[list[str], str]:
    """The series a figure draws: every strategy of at most MAX_VARIANTS models and settings (evenly spaced
    over them), and its caption's word on the rest: a run of many models must not draw a line and a legend
    entry per model."""
    pairs = sorted(set(zip(ok["variant"], ok["strategy"], ok["series"])), key=lambda p: (p[0], strategy_order(p[1])))
    variants = sorted({p[0] for p in pairs})
    keep = set(chosen(variants, MAX_VARIANTS))
    return ([p[2] for p in pairs if p[0] in keep],
            panels_note(len(keep), len(variants), "models and settings (variants)"))


def folded_series(ok: pd.DataFrame) -> tuple[list[str], dict, str]:
    """For a scatter, where every point is drawn: the series of the variants past MAX_VARIANTS become one
    grey "other" series.  Returns the names to draw, their colours and the caption's word."""
    shown, _ = shown_series(ok)
    every = _series_names(ok)
    colors = _colors(shown)
    if len(shown) == len(every):
        return shown, colors, ""
    other = f"{len(every) - len(shown)} other lines"
    keep = set(shown)
    ok["series"] = [n if n in keep else other for n in ok["series"]]
    colors[other] = (0.6, 0.6, 0.6, 1.0)
    variants = ok["variant"].nunique()
    return [*shown, other], colors, (f" The lines of {min(variants, MAX_VARIANTS)} of {variants} models and settings "
                                     "(variants) in colour, evenly spaced over them; the rest in grey.")


def _line_style(series: str) -> dict:
    """Offload variants get hollow squares and a dash-dot line, so a strategy that uses exactly the same
    memory with and without offload (any CPU run) stays visible instead of hiding under its twin."""
    if series.endswith("+offload"):
        return {"marker": "s", "markerfacecolor": "none", "markersize": 8, "linestyle": "-."}
    return {"marker": "o", "linestyle": "-"}


def _grid(n: int, rows_per: int = 1):
    cols = min(n, 3)
    blocks = math.ceil(n / cols)
    return cols, blocks * rows_per


def memory_vs(t: pd.DataFrame, axis: str) -> Figure | None:
    """After-forward and peak memory against `axis` (seq or batch), a line per strategy, a panel per
    value of the other axis; the estimate, when records carry one, dashed in the same colour."""
    other = "batch" if axis == "seq" else "seq"
    ok = t[t["ok"]].dropna(subset=["peak"]).copy()
    if ok[axis].nunique() < 2:
        return None
    ok["series"] = _series(ok)
    # points of one series at one (batch, seq) (seeds, repeats of a setting) are drawn as their median
    values = ["after_fwd", "est_after_fwd", "peak", "est_peak"]
    binned = ok[axis].nunique() > LINE_POINTS
    if binned:  # a finely stepped axis: the median of each of LINE_POINTS log-spaced bins, said in the caption
        edges = np.geomspace(ok[axis].min(), ok[axis].max() * (1 + 1e-9), LINE_POINTS + 1)
        ok[axis] = np.sqrt(edges[:-1] * edges[1:])[np.clip(np.searchsorted(edges, ok[axis], side="right") - 1, 0,
                                                           LINE_POINTS - 1)]
    ok = ok.groupby(["series", "variant", "strategy", axis, other], as_index=False, sort=False)[values].median()
    names, lines_note = shown_series(ok)
    colors = _colors(names)
    every = sorted(ok[other].unique())
    panels = chosen(every, LINE_PANELS)
    with plt.rc_context(STYLE):
        fig, axes = plt.subplots(2, len(panels), figsize=(4.2 * len(panels) + 1.5, 6.4), squeeze=False,
                                 sharex=True)
        for j, value in enumerate(panels):
            sub = ok[ok[other] == value]
            for i, (col, est, what) in enumerate((("after_fwd", "est_after_fwd", "after forward"),
                                                  ("peak", "est_peak", "peak"))):
                ax = axes[i][j]
                for name in names:
                    s = sub[sub["series"] == name].sort_values(axis)
                    if s.empty:
                        continue
                    style = _line_style(name) if len(s) <= MARKED else {"linestyle": _line_style(name)["linestyle"]}
                    ax.plot(s[axis], s[col] / MIB, color=colors[name], label=name, **style)
                    if s[est].notna().any():
                        ax.plot(s[axis], s[est] / MIB, linestyle="--", color=colors[name], alpha=0.8,
                                label=f"{name} (estimate)")
                ax.set_title(f"{what}, {other} {value:.0f}")
                ax.set_ylabel("MiB")
                ax.set_xscale("log", base=2)
                ticks = sorted(ok[axis].unique())
                if len(ticks) <= TICKED:  # each measured value named; past that, the log axis's own ticks
                    ax.set_xticks(ticks, [f"{v:.0f}" for v in ticks])
                    ax.minorticks_off()
                else:
                    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:.0f}"))
                if i == 1:
                    ax.set_xlabel("sequence length" if axis == "seq" else "batch size")
        handles, labels = axes[0][0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False)
        uri = _encode(fig)
    title = "Memory vs sequence length" if axis == "seq" else "Memory vs batch size"
    dashed = " Dashed: analytic estimate." if ok["est_peak"].notna().any() else ""
    if binned:
        dashed += (f" The {'sequence lengths' if axis == 'seq' else 'batch sizes'} are binned into {LINE_POINTS} "
                   "log-spaced bins, each drawn at its middle as the median of its points.")
    return Figure(title, uri, f"{title}, one line per checkpointing strategy",
                  f"Solid: measured (live tensor bytes), the median where several points share a setting.{dashed}"
                  + panels_note(len(panels), len(every), "batch sizes" if other == "batch" else "sequence lengths")
                  + lines_note)


def memory_by_strategy(t: pd.DataFrame) -> Figure | None:
    """Bars per strategy when no axis has two values to draw a line over (e.g. a smoke run)."""
    ok = t[t["ok"]].dropna(subset=["peak"]).copy()
    if ok.empty:
        return None
    ok["series"] = _series(ok)
    names, lines_note = shown_series(ok)
    every = sorted(set(zip(ok["batch"], ok["seq"])))
    shapes = chosen(every)
    with plt.rc_context(STYLE):
        fig, axes = plt.subplots(1, len(shapes), figsize=(max(5.0, 1.0 * len(names)) * len(shapes), 3.8),
                                 squeeze=False)
        for j, (b, s) in enumerate(shapes):
            ax = axes[0][j]
            sub = ok[(ok["batch"] == b) & (ok["seq"] == s)].set_index("series")
            present = [n for n in names if n in sub.index]
            rows = [sub.loc[[n]].iloc[0] for n in present]
            x = _bar_pairs(ax, [r["after_fwd"] / MIB for r in rows], [r["peak"] / MIB for r in rows],
                           "after forward", "peak")
            for est, dx in (("est_after_fwd", -0.2), ("est_peak", 0.2)):
                ys = [(i + dx, r[est] / MIB) for i, r in zip(x, rows) if not math.isnan(r[est])]
                if ys:
                    ax.scatter(*zip(*ys), marker="_", s=300, color="black", zorder=3,
                               label="estimate" if est == "est_peak" else None)
            ax.set_xticks(list(x), present, rotation=30, ha="right")
            ax.set_ylabel("MiB")
            ax.set_title(f"batch {b:.0f}, seq {s:.0f}")
        axes[0][0].legend(frameon=False)
        uri = _encode(fig)
    return Figure("Memory by strategy", uri, "after-forward and peak memory per strategy",
                  "Measured after-forward and peak memory; black marks are the analytic estimate when present."
                  + panels_note(len(shapes), len(every), "(batch, sequence length) shapes") + lines_note)


BREAKDOWN = (("bd_params", "params"), ("bd_grads", "grads"), ("bd_optimizer", "optimizer"),
             ("bd_activations", "activations"))


def breakdown(t: pd.DataFrame) -> Figure | None:
    """What the peak is made of, per strategy, a panel per (batch, seq)."""
    cols = [c for c, _ in BREAKDOWN]
    ok = t[t["ok"]].dropna(subset=cols, how="all").copy()
    if ok.empty:
        return None
    ok["series"] = _series(ok)
    names, lines_note = shown_series(ok)
    ok = ok[ok["series"].isin(set(names))]
    every = sorted(set(zip(ok["batch"], ok["seq"])))
    shapes = chosen(every)
    bars = max(len(set(ok[(ok["batch"] == b) & (ok["seq"] == s)]["series"])) for b, s in shapes)
    width = min(WIDTH_IN, max(4.0, 0.35 * bars))  # a panel's bars, the whole figure within a page's width
    ncols = max(1, min(len(shapes), 3, int(WIDTH_IN // width)))
    nrows = math.ceil(len(shapes) / ncols)
    colors = plt.get_cmap("Set2")
    tall = 3.6 + (0.065 * max(map(len, names)) if bars > 8 else 0.0)  # room for upright bar labels
    with plt.rc_context(STYLE):
        fig, axes = plt.subplots(nrows, ncols, figsize=(width * ncols, tall * nrows), squeeze=False)
        for k, (b, s) in enumerate(shapes):
            ax = axes[k // ncols][k % ncols]
            sub = ok[(ok["batch"] == b) & (ok["seq"] == s)].drop_duplicates("series").set_index("series")
            present = [n for n in names if n in sub.index]
            bottom = [0.0] * len(present)
            for i, (col, label) in enumerate(BREAKDOWN):
                vals = [0.0 if math.isnan(sub.loc[n, col]) else sub.loc[n, col] / MIB for n in present]
                ax.bar(present, vals, bottom=bottom, color=colors(i), label=label)
                bottom = [a + v for a, v in zip(bottom, vals)]
            ax.set_title(f"batch {b:.0f}, seq {s:.0f}")
            ax.set_ylabel("MiB at peak")
            ax.tick_params(axis="x", rotation=30 if len(present) <= 8 else 90)
        for k in range(len(shapes), nrows * ncols):
            axes[k // ncols][k % ncols].set_visible(False)
        handles, labels = axes[0][0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False)
        uri = _encode(fig)
    return Figure("Memory breakdown at peak", uri, "stacked bars of params, grads, optimizer, activations",
                  "Live bytes at the peak, split by what owns them."
                  + panels_note(len(shapes), len(every), "(batch, sequence length) shapes") + lines_note)


def _k_label(k: float) -> str:
    return "DDP" if not k else f"K={k:.0f}"


def comm_vs_k(t: pd.DataFrame) -> Figure | None:
    dist = t[(t["world"] > 1) & t["ok"]].dropna(subset=["comm_payload"])
    if dist.empty:
        return None
    per_k = dist.groupby("K")[["comm_payload", "comm_bus"]].median().sort_index()
    labels = [_k_label(k) for k in per_k.index]
    with plt.rc_context(STYLE):
        fig, ax = plt.subplots(figsize=(6.5, 4.0))
        x = _bar_pairs(ax, per_k["comm_payload"] / MIB, per_k["comm_bus"] / MIB, "payload", "bus (×2(n−1)/n)")
        ax.set_xticks(list(x), labels)
        ax.set_xlabel("synchronisation every K steps (DDP = every step)")
        ax.set_ylabel("MiB per step")
        ax.legend(frameon=False)
        uri = _encode(fig)
    return Figure("Communication per step vs K", uri, "all-reduce bytes per step for each K",
                  "Median over points with the same K.")


def checkpointing_figures(t: pd.DataFrame) -> list[Figure]:
    figs = [memory_vs(t, "seq"), memory_vs(t, "batch")]
    if not any(figs):
        figs.append(memory_by_strategy(t))
    return [f for f in figs if f is not None]

