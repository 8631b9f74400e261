"""Training loss per step for each K of a multi-rank run: smoothed, one line per K, a band over seeds.

A step's training loss is one batch's, noisy enough that raw lines of four K on top of each other read as
one scribble.  Each point's loss per step (the mean over its ranks when each rank's loss was recorded,
else rank 0's) is smoothed by a trailing moving average over a window of about a twentieth of the steps;
the line is the mean of those smoothed curves over the seeds of a K, the band their min–max.  A K run
with one seed has no spread over seeds: its band is then the min–max over its ranks (smoothed alike),
and the caption says which band is which.  Points are grouped as the quality section groups them (by
everything but K, the averaging implementation and the seed), one panel per group.
"""

from __future__ import annotations

import statistics

import matplotlib.pyplot as plt
import pandas as pd

from .figures import MAX_PANELS, STYLE, Figure, _colors, _encode
from .localsgd_quality import GROUP, series_label

SMOOTH_SHARE = 20  # window = steps // SMOOTH_SHARE (300 steps: 15); 1 (no smoothing) below 40 steps


def window(steps: int) -> int:
    return max(1, steps // SMOOTH_SHARE)


def trailing_mean(values: list[float], w: int) -> list[float]:
    """Mean of the last `w` values at each step (fewer at the start), in one pass of running sums."""
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= w:
            total -= values[i - w]
        out.append(total / min(i + 1, w))
    return out


def _ranks(value) -> list[list[float]] | None:
    if isinstance(value, list) and value and all(isinstance(x, list) and x for x in value):
        n = min(len(x) for x in value)
        return [[float(v) for v in x[:n]] for x in value]
    return None


def _loss(losses, per_rank) -> list[float]:
    """One point's loss per step: the mean over ranks when recorded, else the logged (rank 0) losses."""
    ranks = _ranks(per_rank)
    if ranks:
        return [statistics.fmean(step) for step in zip(*ranks)]
    return [float(v) for v in losses]


def _envelope(curves: list[list[float]]) -> tuple[list[float], list[float], list[float]]:
    n = min(len(c) for c in curves)
    cols = [[c[i] for c in curves] for i in range(n)]
    return [statistics.fmean(v) for v in cols], [min(v) for v in cols], [max(v) for v in cols]


def points(t: pd.DataFrame) -> pd.DataFrame:
    """Finished multi-rank points with a loss per step."""
    dist = t[(t["world"] > 1) & t["ok"]]
    dist = dist[[isinstance(v, list) and len(v) > 0 for v in dist["losses"]]]
    if dist.empty:
        return dist
    dist = dist.copy()
    dist["series"] = [series_label(k, impl) for k, impl in zip(dist["K"], dist["sync_impl"])]
    return dist


def training_loss(t: pd.DataFrame) -> Figure | None:
    """The smoothed training loss per K (see the module's text); None without multi-rank losses."""
    dist = points(t)
    if dist.empty:
        return None
    groups = [(dict(zip(GROUP, key)), g) for key, g in dist.groupby(GROUP, dropna=False, sort=True)]
    shown = groups[:MAX_PANELS]
    w = window(max(len(v) for v in dist["losses"]))
    bands = set()
    with plt.rc_context(STYLE):
        fig, axes = plt.subplots(1, len(shown), figsize=(7.0 * len(shown), 4.2), squeeze=False)
        for ax, (key, g) in zip(axes[0], shown):
            names = sorted(set(g["series"]), key=lambda n: (g[g["series"] == n]["K"].iloc[0], n))
            colors = _colors(names)
            for name in names:
                s = g[g["series"] == name]
                curves = [trailing_mean(_loss(loss, ranks), w) for loss, ranks in zip(s["losses"], s["loss_per_rank"])]
                mean, lo, hi = _envelope(curves)
                seeds, band, ranks = len(curves), None, _ranks(s["loss_per_rank"].iloc[0])
                if seeds > 1:
                    band = lo, hi
                    bands.add("seeds")
                elif ranks:
                    band = _envelope([trailing_mean(r, w) for r in ranks])[1:]
                    bands.add("ranks")
                steps = range(1, len(mean) + 1)
                ax.plot(steps, mean, color=colors[name], label=f"{name} ({seeds} seed{'s' if seeds > 1 else ''})")
                if band:
                    ax.fill_between(steps, band[0][:len(mean)], band[1][:len(mean)], color=colors[name], alpha=0.2,
                                    linewidth=0)
            ax.set_xlabel("optimizer step")
            ax.set_ylabel("training loss" + (f" (trailing mean of {w} steps)" if w > 1 else ""))
            ax.set_title(f"{key['model']} · batch {key['batch']:.0f} · seq {key['seq']:.0f} · world {key['world']:.0f}")
            ax.legend(frameon=False)
        uri = _encode(fig)
    return Figure("Training loss vs step per K (smoothed)", uri, "smoothed training loss per step for each K",
                  _caption(w, bands, len(groups) - len(shown)))


def _caption(w: int, bands: set[str], hidden: int) -> str:
    text = ("Loss of each step's batch, the mean over ranks where each rank's loss was recorded (else rank 0's), "
            + (f"smoothed by a trailing moving average over {w} steps (fewer at the start); "
               if w > 1 else "not smoothed (too few steps); ")
            + "line: mean over seeds")
    if "seeds" in bands:
        text += "; band: min–max over seeds"
    if "ranks" in bands:
        text += "; a K run with one seed: band min–max over its ranks" if "seeds" in bands else \
            "; band: min–max over ranks (one seed per K)"
    text += "."
    if hidden:
        text += f" {hidden} more group{'s' if hidden > 1 else ''} of points not drawn."
    return text
