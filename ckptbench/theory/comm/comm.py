"""How many bytes data-parallel training hands to collectives: pure functions, no torch import.

The estimate and the suite validator must stay importable without torch, and the e2e tests check the
measured counters of :mod:`ckptbench.measure.comm` against these formulas *exactly*, so every rule below is a
statement about what the libraries actually do (accelerate 1.15 ``LocalSGD``, torch DDP, torch's
``PeriodicModelAverager``), not an approximation.

Conventions
-----------
* **payload bytes**: the sum of ``nbytes`` of the tensors a rank hands to a collective as input
  (for in-place collectives such as all-reduce and broadcast, the tensors it passes in).
* **bus bytes**: the payload scaled by the nccl-tests "bus bandwidth" factor, the bytes each rank's
  busiest link carries with a bandwidth-optimal (ring) algorithm, so numbers for different world sizes
  compare.  See :data:`ckptbench.measure.bus.BUS_FACTORS`: a unit convention the probe applies to what
  it sees, so it lives with the probe and is imported here.
"""

from __future__ import annotations

from ...measure.bus import bus_bytes


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
