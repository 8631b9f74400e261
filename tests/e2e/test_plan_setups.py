"""The planner's answers for adapters and for sharded state, against runs that really happen on CPU: the
largest batch it allows runs within the budget, and one more does not; and the extrapolated LoRA step it
plans by, against the full simulation of the same depth."""

from __future__ import annotations

import dataclasses
import warnings
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context

import pytest

from ckptbench.point.case import Case, preset
from ckptbench.point.setup import Lora, Setup
from ckptbench.point.strategy import checkpointed_layers
from ckptbench.point.training import TrainSpec
from ckptbench.run.launch import flatten_measurement, run_distributed_cases
from ckptbench.run.sweep import SweepOptions, run_sweep
from ckptbench.store.records import load_records
from ckptbench.suite.parse import load_suite
from ckptbench.theory.comm.fsdp import in_flight_allowance
from ckptbench.theory.memory.extrapolate import Simulated, extrapolation
from ckptbench.theory.memory.simulate import simulate
from ckptbench.theory.policy.plan import Assumptions, ShardedAnalytic, plan

# make test-all only: planner boundaries for LoRA and FSDP by sweep (55 s)
pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing.*:FutureWarning")]
warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)

SEQ = 128
LORA_BUDGET_GIB = 0.03


LORA = Setup(lora=Lora(r=8))


@pytest.fixture(scope="module")
def lora_fit():
    """llama-small with r = 8 adapters, fitted from the few-layer simulations of the peft-wrapped step: what
    the planner sizes it by (built once for the two tests that use it)."""
    with ProcessPoolExecutor(max_workers=2, mp_context=get_context("fork")) as pool:
        return extrapolation(preset("llama-small"), SEQ, "cpu", offloads=(False,), across=False, mapper=pool.map,
                             setup=LORA)


def test_the_planners_extrapolation_of_a_lora_step_equals_its_full_simulation(lora_fit):
    """The planner carries a few-layer simulated step to the full depth; with adapters too, to the byte."""
    spec = preset("llama-small")
    for layers, n, batch in ((8, 0, 2), (9, 3, 3)):
        full = simulate(dataclasses.replace(spec, layers=layers), batch, SEQ, n, setup=LORA)
        peak, moment = lora_fit.fit_for(False, batch, SEQ).peak(layers, checkpointed_layers(layers, n), batch, SEQ)
        assert (peak, moment) == (full.peak_bytes, full.peak_phase)


def test_the_largest_lora_batch_the_planner_allows_is_the_largest_that_fits(tmp_path, write_suite, lora_fit):
    """llama-small with r = 8 adapters, planned from the few-layer simulation of the peft-wrapped step."""
    spec, setup = preset("llama-small"), LORA
    a = Assumptions(int(LORA_BUDGET_GIB * 2**30), "cpu")
    simulated = Simulated(lora_fit)
    options = {o.every_n_layers: o.max_batch for o in plan(spec, SEQ, a, TrainSpec(), predict=simulated, setup=setup)
               if not o.offload}
    checked = {n: options[n] for n in (0, 1)}
    assert all(b >= 1 for b in checked.values()) and checked[1] > checked[0]
    batches = sorted({b + k for b in checked.values() for k in (0, 1)})
    suite = load_suite(write_suite(
        f'[suite]\nname = "plan-lora"\nmemory_budget_gib = {LORA_BUDGET_GIB}\n'
        '[model]\npreset = "llama-small"\nattn = "eager"\n'
        "[train]\nwarmup_steps = 1\nmemory_steps = 1\nsteps = 1\nmax_steps = 1\nlora = { r = 8 }\n"
        f"[sweep]\nbatch_size = {batches}\nseq_len = [{SEQ}]\nevery_n_layers = [0, 1]\n"))
    # only each strategy's predicted maximum and the batch above it are run (not the other strategy's batches)
    wanted = {(n, b + k) for n, b in checked.items() for k in (0, 1)}
    suite = dataclasses.replace(suite, cases=tuple(c for c in suite.cases
                                                   if (c.every_n_layers, c.batch_size) in wanted))
    assert len(suite.cases) == len(wanted) == 4
    run_sweep(suite, SweepOptions(out_dir=str(tmp_path / "run"), calibrate=False))  # statuses only: no timings
    status = {(r["case"]["every_n_layers"], r["case"]["batch_size"]): r["status"]
              for r in load_records(str(tmp_path / "run")).records}
    for n, b in checked.items():
        assert status[(n, b)] == "ok", (n, b, status)
        assert status[(n, b + 1)] == "over_budget", (n, b + 1, status)


def test_the_largest_fsdp_batch_per_rank_the_planner_allows_is_the_largest_that_fits(tmp_path):
    """llama-tiny over two FSDP2 ranks (gloo): the per-rank estimate's largest batch under a budget set
    between its predictions for batch 4 and 5 runs within it on each rank, and batch 5 does not; both
    peaks are the predicted ones."""
    spec, train = preset("llama-tiny"), TrainSpec(warmup_steps=1, memory_steps=1, steps=1)
    predict = ShardedAnalytic(2)

    def case(batch: int) -> Case:
        return Case(model=spec, train=train, batch_size=batch, seq_len=SEQ, world_size=2, setup=Setup(sharding="fsdp"))

    four, five = predict.peak(case(4)), predict.peak(case(5))
    budget = (four + five) // 2
    options = plan(spec, SEQ, Assumptions(budget, "cpu", world=2, sharding="fsdp"), train, predict=predict)
    assert next(o.max_batch for o in options if o.every_n_layers == 0 and not o.offload) == 4
    results = run_distributed_cases([case(4), case(5)], str(tmp_path), 600)
    peaks = []
    for c, r in zip((case(4), case(5)), results):
        assert r["status"] == "ok", r["reason"]
        m = flatten_measurement(c, r["measurement"])
        peaks.append(max(rank["memory"][0]["peak_bytes"] for rank in m["distributed"]["ranks"]))
    assert peaks[0] <= budget < peaks[1], (peaks, budget, four, five)
    # the per-rank estimate is exact on CPU (up to one in-flight reduce-scatter buffer on a loaded machine)
    for peak, predicted, c in zip(peaks, (four, five), (case(4), case(5))):
        assert 0 <= peak - predicted <= in_flight_allowance(c)
