"""Every prediction set beside its observation, with a verdict per quantity.

Single-process points are checked against the memory estimate (:mod:`..memory.estimate`); multi-rank points
against the communication formula (:mod:`..comm.comm`), fed with the parameter bytes of the *analytic*
parameter count, so the measured bytes are compared with a number that was not read off the run itself.
Pure: no torch import, runs in the sweep's parent process.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from ...point.case import DTYPES, Case
from ...sources.configs import DIM_ALIASES
from ..comm.comm import comm_estimate
from ..memory.estimate import Estimate, estimate_case
from ..memory.params import param_count
from ..time import flops


@dataclass(frozen=True)
class Tolerances:
    """Allowed relative error |measured − estimated| / estimated per quantity; 0 means exact.

    Params, optimizer state, checkpointed inputs and offloaded bytes are counts of known tensors and must
    be exact.  On CPU the estimate models every moment of the step (:mod:`..memory.backward`), and the grid in
    ``tests/unit/test_peak_grid.py`` holds it within 1 % of the simulated step from 64 to 4096 tokens, so
    5 % for the peak and for each of its parts (judged at the phase the measured peak fell in) leaves room
    for kernel changes.  CUDA adds allocator rounding, library workspaces and kernels whose saved tensors
    differ (flash attention), and its allocator cannot say what a block is for: no part is judged there.
    """

    params: float = 0.0
    optimizer: float = 0.0
    activations_after_forward: float = 0.05
    mem_after_forward: float = 0.05
    saved: float = 0.05
    peak: float = 0.05
    peak_grads: float = 0.05
    peak_activations: float = 0.05
    checkpointed_input: float = 0.0
    offloaded: float = 0.0

    @classmethod
    def for_device(cls, device: str) -> Tolerances:
        if device == "cuda":
            return cls(params=0.01, optimizer=0.01, activations_after_forward=0.10, mem_after_forward=0.10,
                       saved=0.05, peak=0.20, peak_grads=0.10, peak_activations=0.20)
        return cls()


@dataclass(frozen=True)
class Check:
    quantity: str
    measured: object
    estimated: object
    ratio: float | None
    tolerance: float | None
    verdict: str  # "pass" | "fail" | "skip"
    difference: object = None

    def to_dict(self) -> dict:
        return asdict(self)


def judge(quantity: str, measured, estimated, tol: float = 0.0) -> Check:
    """One quantity's verdict: |measured/estimated - 1| <= tol, or equality when tol is 0; a missing
    measurement, or a quantity nothing predicts, is ``skip``, never ``pass``."""
    if measured is None or estimated is None:
        return Check(quantity, measured, estimated, None, tol, "skip", None)
    diff = measured - estimated
    ratio = measured / estimated if estimated else (1.0 if measured == 0 else None)
    if tol == 0:
        ok = diff == 0
    else:  # a bound of a whole number of bytes is met exactly at it, whatever the last bit of the quotients
        ok = ratio is not None and abs(ratio - 1.0) <= tol * (1 + 1e-12)
    return Check(quantity, measured, estimated, ratio, tol, "pass" if ok else "fail", diff)


def check(case: Case, measurement: dict, est: Estimate | None = None,
          tolerances: Tolerances | None = None) -> list[Check]:
    """Compare a harness measurement with the estimate, quantity by quantity.

    A key missing from the measurement gives verdict ``skip`` (never ``pass``): a probe that could not
    measure something must not look like agreement.  The parts of the peak are judged at the moment the
    measurement says its peak happened (``peak_phase``), each against its own estimate at that moment.
    """
    est = est or estimate_case(case)
    tol = tolerances or Tolerances.for_device(case.device)
    m = measurement
    out = [
        judge("params_bytes", m.get("params_bytes"), est.params_bytes, tol.params),
        judge("optimizer_bytes", m.get("optimizer_bytes"), est.optimizer_bytes, tol.optimizer),
        judge("mem_after_forward_bytes", m.get("mem_after_forward_bytes"), est.mem_after_forward_bytes,
              tol.mem_after_forward),
        judge("activations_after_forward_bytes", m.get("activations_after_forward_bytes"),
              est.activations_after_forward_bytes, tol.activations_after_forward),
        judge("peak_bytes", m.get("peak_bytes"), est.peak_bytes, tol.peak),
        judge("saved_bytes", m.get("saved_bytes"), est.saved_bytes, tol.saved),
        judge("checkpointed_input_bytes", m.get("checkpointed_input_bytes"), est.checkpointed_input_bytes,
              tol.checkpointed_input),
        judge("offloaded_bytes", m.get("offloaded_bytes"), est.offloaded_bytes, tol.offloaded),
        *phase_checks(m, est, tol),
        *flop_checks(case, m),
        attention_kernel_check(case, m),
        same_layers("checkpointed_layers", m.get("checkpointed_layers"), est.checkpointed_layers),
        same_layers("recomputed_layers", m.get("recomputed_layers"), est.recomputed_layers),
    ]
    return out


def flop_checks(case: Case, m: dict) -> list[Check]:
    """FLOPs torch's counter saw on the memory step against the formula (exact: both count matmuls and
    attention kernels from shapes, so any difference is a term the formula gets wrong)."""
    counted = m.get("counted_flops")
    formula = flops.figures(case, step_time_s=None)
    hardware, recompute = int(formula["hardware_flops_per_step"]), int(formula["recompute_flops_per_step"])
    if counted is None:
        return [judge("hardware_flops", None, hardware), judge("recompute_flops", None, recompute)]
    total = counted["forward"] + counted["backward"] + counted["recompute"]
    return [judge("hardware_flops", total, hardware), judge("recompute_flops", counted["recompute"], recompute)]


def attention_kernel_check(case: Case, m: dict) -> Check:
    """sdpa is modelled as a fused kernel (no s² tensor kept); eager as separate matmuls.  A run whose
    kernels say otherwise (sdpa fell back to its math path) was measured on a model the estimate does not
    describe."""
    kernels = m.get("attention_kernels")
    expected = "fused" if case.model.attn == "sdpa" else "none"
    if kernels is None:
        return Check("attention_kernel", None, expected, None, 0.0, "skip", None)
    seen = "fused" if kernels else "none"
    return Check("attention_kernel", ",".join(kernels) or "none", expected, 1.0 if seen == expected else 0.0, 0.0,
                 "pass" if seen == expected else "fail", None)


def attention_implementation_check(case: Case, m: dict) -> Check:
    """The attention that ran, read off the kernels the FLOP counter saw (a fused
    ``_scaled_dot_product_*`` kernel is sdpa, none is eager), against the Case's, which the estimate and
    the FLOP formula assume: exact.  The built config's ``_attn_implementation`` only echoes what the
    builder was told, so it cannot stand alone; it must agree too.  sdpa that fell back to its math path
    reads as eager here: it ran the separate matmuls the Case did not ask for.  A suite that names no
    attention gets transformers' default when it is parsed, so this also checks that default was read right."""
    kernels = m.get("attention_kernels")
    if kernels is None:  # records from before the worker counted kernels: nothing independent to compare
        return Check("attn_implementation", None, case.model.attn, None, 0.0, "skip", None)
    ran = "sdpa" if kernels else "eager"
    built = m.get("attn_implementation")
    # sdpa with attention dropout in training runs torch's math path (no fused kernel takes it on CPU): the
    # separate matmuls, but what the Case asked for, with the masks the simulation of the same step keeps
    dropped = {k: v for k, v in (m.get("dropout") or {}).items()
               if ("attn" in k or "attention" in k) and isinstance(v, (int, float)) and v > 0}
    math_path = not kernels and case.model.attn == "sdpa" and bool(dropped)
    same = (ran == case.model.attn or math_path) and built in (None, case.model.attn)
    why = (f"sdpa ran its math path: attention dropout {dropped} in training" if same and math_path else
           None if same else f"kernels: {', '.join(kernels) or 'none'}; built config: {built or 'not recorded'}")
    return Check("attn_implementation", "sdpa" if math_path else ran, case.model.attn, 1.0 if same else 0.0, 0.0,
                 "pass" if same else "fail", why)


# What the builder sets whatever the config says (no KV cache, the Case's dtype; dropout 0 when the Case
# says dropout "off"): a difference there is the Case's stated choice, not a request it lost.
BUILDER_KEYS = ("dtype", "torch_dtype", "use_cache")
# Token ids a tokenizer gives (a user's run sets pad_token_id to its tokenizer's): no shape, no memory, no
# step the Case describes changes with them, so a tracked run's own are no difference
TOKEN_KEYS = ("pad_token_id", "bos_token_id", "eos_token_id")
_ABSENT = "<absent>"


def _set_by_builder(key: str, built, dropout_off: bool) -> bool:
    return key in BUILDER_KEYS or key in TOKEN_KEYS or (dropout_off and ("dropout" in key or key.endswith("pdrop")) and built == 0)


def config_differences(requested: dict, built: dict, prefix: str = "", dropout_off: bool = True) -> list[str]:
    """The keys (dotted into nested configs) where the built model's config differs from the requested one.

    `requested` holds every name of each dimension (the reference passes them all and transformers keeps the
    ones its class does not read as plain attributes); such a name the built config lacks is no difference.
    A dropout key built at 0 is a difference only when the Case keeps the published dropout."""
    out = []
    for key in sorted(set(requested) | set(built)):
        if key not in built and not prefix and key in DIM_ALIASES:
            continue
        r, b = requested.get(key, _ABSENT), built.get(key, _ABSENT)
        if _set_by_builder(key, b, dropout_off):
            continue
        if isinstance(r, dict) and isinstance(b, dict):
            out += config_differences(r, b, f"{prefix}{key}.", dropout_off)
        elif r != b:
            out.append(prefix + key)
    return out


def _value_at(config: dict, dotted: str):
    for part in dotted.split("."):
        config = config.get(part, _ABSENT) if isinstance(config, dict) else _ABSENT
    return config


def config_checks(m: dict, dropout: str = "off") -> list[Check]:
    """The model built is the one asked for, exactly.

    ``config``: every key the Case asks for (its dimensions and extra keys, as transformers normalises them:
    ``rope_scaling`` becomes ``rope_parameters``) against the built model's config, key by key.
    ``params_from_config``: the built model's parameter count against ``AutoModelForCausalLM.from_config`` of
    the requested config on the meta device, built apart from the builder (:mod:`ckptbench.train.reference`).
    Records from before the worker recorded them skip; a reference transformers refused fails."""
    requested, built = m.get("requested_config"), m.get("resolved_config")
    if m.get("reference_error"):
        why = f"the requested config did not build: {m['reference_error']}"
        return [Check("config", None, None, None, 0.0, "fail", why),
                Check("params_from_config", m.get("n_params"), None, None, 0.0, "fail", why)]
    if requested is None or built is None or m.get("reference_n_params") is None:
        return [Check("config", None, None, None, 0.0, "skip", None),
                judge("params_from_config", None, m.get("reference_n_params"))]
    diffs = config_differences(requested, built, dropout_off=dropout == "off")
    if diffs:
        config = Check("config", "; ".join(f"{k}={_value_at(built, k)!r}" for k in diffs),
                       "; ".join(f"{k}={_value_at(requested, k)!r}" for k in diffs), 0.0, 0.0, "fail", diffs)
    else:
        config = Check("config", "as requested", "as requested", 1.0, 0.0, "pass", None)
    return [config, judge("params_from_config", m.get("n_params"), m["reference_n_params"])]


def same_layers(quantity: str, observed, expected) -> Check:
    """A list of layer indices seen at run time against the list the setting implies (exact)."""
    expected = sorted(expected)
    if observed is None:
        return Check(quantity, None, expected, None, 0.0, "skip", None)
    same = sorted(observed) == expected
    return Check(quantity, sorted(observed), expected, 1.0 if same else 0.0, 0.0, "pass" if same else "fail",
                 None if same else sorted(set(observed) ^ set(expected)))


def phase_checks(m: dict, est: Estimate, tol: Tolerances) -> list[Check]:
    """When the peak happened, and what was live then, part by part.

    ``peak_phase`` passes when the measured peak fell in the phase the estimate names, or in one the
    estimate puts within the peak tolerance of its own peak (two moments that close may swap); a phase
    the estimate does not model at all fails.  The grads and activations of the measured peak are then
    judged against the estimate *of that phase*, each with its own tolerance.
    """
    measured = m.get("peak_phase")
    if not measured:
        return [Check("peak_phase", None, est.peak_phase, None, tol.peak, "skip", None)]
    at = est.phases.get(measured)
    if at is None:
        return [Check("peak_phase", measured, est.peak_phase, None, tol.peak, "fail",
                      f"the estimate has no phase {measured!r}")]
    ratio = at["total"] / est.peak_bytes
    ok = measured == est.peak_phase or ratio >= 1 - tol.peak
    out = [Check("peak_phase", measured, est.peak_phase, ratio, tol.peak, "pass" if ok else "fail",
                 None if ok else f"the estimate puts {measured} at {ratio:.3f} of its peak")]
    breakdown = m.get("peak_breakdown") or {}
    for part, part_tol in (("grads", tol.peak_grads), ("activations", tol.peak_activations)):
        out.append(judge(f"peak_breakdown.{part}", breakdown.get(part), at[part], part_tol))
    return out


def comm_checks(case: Case, m: dict) -> tuple[dict, list[Check]]:
    """All-reduce payload and count of one rank over the run, against the formula (exact).  An fsdp point:
    its all-gathers and reduce-scatters (exact) and rank 0's memory (:func:`..comm.fsdp.fsdp_predictions`)."""
    if case.setup.sharding == "fsdp":
        from ..comm.fsdp import fsdp_predictions

        if not case.model.analytic:  # no unit layout without the family's parameter shapes: unchecked
            return {}, [judge("allgather_payload_bytes", None, None)]
        est, rows = fsdp_predictions(case)
        return est, [judge(name, m.get(key), expected, tol) for name, key, expected, tol in rows]
    n_params = param_count(case.model)
    param_bytes = n_params.total * DTYPES[case.model.dtype]
    est = comm_estimate(param_bytes, param_bytes, case.train.warmup_steps + case.train.steps,
                        case.local_sgd_steps, case.world_size, grad_accum=case.grad_accum,
                        n_param_tensors=n_params.n_tensors, sync_impl=case.sync_impl)
    checks = [
        judge("comm_payload_bytes", m.get("comm_payload_bytes"), est["allreduce_payload_bytes"]),
        # averaging rounds seen at c10d, not the loop's own count (which follows the same rule as the formula)
        judge("syncs", m.get("syncs_observed"), est["syncs"]),
        judge("params_bytes", m.get("params_bytes"), param_bytes),
    ]
    if case.local_sgd_steps > 0:  # DDP's bucket count depends on bucket_cap_mb, not a formula
        checks.append(judge("allreduce_count", m.get("allreduce_count"), est["allreduce_count"]))
    return est, checks


STEP_TIME_TOLERANCE = 0.10
PREDICTION_VERDICTS = ("agrees", "off")  # a prediction's verdicts: reported, never a pass or a fail


def step_time_check(m: dict, tol: float = STEP_TIME_TOLERANCE) -> Check:
    """The measured median step time against the step-time model's prediction (:mod:`..time.steptime`: other
    points' measured steps, transformed; never this point's own): ``agrees`` within `tol`, else ``off``.
    A prediction, not a gate: neither verdict passes or fails the record (:func:`verdict`); ``skip`` when
    either side is missing, with the reason the model gave."""
    model = m.get("step_time_model") or {}
    measured, predicted = m.get("step_time_median_s"), model.get("predicted_s")
    if not measured or not predicted:
        return Check("step_time_s", measured, predicted, None, tol, "skip", model.get("error"))
    ratio = measured / predicted
    note = f"prediction from {model.get('source', 'measured baselines')}"
    return Check("step_time_s", measured, predicted, ratio, tol, PREDICTION_VERDICTS[abs(ratio - 1) > tol], note)


def offload_kind_check(case: Case, m: dict) -> Check:
    """Which offload the step ran (the record's ``offload_kind``) against the one its point asks for:
    the probes see a kind's tensors only through its pack hook, so a record that does not say which hooks
    ran is ``skip`` here, and a point with a kind beyond transformers' is then unchecked (``blind_spot``)."""
    expected = (case.recompute.offload or "transformers") if case.offload else None
    if "offload_kind" not in m:
        return Check("offload_kind", None, expected, None, 0.0, "skip", "the record does not say which offload ran")
    ok = m["offload_kind"] == expected
    return Check("offload_kind", m["offload_kind"], expected, 1.0 if ok else 0.0, 0.0, "pass" if ok else "fail", None)


def blind_spot(case: Case, checks: list[Check]) -> str:
    """Why the probes cannot vouch for this point's memory ("" when they can): a streamed offload whose
    record does not say its hooks ran (:func:`offload_kind_check`)."""
    if case.offload and case.recompute.offload and any(
            c.quantity == "offload_kind" and c.verdict == "skip" for c in checks):
        return (f"offload {case.recompute.offload!r}: the record does not say its hooks ran, so the probes may "
                "not have seen its tensors")
    return ""


def gates(m: dict) -> dict[str, int]:
    """Conditions that make a measurement worthless whatever it says (not predictions): steps whose loss
    was NaN or inf.  A failed gate fails the record; a passed one proves nothing about the estimate."""
    losses = m.get("losses")
    if losses is None:
        return {}
    return {"nonfinite_losses": sum(1 for x in losses if x is None or not math.isfinite(x))}


def verdict(checks: list[Check], gate_values: dict[str, int]) -> str:
    """``fail`` on any failed check or gate, ``pass`` when at least one check was judged and none failed,
    ``unchecked`` when nothing was judged (every check skipped): never a pass by default.  A prediction's
    ``agrees`` / ``off`` (:func:`step_time_check`) judges nothing here."""
    verdicts = {c.verdict for c in checks}
    if "fail" in verdicts or any(gate_values.values()):
        return "fail"
    return "pass" if "pass" in verdicts else "unchecked"
