"""How many bytes data-parallel training hands to collectives: pure functions, no torch import.

The estimate and the suite validator must stay importable without torch, and the e2e tests check the
measured counters of :mod:`ckptbench.comm` against these formulas *exactly*, so every rule below is a
statement about what the libraries actually do (accelerate 1.15 ``LocalSGD``, torch DDP, torch's
``PeriodicModelAverager``), not an approximation.

Conventions
-----------
* **payload bytes**: the sum of ``nbytes`` of the tensors a rank hands to a collective as input
  (for in-place collectives such as all-reduce and broadcast, the tensors it passes in).
* **bus bytes**: the payload scaled by the nccl-tests "bus bandwidth" factor, the bytes each rank's
  busiest link carries with a bandwidth-optimal (ring) algorithm, so numbers for different world sizes
  compare.  See :data:`BUS_FACTORS`.
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


def accelerate_syncs(iterations: int, local_sgd_steps: int) -> int:
    """Parameter averagings accelerate's ``LocalSGD`` performs over `iterations` calls to ``step()``.

    ``LocalSGD.step()`` increments a counter and averages when ``num_steps % K == 0``; ``__exit__``
    averages once more unconditionally, so a run whose length is a multiple of K ends with two
    back-to-back averagings (the second one moves bytes but changes nothing).  The counter counts calls,
    and the documented loop calls ``step()`` once per *micro-batch*: with gradient accumulation A,
    K counts micro-batches, i.e. an averaging every K/A optimizer updates.
    """
    if local_sgd_steps <= 0:
        return 0
    return iterations // local_sgd_steps + 1


def comm_estimate(param_bytes: int, grad_bytes: int, steps: int, local_sgd_steps: int, world_size: int,
                  grad_accum: int = 1, n_param_tensors: int = 0, sync_impl: str = "accelerate") -> dict:
    """All-reduce traffic per rank of `steps` optimizer steps of data-parallel training.

    * ``local_sgd_steps == 0`` (plain DDP): one gradient all-reduce per optimizer step (DDP skips it on
      accumulation micro-batches under ``no_sync``), so ``grad_bytes`` per step, in as many buckets as
      DDP makes (counted as 1 per step here when ``n_param_tensors`` is unknown: the bucket count
      depends on ``bucket_cap_mb``; the tiny test models fit one bucket).
    * ``local_sgd_steps == K > 0``: no gradient all-reduce at all (``LocalSGD`` keeps the model under
      ``no_sync``); ``param_bytes`` per averaging, ``accelerate_syncs(steps * grad_accum, K)`` averagings.
      ``sync_impl="accelerate"`` issues one all-reduce per parameter tensor plus one barrier per
      averaging; ``"torch-averager"`` (``PeriodicModelAverager``) issues one flattened all-reduce.
      Our torch-averager loop uses the same schedule (including the exit averaging) so the two differ
      only in how an averaging is carried out.

    Returns payload and bus bytes per rank (total and per optimizer step), the number of averagings
    and the expected all-reduce and barrier counts.
    """
    if steps <= 0:
        raise ValueError("steps must be positive")
    if world_size < 2:
        raise ValueError("data-parallel communication needs world_size >= 2")
    if sync_impl not in ("accelerate", "torch-averager"):
        raise ValueError(f"unknown sync_impl {sync_impl!r}")
    iterations = steps * grad_accum
    if local_sgd_steps == 0:
        syncs = 0
        payload = grad_bytes * steps
        allreduces = steps
        barriers = 0
    else:
        syncs = accelerate_syncs(iterations, local_sgd_steps)
        payload = param_bytes * syncs
        per_sync = n_param_tensors if sync_impl == "accelerate" else 1
        allreduces = per_sync * syncs
        barriers = syncs if sync_impl == "accelerate" else 0
    bus = bus_bytes("allreduce", payload, world_size)
    return {
        "syncs": syncs,
        "allreduce_payload_bytes": payload,
        "allreduce_bus_bytes": bus,
        "payload_bytes_per_step": payload / steps,
        "bus_bytes_per_step": bus / steps,
        "allreduce_count": allreduces,
        "barrier_count": barriers,
    }
