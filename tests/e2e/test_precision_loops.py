"""Mixed precision and the Trainer / Accelerate loops, measured on CPU against the simulation of the same
step, to the byte; the differences between the loops named and measured one by one; and the checks shown
to fail when the simulation leaves out what mixed precision or a loop adds."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from ckptbench.point.case import Case, preset
from ckptbench.point.setup import PRECISIONS, Setup
from ckptbench.point.training import TrainSpec
from ckptbench.run.worker import measure
from ckptbench.theory.memory.loop_step import LoopStep
from ckptbench.theory.memory.simulate import simulate
from ckptbench.theory.verdicts.annotate import annotate_record
from tests.conftest import covering

# each point builds its Accelerator from no state, as the sweep's worker process does (in whatever order)
pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("fresh_accelerate")]

QUANTITIES = ("params_bytes", "optimizer_bytes", "mem_after_forward_bytes", "activations_after_forward_bytes",
              "peak_bytes", "peak_phase", "checkpointed_input_bytes")
STRATEGIES = ((0, False), (2, False), (1, False), (1, True))  # none, every-2, full, full+offload


def _case(name: str, precision: str, loop: str, every_n: int, offload: bool = False, batch: int = 2,
          seq: int = 32) -> Case:
    dtype, autocast = PRECISIONS[precision]
    return Case(model=preset(name, dtype=dtype, attn="sdpa"), train=TrainSpec(warmup_steps=1, steps=1),
                batch_size=batch, seq_len=seq, every_n_layers=every_n, offload=offload,
                setup=Setup(autocast=autocast, loop=loop))


def _simulated(case: Case, setup: Setup | None = None, dtype: str | None = None):
    model = replace(case.model, dtype=dtype) if dtype else case.model
    return simulate(model, case.batch_size, case.seq_len, case.every_n_layers, case.offload,
                    setup=case.setup if setup is None else setup)


def _record(case: Case, m: dict) -> dict:
    record = {"status": "ok", "measurement": m}
    annotate_record(case, record)
    return record


GRID = [(name, "bf16-mixed", loop, n, off) for name in ("llama-tiny", "qwen2-tiny", "gpt2-tiny")
        for loop in ("manual", "trainer", "accelerate") for n, off in STRATEGIES]
GRID += [("llama-tiny", "fp32", loop, n, off) for loop in ("trainer", "accelerate") for n, off in STRATEGIES]


@pytest.mark.parametrize("point", covering(GRID, unpack=False), ids=lambda p: "-".join(map(str, p)))
def test_measured_step_equals_the_simulated_one_to_the_byte(point):
    case = _case(*point)
    m = measure(case)
    sim = _simulated(case).to_dict()
    for q in QUANTITIES:
        assert m[q] == sim[q], (q, m[q], sim[q])
    assert m["peak_breakdown"] == sim["peak_breakdown"]
    assert m["precision"] == point[1] and m["loop"] == point[2]
    record = _record(case, m)  # judged as a sweep judges it: by the analytic estimate where it has mixed
    # terms (bf16-mixed Llama / Qwen2, the manual loop), else by the worker's own simulation
    source = "analytic" if case.analytic else "simulation"
    failed = [c for c in record["checks"] if c["verdict"] != "pass"]
    assert record["estimate_source"] == source and record["verdict"] == "pass", (failed, record["gates"],
                                                                                 record["meters"])
    if case.analytic:
        est = record["estimate"]
        for q in ("mem_after_forward_bytes", "activations_after_forward_bytes", "peak_phase"):
            assert m[q] == est[q], (q, m[q], est[q])
        # exact, the optimizer step included (the per-parameter AdamW's moment: theory/memory/params.py loop_step)
        assert m["peak_bytes"] == est["peak_bytes"]


def test_mixed_precision_keeps_fp32_master_weights_and_state():
    m = measure(_case("llama-tiny", "bf16-mixed", "manual", 1))
    pure = measure(_case("llama-tiny", "fp32", "manual", 1))
    assert m["params_bytes"] == pure["params_bytes"] and m["optimizer_bytes"] == pure["optimizer_bytes"]
    # what autocast changes is the activations: bf16 copies beside an fp32 residual stream
    assert m["activations_after_forward_bytes"] != pure["activations_after_forward_bytes"]
    assert m["checkpointed_input_bytes"] == pure["checkpointed_input_bytes"]  # the residual stream stays fp32


def test_a_simulation_without_autocast_or_with_bf16_gradients_fails_the_check():
    case = _case("gpt2-tiny", "bf16-mixed", "manual", 2)  # no analytic mixed terms: the simulation judges it
    assert not case.analytic
    m = measure(case)
    assert _record(case, m)["verdict"] == "pass"
    for wrong in (_simulated(case, setup=Setup()),  # the cast cache and bf16 activations left out
                  _simulated(case, dtype="bf16")):  # gradients and optimizer state counted in bf16
        record = _record(case, {**m, "simulation": wrong.to_dict()})
        assert record["verdict"] == "fail"


def test_a_trainer_step_against_the_manual_loops_simulation_is_off_by_the_named_terms():
    b, s = 2, 32
    case = _case("llama-tiny", "bf16-mixed", "trainer", 0, batch=b, seq=s)
    m = measure(case)
    manual = _simulated(case, setup=replace(case.setup, loop="manual"))
    checks = {c["quantity"]: c for c in _record(case, {**m, "simulation": manual.to_dict()})["checks"]}
    # labels, the token count and the running loss (below)
    assert checks["mem_after_forward_bytes"]["difference"] == 8 * b * s + 4 + 4


# --- the differences between the loops, one by one ---------------------------------------------------

def test_trainer_keeps_the_collators_labels_the_token_count_and_its_running_loss_beside_the_batch():
    """Trainer's collator gives labels a tensor of their own (8·b·s bytes); the loss is divided by
    num_items_in_batch, an fp32 scalar made before the step that the division saves; and the step's loss
    is added into the running loss (an fp32 scalar the Trainer made before the first step): 8·b·s + 8."""
    b, s = 3, 32
    manual = measure(_case("llama-tiny", "fp32", "manual", 0, batch=b, seq=s))
    trainer = measure(_case("llama-tiny", "fp32", "trainer", 0, batch=b, seq=s))
    assert trainer["mem_after_forward_bytes"] - manual["mem_after_forward_bytes"] == 8 * b * s + 4 + 4


def test_accelerate_divides_the_loss_inside_backward():
    """The manual loop divides the loss by the accumulation steps in the forward and keeps only the
    quotient; Accelerator.backward divides the loss the loop still holds: one fp32 scalar more through
    the backward, nothing more after the forward."""
    manual = measure(_case("llama-tiny", "fp32", "manual", 0, batch=3))
    acc = measure(_case("llama-tiny", "fp32", "accelerate", 0, batch=3))
    assert acc["mem_after_forward_bytes"] == manual["mem_after_forward_bytes"]
    assert manual["peak_phase"] == acc["peak_phase"] == "backward-head"
    assert acc["peak_bytes"] - manual["peak_bytes"] == 4


def test_trainers_two_parameter_groups_move_the_optimizer_peak(monkeypatch):
    """Trainer gives AdamW a weight-decay group and a no-decay group (norms, biases).  The single-tensor
    AdamW frees a parameter's ``denom`` only when the next one's replaces it, so the parameter before the
    largest (the untied LM head) adds its size: the manual loop's single group has the final norm there
    (h elements), the Trainer's decay group the last layer's down projection (h·i)."""
    spec = preset("llama-tiny")
    h, i = spec.hidden, spec.intermediate
    b, s = 1, 32
    case = _case("llama-tiny", "fp32", "trainer", 0, batch=b, seq=s)
    trainer = measure(case)
    assert trainer["peak_phase"] == "optimizer"
    two_groups = _simulated(case)
    monkeypatch.setattr(LoopStep, "optimizer", lambda self, model, lr: torch.optim.AdamW(model.parameters(), lr=lr))
    one_group = _simulated(case)
    assert trainer["peak_bytes"] == two_groups.peak_bytes
    assert two_groups.peak_bytes - one_group.peak_bytes == 4 * (h * i - h)


def test_fp16_mixed_is_unsupported_on_cpu_in_every_loop():
    from ckptbench.run.worker import Unsupported

    for loop in ("manual", "trainer", "accelerate"):
        with pytest.raises(Unsupported, match="fp16 mixed precision is not run on CPU"):
            measure(_case("llama-tiny", "fp16-mixed", loop, 0))


def test_fp16_mixed_simulates_fp32_state_and_its_scaler():
    """The simulation of fp16-mixed (for CUDA plans): fp32 master weights and state as bf16-mixed, the
    gradient scaler's unscale and step run on fake tensors."""
    fp16 = _simulated(_case("llama-tiny", "fp16-mixed", "manual", 1))
    bf16 = _simulated(_case("llama-tiny", "bf16-mixed", "manual", 1))
    assert (fp16.params_bytes, fp16.optimizer_bytes) == (bf16.params_bytes, bf16.optimizer_bytes)
    assert fp16.peak_phase == bf16.peak_phase


@pytest.mark.parametrize("loop", ["manual", "accelerate", "trainer"])
@pytest.mark.parametrize("grad_accum", [2, 3])
def test_gradient_accumulation_is_simulated_micro_batch_by_micro_batch_to_the_byte(loop, grad_accum):
    """Every micro-batch of the optimizer step is simulated: the later ones start with all the gradients
    the first made (the peak moves to the last layer's backward, full checkpointing), the Trainer fetches
    every micro-batch before the first forward, Accelerate's and the Trainer's loops keep each loss."""
    case = replace(_case("llama-tiny", "fp32", loop, 1, seq=64), grad_accum=grad_accum)
    m = measure(case)
    sim = simulate(case.model, case.batch_size, case.seq_len, 1, setup=case.setup, grad_accum=grad_accum)
    assert {q: m[q] for q in QUANTITIES} == {q: getattr(sim, q) for q in QUANTITIES}
    one = simulate(case.model, case.batch_size, case.seq_len, 1, setup=case.setup)
    assert sim.peak_bytes > one.peak_bytes  # what one micro-batch's simulation left out
