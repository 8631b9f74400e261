"""Precision and loop as a Setup: how suites and commands name them, the ids they keep, and what the
planner says when nothing fits."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ckptbench.point.case import Case, preset
from ckptbench.point.setup import Setup
from ckptbench.point.training import TrainSpec
from ckptbench.suite.keys import SuiteError
from ckptbench.suite.parse import parse_suite
from ckptbench.theory.policy import plan as planner


def _suite(model: str = "", sweep: str = "", train: str = "") -> str:
    return (f'[suite]\nname = "p"\n[model]\npreset = "llama-tiny"\n{model}\n[train]\n{train}\n'
            f"[sweep]\nbatch_size = [2]\nseq_len = [32]\nevery_n_layers = [0, 1]\n{sweep}\n")


def test_a_pure_precision_keeps_the_ids_a_dtype_gave():
    by_dtype = parse_suite(_suite('dtype = "bf16"')).cases
    by_precision = parse_suite(_suite('precision = "bf16"')).cases
    assert [c.id for c in by_dtype] == [c.id for c in by_precision]
    # the id of a Case made with no Setup at all, as every record before the setup existed
    plain = Case(model=by_dtype[0].model, train=TrainSpec(), batch_size=2, seq_len=32)
    assert plain.setup == Setup() and plain.id == by_dtype[0].id


def test_mixed_precision_is_fp32_weights_under_autocast_and_names_itself():
    cases = parse_suite(_suite(sweep='precision = ["fp32", "bf16-mixed"]\nloop = ["manual", "trainer"]')).cases
    assert len(cases) == 2 * 2 * 2
    mixed = [c for c in cases if c.precision == "bf16-mixed"]
    assert all(c.model.dtype == "fp32" and c.setup.autocast == "bf16" for c in mixed)
    assert {c.strategy for c in mixed} == {"none+bf16-mixed", "full+bf16-mixed", "none+bf16-mixed+trainer",
                                           "full+bf16-mixed+trainer"}
    assert len({c.id for c in cases}) == len(cases)
    # bf16-mixed has analytic terms for Llama under the manual loop (test_mixed_estimate.py); other loops
    # are simulated
    assert [c.analytic for c in mixed] == [c.setup.loop == "manual" for c in mixed]
    again = Case.from_dict(mixed[-1].to_dict())
    assert again == mixed[-1] and again.id == mixed[-1].id


@pytest.mark.parametrize("model, sweep, train, key", [
    ('precision = "bf16-mixed"\ndtype = "fp32"', "", "", "model.precision"),
    ('precision = "int8"', "", "", "model.precision"),
    ("", 'precision = ["bf17-mixed"]', "", "sweep.precision"),
    ('dtype = "bf16-mixed"', "", "", "model.dtype"),
    ("", "", 'loop = "lightning"', "train.loop"),
    ("", 'loop = ["manual", "keras"]', "", "sweep.loop"),
])
def test_a_precision_or_loop_that_does_not_exist_is_refused_with_its_key(model, sweep, train, key):
    with pytest.raises(SuiteError) as err:
        parse_suite(_suite(model, sweep, train))
    assert err.value.key == key


def test_sdpa_in_fp32_on_cuda_is_refused_but_bf16_mixed_is_not():
    text = _suite('attn = "sdpa"').replace('name = "p"', 'name = "p"\ndevice = "cuda"')
    with pytest.raises(SuiteError, match="precision bf16-mixed"):
        parse_suite(text)
    cuda = parse_suite(text.replace('attn = "sdpa"', 'attn = "sdpa"\nprecision = "bf16-mixed"')).cases
    assert {c.precision for c in cuda} == {"bf16-mixed"}


def test_a_multi_rank_point_runs_only_its_own_loop():
    cases = parse_suite(_suite(sweep='world_size = [1, 2]\nloop = ["manual", "accelerate"]')).cases
    assert {(c.world_size, c.setup.loop) for c in cases} == {(1, "manual"), (1, "accelerate"), (2, "manual")}


def _h100(memory_gib: float = 80) -> planner.Assumptions:
    return planner.Assumptions(memory_bytes=int(memory_gib * 2**30), device="cuda", device_name="H100",
                               reserved_margin=planner.CUDA_RESERVED_MARGIN, context_bytes=planner.CUDA_CONTEXT_BYTES,
                               peak_flops_per_s=1e15)


def test_nothing_fits_names_the_training_state_and_what_would_shrink_it():
    spec = preset("llama-8b", dtype="fp32", attn="sdpa")
    a, predict = _h100(), planner.Analytic()
    assert not any(o.max_batch for o in planner.plan(spec, 8192, a, predict=predict))
    why = planner.nothing_fits(spec, 8192, a, predict)
    assert "do not fit before a single activation" in why
    for fix in ("FSDP", "LoRA", "Adafactor", "pure bf16"):
        assert fix in why
    weights = predict.params_bytes(Case(model=spec, train=TrainSpec(), batch_size=1, seq_len=8192))
    assert f"Weights {weights / 2**30:.1f} GiB" in why


def test_nothing_fits_names_the_activations_when_the_state_fits():
    spec = preset("llama-1b", dtype="bf16", attn="sdpa")
    a, predict = _h100(16), planner.Analytic()
    seq = 131072
    assert not any(o.max_batch for o in planner.plan(spec, seq, a, predict=predict))
    why = planner.nothing_fits(spec, seq, a, predict)
    assert "and the activations need" in why and "do not fit before" not in why


@pytest.mark.slow
def test_the_commands_default_to_bf16_mixed_and_say_why_the_simulation_answers():
    # bf16-mixed Llama on a CPU has analytic terms; GPT-2's mixed step is simulated, and says so
    out = subprocess.run([sys.executable, "-m", "ckptbench", "estimate", "--model", "llama-tiny", "--batch", "1",
                          "--seq", "64", "--device", "cpu"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "bf16-mixed" in out.stdout and "simulated step" not in out.stdout
    out = subprocess.run([sys.executable, "-m", "ckptbench", "estimate", "--model", "gpt2-tiny", "--batch", "1",
                          "--seq", "64", "--device", "cpu"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "bf16-mixed" in out.stdout and "simulated step" in out.stdout
    pure = subprocess.run([sys.executable, "-m", "ckptbench", "estimate", "--model", "llama-tiny", "--batch", "1",
                           "--seq", "64", "--device", "cpu", "--dtype", "fp32"], capture_output=True, text=True,
                          timeout=300)
    assert pure.returncode == 0 and "simulated step" not in pure.stdout
    both = subprocess.run([sys.executable, "-m", "ckptbench", "estimate", "--model", "llama-tiny", "--batch", "1",
                           "--seq", "64", "--dtype", "fp32", "--precision", "bf16-mixed"], capture_output=True,
                          text=True, timeout=300)
    assert both.returncode == 2 and len(both.stderr.strip().splitlines()) == 1


def test_nothing_fits_names_the_optimizer_step_when_it_is_the_peak():
    # pure bf16 Llama-8B, full AdamW on an 80 GB card: the state fits, but the foreach optimizer step's copy
    # of every parameter does not, at 16 tokens as at 8192: "the activations need", "a shorter sequence"
    # would send the user the wrong way; the per-parameter AdamW is what fits
    spec = preset("llama-8b", dtype="bf16", attn="sdpa")
    a, predict = _h100(79.19), planner.Analytic()
    for seq in (16, 8192):
        assert not any(o.max_batch for o in planner.plan(spec, seq, a, predict=predict))
        why = planner.nothing_fits(spec, seq, a, predict)
        assert "the activations need" not in why and "a shorter sequence," not in why
        assert "the optimizer step needs" in why and "--optimizer adamw-loop" in why
    loop = Setup(optimizer="adamw-loop")
    assert any(o.max_batch for o in planner.plan(spec, 8192, a, predict=predict, setup=loop))
