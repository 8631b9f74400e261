"""plan --optimize: the dynamic program over layers against a brute-force search of every layer set."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

from ckptbench.point.case import Case, preset
from ckptbench.point.setup import Setup
from ckptbench.point.training import TrainSpec
from ckptbench.theory.policy import plan as planner
from ckptbench.theory.policy.optimize import HostBudget, optimize, policy_case

GIB = 2**30


class Uneven:
    """A step time that differs per layer (each layer's recompute its own), additive as the step-time model is."""

    source = "test"

    def __init__(self, offload: float = 1.5):
        self.offload = offload  # what offload multiplies a checkpointed layer's cost by

    def __call__(self, case: Case) -> float:
        extra = sum(0.010 + 0.003 * ((7 * i) % 5) for i in case.checkpointed_layers)
        return 0.2 * case.batch_size ** 0.8 + case.batch_size * extra * (self.offload if case.offload else 1.0)


def brute(template: Case, a, predict, timer, modes, host=HostBudget()):
    """Every batch, mode and layer set, each judged whole by the predictor's own peak and the timer."""
    best, L = None, template.model.layers
    for batch in range(1, 64):
        fitted = False
        for mode in modes:
            for k in range(L + 1):
                for layers in itertools.combinations(range(L), k):
                    case = policy_case(template, batch, layers, mode)
                    peak = predict.peak(case)
                    if a.needed(peak) > a.memory_bytes:
                        continue
                    if case.offload and host.refused(predict.offloaded(case)):
                        continue
                    fitted = True
                    key = (a.world * batch * case.seq_len / planner.step_seconds(case, a, predict, timer)[0], -peak)
                    if best is None or key > best[0]:
                        best = (key, batch, layers)
        if not fitted:
            break
    return None if best is None else (best[0][0], -best[0][1], best[1])  # (tokens/s, peak, batch)


def _template(spec, seq, device="cpu", **kw):
    return Case(model=spec, train=TrainSpec(), batch_size=1, seq_len=seq, device=device, **kw)


@pytest.mark.parametrize("model,attn,seq,gib,layers", [
    ("llama-small", "sdpa", 512, 0.09, 5), ("llama-small", "eager", 256, 0.13, 6),
    ("llama-small", "eager", 256, 0.095, 6),  # batch 1 peaks inside the top layer's backward
    ("llama-small", "sdpa", 512, 0.15, 5), ("llama-small", "eager", 128, 0.07, 4), ("qwen2-tiny", "eager", 256, 0.03, 5)])
def test_the_program_finds_what_a_search_of_every_set_finds(model, attn, seq, gib, layers):
    spec = replace(preset(model, attn=attn), layers=layers)
    a = planner.Assumptions(memory_bytes=int(gib * GIB), device="cpu")
    template, timer = _template(spec, seq), Uneven()
    found = optimize(template, a, planner.Analytic(), timer)
    expected = brute(template, a, planner.Analytic(), timer, ("",))
    assert found.best is not None and expected is not None
    # the same optimum: tokens/s, peak and batch (an equally good set may be named where two tie exactly)
    assert (found.best.tokens_per_s, found.best.peak_bytes, found.best.batch) == expected
    assert found.best.checked["peak_agrees"] and found.best.checked["step_additive"]
    assert a.needed(found.best.peak_bytes) <= a.memory_bytes


def test_offload_on_a_card_and_the_host_budget_that_refuses_it():
    spec = replace(preset("llama-small", attn="sdpa"), layers=5)
    template = _template(spec, 2048, device="cuda")
    a = planner.Assumptions(memory_bytes=int(0.13 * GIB), device="cuda", reserved_margin=0.1)
    modes, timer = ("", "offload"), Uneven(offload=1.0)
    free = optimize(template, a, planner.Analytic(), timer, modes)
    expected = brute(template, a, planner.Analytic(), timer, modes)
    assert (free.best.tokens_per_s, free.best.peak_bytes, free.best.batch) == expected
    assert free.best.mode == "offload"
    host = HostBudget(pinned_bytes=free.best.host_bytes - 1)
    held = optimize(template, a, planner.Analytic(), timer, modes, host)
    expected = brute(template, a, planner.Analytic(), timer, modes, host)
    assert (held.best.tokens_per_s, held.best.peak_bytes, held.best.batch) == expected
    assert held.best.tokens_per_s < free.best.tokens_per_s
    assert held.refused and held.refused[0][1].startswith("pinned host memory:")


def test_bf16_mixed_where_the_cast_cache_depends_on_the_count():
    # bf16 autocast over fp32 weights: the forward's moment holds the weight casts of every checkpointed layer
    spec = replace(preset("llama-small", attn="sdpa"), layers=5)
    template = replace(_template(spec, 512), setup=Setup(autocast="bf16"))
    a = planner.Assumptions(memory_bytes=int(0.11 * GIB), device="cpu")
    found = optimize(template, a, planner.Analytic(), Uneven())
    assert (found.best.tokens_per_s, found.best.peak_bytes, found.best.batch) == brute(template, a, planner.Analytic(),
                                                                                         Uneven(), ("",))
    assert found.best.layers


def test_one_fsdp_rank_is_searched_from_its_own_moments():
    # FSDP2 over 2 ranks: each rank's peak is a max over moments with the gathered layers and the
    # reduce-scatter buffers (theory/comm/fsdp.py), and a layer's boundary moment is named by the head's backward
    spec = replace(preset("llama-small", attn="sdpa"), layers=5)
    template = replace(_template(spec, 512, world_size=2), setup=Setup(sharding="fsdp"))
    a = planner.Assumptions(memory_bytes=int(0.08 * GIB), device="cpu", world=2, sharding="fsdp")
    predict, timer = planner.ShardedAnalytic(2), Uneven()
    found = optimize(template, a, predict, timer)
    assert (found.best.tokens_per_s, found.best.peak_bytes, found.best.batch) == brute(template, a, predict, timer,
                                                                                         ("",))
    assert found.best.layers and found.best.checked["peak_agrees"]
