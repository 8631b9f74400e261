"""A deep model's step, extrapolated from 3- and 5-layer simulations, equals its full simulation to the byte.

The planner sizes models without an analytic estimate this way (``ckptbench plan`` on any model type), so
the extrapolation is checked against the thing it stands in for: the FakeTensor simulation of the whole
model, at depths, batches, sequence lengths and checkpointing patterns none of the fitted steps had —
peak, the moment of the peak, and the counted FLOPs with recompute.  And a step that does not add up layer
by layer is refused, not extrapolated.
"""

from __future__ import annotations

import dataclasses
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context

import numpy as np
import pytest

from ckptbench.point.case import ModelSpec, canonical_config, preset
from ckptbench.point.strategy import checkpointed_layers
from ckptbench.theory.memory.extrapolate import (
    NotAffine,
    Observation,
    Simulated,
    SimulationFailed,
    extrapolation,
    fit,
    seq_points,
)
from ckptbench.theory.memory.simulate import simulate
from ckptbench.theory.memory.stacks import layer_kinds

SEQ = 48
# a model with an analytic estimate and one without (qwen3: per-head q/k norms), both small enough to
# simulate deep in a second
LLAMA = preset("llama-small", hidden=128, intermediate=256, heads=4, kv_heads=2, vocab=512)
QWEN3 = preset("qwen3-8b", dtype="bf16", attn="sdpa", hidden=128, intermediate=256, heads=4, kv_heads=2,
               vocab=512, max_positions=4096)


@pytest.fixture(scope="module")
def pool():
    with ProcessPoolExecutor(max_workers=2, mp_context=get_context("fork")) as p:
        yield p


@pytest.fixture(scope="module")
def llama_cuda(pool):
    """Fitted for a CUDA device (offload moves checkpointed inputs off it), batch 1 across lengths."""
    return extrapolation(LLAMA, SEQ, "cuda", mapper=pool.map)


@pytest.fixture(scope="module")
def qwen3_cpu(pool):
    return extrapolation(QWEN3, SEQ, "cpu", offloads=(False,), across=False, mapper=pool.map)


def _full(spec, layers, n, off, batch, seq, device):
    return simulate(dataclasses.replace(spec, layers=layers), batch, seq, n, off, device=device, count_flops=True)


def _hardware(r) -> int:
    f = r.counted_flops
    return f["forward"] + f["backward"] + f["recompute"]


@pytest.mark.parametrize("layers,n,offload,batch,seq", [
    (8, 0, False, 2, SEQ), (8, 1, False, 5, SEQ), (9, 3, True, 4, SEQ), (9, 9, False, 2, SEQ),
    (10, 4, True, 1, SEQ), (9, 2, False, 1, 200), (8, 1, True, 1, 700),  # batch 1 at lengths not fitted
])
@pytest.mark.slow
def test_extrapolated_step_equals_the_full_simulation(llama_cuda, layers, n, offload, batch, seq):
    real = _full(LLAMA, layers, n, offload, batch, seq, "cuda")
    peak, moment = llama_cuda.fit_for(offload, batch, seq).peak(layers, checkpointed_layers(layers, n), batch, seq)
    assert peak == real.peak_bytes
    assert moment.startswith(real.peak_phase) or real.peak_phase == moment.split("-layer-")[0]
    if seq == SEQ:
        got = llama_cuda.fit_for(offload, batch, seq).hardware_flops(layers, checkpointed_layers(layers, n), batch, seq)
        assert got == _hardware(real)


@pytest.mark.slow
@pytest.mark.parametrize("layers,n,batch", [(7, 0, 3), (11, 3, 6), (6, 6, 1), (12, 1, 1)])
def test_a_model_without_an_analytic_estimate_extrapolates_exactly(qwen3_cpu, layers, n, batch):
    real = _full(QWEN3, layers, n, False, batch, SEQ, "cpu")
    predict = qwen3_cpu.fit_for(False, batch, SEQ)
    assert predict.peak(layers, checkpointed_layers(layers, n), batch, SEQ)[0] == real.peak_bytes
    assert predict.hardware_flops(layers, checkpointed_layers(layers, n), batch, SEQ) == _hardware(real)


@pytest.mark.slow
def test_the_planner_predictor_answers_full_depth_cases(qwen3_cpu):
    from ckptbench.point.case import Case
    from ckptbench.point.training import TrainSpec

    deep = dataclasses.replace(QWEN3, layers=10)
    case = Case(model=deep, train=TrainSpec(), batch_size=4, seq_len=SEQ, every_n_layers=3, device="cpu")
    real = _full(QWEN3, 10, 3, False, 4, SEQ, "cpu")
    sim = Simulated(dataclasses.replace(qwen3_cpu, spec=deep))
    assert sim.peak(case) == real.peak_bytes
    total, plain = sim.flops(case)
    assert total == _hardware(real) and plain == _hardware(_full(QWEN3, 10, 0, False, 4, SEQ, "cpu"))
    with pytest.raises(NotAffine):  # not fitted across lengths: batch 1 elsewhere is refused, not guessed
        sim.peak(dataclasses.replace(case, batch_size=1, seq_len=2 * SEQ))


def _synthetic(value) -> list[Observation]:
    """Observations of a made-up model whose moments are `value(L, chosen, b)`."""
    out = []
    steps = [(3, c) for c in ((), (0, 1, 2), (0,), (0, 2))] + [(4, ()), (4, (0, 2))]
    steps += [(5, c) for c in ((), (0, 1, 2, 3, 4), (0,), (0, 2, 4), (0, 3))]
    for layers, chosen in steps:
        for b in (2, 3):
            moments = {"optimizer": [value(layers, chosen, b)]}
            out.append(Observation(layers, frozenset(chosen), b, SEQ, moments, None))
    return out


def test_fit_recovers_an_affine_model_and_refuses_one_that_is_not():
    affine = fit(_synthetic(lambda L, c, b: 1000 + 77 * L + 5 * len(c) + b * (300 + 11 * L)), s_degree=0)
    assert affine.moments(40, range(0, 40, 3), 9, SEQ)["optimizer"] == 1000 + 77 * 40 + 5 * 14 + 9 * (300 + 11 * 40)
    with pytest.raises(NotAffine, match="do not add up"):  # a term in L²: the four-layer check step disagrees
        fit(_synthetic(lambda L, c, b: 1000 + 77 * L * L + b * 300), s_degree=0)


@pytest.mark.slow
def test_real_steps_perturbed_by_a_term_the_layers_do_not_explain_are_refused(qwen3_cpu):
    batched = [o for o in qwen3_cpu.observations if o.batch >= 2]
    assert fit(batched, s_degree=0).coefficients  # as simulated, they fit

    def perturbed(o: Observation) -> Observation:
        extra = o.layers ** 2  # bytes no sum of per-layer pieces gives
        return dataclasses.replace(o, moment_traces={k: [v + extra for v in t] for k, t in o.moment_traces.items()})

    with pytest.raises(NotAffine, match="do not add up"):
        fit([perturbed(o) for o in batched], s_degree=0)


def test_sequence_points_stay_within_the_model_and_number_four():
    assert seq_points(1024, 131072) == [512, 1024, 2048, 4096]
    assert seq_points(2048, 2048) == [256, 512, 1024, 2048]
    assert len(seq_points(16, 16)) < 4  # too short to fit across lengths: batch 1 is fitted at 16 only
    assert np.all(np.diff(seq_points(3000, 8000)) > 0)


def test_a_depth_no_fitted_step_determines_is_refused_not_guessed():
    model = lambda L, c, b: 1000 + 77 * L + 5 * len(c) + b * 300  # noqa: E731
    three_only = fit([o for o in _synthetic(model) if o.layers == 3], s_degree=0)
    assert three_only.moments(3, (0, 2), 5, SEQ)["optimizer"] == model(3, (0, 2), 5)  # inside: answered
    with pytest.raises(NotAffine, match="do not determine"):  # one depth cannot say how depth matters
        three_only.moments(7, (0, 2, 4, 6), 5, SEQ)


class StrictConfigError(Exception):
    """Like a config class's validation error: its __init__ takes fields, so it cannot be unpickled."""

    def __init__(self, field: str, value):
        super().__init__(f"{field}: {value!r} is not allowed")


def refusing_simulate(*args, **kwargs):
    raise StrictConfigError("num_key_value_heads", 3)


def test_a_failing_simulation_in_a_pool_worker_comes_back_with_its_reason():
    with ProcessPoolExecutor(max_workers=2, mp_context=get_context("fork")) as pool:
        with pytest.raises(SimulationFailed) as err:
            extrapolation(preset("llama-tiny"), 64, "cpu", offloads=(False,), simulate=refusing_simulate,
                          mapper=pool.map)
    assert "StrictConfigError: num_key_value_heads: 3 is not allowed" in str(err.value)
    assert "llama-tiny" in str(err.value)


# Stacks of unlike layers, each type's own default pattern (transformers' config classes derive it from the
# depth), with a sliding window shorter than the sequence so sliding and global layers really differ.
WINDOW = 16
STACKS = {
    "gemma3_text": (dict(head_dim=16, sliding_window=WINDOW), 12, "5 x layer_types=sliding_attention, "
                    "1 x layer_types=full_attention, 5 x layer_types=sliding_attention, 1 x layer_types=full_attention"),
    "gemma2": (dict(head_dim=16, query_pre_attn_scalar=16, sliding_window=WINDOW), 8,
               "1 x layer_types=sliding_attention, 1 x layer_types=full_attention, 1 x"),
    "smollm3": ({}, 8, "3 x no_rope_layers=1, 1 x no_rope_layers=0, 3 x no_rope_layers=1, 1 x no_rope_layers=0"),
    "qwen3": (dict(head_dim=16, use_sliding_window=True, sliding_window=WINDOW, max_window_layers=3), 6,
              "3 x layer_types=full_attention, 3 x layer_types=sliding_attention"),
}


def _stack(family: str, attn: str = "eager") -> ModelSpec:
    extra, layers, _ = STACKS[family]
    return ModelSpec(family=family, hidden=64, layers=layers, heads=4, kv_heads=2, intermediate=128, vocab=256,
                     attn=attn, max_positions=1024, config=canonical_config(extra))


@pytest.mark.parametrize("family", sorted(STACKS))
def test_a_stack_of_unlike_layers_is_refused_with_its_pattern(family):
    def never(*args, **kwargs):
        raise AssertionError("refused before any few-layer step is simulated")

    with pytest.raises(NotAffine, match="not all alike") as err:
        extrapolation(_stack(family), 4 * WINDOW, "cpu", offloads=(False,), simulate=never)
    assert STACKS[family][2] in str(err.value)


def test_layer_kinds_follow_the_config_and_one_kind_is_no_pattern():
    assert layer_kinds(_stack("gemma3_text")) == (("layer_types=sliding_attention",) * 5
                                                  + ("layer_types=full_attention",)) * 2
    assert layer_kinds(_stack("gemma2"))[:3] == ("layer_types=sliding_attention", "layer_types=full_attention",
                                                 "layer_types=sliding_attention")
    assert layer_kinds(dataclasses.replace(QWEN3, layers=6)) == ("",) * 6  # all full attention: extrapolated
    # a layer_types list from a config.json, cut to the depth: three sliding layers of a mixed list are alike
    cut = dataclasses.replace(_stack("qwen3"), layers=3, config=canonical_config(
        {"head_dim": 16, "use_sliding_window": True, "sliding_window": WINDOW,
         "layer_types": ["sliding_attention"] * 3 + ["full_attention"] * 3}))
    assert layer_kinds(cut) == ("",) * 3
