"""What a GPU run says at a glance: utilisation, recompute cost against its ideal, offload cost against
the copy bound, and the estimate checks.  Pure functions over records (plain dicts), so they run and are
tested anywhere; ``gpu-summary`` prints them and stores them as ``summary.json`` for the report.
"""

from __future__ import annotations

import json

from .bandwidth import offload_overheads
from .flops import utilisation


def _latest(records: list[dict]) -> list[dict]:
    """One record per Case, the last one written (a resumed sweep may have recorded a Case twice)."""
    latest: dict[str, dict] = {}
    for r in records:
        latest[r["case_id"]] = r
    return list(latest.values())


def _baseline_key(case: dict) -> str:
    return json.dumps({k: v for k, v in case.items() if k not in ("every_n_layers", "offload")}, sort_keys=True)


def point_rows(records: list[dict], measured_peak: float | None = None) -> list[dict]:
    """Per successful point: step time, MFU/HFU, and the measured vs ideal recompute ratio.

    The measured ratio divides the point's median step time by that of the same point with no
    checkpointing (every_n_layers 0); the ideal one is pure FLOP arithmetic (see ``flops.py``).
    """
    latest = _latest(records)
    base = {_baseline_key(r["case"]): r for r in latest
            if r.get("status") == "ok" and r["case"].get("every_n_layers", 0) == 0}
    rows = []
    for r in latest:
        if r.get("status") != "ok":
            continue
        m = r.get("measurement") or {}
        t = m.get("step_time_median_s")
        twin = base.get(_baseline_key(r["case"]))
        t_base = (twin.get("measurement") or {}).get("step_time_median_s") if twin else None
        rows.append({
            "case_id": r["case_id"],
            "strategy": r.get("strategy"),
            "batch_size": r["case"].get("batch_size"),
            "seq_len": r["case"].get("seq_len"),
            "step_time_s": t,
            "tokens_per_s": m.get("tokens_per_s"),
            "peak_bytes": m.get("peak_bytes"),
            "mfu": m.get("mfu"),
            "hfu": m.get("hfu"),
            "mfu_measured_peak": utilisation(m.get("model_flops_per_step") or 0, t, measured_peak),
            "hfu_measured_peak": utilisation(m.get("hardware_flops_per_step") or 0, t, measured_peak),
            "recompute_ratio_measured": t / t_base if (t and t_base) else None,
            "recompute_ratio_ideal": m.get("ideal_recompute_ratio"),
            "energy_per_step_j": m.get("energy_per_step_j"),
        })
    return rows


def check_rows(records: list[dict]) -> list[dict]:
    """The estimate checks each record carries (``record["checks"]``: quantity, measured, estimated,
    ratio, verdict), flattened with the point they belong to.  Empty until the estimate work lands."""
    rows = []
    for r in _latest(records):
        checks = r.get("checks") or (r.get("measurement") or {}).get("checks") or []
        for c in checks:
            if isinstance(c, dict):
                rows.append({"case_id": r["case_id"], "strategy": r.get("strategy"),
                             "batch_size": r["case"].get("batch_size"), "seq_len": r["case"].get("seq_len"),
                             **{k: c.get(k) for k in ("quantity", "measured", "estimated", "ratio", "verdict")}})
    return rows


def status_counts(records: list[dict]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for r in _latest(records):
        counts[r.get("status", "?")] = counts.get(r.get("status", "?"), 0) + 1
    return counts


def summarise(records: list[dict], calibration: dict | None = None) -> dict:
    calibration = calibration or {}
    return {
        "statuses": status_counts(records),
        "calibration": calibration,
        "points": point_rows(records, calibration.get("matmul_flops_per_s")),
        "offload": offload_overheads(records, calibration),
        "checks": check_rows(records),
    }


def _f(value, fmt: str, scale: float = 1.0) -> str:
    return "-" if value is None else format(value * scale, fmt)


def format_summary(summary: dict) -> list[str]:
    """Plain text lines (they end up in a log, so no colour or box drawing)."""
    lines = ["statuses: " + ", ".join(f"{k} {v}" for k, v in sorted(summary["statuses"].items()))]
    cal = summary.get("calibration") or {}
    if cal.get("h2d_bytes_per_s"):
        lines.append(f"pinned copies: H2D {cal['h2d_bytes_per_s'] / 1e9:.1f} GB/s, "
                     f"D2H {cal['d2h_bytes_per_s'] / 1e9:.1f} GB/s"
                     + (f"; bf16 matmul {cal['matmul_flops_per_s'] / 1e12:.0f} TFLOP/s"
                        if cal.get("matmul_flops_per_s") else ""))
    lines += ["", f"{'strategy':<16}{'batch':>6}{'seq':>7}{'step ms':>10}{'MFU':>7}{'HFU':>7}"
              f"{'MFU*':>7}{'ratio':>7}{'ideal':>7}{'J/step':>8}"]
    for p in summary["points"]:
        lines.append(f"{p['strategy']:<16}{p['batch_size']:>6}{p['seq_len']:>7}{_f(p['step_time_s'], '.1f', 1e3):>10}"
                     f"{_f(p['mfu'], '.2f'):>7}{_f(p['hfu'], '.2f'):>7}{_f(p['mfu_measured_peak'], '.2f'):>7}"
                     f"{_f(p['recompute_ratio_measured'], '.2f'):>7}{_f(p['recompute_ratio_ideal'], '.2f'):>7}"
                     f"{_f(p['energy_per_step_j'], '.0f'):>8}")
    lines.append("MFU/HFU against the datasheet peak, MFU* against the measured matmul peak; ratio = step time / "
                 "same point without checkpointing, ideal = 1 + recomputed forward FLOPs / (fwd + bwd)")
    if summary["offload"]:
        lines += ["", f"{'offload point':<16}{'batch':>6}{'seq':>7}{'MiB':>9}{'extra ms':>10}{'bound ms':>10}"
                  f"{'extra/bound':>12}"]
        for o in summary["offload"]:
            lines.append(f"{o['strategy']:<16}{o['batch_size']:>6}{o['seq_len']:>7}"
                         f"{_f(o['offloaded_bytes'], '.0f', 2**-20):>9}{_f(o['overhead_s'], '.1f', 1e3):>10}"
                         f"{_f(o['bound_s'], '.1f', 1e3):>10}{_f(o['overhead_over_bound'], '.2f'):>12}")
    if summary["checks"]:
        lines += ["", "estimate checks:"]
        for c in summary["checks"]:
            lines.append(f"  {c['verdict'] or '?':<6} {c['strategy']:<16} b={c['batch_size']} s={c['seq_len']} "
                         f"{c['quantity']}: measured {c['measured']} estimated {c['estimated']} "
                         f"ratio {_f(c['ratio'], '.3f')}")
    else:
        lines += ["", "estimate checks: none in these records (the estimate annotator is not in this version)"]
    return lines
