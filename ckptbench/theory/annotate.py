"""What the sweep adds to each record once its point has run: the estimate, every check, the meters' agreement.

The one place a record meets the theory: :func:`annotate_record` is the sweep's ``annotate`` hook.
"""

from __future__ import annotations

from ..spec import Case
from .checks import check, comm_checks, gates, verdict
from .estimate import estimate_case
from .meters import agreement, context_bytes, meter_checks

ESTIMATE_KEYS = ("params_bytes", "grads_bytes", "optimizer_bytes", "mem_after_forward_bytes",
                 "activations_after_forward_bytes", "peak_bytes", "saved_bytes", "checkpointed_input_bytes",
                 "offloaded_bytes", "host_bytes", "peak_phase", "peak_breakdown", "checkpointed_layers",
                 "recomputed_layers")


def annotate_record(case: Case, record: dict) -> None:
    """Add ``estimate``, ``checks``, ``meters``, ``gates`` and ``verdict`` (pass / fail / unchecked; skip
    when the point did not run) to a record in place."""
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
    record["checks"] = [c.to_dict() for c in checks]
    record["gates"] = gates(m)
    if case.world_size == 1:
        meters = meter_checks(case, m)
        record["meters"] = {"agreement": agreement(meters), "checks": [c.to_dict() for c in meters],
                            "cuda_context_bytes": context_bytes(m)}
        # two meters that disagree beyond their known blind spots make the measurement itself suspect
        record["gates"]["meters_disagree"] = int(record["meters"]["agreement"] == "disagree")
    record["verdict"] = verdict(checks, record["gates"])
