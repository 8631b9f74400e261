"""A CUDA plan's margins as a CUDA run measured them: the allocator's reserve over what it allocated, and
the CUDA context, from that run's records (``plan --from-run``), read as any file in a results folder is."""

from __future__ import annotations

from ...base.finite import finite_number

MAX_DEVICE_BYTES = 2**50  # a PiB: beyond any card's memory, so a figure over it is not one a card measured


def _device_bytes(x) -> bool:
    return finite_number(x) and 0 <= x <= MAX_DEVICE_BYTES


def measured_margins(records: list[dict]) -> tuple[float | None, int | None, int, int]:
    """(reserved-over-allocated margin, CUDA context bytes, points used, points whose figures were left
    out) from a CUDA run's ok records.

    The margin is the largest ``max_memory_reserved / max_memory_allocated − 1`` seen (a plan must fit the
    worst point, not the typical one); the context is the largest NVML-minus-reserved difference the
    meters stated.  None where no record carries the figure.  A run's folder may hold anything: a figure
    that is not a byte count a card could have measured (text, a bool, not finite, negative, over
    :data:`MAX_DEVICE_BYTES`), or a reserve below what was allocated (torch's caching allocator never
    reserves less), is left out and counted, never planned with (a reserve of −1 GB had Llama-8B fit an
    H100 at batch 65,536; 1e300 raised OverflowError).
    """
    margins, contexts, rejected = [], [], 0
    for r in records:
        m = r.get("measurement") or {}
        if r.get("status") != "ok" or (r.get("case") or {}).get("device") != "cuda":
            continue
        allocated, reserved = m.get("cuda_max_allocated_bytes"), m.get("cuda_max_reserved_bytes")
        meters = r.get("meters")
        context = meters.get("cuda_context_bytes") if isinstance(meters, dict) else None
        margin = bad = None
        if allocated is not None or reserved is not None:
            if _device_bytes(allocated) and _device_bytes(reserved) and 0 < allocated <= reserved:
                margin = reserved / allocated - 1
            elif allocated or reserved:  # zeros: a point that allocated nothing says nothing
                bad = True
        if context is not None and not _device_bytes(context):
            # a negative difference is the meters' reading order, skipped as before; anything else is not
            bad = bad or not (finite_number(context) and -MAX_DEVICE_BYTES <= context < 0)
            context = None
        if bad:  # one figure no card measured: none of the record's is planned with
            rejected += 1
            continue
        if margin is not None:
            margins.append(margin)
        if context is not None:
            contexts.append(int(context))
    return (max(margins) if margins else None, max(contexts) if contexts else None,
            max(len(margins), len(contexts)), rejected)
