"""The communication estimate is exact arithmetic about what accelerate and DDP do: pin it down."""

import sys

import pytest

from ckptbench.measure.bus import bus_bytes
from ckptbench.theory.comm.comm import accelerate_syncs, comm_estimate

P = 723_200  # llama-tiny fp32 parameter bytes
N_TENSORS = 39


def test_module_does_not_import_torch():
    import ckptbench.measure.bus  # noqa: F401
    import ckptbench.theory.comm.comm  # noqa: F401

    # The estimate must stay usable without torch; it imports nothing heavy itself.
    for name in ("ckptbench.theory.comm.comm", "ckptbench.measure.bus"):
        src = open(sys.modules[name].__file__).read()
        assert "import torch" not in src


def test_ddp_moves_gradient_bytes_every_optimizer_step():
    est = comm_estimate(P, P, steps=16, local_sgd_steps=0, world_size=2)
    assert est["allreduce_payload_bytes"] == 16 * P
    assert est["payload_bytes_per_step"] == P
    assert est["allreduce_count"] == 16 and est["syncs"] == 0


def test_ddp_with_accumulation_still_one_allreduce_per_optimizer_step():
    est = comm_estimate(P, P, steps=16, local_sgd_steps=0, world_size=2, grad_accum=2)
    assert est["allreduce_payload_bytes"] == 16 * P


@pytest.mark.parametrize("iterations,k,syncs", [(16, 4, 5), (16, 8, 3), (16, 5, 4), (3, 4, 1), (16, 1, 17)])
def test_accelerate_syncs_every_k_calls_plus_exit(iterations, k, syncs):
    assert accelerate_syncs(iterations, k) == syncs


def test_local_sgd_payload_is_params_times_syncs():
    est = comm_estimate(P, P, steps=16, local_sgd_steps=4, world_size=2, n_param_tensors=N_TENSORS)
    assert est["syncs"] == 5
    assert est["allreduce_payload_bytes"] == 5 * P
    assert est["payload_bytes_per_step"] == 5 * P / 16
    assert est["allreduce_count"] == 5 * N_TENSORS
    assert est["barrier_count"] == 5


def test_local_sgd_counts_micro_batches_under_accumulation():
    # 16 optimizer steps x 2 micro-batches = 32 LocalSGD.step() calls -> 32 // 4 + 1 averagings.
    est = comm_estimate(P, P, steps=16, local_sgd_steps=4, world_size=2, grad_accum=2, n_param_tensors=N_TENSORS)
    assert est["syncs"] == 9


def test_torch_averager_is_one_flat_allreduce_per_sync():
    est = comm_estimate(P, P, steps=16, local_sgd_steps=4, world_size=2, n_param_tensors=N_TENSORS,
                        sync_impl="torch-averager")
    assert est["allreduce_count"] == 5 and est["barrier_count"] == 0
    assert est["allreduce_payload_bytes"] == 5 * P


@pytest.mark.parametrize("n,factor", [(2, 1.0), (4, 1.5), (8, 1.75)])
def test_allreduce_bus_factor_is_nccl_tests_convention(n, factor):
    assert bus_bytes("allreduce", 1000, n) == pytest.approx(1000 * factor)


def test_bus_factors_of_other_collectives():
    assert bus_bytes("allgather", 100, 4) == 300  # payload is the per-rank input: n-1 chunks pass a link
    assert bus_bytes("reduce_scatter", 100, 4) == 75
    assert bus_bytes("broadcast", 100, 4) == 100
    assert bus_bytes("barrier", 0, 4) == 0
    assert bus_bytes("allreduce", 100, 1) == 0


def test_invalid_inputs_are_rejected():
    with pytest.raises(ValueError):
        comm_estimate(P, P, steps=16, local_sgd_steps=4, world_size=1)
    with pytest.raises(ValueError):
        comm_estimate(P, P, steps=0, local_sgd_steps=4, world_size=2)
    with pytest.raises(ValueError):
        comm_estimate(P, P, steps=16, local_sgd_steps=4, world_size=2, sync_impl="nope")


def test_averagings_are_counted_from_the_collectives_seen():
    from ckptbench.train.localsgd import averagings_seen

    def ev(step, op="allreduce", phase="sync"):
        return {"step": step, "op": op, "phase": phase}

    # two parameter tensors averaged at steps 3 and 7 (a barrier each), once more on exit; DDP's
    # backward all-reduces and the barriers are not averagings
    events = [ev(0, phase="backward"), ev(3), ev(3), ev(3, "barrier"), ev(7), ev(7), ev("exit", phase="")]
    assert averagings_seen(events) == 3
    assert averagings_seen([ev(0, phase="backward"), ev(1, phase="backward")]) == 0
