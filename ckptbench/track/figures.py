"""What a tracked run shows where the user looks: the line it prints when its record is written, and the
figures it hands to the user's own loggers (Trainer's ``report_to``, ``accelerator.log``)."""

from __future__ import annotations

from ..store.schema import Record


def figures_of(record: dict) -> dict[str, float]:
    """What a tracked run hands to the user's own loggers (Trainer's ``report_to``, ``accelerator.log``):
    keys under ``ckptbench/``; nothing for a record that measured nothing."""
    r = Record.read(record)
    m = r.measurement
    if not r.ok or not m.peak_bytes:
        return {}
    out = {"ckptbench/peak_gib": m.peak_bytes / 2**30, "ckptbench/step_s": m.step_time_median_s,
           "ckptbench/tokens_per_s": m.tokens_per_s, "ckptbench/checkpointed_layers": float(len(m.checkpointed_layers))}
    estimated = r.estimate.get("peak_bytes")
    if estimated:
        out["ckptbench/peak_estimate_error"] = m.peak_bytes / estimated - 1
    return {k: float(v) for k, v in out.items() if v is not None}


def failing_named(r: Record) -> str:
    """`` (failing: q1, meters.q2, gate g)`` for a record whose verdict is fail: every check, meter check and
    gate behind it, by name; empty otherwise."""
    if r.verdict != "fail":
        return ""
    names = [c.quantity for c in r.checks if c.verdict == "fail"]
    names += [f"meters.{c.quantity}" for c in r.meter_checks if c.verdict == "fail"]
    names += [f"gate {g}" for g, v in r.gates.items() if v]
    return f" (failing: {', '.join(dict.fromkeys(str(n) for n in names))})" if names else ""


def summary_line(record: dict, path: str) -> str:
    """What a tracked run prints when its record is written: the peak, its phase, the verdict, each mistake."""
    r = Record.read(record)
    m = r.measurement
    lines = [f"ckptbench: {r.strategy} · batch {r.case.batch_size} · seq {r.case.seq_len}: {r.status}"]
    if r.ok:
        lines[0] += (f", peak {m.peak_bytes / 2**20:.2f} MiB ({m.peak_phase}), after forward "
                     f"{m.mem_after_forward_bytes / 2**20:.2f} MiB, step {m.step_time_median_s * 1e3:.1f} ms, "
                     f"verdict {r.verdict}{failing_named(r)} -> {path}")
    else:
        lines[0] += f": {r.reason}"
    lines += [f"ckptbench: mistake: {x['line']}" for x in r.track.get("mistakes", [])]
    return "\n".join(lines)
