"""What local SGD costs in quality: held-out loss against tokens per K, and the loss gap against the bytes saved.

Read from records of text-source runs (``measurement.eval_curve``); runs on random tokens have nothing to
learn and draw nothing here.  Points are grouped by everything but K, the averaging implementation and
the seed; DDP (K = 0) of the same group is the baseline, and a K's gap is paired by seed (same initial
weights, same data order), so the spread shown is the seeds' and not the baseline's noise added twice.
The gap's interval is the order-statistic interval of the median paired gap (:mod:`ckptbench.store.stats`),
labelled with the coverage it has: with three seeds it is their range, which covers the median 75 % of the
time, and says so.
"""

from __future__ import annotations

import math
import statistics

import matplotlib.pyplot as plt
import pandas as pd

from ..measure.interval import coverage_label
from ..store.stats import median_ci
from .figures import STYLE, Figure, _colors, _encode

GROUP = ["model", "dtype", "batch", "seq", "accum", "world", "data_source", "every_n", "offload"]


def series_label(k: float, sync_impl: str) -> str:
    label = "DDP" if not k else f"K={k:.0f}"
    return label + (" (torch averager)" if k and sync_impl == "torch-averager" else "")


def quality_points(t: pd.DataFrame) -> pd.DataFrame:
    """Finished multi-rank points with a held-out curve (at least two evaluations)."""
    if "eval_curve" not in t.columns:
        return t.iloc[0:0]
    curves = pd.Series([isinstance(c, list) and len(c) > 1 for c in t["eval_curve"]], index=t.index)
    keep = (t["world"] > 1) & t["ok"] & curves
    q = t[keep].copy()
    q["series"] = [series_label(k, impl) for k, impl in zip(q["K"], q["sync_impl"])]
    return q


def _groups(q: pd.DataFrame):
    for key, g in q.groupby(GROUP, dropna=False, sort=True):
        yield dict(zip(GROUP, key)), g


def _final(curve: list[dict]) -> float:
    return float(curve[-1]["loss"])


def gap_rows(t: pd.DataFrame) -> list[dict]:
    """One row per (group, K): seeds, bytes per rank and saved against DDP, final held-out loss over seeds,
    the paired gap against DDP (median, its interval and that interval's coverage), and how far DDP's
    loss fell."""
    q = quality_points(t)
    rows = []
    for key, g in _groups(q):
        ddp = g[g["K"] == 0]
        ddp_final = {s: _final(c) for s, c in zip(ddp["seed"], ddp["eval_curve"])}
        ddp_bytes = ddp["comm_payload_total"].median() if len(ddp) else float("nan")
        for series, s in sorted(g.groupby("series"), key=lambda p: (p[1]["K"].iloc[0], p[0])):
            finals = [_final(c) for c in s["eval_curve"]]
            gaps = [_final(c) - ddp_final[seed] for seed, c in zip(s["seed"], s["eval_curve"]) if seed in ddp_final]
            ci = median_ci(gaps) if len(gaps) >= 3 else None
            payload = s["comm_payload_total"].median()
            first = [float(c[0]["loss"]) for c in s["eval_curve"]]
            rows.append({
                "group": f"{key['model']} · batch {key['batch']:.0f} · seq {key['seq']:.0f} · {key['data_source']}",
                "series": series, "K": float(s["K"].iloc[0]), "seeds": len(s),
                "tokens": int(s["eval_curve"].iloc[0][-1]["tokens"]),
                "syncs": float(s["syncs"].median()), "payload": payload,
                "saved_factor": ddp_bytes / payload if payload and not math.isnan(ddp_bytes) else float("nan"),
                "saved_pct": 100 * (1 - payload / ddp_bytes) if ddp_bytes and not math.isnan(ddp_bytes) else float("nan"),
                "final_mean": statistics.fmean(finals),
                "final_sd": statistics.stdev(finals) if len(finals) > 1 else 0.0,
                "drop": statistics.fmean(first) - statistics.fmean(finals),
                "gap": statistics.median(gaps) if gaps else float("nan"),
                "gap_lo": ci[0] if ci else (min(gaps) if gaps else float("nan")),
                "gap_hi": ci[1] if ci else (max(gaps) if gaps else float("nan")),
                "gap_coverage": coverage_label(ci.coverage) if ci else "the seeds' range",
                "gaps": gaps,
            })
    return rows


def eval_curves(t: pd.DataFrame) -> Figure | None:
    """Held-out loss against tokens seen (all ranks), a line per K: mean over seeds, band min–max."""
    q = quality_points(t)
    if q.empty:
        return None
    groups = list(_groups(q))
    with plt.rc_context(STYLE):
        fig, axes = plt.subplots(1, len(groups), figsize=(7.0 * len(groups), 4.4), squeeze=False)
        for ax, (key, g) in zip(axes[0], groups):
            names = sorted(set(g["series"]), key=lambda n: (g[g["series"] == n]["K"].iloc[0], n))
            colors = _colors(names)
            for name in names:
                curves = list(g[g["series"] == name]["eval_curve"])
                n = min(len(c) for c in curves)
                tokens = [curves[0][i]["tokens"] for i in range(n)]
                losses = [[c[i]["loss"] for c in curves] for i in range(n)]
                ax.plot(tokens, [statistics.fmean(v) for v in losses], marker="o", markersize=3,
                        color=colors[name], label=f"{name} ({len(curves)} seeds)")
                ax.fill_between(tokens, [min(v) for v in losses], [max(v) for v in losses],
                                color=colors[name], alpha=0.2)
            ax.set_xlabel("tokens seen by all ranks")
            ax.set_ylabel("held-out loss (nats/token)")
            ax.set_title(f"{key['model']} · {key['data_source']} · world {key['world']:.0f}")
            ax.legend(frameon=False)
        uri = _encode(fig)
    return Figure("Held-out loss vs tokens per K", uri, "held-out loss against tokens seen, one line per K",
                  "Loss of the ranks' parameter average on held-out text. Line: mean over seeds; band: "
                  "min–max over seeds.")


def gap_vs_saved(rows: list[dict]) -> Figure | None:
    """One point per K: communication saved against DDP (×, log axis) and the held-out loss gap."""
    pts = [r for r in rows if r["K"] and not math.isnan(r["saved_factor"]) and not math.isnan(r["gap"])]
    if not pts:
        return None
    with plt.rc_context(STYLE):
        fig, ax = plt.subplots(figsize=(6.5, 4.2))
        colors = _colors([r["series"] for r in pts])
        for r in pts:
            ax.errorbar([r["saved_factor"]], [r["gap"]], yerr=[[r["gap"] - r["gap_lo"]], [r["gap_hi"] - r["gap"]]],
                        fmt="o", capsize=4, color=colors[r["series"]], label=f"{r['series']} ({r['seeds']} seeds)")
        ax.axhline(0.0, color="0.4", linewidth=0.8, linestyle="--")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("communication saved: DDP's all-reduce bytes / this K's")
        ax.set_ylabel("held-out loss gap vs DDP (nats)")
        ax.legend(frameon=False, fontsize=8)
        uri = _encode(fig)
    return Figure("Communication saved vs held-out loss gap", uri,
                  "held-out loss gap against DDP for each K, against the factor of bytes saved",
                  "Gap: final held-out loss minus DDP's with the same seed; point: median over seeds; "
                  "bar: order-statistic interval of that median, covering it "
                  f"{_coverage_range(pts)} (the seeds' range when there are fewer than 3).")


def _coverage_range(rows: list[dict]) -> str:
    """The coverages of the drawn bars, as one phrase."""
    labels = sorted({r.get("gap_coverage", "?") for r in rows})
    return labels[0] if len(labels) == 1 else "by the number of seeds: " + ", ".join(labels)
