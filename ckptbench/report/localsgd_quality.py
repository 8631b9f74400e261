"""What local SGD costs in quality: the held-out loss gap per K against DDP, over seeds, and its curves.

Read from records of text-source runs (``measurement.eval_curve``); runs on random tokens have nothing to
learn and draw nothing here.  Points are grouped by everything but K, the averaging implementation and
the seed; DDP (K = 0) of the same group is the baseline.  A K's gap is paired by seed (same initial
weights, same data order) and taken at equal tokens (the last token count both curves were evaluated
at), so the spread shown is the seeds' and not the baseline's noise added twice.

The gap's interval says what it is: with three or more seeds, the 95 % Student-t interval of the mean
paired gap (exact when the seeds' gaps are normal); with two, their min–max, which holds the median gap
with only 50 % probability; with one, none.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

import matplotlib.pyplot as plt
import pandas as pd

from .figures import STYLE, Figure, _colors, _encode

GROUP = ["model", "dtype", "batch", "seq", "accum", "world", "data_source", "every_n", "offload"]
CONFIDENCE = 0.95
INTERVAL_NOTE = ("Interval over seeds: with 3 or more, the 95 % Student-t interval of the mean paired gap; "
                 "with 2, their min–max (it holds the median gap with 50 % probability); with 1, none.")


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


def _group_name(key: dict) -> str:
    return f"{key['model']} · batch {key['batch']:.0f} · seq {key['seq']:.0f} · {key['data_source']}"


def _final(curve: list[dict]) -> float:
    return float(curve[-1]["loss"])


def at_equal_tokens(curve: list[dict], base: list[dict]) -> tuple[int, float, float] | None:
    """(tokens, loss, base loss) at the last token count both held-out curves were evaluated at."""
    theirs = {int(p["tokens"]): float(p["loss"]) for p in base}
    common = [int(p["tokens"]) for p in curve if int(p["tokens"]) in theirs]
    if not common:
        return None
    tokens = max(common)
    ours = {int(p["tokens"]): float(p["loss"]) for p in curve}
    return tokens, ours[tokens], theirs[tokens]


@dataclass(frozen=True)
class Interval:
    lo: float
    hi: float
    method: str


def seed_interval(gaps: list[float], confidence: float = CONFIDENCE) -> Interval:
    """The interval of the paired gaps the page shows beside their mean, named by how it was drawn."""
    n = len(gaps)
    if n >= 3:
        from scipy.stats import t as student

        mean, sd = statistics.fmean(gaps), statistics.stdev(gaps)
        half = float(student.ppf(0.5 + confidence / 2, n - 1)) * sd / math.sqrt(n)
        return Interval(mean - half, mean + half, f"{100 * confidence:.0f} % t-interval, {n} seeds")
    if n == 2:
        return Interval(min(gaps), max(gaps), "min–max of 2 seeds")
    nan = float("nan")
    return Interval(nan, nan, "1 seed: no interval" if n else "no seed run with DDP")


def _seed(value) -> int | None:
    """A record's seed as an int (None for records from before seeds were recorded)."""
    return None if value is None or value != value else int(value)


def seed_pairs(g: pd.DataFrame, s: pd.DataFrame) -> list[dict]:
    """Each seed of one series against DDP's run with the same seed in its group, at equal tokens."""
    ddp = {_seed(seed): c for seed, c in zip(g.loc[g["K"] == 0, "seed"], g.loc[g["K"] == 0, "eval_curve"])}
    out = []
    for seed, curve in sorted(zip(map(_seed, s["seed"]), s["eval_curve"]), key=lambda p: (p[0] is None, p[0] or 0)):
        pair = at_equal_tokens(curve, ddp[seed]) if seed in ddp else None
        out.append({"seed": seed, "final": _final(curve), "tokens": pair[0] if pair else None,
                    "loss": pair[1] if pair else None, "ddp": pair[2] if pair else None,
                    "gap": pair[1] - pair[2] if pair else None})
    return out


def _series(g: pd.DataFrame):
    return sorted(g.groupby("series"), key=lambda p: (p[1]["K"].iloc[0], p[0]))


def gap_rows(t: pd.DataFrame) -> list[dict]:
    """One row per (group, K): the paired held-out loss gap against DDP at equal tokens (mean over seeds,
    the interval of :func:`seed_interval`), final held-out loss over seeds, bytes per rank and saved
    against DDP, and how far the loss fell."""
    rows = []
    for key, g in _groups(quality_points(t)):
        ddp_bytes = g.loc[g["K"] == 0, "comm_payload_total"].median() if (g["K"] == 0).any() else float("nan")
        for series, s in _series(g):
            k = float(s["K"].iloc[0])
            pairs = seed_pairs(g, s) if k else []
            gaps = [p["gap"] for p in pairs if p["gap"] is not None]
            ci = seed_interval(gaps)
            tokens = sorted({p["tokens"] for p in pairs if p["tokens"] is not None})
            finals = [_final(c) for c in s["eval_curve"]]
            payload = s["comm_payload_total"].median()
            first = [float(c[0]["loss"]) for c in s["eval_curve"]]
            rows.append({
                "group": _group_name(key), "series": series, "K": k, "seeds": len(s),
                "tokens": int(s["eval_curve"].iloc[0][-1]["tokens"]),
                "gap_tokens": ", ".join(f"{n:,}" for n in tokens) or "–",
                "syncs": float(s["syncs"].median()), "payload": payload,
                "saved_factor": ddp_bytes / payload if payload and not math.isnan(ddp_bytes) else float("nan"),
                "saved_pct": 100 * (1 - payload / ddp_bytes) if ddp_bytes and not math.isnan(ddp_bytes) else float("nan"),
                "final_mean": statistics.fmean(finals),
                "final_sd": statistics.stdev(finals) if len(finals) > 1 else 0.0,
                "drop": statistics.fmean(first) - statistics.fmean(finals),
                "gap": statistics.fmean(gaps) if gaps else float("nan"),
                "gap_lo": ci.lo, "gap_hi": ci.hi, "interval": ci.method if k else "",
                "gaps": gaps,
            })
    return rows


def seed_rows(t: pd.DataFrame) -> list[dict]:
    """One row per (group, K, seed): its held-out loss and DDP's with the same seed at equal tokens."""
    rows = []
    for key, g in _groups(quality_points(t)):
        for series, s in _series(g):
            k = float(s["K"].iloc[0])
            for p in seed_pairs(g, s):
                rows.append({"group": _group_name(key), "series": series, "K": k,
                             "seed": "–" if p["seed"] is None else str(p["seed"]),
                             "final": p["final"], "tokens": p["tokens"], "loss": p["loss"], "ddp": p["ddp"],
                             "gap": p["gap"] if k else None})
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
            bar = [[r["gap"] - r["gap_lo"]], [r["gap_hi"] - r["gap"]]] if not math.isnan(r["gap_lo"]) else None
            ax.errorbar([r["saved_factor"]], [r["gap"]], yerr=bar, fmt="o", capsize=4, color=colors[r["series"]],
                        label=f"{r['series']} ({r['interval']})")
        ax.axhline(0.0, color="0.4", linewidth=0.8, linestyle="--")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("communication saved: DDP's all-reduce bytes / this K's")
        ax.set_ylabel("held-out loss gap vs DDP (nats)")
        ax.legend(frameon=False, fontsize=8)
        uri = _encode(fig)
    return Figure("Communication saved vs held-out loss gap", uri,
                  "held-out loss gap against DDP for each K, against the factor of bytes saved",
                  "Gap: held-out loss minus DDP's with the same seed, at equal tokens; point: mean over seeds; "
                  "bar: " + INTERVAL_NOTE[0].lower() + INTERVAL_NOTE[1:])
