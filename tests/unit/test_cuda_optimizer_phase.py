"""On CUDA torch's AdamW runs its foreach kernels, whose temporaries (a copy of every parameter) make the
optimizer step the peak of a short step.  The simulation runs that AdamW, so it and the analytic estimate
give one answer where the optimizer phase decides: per Case, and as the plan's largest batches."""

from __future__ import annotations

import pytest

from ckptbench.point.case import Case, preset
from ckptbench.point.training import TrainSpec
from ckptbench.theory.memory.estimate import estimate_case
from ckptbench.theory.memory.simulate import simulate


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("seq", [16, 64])
def test_the_simulated_cuda_optimizer_step_equals_the_analytic_one(dtype, seq):
    spec = preset("llama-small", dtype=dtype, attn="sdpa")
    case = Case(model=spec, train=TrainSpec(), batch_size=1, seq_len=seq, every_n_layers=1, device="cuda")
    est, sim = estimate_case(case), simulate(spec, 1, seq, 1, False, device="cuda")
    assert est.peak_phase == sim.peak_phase == "optimizer"
    assert est.peak_bytes == sim.peak_bytes
    # the foreach temporaries: on a CPU (the per-parameter loop, which holds temporaries of one tensor at a
    # time, the LM head the largest) the same step peaks lower, by most of a copy of the parameters
    cpu = simulate(spec, 1, seq, 1, False, device="cpu")
    assert sim.peak_bytes - cpu.peak_bytes > 0.8 * sim.params_bytes


@pytest.mark.slow
@pytest.mark.e2e
def test_simulated_and_analytic_plans_agree_on_a_card_where_the_optimizer_step_is_the_peak():
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    from ckptbench.theory.memory.extrapolate import Simulated, extrapolation
    from ckptbench.theory.policy.plan import Analytic, Assumptions, plan

    spec, seq = preset("llama-small", dtype="bf16", attn="sdpa"), 32
    single = estimate_case(Case(model=spec, train=TrainSpec(), batch_size=1, seq_len=seq, device="cuda"))
    # a card just big enough for the optimizer step of batch 1 and a few more sequences' activations
    a = Assumptions(memory_bytes=int(single.peak_bytes * 1.2), device="cuda", device_name="H100")
    with ProcessPoolExecutor(max_workers=2, mp_context=get_context("fork")) as pool:
        simulated = Simulated(extrapolation(spec, seq, "cuda", offloads=(False, True), across=False,
                                            mapper=pool.map))
    by_estimate = {(o.every_n_layers, o.offload): o.max_batch for o in plan(spec, seq, a, predict=Analytic())}
    by_simulation = {(o.every_n_layers, o.offload): o.max_batch for o in plan(spec, seq, a, predict=simulated)}
    assert by_estimate == by_simulation
    assert by_estimate[(0, False)] >= 1
