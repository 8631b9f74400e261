"""The numbers of the report, as plain rows of strings: verdicts, savings, checks, failures, deltas.

Kept apart from the figures and the template so each answer (which setting is best, what checkpointing
saves and costs) is a small pure function of the tidy records frame that a test can call directly.
Every number shown is read from records; nothing here measures or estimates anything itself.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ..measure.interval import coverage_label
from ..store.repeats import MIN_REPEATS_AS_UNIT
from ..store.stats import ratio_cis
from .columns import no_checkpointing, setup_of, strategies

GIB = 2**30


def fmt_bytes(value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if not isinstance(value, (int, float)):
        return str(value)  # non-numeric checks (recomputed layer lists) are shown as they are
    value = float(value)
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(value) >= scale:
            return f"{value / scale:.2f} {unit}"
    return f"{value:.0f} B"


def fmt_num(value, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if not isinstance(value, (int, float)):
        return str(value)
    return f"{float(value):.{digits}g}"


def fmt_pct(value) -> str:
    return "–" if value is None or math.isnan(value) else f"{value:+.1f} %"


def setting(row) -> str:
    """A human name of one point: model, strategy, batch, sequence (and the distributed setting)."""
    text = f"{row['variant']} · {row['strategy']} · batch {row['batch']:.0f} · seq {row['seq']:.0f}"
    return text


def status_counts(t: pd.DataFrame) -> list[tuple[str, int]]:
    return [(str(k), int(v)) for k, v in t["status"].value_counts().items()]


def pareto_mask(x: pd.Series, y: pd.Series, maximize_y: bool = False) -> pd.Series:
    """True for points no other point beats on both x (lower is better) and y (one sort, no loop)."""
    xv = x.to_numpy(dtype=float)
    yv = -y.to_numpy(dtype=float) if maximize_y else y.to_numpy(dtype=float)
    order = np.lexsort((yv, xv))  # by x, then y; stable
    ys = yv[order]
    best_before = np.concatenate(([np.inf], np.fmin.accumulate(ys)[:-1])) if len(ys) else ys
    mask = np.zeros(len(xv), dtype=bool)
    mask[order] = ys < best_before
    return pd.Series(mask, index=x.index)


def _range(values: list[float], fmt) -> str:
    if not values:
        return "–"
    s = pd.Series(values)
    if fmt(s.min()) == fmt(s.max()):
        return fmt(s.median())
    return f"{fmt(s.median())} ({fmt(s.min())} … {fmt(s.max())})"


def savings(t: pd.DataFrame) -> list[dict]:
    """Each checkpointing strategy against 'none' at the same variant, setup (the name's ranks, precision,
    loop, adapters and optimizer: "full+bf16-mixed+lora8" against "none+bf16-mixed+lora8"), batch and
    sequence length.

    Saving is 1 − strategy/none in percent (positive = less memory); cost is the step-time ratio ×.
    With several matched points the median is shown with the range; ``time_x_ci`` spans the matched points'
    ratio intervals (from each side's order-statistic interval of its median), labelled with the lowest
    coverage among them (at least the product of the two sides' coverages).
    """
    ok = t[t["ok"]]
    ok = ok.assign(setup=[setup_of(s) for s in ok["strategy"]])
    key = ["variant", "setup", "batch", "seq"]
    cols = key + ["peak", "after_fwd", "step_s", "tok_s", "step_times", "repeat_medians"]
    base = ok[ok["strategy"].map(no_checkpointing).astype(bool)].drop_duplicates(subset=key)[cols]
    rows = []
    for strat in strategies(ok):
        if no_checkpointing(strat):
            continue
        m = ok.loc[ok["strategy"] == strat, cols].merge(base, on=key, how="inner", suffixes=("", "_b"))
        peak = _saving(m, "peak")
        fwd = _saving(m, "after_fwd")
        timed = m[(m["step_s_b"] > 0) & m["step_s"].notna()]
        time_x = list(timed["step_s"] / timed["step_s_b"])
        time_ci = [ci for ci in ratio_cis([(_samples(a, ra), _samples(b, rb)) for a, ra, b, rb in zip(
            timed["step_times"], timed["repeat_medians"], timed["step_times_b"], timed["repeat_medians_b"])]) if ci]
        tok = m[(m["tok_s_b"] > 0) & m["tok_s"].notna()]
        tok_x = list(tok["tok_s"] / tok["tok_s_b"])
        if not (peak or fwd or time_x):
            continue
        rows.append({"strategy": strat, "points": max(len(peak), len(fwd), len(time_x)),
                     "peak_saving": _range(peak, lambda v: f"{v:.1f} %"),
                     "fwd_saving": _range(fwd, lambda v: f"{v:.1f} %"),
                     "time_x": _range(time_x, lambda v: f"{v:.2f}×"),
                     # each point's interval of its ratio of medians: their envelope, at the lowest coverage
                     "time_x_ci": (f"[{min(ci.low for ci in time_ci):.2f}×, {max(ci.high for ci in time_ci):.2f}×] "
                                   f"(≥ {coverage_label(min(ci.coverage for ci in time_ci))})" if time_ci else "–"),
                     "tok_x": _range(tok_x, lambda v: f"{v:.2f}×")})
    return rows


def _saving(m: pd.DataFrame, col: str) -> list[float]:
    """1 − strategy/none in percent for the matched rows where both are known."""
    both = m[(m[f"{col}_b"] > 0) & m[col].notna()]
    return list((1 - both[col] / both[f"{col}_b"]) * 100)


def _list(value) -> list:
    return value if isinstance(value, list) else []


def _samples(steps, repeat_medians) -> list:
    """What a point's time interval is over: one median per repeat from 3 repeats, else every step."""
    medians = _list(repeat_medians)
    return medians if len(medians) >= MIN_REPEATS_AS_UNIT else _list(steps)


def record_verdicts(frame: pd.DataFrame) -> list[tuple[str, int]]:
    """How many measured points passed, failed, or had nothing judged (``unchecked``: never a pass)."""
    if "verdict" not in frame.columns or "status" not in frame.columns:
        return []
    counts = frame.loc[frame["status"] == "ok", "verdict"].fillna("unchecked").value_counts()
    return [(v, int(counts[v])) for v in ("fail", "unchecked", "pass") if v in counts]


def failure_rows(t: pd.DataFrame) -> list[dict]:
    bad = t[~t["ok"]]
    rows = [{"setting": setting(r), "status": r["status"] or "?", "reason": r["reason"],
             "stderr_tail": r["stderr_tail"], "case_id": r["case_id"]} for r in bad.to_dict("records")]
    return sorted(rows, key=lambda r: (r["status"], r["setting"]))


def offload_notes(t: pd.DataFrame) -> list[str]:
    return sorted({n for n in t["offload_note"] if n})


def local_sgd_rows(t: pd.DataFrame) -> list[dict]:
    dist = t[(t["world"] > 1) & t["ok"]].sort_values(["K", "variant", "strategy", "batch", "seq", "seed"])
    rows = []
    for _, r in dist.iterrows():
        losses = r["losses"] if isinstance(r["losses"], list) else []
        rows.append({"setting": setting(r), "K": "DDP" if not r["K"] else f"{r['K']:.0f}",
                     "seed": "–" if math.isnan(r["seed"]) else f"{r['seed']:.0f}",
                     "world": f"{r['world']:.0f}", "payload": fmt_bytes(r["comm_payload"]),
                     "bus": fmt_bytes(r["comm_bus"]), "collectives": fmt_num(r["collectives"]),
                     "sync": fmt_num(r["sync_s"] * 1e3 if not math.isnan(r["sync_s"]) else r["sync_s"]),
                     "tok_s": "–" if math.isnan(r["tok_s"]) else f"{r['tok_s']:.0f}",
                     "final_loss": f"{losses[-1]:.4f}" if losses else "–"})
    return rows


DELTA_QUANTITIES = (("peak", "peak memory", fmt_bytes), ("after_fwd", "after forward", fmt_bytes),
                    ("step_s", "step time (s)", fmt_num), ("tok_s", "tokens/s", lambda v: "–" if math.isnan(v) else f"{v:.0f}"))


DELTA_ROWS = 400  # past this many compared quantities the page lists the largest changes only


def deltas(t: pd.DataFrame, base: pd.DataFrame, limit: int = DELTA_ROWS) -> dict:
    """This run against a baseline run, matched by case id: one row per matched point and quantity
    (status changes first, then the largest changes, when there are more than `limit`)."""
    cur = t.drop_duplicates("case_id", keep="last")
    old = base.drop_duplicates("case_id", keep="last")
    cols = ["case_id", "status"] + [col for col, _, _ in DELTA_QUANTITIES]
    m = cur[cols + ["variant", "strategy", "batch", "seq"]].merge(old[cols], on="case_id", how="inner",
                                                                 suffixes=("", "_b"))
    rows, sizes = [], []
    names = [setting(r) for r in m[["variant", "strategy", "batch", "seq"]].to_dict("records")]
    for i, r in enumerate(m.to_dict("records")):
        if r["status_b"] != "ok" or r["status"] != "ok":
            rows.append({"setting": names[i], "quantity": "status", "baseline": r["status_b"],
                         "current": r["status"], "delta": "–" if r["status_b"] == r["status"] else "changed"})
            sizes.append(math.inf if r["status_b"] != r["status"] else 0.0)
            continue
        for col, name, fmt in DELTA_QUANTITIES:
            a, b = r[f"{col}_b"], r[col]
            if math.isnan(a) and math.isnan(b):
                continue
            pct = (b / a - 1) * 100 if a else float("nan")
            rows.append({"setting": names[i], "quantity": name, "baseline": fmt(a), "current": fmt(b),
                         "delta": fmt_pct(pct)})
            sizes.append(0.0 if math.isnan(pct) else abs(pct))
    total = len(rows)
    if total > limit:
        largest = sorted(range(total), key=lambda k: -sizes[k])[:limit]
        rows = [rows[k] for k in sorted(largest)]
    cur_ids, old_ids = set(cur["case_id"]), set(old["case_id"])
    return {"rows": rows, "total_rows": total, "matched": len(m), "only_current": len(cur_ids - old_ids),
            "only_baseline": len(old_ids - cur_ids)}
