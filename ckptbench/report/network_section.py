"""Projected step time on named links for DDP and each K of a local-SGD run: a projection, labelled so.

Inputs are the run's own observations per optimizer step (all-reduces, bus bytes, compute time); the
model and the links' α and β are :mod:`ckptbench.theory.comm.network`'s, stated beside the table.  Compute is
one figure for every K: the median step of the local-SGD points less their averagings, steps that ran
no collective at all.  DDP's own step also holds its reducer's loopback all-reduce, which is exactly
what the projected link replaces, so it is used only when the run has no local-SGD point.  The
crossover K per link is where averaging stops mattering (at most 10 % of the compute), from the
parameter bytes and all-reduces per averaging the run counted.
"""

from __future__ import annotations

import statistics

import matplotlib.pyplot as plt
import pandas as pd

from ..theory.comm.network import LINKS, NEGLIGIBLE, crossover_k, project_step, sync_s
from .figures import STYLE, Figure, _colors, _encode
from .localsgd_quality import series_label

MODEL_NOTE = ("α–β model of a ring all-reduce: T = 2(n−1)·α + 2(n−1)/n · bytes / β per all-reduce; projected "
              "step = measured compute (local-SGD steps that ran no collective) + measured all-reduces × "
              "2(n−1)·α + measured bus bytes / β, no overlap "
              "(DDP overlaps its buckets with the backward: its real time lies between max(compute, comm) and "
              "the sum). Links at nominal rate; no congestion or protocol overhead.")


def _points(t: pd.DataFrame) -> pd.DataFrame:
    need = ["compute_s", "comm_bus", "allreduce_count", "losses"]
    ok = t[(t["world"] > 1) & t["ok"]]
    ok = ok.dropna(subset=[c for c in need if c != "losses"])
    ok = ok[[isinstance(v, list) and len(v) > 0 for v in ok["losses"]]]
    if ok.empty:
        return ok
    ok = ok.copy()
    ok["series"] = [series_label(k, impl) for k, impl in zip(ok["K"], ok["sync_impl"])]
    ok["steps"] = [len(v) for v in ok["losses"]]
    return ok


def projection(t: pd.DataFrame) -> dict | None:
    """Per series (DDP, each K): measured compute and communication per step, and the projected step on
    each link; per link, the crossover K.  Medians over the series' points (seeds, repeats)."""
    p = _points(t)
    if p.empty:
        return None
    world = int(p["world"].max())
    p = p[p["world"] == world]
    rows = []
    local = p[(p["K"] > 0) & (p["syncs"] > 0)]
    shared = statistics.median(local["compute_s"]) if not local.empty else None
    for series, s in sorted(p.groupby("series"), key=lambda kv: (kv[1]["K"].iloc[0], kv[0])):
        compute = shared if shared is not None else statistics.median(s["compute_s"])
        per_step = statistics.median(s["allreduce_count"] / s["steps"])
        bus = statistics.median(s["comm_bus"])
        cells = {link.name: project_step(compute, per_step, bus, world, link) for link in LINKS}
        rows.append({"series": series, "K": float(s["K"].iloc[0]), "compute_s": compute,
                     "allreduces_per_step": per_step, "bus_per_step": bus, "cells": cells})
    ddp = next((r for r in rows if not r["K"]), None)
    for r in rows:
        r["speedup"] = {name: ddp["cells"][name].step_s / cell.step_s for name, cell in r["cells"].items()} if ddp else {}
    crossover = []
    if not local.empty:
        params = statistics.median(local["params_bytes"])
        per_sync = statistics.median(local["allreduce_count"] / local["syncs"])
        for link in LINKS:
            crossover.append({"link": link.name, "note": link.note, "sync_s": sync_s(params, per_sync, world, link),
                              "k": crossover_k(params, per_sync, world, shared, link)})
    return {"world": world, "rows": rows, "compute_s": shared, "links": [link.name for link in LINKS], "crossover": crossover,
            "negligible_pct": 100 * NEGLIGIBLE, "note": MODEL_NOTE,
            "link_notes": [f"{link.name}: {link.note}" for link in LINKS]}


def projection_figure(proj: dict | None) -> Figure | None:
    """Projected step time against K per link (K on a log axis), the run's compute time as the floor."""
    if not proj or not proj["crossover"]:
        return None
    ddp = next((r for r in proj["rows"] if not r["K"]), None)
    compute = proj["compute_s"]
    ks = [2 ** i for i in range(0, 13)]
    with plt.rc_context(STYLE):
        fig, ax = plt.subplots(figsize=(7.0, 4.4))
        colors = _colors(proj["links"])
        for c in proj["crossover"]:
            ax.plot(ks, [1e3 * (compute + c["sync_s"] / k) for k in ks], color=colors[c["link"]], label=c["link"])
            ax.axvline(c["k"], color=colors[c["link"]], linestyle=":", linewidth=0.8)
            if ddp:
                ax.plot([1], [1e3 * ddp["cells"][c["link"]].step_s], marker="s", color=colors[c["link"]])
        ax.axhline(1e3 * compute, color="0.3", linestyle="--", linewidth=0.8, label="compute (measured)")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("averaging every K steps (square at K=1: DDP, from its measured all-reduces)")
        ax.set_ylabel("projected step time (ms)")
        ax.legend(frameon=False, fontsize=8)
        uri = _encode(fig)
    return Figure("Projected step time vs K on named links (projection)", uri,
                  "projected step time against K for each link, with the crossover K dotted",
                  f"PROJECTION, not a measurement, for world {proj['world']}. Dotted: the crossover K, where "
                  f"averaging costs at most {proj['negligible_pct']:.0f} % of the compute. " + proj["note"])
