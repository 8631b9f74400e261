"""Every prediction set beside its observation, with a verdict per quantity.

Single-process points are checked against the memory estimate (:mod:`.estimate`); multi-rank points
against the communication formula (:mod:`.comm`), fed with the parameter bytes of the *analytic*
parameter count, so the measured bytes are compared with a number that was not read off the run itself.
Pure: no torch import, runs in the sweep's parent process.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from ..spec import DTYPES, Case
from .comm import comm_estimate
from .estimate import Estimate, estimate_case
from .params import param_count


@dataclass(frozen=True)
class Tolerances:
    """Allowed relative error |measured − estimated| / estimated per quantity; 0 means exact.

    Params, optimizer state, checkpointed inputs and offloaded bytes are counts of known tensors and must
    be exact.  Activations after forward are exact on CPU today (see the tests); 5% leaves room for
    kernel changes.  The peak depends on transient gradient buffers inside a layer's backward that the
    model only approximates, hence 15%.  CUDA adds allocator rounding and library workspaces.
    """

    params: float = 0.0
    optimizer: float = 0.0
    activations_after_forward: float = 0.05
    mem_after_forward: float = 0.05
    saved: float = 0.05
    peak: float = 0.15
    peak_component: float = 0.25  # of the whole estimated peak, see judge
    checkpointed_input: float = 0.0
    offloaded: float = 0.0

    @classmethod
    def for_device(cls, device: str) -> Tolerances:
        if device == "cuda":
            return cls(params=0.01, optimizer=0.01, activations_after_forward=0.10, mem_after_forward=0.10,
                       saved=0.05, peak=0.20, peak_component=0.30)
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


def judge(quantity: str, measured, estimated, tol: float = 0.0, whole: int | None = None) -> Check:
    """One quantity's verdict; a missing measurement is ``skip``, never ``pass``.

    Without `whole`: |measured/estimated - 1| <= tol, or equality when tol is 0.  With `whole` (a part of
    the peak): |measured - estimated| <= tol x whole.  Where two moments of a step come within a few
    percent of each other (end of forward vs the first layer's backward), the measured peak can land on
    the other one, and its parts move between activations and grads while the total barely changes.
    """
    if measured is None:
        return Check(quantity, None, estimated, None, tol, "skip", None)
    diff = measured - estimated
    ratio = measured / estimated if estimated else (1.0 if measured == 0 else None)
    if whole is not None:
        ok = abs(diff) <= tol * whole
    elif tol == 0:
        ok = diff == 0
    else:
        ok = ratio is not None and abs(ratio - 1.0) <= tol
    return Check(quantity, measured, estimated, ratio, tol, "pass" if ok else "fail", diff)


def check(case: Case, measurement: dict, est: Estimate | None = None,
          tolerances: Tolerances | None = None) -> list[Check]:
    """Compare a harness measurement with the estimate, quantity by quantity.

    A key missing from the measurement gives verdict ``skip`` (never ``pass``): a probe that could not
    measure something must not look like agreement.
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
    ]
    breakdown = m.get("peak_breakdown") or {}
    for part in ("params", "grads", "optimizer", "activations"):
        out.append(judge(f"peak_breakdown.{part}", breakdown.get(part), est.peak_breakdown[part],
                         tol.peak_component, whole=est.peak_bytes))
    rec = m.get("recomputed_layers")
    if rec is None:
        out.append(Check("recomputed_layers", None, est.recomputed_layers, None, 0.0, "skip", None))
    else:
        same = sorted(rec) == est.recomputed_layers
        out.append(Check("recomputed_layers", list(rec), est.recomputed_layers, 1.0 if same else 0.0, 0.0,
                         "pass" if same else "fail",
                         None if same else sorted(set(rec) ^ set(est.recomputed_layers))))
    return out


ESTIMATE_KEYS = ("params_bytes", "grads_bytes", "optimizer_bytes", "mem_after_forward_bytes",
                 "activations_after_forward_bytes", "peak_bytes", "saved_bytes", "checkpointed_input_bytes",
                 "offloaded_bytes", "host_bytes", "peak_phase", "peak_breakdown", "recomputed_layers")


def comm_checks(case: Case, m: dict) -> tuple[dict, list[Check]]:
    """All-reduce payload and count of one rank over the run, against the formula (exact)."""
    n_params = param_count(case.model)
    param_bytes = n_params.total * DTYPES[case.model.dtype]
    est = comm_estimate(param_bytes, param_bytes, case.train.warmup_steps + case.train.steps,
                        case.local_sgd_steps, case.world_size, grad_accum=case.grad_accum,
                        n_param_tensors=n_params.n_tensors, sync_impl=case.sync_impl)
    checks = [
        judge("comm_payload_bytes", m.get("comm_payload_bytes"), est["allreduce_payload_bytes"]),
        judge("syncs", m.get("syncs"), est["syncs"]),
        judge("params_bytes", m.get("params_bytes"), param_bytes),
    ]
    if case.local_sgd_steps > 0:  # DDP's bucket count depends on bucket_cap_mb, not a formula
        checks.append(judge("allreduce_count", m.get("allreduce_count"), est["allreduce_count"]))
    return est, checks


def annotate_record(case: Case, record: dict) -> None:
    """Add ``estimate``, ``checks`` and ``verdict`` (pass / fail / skip) to a record in place."""
    if record["status"] != "ok":
        record["verdict"] = "skip"
        return
    m = record["measurement"]
    if case.world_size > 1:
        est, checks = comm_checks(case, m)
        record["estimate"] = est
    else:
        est_obj = estimate_case(case)
        full = est_obj.to_dict()
        record["estimate"] = {k: full[k] for k in ESTIMATE_KEYS if k in full}
        checks = check(case, m, est_obj)
    losses = m.get("losses")
    if losses is not None:  # a step that produced NaN/inf measured nothing worth comparing
        bad = sum(1 for x in losses if x is None or not math.isfinite(x))
        checks.append(judge("nonfinite_losses", bad, 0))
    record["checks"] = [c.to_dict() for c in checks]
    verdicts = {c.verdict for c in checks}
    record["verdict"] = "fail" if "fail" in verdicts else ("pass" if "pass" in verdicts else "skip")
