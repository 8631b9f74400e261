"""Put the analytic estimate beside every measurement, with a verdict per quantity.

Single-process points are checked against :func:`ckptbench.estimate.check` (memory).  Multi-rank points
are checked against :func:`ckptbench.comm_estimate.comm_estimate`, fed with the parameter bytes of the
*analytic* parameter count, so the measured bytes are compared with a number that was not read off the
run itself.  Pure: no torch import, runs in the sweep's parent process.
"""

from __future__ import annotations

import math

from .comm_estimate import comm_estimate
from .estimate import Check, check, estimate_case, judge, param_count
from .spec import DTYPES, Case

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
