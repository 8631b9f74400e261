"""Host↔device copy bandwidth, and what it implies for offloaded checkpointing.

transformers' offload wraps each checkpointed layer in ``save_on_cpu(pin_memory=True)``: every tensor
packed for backward is copied device→host during forward and host→device during backward, on the compute
stream.  So the least an offloaded step can cost over the same step without offload is

    bound = offloaded_bytes / D2H bandwidth + offloaded_bytes / H2D bandwidth      (per micro-batch)

and the measured overhead (offload step time − same point without offload) against that bound says
whether the copies were all the extra cost (ratio ≈ 1), were partly hidden (< 1) or came with more
(pinned allocations, synchronisation: > 1).  The arithmetic is pure; the bandwidth itself is measured by :mod:`ckptbench.measure.calibrate`.
"""

from __future__ import annotations


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
