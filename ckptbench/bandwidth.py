"""Host↔device copy bandwidth, and what it implies for offloaded checkpointing.

transformers' offload wraps each checkpointed layer in ``save_on_cpu(pin_memory=True)``: every tensor
packed for backward is copied device→host during forward and host→device during backward, on the compute
stream.  So the least an offloaded step can cost over the same step without offload is

    bound = offloaded_bytes / D2H bandwidth + offloaded_bytes / H2D bandwidth      (per micro-batch)

and the measured overhead (offload step time − same point without offload) against that bound says
whether the copies were all the extra cost (ratio ≈ 1), were partly hidden (< 1) or came with more
(pinned allocations, synchronisation: > 1).  The arithmetic is pure; only :func:`measure` needs CUDA.
"""

from __future__ import annotations

import json
import statistics

MIB = 2**20
DEFAULT_SIZE_BYTES = 256 * MIB
DEFAULT_REPS = 5


def transfer_time_s(nbytes: float, bytes_per_s: float | None) -> float | None:
    """Seconds to move `nbytes` at `bytes_per_s`; None when the bandwidth is unknown."""
    if not bytes_per_s or bytes_per_s <= 0:
        return None
    return nbytes / bytes_per_s


def offload_bound_s(offloaded_bytes: float, d2h_bytes_per_s: float | None, h2d_bytes_per_s: float | None,
                    grad_accum: int = 1) -> float | None:
    """Copy time an offloaded step cannot avoid: D2H in each forward plus H2D in each backward."""
    d2h = transfer_time_s(offloaded_bytes, d2h_bytes_per_s)
    h2d = transfer_time_s(offloaded_bytes, h2d_bytes_per_s)
    if d2h is None or h2d is None:
        return None
    return grad_accum * (d2h + h2d)


def _pair_key(case: dict) -> str:
    """A Case without its offload flag: the offloaded point and its plain twin share this key."""
    return json.dumps({k: v for k, v in case.items() if k != "offload"}, sort_keys=True)


def offload_overheads(records: list[dict], bandwidth: dict | None) -> list[dict]:
    """One row per successful offloaded point that has a successful twin without offload.

    ``bandwidth`` holds ``d2h_bytes_per_s`` and ``h2d_bytes_per_s`` (from :func:`measure`); without it the
    bound and ratio are None and the overhead is still reported.  When a Case was recorded more than once
    (a resumed sweep), the last record wins.
    """
    bandwidth = bandwidth or {}
    latest: dict[str, dict] = {}
    for r in records:
        latest[r["case_id"]] = r
    plain = {_pair_key(r["case"]): r for r in latest.values()
             if r.get("status") == "ok" and not r["case"].get("offload")}
    rows = []
    for r in latest.values():
        case = r["case"]
        if r.get("status") != "ok" or not case.get("offload"):
            continue
        twin = plain.get(_pair_key(case))
        m = r.get("measurement") or {}
        t_off = m.get("step_time_median_s")
        t_base = (twin.get("measurement") or {}).get("step_time_median_s") if twin else None
        overhead = t_off - t_base if (t_off is not None and t_base is not None) else None
        offloaded = m.get("offloaded_bytes")
        bound = None if offloaded is None else offload_bound_s(
            offloaded, bandwidth.get("d2h_bytes_per_s"), bandwidth.get("h2d_bytes_per_s"),
            case.get("grad_accum", 1))
        rows.append({
            "case_id": r["case_id"],
            "twin_case_id": twin["case_id"] if twin else None,
            "strategy": r.get("strategy"),
            "batch_size": case.get("batch_size"),
            "seq_len": case.get("seq_len"),
            "offloaded_bytes": offloaded,
            "step_time_s": t_off,
            "twin_step_time_s": t_base,
            "overhead_s": overhead,
            "bound_s": bound,
            "overhead_over_bound": overhead / bound if (overhead is not None and bound) else None,
        })
    return rows


def measure(size_bytes: int = DEFAULT_SIZE_BYTES, reps: int = DEFAULT_REPS, device: str = "cuda") -> dict:
    """Pinned host↔device copy bandwidth: one warm-up copy each way, then `reps` timed with CUDA events.

    Pinned buffers because that is what ``save_on_cpu(pin_memory=True)`` copies into; the median of the
    reps is reported.  Raises RuntimeError without CUDA (callers check first).
    """
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("host-device bandwidth needs a CUDA device")
    n = size_bytes // 2
    host = torch.empty(n, dtype=torch.bfloat16, pin_memory=True)
    host.fill_(1)
    dev = torch.empty(n, dtype=torch.bfloat16, device=device)
    nbytes = n * 2

    def timed(copy) -> list[float]:
        copy()  # warm-up
        torch.cuda.synchronize()
        pairs = []
        for _ in range(reps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            copy()
            end.record()
            pairs.append((start, end))
        torch.cuda.synchronize()
        return [s.elapsed_time(e) / 1000.0 for s, e in pairs]

    h2d = timed(lambda: dev.copy_(host, non_blocking=True))
    d2h = timed(lambda: host.copy_(dev, non_blocking=True))
    return {
        "size_bytes": nbytes,
        "reps": reps,
        "pinned": True,
        "h2d_times_s": h2d,
        "d2h_times_s": d2h,
        "h2d_bytes_per_s": nbytes / statistics.median(h2d),
        "d2h_bytes_per_s": nbytes / statistics.median(d2h),
    }
