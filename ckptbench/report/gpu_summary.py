"""What a GPU run says at a glance: utilisation, recompute cost against its ideal, offload cost against
the copy bound, and the estimate checks.  Pure functions over records (typed once read: :mod:`ckptbench.store.schema`), so they run and are
tested anywhere; ``gpu-summary`` prints them and stores them as ``summary.json`` for the report.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from ..store.records import latest_per_case
from ..store.schema import Record, read_checks, typed
from ..theory.memory.offload import offload_bound_s
from ..theory.memory.simulated import beside_measurements
from ..theory.time.flops import utilisation


def twin_key(case: Mapping, *differing: str) -> str:
    """A Case without the settings named: points that differ only in those share this key (a checkpointed
    point and its twin without checkpointing, an offloaded point and its twin without offload)."""
    return json.dumps({k: v for k, v in case.items() if k not in differing}, sort_keys=True)


def _offload_twin_key(case: Mapping) -> str:
    """:func:`twin_key` without offload, its kind (``recompute.offload``) too: a streamed point's twin is
    the same point without offload, as transformers' offload's is."""
    recompute = {k: v for k, v in (case.get("recompute") or {}).items() if k != "offload"}
    return twin_key({**case, "recompute": recompute}, "offload")


def _latest(records: list[dict]) -> list[Record]:
    return typed(latest_per_case(records))


def offload_overheads(records: list[dict], bandwidth: dict | None) -> list[dict]:
    """One row per successful offloaded point that has a successful twin without offload.

    ``bandwidth`` holds ``d2h_bytes_per_s`` and ``h2d_bytes_per_s`` (from :func:`ckptbench.measure.calibrate.copy_bandwidth`); without it the
    bound and ratio are None and the overhead is still reported.  When a Case was recorded more than once
    (a resumed sweep), the last record wins.
    """
    bandwidth = bandwidth or {}
    latest = _latest(records)
    plain = {_offload_twin_key(r.case_fields): r for r in latest if r.ok and not r.case.offload}
    rows = []
    for r in latest:
        case = r.case
        if not r.ok or not case.offload:
            continue
        twin = plain.get(_offload_twin_key(r.case_fields))
        t_off = r.measurement.step_time_median_s
        t_base = twin.measurement.step_time_median_s if twin else None
        overhead = t_off - t_base if (t_off is not None and t_base is not None) else None
        offloaded = r.measurement.offloaded_bytes
        bound = None if offloaded is None else offload_bound_s(
            offloaded, bandwidth.get("d2h_bytes_per_s"), bandwidth.get("h2d_bytes_per_s"), case.grad_accum)
        rows.append({
            "case_id": r.case_id,
            "twin_case_id": twin.case_id if twin else None,
            "strategy": r.strategy,
            "offload_kind": case.recompute.offload or "transformers",
            "batch_size": case.batch_size,
            "seq_len": case.seq_len,
            "offloaded_bytes": offloaded,
            "step_time_s": t_off,
            "twin_step_time_s": t_base,
            "overhead_s": overhead,
            "bound_s": bound,
            "overhead_over_bound": overhead / bound if (overhead is not None and bound) else None,
        })
    return rows


def point_rows(records: list[dict], measured_peak: float | None = None) -> list[dict]:
    """Per successful point: step time, MFU/HFU, and the measured vs ideal recompute ratio.

    The measured ratio divides the point's median step time by that of the same point with no
    checkpointing (every_n_layers 0); the ideal one is pure FLOP arithmetic (see :mod:`ckptbench.theory.time.flops`).
    """
    latest = _latest(records)
    base = {twin_key(r.case_fields, "every_n_layers", "offload"): r for r in latest
            if r.ok and r.case.every_n_layers == 0}
    rows = []
    for r in latest:
        if not r.ok:
            continue
        m = r.measurement
        t = m.step_time_median_s
        twin = base.get(twin_key(r.case_fields, "every_n_layers", "offload"))
        t_base = twin.measurement.step_time_median_s if twin else None
        rows.append({
            "case_id": r.case_id,
            "strategy": r.strategy,
            "batch_size": r.case.batch_size,
            "seq_len": r.case.seq_len,
            "step_time_s": t,
            "tokens_per_s": m.tokens_per_s,
            "peak_bytes": m.peak_bytes,
            "mfu": m.mfu,
            "hfu": m.hfu,
            "mfu_measured_peak": utilisation(m.model_flops_per_step or 0, t, measured_peak),
            "hfu_measured_peak": utilisation(m.hardware_flops_per_step or 0, t, measured_peak),
            "recompute_ratio_measured": t / t_base if (t and t_base) else None,
            "recompute_ratio_ideal": m.ideal_recompute_ratio,
            "energy_per_step_j": m.energy_per_step_j,
        })
    return rows


def check_rows(records: list[dict]) -> list[dict]:
    """The estimate checks each record carries (``record["checks"]``: quantity, measured, estimated,
    ratio, verdict), flattened with the point they belong to."""
    return [{"case_id": r.case_id, "strategy": r.strategy, "batch_size": r.case.batch_size, "seq_len": r.case.seq_len,
             "quantity": c.quantity, "measured": c.measured, "estimated": c.estimated, "ratio": c.ratio,
             "verdict": c.verdict}
            for r in _latest(records) for c in r.checks or read_checks(r.measurement.figures.get("checks"))]


def status_counts(records: list[dict]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for r in latest_per_case(records):
        counts[r.get("status", "?")] = counts.get(r.get("status", "?"), 0) + 1
    return counts


def summarise(records: list[dict], calibration: dict | None = None, simulated: dict | None = None) -> dict:
    calibration = calibration or {}
    return {
        "simulated": beside_measurements(latest_per_case(records), simulated or {}),
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
    if summary.get("simulated"):
        lines += ["", f"{'simulated point':<32}{'measured GiB':>14}{'simulated GiB':>15}{'ratio':>8}"]
        for p in summary["simulated"]:
            lines.append(f"{p['setting']:<32}{_f(p['measured'], '.3f', 2**-30):>14}"
                         f"{_f(p['simulated'], '.3f', 2**-30):>15}{_f(p['ratio'], '.4f'):>8}")
    if summary["checks"]:
        lines += ["", "estimate checks:"]
        for c in summary["checks"]:
            lines.append(f"  {c['verdict'] or '?':<6} {c['strategy']:<16} b={c['batch_size']} s={c['seq_len']} "
                         f"{c['quantity']}: measured {c['measured']} estimated {c['estimated']} "
                         f"ratio {_f(c['ratio'], '.3f')}")
    else:
        lines += ["", "estimate checks: none in these records (no point finished ok)"]
    return lines
