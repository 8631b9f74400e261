"""The optimizers of ``Setup.optimizer``: built as their users build them, their state and step predicted.

- the Trainer loop asks ``TrainingArguments`` for the same optimizer :func:`build_optimizer` builds, as
  Trainer's own ``get_optimizer_cls_and_kwargs`` resolves it;
- each optimizer's state, counted from the parameter shapes of the model transformers builds (not from any
  optimizer), equals what the simulation's optimizer creates, and the analytic estimate's where it has one;
- the analytic estimate equals the simulated step to the byte for SGD and the foreach AdamW, and the
  foreach AdamW's optimizer step costs the loop's two largest tensors less, one copy of every parameter more;
- a deep SGD / Adafactor step extrapolated from few-layer simulations equals the full simulation.
"""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch

from ckptbench.point.case import Case, analytic_point, preset
from ckptbench.point.setup import Setup
from ckptbench.point.strategy import checkpointed_layers
from ckptbench.point.training import TrainSpec
from ckptbench.theory.memory.estimate import estimate
from ckptbench.theory.memory.extrapolate import extrapolation
from ckptbench.theory.memory.params import param_count
from ckptbench.theory.memory.simulate import simulate
from ckptbench.train.models import build_model
from ckptbench.train.optimizers import build_optimizer, describe_optimizer, optimizer_refusal, trainer_choice

BUILT = ("adamw", "adamw-foreach", "adamw-loop", "adamw-fused", "sgd", "adafactor")


@functools.cache
def simulated(name: str, dtype: str, optimizer: str, every_n: int = 0, batch: int = 1, seq: int = 16,
              autocast: str = ""):
    return simulate(preset(name, dtype=dtype, attn="sdpa"), batch, seq, every_n,
                    setup=Setup(optimizer=optimizer, autocast=autocast))


def _shapes(name: str) -> list[tuple[tuple[int, ...], int]]:
    """(shape, element bytes) of each parameter tensor of the model transformers builds, on meta."""
    with torch.device("meta"):
        model = build_model(preset(name, attn="sdpa"), device="meta")
    return [(tuple(p.shape), p.element_size()) for p in model.parameters()]


def _state_from_shapes(name: str, optimizer: str, dtype: str) -> int:
    """The state each optimizer's first step leaves, from the shapes alone (its documented layout)."""
    b = {"fp32": 4, "bf16": 2}[dtype]
    total = 0
    for shape, _ in _shapes(name):
        n = 1
        for d in shape:
            n *= d
        if optimizer.startswith("adamw"):  # exp_avg, exp_avg_sq like the param; an fp32 step scalar
            total += 2 * n * b + 4
        elif optimizer == "sgd":  # the momentum buffer, like the param
            total += n * b
        elif optimizer == "adafactor":  # fp32 row and column second moments, or the full one for 1-D; RMS
            total += 4 * (_rows_cols(shape) if len(shape) >= 2 else n) + 4
    return total


def _rows_cols(shape: tuple[int, ...]) -> int:
    """Adafactor's factored second moment: one value per row (all but the last dimension) and per column
    (all but the second last)."""
    rows, cols = 1, 1
    for d in shape[:-1]:
        rows *= d
    for d in shape[:-2] + shape[-1:]:
        cols *= d
    return rows + cols


@pytest.mark.parametrize("optimizer", BUILT)
def test_trainer_asks_for_the_optimizer_the_other_loops_build(tmp_path, optimizer):
    from transformers import Trainer

    from ckptbench.train.loops import training_arguments

    case = Case(model=preset("llama-tiny"), train=TrainSpec(lr=3e-4), batch_size=1, seq_len=8,
                setup=Setup(loop="trainer", optimizer=optimizer))
    args, cls_and_kwargs = trainer_choice(case.setup, case.train.lr)
    if cls_and_kwargs is None:  # through TrainingArguments(optim=..., optim_args=...), as Trainer resolves it
        cls, kwargs = Trainer.get_optimizer_cls_and_kwargs(training_arguments(case, str(tmp_path), 1))
    else:  # Trainer(optimizer_cls_and_kwargs=...): the foreach choice optim cannot express
        assert optimizer in ("adamw-foreach", "adamw-loop")
        cls, kwargs = cls_and_kwargs
    params = [torch.nn.Parameter(torch.zeros(2, 3))]
    theirs, ours = cls(params, **kwargs), build_optimizer(optimizer, params, 3e-4)
    assert type(theirs) is type(ours) and theirs.defaults == ours.defaults
    assert describe_optimizer(ours)["settings"]["lr"] == 3e-4


def test_the_record_names_the_implementation_that_runs():
    params = [torch.nn.Parameter(torch.zeros(4))]
    assert describe_optimizer(build_optimizer("adamw", params, 1e-3))["implementation"] == "loop"  # CPU default
    assert describe_optimizer(build_optimizer("adamw-foreach", params, 1e-3))["implementation"] == "foreach"
    assert describe_optimizer(build_optimizer("sgd", params, 1e-3)) == {
        "class": "torch.optim.sgd.SGD", "param_groups": 1, "params": 1, "implementation": "loop",
        "settings": torch.optim.SGD(params, lr=1e-3, momentum=0.9).defaults}


def test_a_model_is_optimised_over_its_trainable_parameters_only():
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 2))
    model[0].requires_grad_(False)
    opt = build_optimizer("sgd", model, 0.1)
    assert [p for g in opt.param_groups for p in g["params"]] == list(model[1].parameters())


def test_8bit_adamw_is_refused_where_bitsandbytes_is_missing():
    import importlib.util

    reason = optimizer_refusal(Setup(optimizer="adamw-8bit"))
    if importlib.util.find_spec("bitsandbytes") is None:
        assert "bitsandbytes is not installed" in reason
    else:
        assert reason is None
    assert all(optimizer_refusal(Setup(optimizer=o)) is None for o in BUILT)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("optimizer", BUILT)
def test_state_bytes_from_the_parameter_shapes(optimizer, dtype):
    expected = _state_from_shapes("llama-tiny", optimizer, dtype)
    assert simulated("llama-tiny", dtype, optimizer).optimizer_bytes == expected
    spec = preset("llama-tiny", dtype=dtype, attn="sdpa")
    if analytic_point(spec, Setup(optimizer=optimizer)):
        assert estimate(spec, 1, 16, optimizer=optimizer).optimizer_bytes == expected
    else:  # their step's temporaries are not derived: the simulation runs the optimizer itself
        assert optimizer in ("adafactor", "adamw-fused")


def test_state_sizes_relative_to_the_weights():
    """AdamW keeps twice the weights, SGD once, Adafactor rows + columns: ~3 % of llama-tiny's weights."""
    params = simulated("llama-tiny", "fp32", "sgd").params_bytes
    sgd, adamw = simulated("llama-tiny", "fp32", "sgd"), simulated("llama-tiny", "fp32", "adamw")
    adafactor = simulated("llama-tiny", "fp32", "adafactor")
    n = len(_shapes("llama-tiny"))
    assert adamw.optimizer_bytes == 2 * sgd.optimizer_bytes + 4 * n
    assert adafactor.optimizer_bytes < 0.05 * params


def test_analytic_points():
    spec = preset("llama-tiny", attn="sdpa")
    for optimizer in ("adamw", "adamw-loop", "adamw-foreach", "sgd"):
        assert analytic_point(spec, Setup(optimizer=optimizer))
        assert analytic_point(spec, Setup(optimizer=optimizer, autocast="bf16"))
    for optimizer in ("adafactor", "adamw-8bit"):
        assert not analytic_point(spec, Setup(optimizer=optimizer))
    assert not analytic_point(spec, Setup(optimizer="sgd", loop="trainer"))
    with pytest.raises(ValueError, match="estimated by its simulation"):
        estimate(spec, 1, 16, optimizer="adafactor")


# (preset, dtype, every_n, batch, seq, autocast): the optimizer step is the peak at a few tokens, a layer's
# or the head's backward elsewhere
POINTS = [("llama-tiny", "fp32", 0, 1, 16, ""), ("llama-tiny", "fp32", 1, 2, 32, ""),
          ("llama-tiny", "fp32", 0, 2, 32, "bf16"), ("llama-tiny", "bf16", 2, 2, 64, ""),
          ("qwen2-tiny", "fp32", 0, 1, 16, ""), ("gpt2-tiny", "fp32", 1, 1, 16, ""),
          ("llama-tiny", "fp32", 1, 1, 512, "")]


@pytest.mark.parametrize("optimizer", ["sgd", "adamw-foreach"])
@pytest.mark.parametrize("point", POINTS, ids=lambda p: "-".join(map(str, p)))
def test_the_estimate_equals_the_simulated_step_to_the_byte(optimizer, point):
    name, dtype, every_n, batch, seq, autocast = point
    sim = simulated(name, dtype, optimizer, every_n, batch, seq, autocast)
    est = estimate(preset(name, dtype=dtype, attn="sdpa"), batch, seq, every_n, autocast=autocast,
                   optimizer=optimizer)
    assert (sim.peak_phase, sim.peak_bytes) == (est.peak_phase, est.peak_bytes)
    assert sim.peak_breakdown == est.peak_breakdown
    assert sim.mem_after_forward_bytes == est.mem_after_forward_bytes


def test_foreach_holds_a_copy_of_every_parameter_where_the_loop_holds_two_of_the_largest():
    """``torch._foreach_sqrt`` of all the ``exp_avg_sq`` at once lives until the update: one copy of the
    parameters (P·4 bytes).  The per-parameter loop's ``exp_avg_sq.sqrt() / bias_correction2_sqrt`` holds
    two copies of one tensor, the largest (the V·h head), with the denominator of the parameter before it
    (the final norm, h) not yet replaced."""
    spec = preset("llama-tiny", attn="sdpa")
    shapes = [s for s, _ in _shapes("llama-tiny")]
    numel = [torch.Size(s).numel() for s in shapes]
    P, largest = sum(numel), max(numel)
    assert (P, largest) == (param_count(spec).total, spec.vocab * spec.hidden)
    loop, foreach = simulated("llama-tiny", "fp32", "adamw-loop"), simulated("llama-tiny", "fp32", "adamw-foreach")
    assert loop.peak_phase == foreach.peak_phase == "optimizer"
    assert foreach.peak_bytes - loop.peak_bytes == 4 * P - (2 * 4 * largest + 4 * spec.hidden)
    assert foreach.peak_breakdown["activations"] == 4 * P + 8 * 16  # beside the batch's ids
    assert simulated("llama-tiny", "fp32", "adamw").peak_bytes == loop.peak_bytes  # torch's CPU choice


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", ["sgd", "adafactor"])
def test_extrapolated_step_equals_the_full_simulation(optimizer):
    """SGD allocates nothing in its step (no optimizer moment to fit); Adafactor's per-parameter loop runs
    more ops the deeper the model (its maximum is fitted)."""
    spec = preset("llama-small", hidden=64, intermediate=128, heads=2, kv_heads=1, vocab=256)
    setup, seq = Setup(optimizer=optimizer), 16
    ex = extrapolation(spec, seq, "cpu", offloads=(False,), across=False, setup=setup)
    for layers, n, batch in ((8, 0, 2), (9, 3, 3)):
        full = simulate(dataclasses.replace(spec, layers=layers), batch, seq, n, setup=setup)
        peak, moment = ex.fit_for(False, batch, seq).peak(layers, checkpointed_layers(layers, n), batch, seq)
        assert peak == full.peak_bytes, (layers, n, batch, moment, full.peak_phase)


@pytest.mark.parametrize("name, tied", [("llama-tiny", False), ("llama-tiny", True), ("qwen2-tiny", False),
                                        ("gpt2-tiny", True), ("gpt2-tiny", False)])
def test_the_parameter_order_is_the_built_models(name, tied):
    """The per-parameter AdamW visits ``model.parameters()`` in order, so its largest moment depends on which
    parameter comes before the largest: the order the estimate assumes is the one transformers builds."""
    from ckptbench.theory.memory.params import loop_step_elements, tensor_sizes

    spec = dataclasses.replace(preset(name, attn="sdpa"), tie_embeddings=tied)
    with torch.device("meta"):
        model = build_model(spec, device="meta")
    built = [p.numel() for p in model.parameters()]
    assert tensor_sizes(spec) == built
    pc = param_count(spec)
    assert (sum(built), len(built), max(built)) == (pc.total, pc.n_tensors, pc.largest_tensor)
    assert pc.loop_step == loop_step_elements(built)
    if name == "gpt2-tiny":  # the position table (1,024 rows) is the largest, right after the token embedding
        assert pc.loop_step == 2 * spec.max_positions * spec.hidden + spec.vocab * spec.hidden
