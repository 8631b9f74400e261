"""Bus bytes: the nccl-tests convention that turns a collective's payload into what a link carries.

A unit convention, not a prediction: the collective probe applies it to the payloads it observes, and
the communication formulas of :mod:`ckptbench.theory.comm.comm` use the same one.  Torch-free.
"""

from __future__ import annotations

from collections.abc import Callable

# op name (as in torch.ops.c10d, trailing underscore dropped) -> bus factor as a function of world size n.
# nccl-tests (doc/PERFORMANCE.md): all-reduce 2(n-1)/n; reduce-scatter and all-gather (n-1)/n of the
# *full* buffer.  Our payload for all-gather is the per-rank input (1/n of the full buffer), so its
# factor is (n-1); for reduce-scatter the input *is* the full buffer, so (n-1)/n.  Broadcast, reduce,
# send/recv move the buffer once: 1.  All-to-all sends (n-1)/n of the input away.  A barrier carries no
# data we account for: 0.
BUS_FACTORS: dict[str, Callable[[int], float]] = {
    "allreduce": lambda n: 2 * (n - 1) / n,
    "allreduce_coalesced": lambda n: 2 * (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "_reduce_scatter_base": lambda n: (n - 1) / n,
    "reduce_scatter_tensor_coalesced": lambda n: (n - 1) / n,
    "allgather": lambda n: float(n - 1),
    "_allgather_base": lambda n: float(n - 1),
    "allgather_coalesced": lambda n: float(n - 1),
    "allgather_into_tensor_coalesced": lambda n: float(n - 1),
    "alltoall": lambda n: (n - 1) / n,
    "alltoall_base": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "gather": lambda n: 1.0,
    "scatter": lambda n: 1.0,
    "send": lambda n: 1.0,
    "recv": lambda n: 1.0,
    "recv_any_source": lambda n: 1.0,
    "barrier": lambda n: 0.0,
    "monitored_barrier": lambda n: 0.0,
}


def bus_bytes(op: str, payload: int, world_size: int) -> float:
    """Payload scaled by the nccl-tests bus factor of `op` (0 for a single rank: nothing moves)."""
    if world_size <= 1:
        return 0.0
    return payload * BUS_FACTORS[op](world_size)
