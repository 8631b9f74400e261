"""What a tracked run shows where the user looks: the line it prints when its record is written, and the
figures it hands to the user's own loggers (Trainer's ``report_to``, ``accelerator.log``)."""

from __future__ import annotations


def figures_of(record: dict) -> dict[str, float]:
    """What a tracked run hands to the user's own loggers (Trainer's ``report_to``, ``accelerator.log``):
    keys under ``ckptbench/``; nothing for a record that measured nothing."""
    m = record.get("measurement") or {}
    if record.get("status") != "ok" or not m.get("peak_bytes"):
        return {}
    out = {"ckptbench/peak_gib": m["peak_bytes"] / 2**30, "ckptbench/step_s": m["step_time_median_s"],
           "ckptbench/tokens_per_s": m["tokens_per_s"],
           "ckptbench/checkpointed_layers": float(len(m.get("checkpointed_layers") or []))}
    estimated = (record.get("estimate") or {}).get("peak_bytes")
    if estimated:
        out["ckptbench/peak_estimate_error"] = m["peak_bytes"] / estimated - 1
    return {k: float(v) for k, v in out.items() if v is not None}


def failing_named(record: dict) -> str:
    """`` (failing: q1, meters.q2, gate g)`` for a record whose verdict is fail: every check, meter check and
    gate behind it, by name; empty otherwise."""
    if record.get("verdict") != "fail":
        return ""
    names = [c.get("quantity") for c in record.get("checks") or [] if c.get("verdict") == "fail"]
    names += [f"meters.{c.get('quantity')}" for c in (record.get("meters") or {}).get("checks") or []
              if c.get("verdict") == "fail"]
    names += [f"gate {g}" for g, v in (record.get("gates") or {}).items() if v]
    return f" (failing: {', '.join(dict.fromkeys(str(n) for n in names))})" if names else ""


def summary_line(record: dict, path: str) -> str:
    """What a tracked run prints when its record is written: the peak, its phase, the verdict, each mistake."""
    m = record.get("measurement") or {}
    lines = [f"ckptbench: {record['strategy']} · batch {record['case']['batch_size']} · seq "
             f"{record['case']['seq_len']}: {record['status']}"]
    if record["status"] == "ok":
        lines[0] += (f", peak {m['peak_bytes'] / 2**20:.2f} MiB ({m.get('peak_phase')}), after forward "
                     f"{m['mem_after_forward_bytes'] / 2**20:.2f} MiB, step {m['step_time_median_s'] * 1e3:.1f} ms, "
                     f"verdict {record.get('verdict')}{failing_named(record)} -> {path}")
    else:
        lines[0] += f": {record.get('reason')}"
    lines += [f"ckptbench: mistake: {x['line']}" for x in (record.get("track") or {}).get("mistakes", [])]
    return "\n".join(lines)
