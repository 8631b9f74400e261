"""The verdicts a record gets: estimate checks per quantity, and a training step that produced NaN."""

from __future__ import annotations

from ckptbench.point.case import Case, preset
from ckptbench.point.training import Timing, TrainSpec
from ckptbench.run.worker import measure
from ckptbench.theory.verdicts.annotate import annotate_record


def _record(case: Case, measurement: dict, status: str = "ok") -> dict:
    return {"status": status, "measurement": measurement}


def test_a_real_tiny_point_passes_every_check():
    case = Case(model=preset("llama-tiny"), train=TrainSpec(steps=1), batch_size=2, seq_len=32, every_n_layers=2)
    record = _record(case, measure(case))
    annotate_record(case, record)
    assert record["verdict"] == "pass"
    by = {c["quantity"]: c for c in record["checks"]}
    assert by["checkpointed_input_bytes"]["measured"] == 2 * 2 * 32 * 64 * 4
    assert record["gates"] == {"nonfinite_losses": 0, "meters_disagree": 0}
    assert record["meters"]["agreement"] == "agree"
    # every prediction was judged against an observation, and held
    for quantity in ("peak_bytes", "peak_phase", "peak_breakdown.grads", "peak_breakdown.activations",
                     "checkpointed_layers", "recomputed_layers", "saved_bytes", "hardware_flops", "recompute_flops", "attention_kernel",
                     "config", "params_from_config"):
        assert by[quantity]["verdict"] == "pass", by[quantity]


def test_non_finite_losses_fail_the_record():
    # seq_len 1 leaves a causal LM nothing to predict: the loss is NaN (suites refuse it; measure() does not)
    case = Case(model=preset("llama-tiny"), train=TrainSpec(steps=1, timing=Timing(max_steps=1)), batch_size=2,
                seq_len=1)
    record = _record(case, measure(case))
    annotate_record(case, record)
    assert record["verdict"] == "fail"
    assert record["gates"] == {"nonfinite_losses": 2, "meters_disagree": 0}  # the warm-up step and the timed step


def test_a_record_with_nothing_judged_is_unchecked_not_passed():
    # finite losses are a gate, not a prediction: with every check skipped there is nothing to pass
    case = Case(model=preset("llama-tiny"), train=TrainSpec(), batch_size=1, seq_len=8)
    record = _record(case, {"losses": [5.5, 5.4]})
    annotate_record(case, record)
    assert {c["verdict"] for c in record["checks"]} == {"skip"}
    assert record["verdict"] == "unchecked"


def test_failed_points_are_not_checked():
    case = Case(model=preset("llama-tiny"), train=TrainSpec(), batch_size=1, seq_len=8)
    record = _record(case, {}, status="crash")
    annotate_record(case, record)
    assert record["verdict"] == "skip" and "checks" not in record


def test_sdpa_that_fell_back_to_separate_matmuls_fails():
    from ckptbench.theory.verdicts.checks import attention_kernel_check

    sdpa = Case(model=preset("llama-tiny", attn="sdpa"), train=TrainSpec(), batch_size=1, seq_len=8)
    assert attention_kernel_check(sdpa, {"attention_kernels": []}).verdict == "fail"
    assert attention_kernel_check(sdpa, {"attention_kernels": ["_scaled_dot_product_flash_attention"]}).verdict == "pass"
    eager = Case(model=preset("llama-tiny"), train=TrainSpec(), batch_size=1, seq_len=8)
    assert attention_kernel_check(eager, {"attention_kernels": []}).verdict == "pass"
    assert attention_kernel_check(eager, {}).verdict == "skip"


def test_the_attention_implementation_is_judged_by_the_kernels_that_ran():
    """The built config's attention is what the builder was told: only the kernels are independent."""
    from ckptbench.theory.verdicts.checks import attention_implementation_check

    fused = ["_scaled_dot_product_flash_attention_for_cpu"]
    sdpa = Case(model=preset("gemma2-2b", attn="sdpa", layers=2), train=TrainSpec(), batch_size=1, seq_len=8)
    eager = Case(model=preset("gemma2-2b", attn="eager", layers=2), train=TrainSpec(), batch_size=1, seq_len=8)
    # the config echoes the request, the kernels contradict it
    assert attention_implementation_check(sdpa, {"attn_implementation": "sdpa", "attention_kernels": []}).verdict == "fail"
    bad = attention_implementation_check(eager, {"attn_implementation": "eager", "attention_kernels": fused})
    assert bad.verdict == "fail" and bad.measured == "sdpa"
    assert attention_implementation_check(sdpa, {"attn_implementation": "sdpa", "attention_kernels": fused}).verdict == "pass"
    assert attention_implementation_check(eager, {"attn_implementation": "eager", "attention_kernels": []}).verdict == "pass"
    # a config that says otherwise fails too; with no kernels recorded there is nothing independent: skip
    assert attention_implementation_check(sdpa, {"attn_implementation": "eager", "attention_kernels": fused}).verdict == "fail"
    assert attention_implementation_check(sdpa, {"attn_implementation": "sdpa"}).verdict == "skip"


def test_sdpa_with_attention_dropout_may_run_its_math_path_and_nothing_else_may():
    """Training with attention dropout sends sdpa to torch's math path (no fused kernel): still the sdpa the
    Case asked for.  Dropout elsewhere (residual, embedding) explains nothing."""
    from ckptbench.theory.verdicts.checks import attention_implementation_check

    sdpa = Case(model=preset("gemma2-2b", attn="sdpa", layers=2), train=TrainSpec(), batch_size=1, seq_len=8)
    eager = Case(model=preset("gemma2-2b", attn="eager", layers=2), train=TrainSpec(), batch_size=1, seq_len=8)
    math = {"attn_implementation": "sdpa", "attention_kernels": [], "dropout": {"attention_dropout": 0.1}}
    check = attention_implementation_check(sdpa, math)
    assert check.verdict == "pass" and "math path" in check.difference
    residual_only = {**math, "dropout": {"attention_dropout": 0.0, "residual_dropout": 0.1}}
    assert attention_implementation_check(sdpa, residual_only).verdict == "fail"
    assert attention_implementation_check(eager, {**math, "attn_implementation": "eager"}).verdict == "pass"


def test_a_bound_of_whole_bytes_is_met_at_the_bound():
    """The FSDP params check allows one unsharded layer either way: 73,984 B over 427,328 B is at the bound,
    though (501,312 / 427,328) − 1 exceeds 73,984 / 427,328 in floating point (seen in CI)."""
    from ckptbench.theory.verdicts.checks import judge

    assert (501_312 / 427_328) - 1 > 73_984 / 427_328
    assert judge("peak_breakdown.params", 501_312, 427_328, 73_984 / 427_328).verdict == "pass"
    assert judge("peak_breakdown.params", 501_313, 427_328, 73_984 / 427_328).verdict == "fail"
    assert judge("peak_breakdown.params", 353_344, 427_328, 73_984 / 427_328).verdict == "pass"
    assert judge("peak_breakdown.params", 353_343, 427_328, 73_984 / 427_328).verdict == "fail"


def test_token_ids_are_no_config_difference_but_a_dimension_is():
    from ckptbench.theory.verdicts.checks import config_differences

    requested = {"hidden_size": 64, "pad_token_id": None, "bos_token_id": 1}
    built = {"hidden_size": 64, "pad_token_id": 0, "bos_token_id": 128000}  # a user's tokenizer's ids
    assert config_differences(requested, built) == []
    assert config_differences(requested, {**built, "hidden_size": 128}) == ["hidden_size"]
