"""What the sweep adds to each record once its point has run: the estimate, every check, the meters' agreement.

The one place a record meets the theory: :func:`annotate_record` is the sweep's ``annotate`` hook.
"""

from __future__ import annotations

from ...point.case import Case
from ..memory.estimate import estimate_case
from ..memory.workspaces import capability_major
from .checks import (
    Check,
    Tolerances,
    attention_implementation_check,
    blind_spot,
    check,
    comm_checks,
    config_checks,
    gates,
    judge,
    offload_kind_check,
    same_layers,
    step_time_check,
    verdict,
)
from .ddp import ddp_meter_checks
from .meters import agreement, context_bytes, meter_checks

ESTIMATE_KEYS = ("params_bytes", "grads_bytes", "optimizer_bytes", "mem_after_forward_bytes",
                 "activations_after_forward_bytes", "peak_bytes", "saved_bytes", "checkpointed_input_bytes",
                 "offloaded_bytes", "host_bytes", "peak_phase", "peak_breakdown", "checkpointed_layers",
                 "recomputed_layers", "cublas_workspace_bytes")


def device_facts(case: Case, record: dict) -> dict:
    """What the analytic estimate of a CUDA point takes from the record's ``env``: the device's compute
    capability and the run's ``CUBLAS_WORKSPACE_CONFIG`` (:mod:`..memory.workspaces`).  Facts of the machine the
    worker ran on, recorded before its step: nothing the step measured.  {} on a CPU, or when the record
    does not say (the workspaces then go unmodelled, as ``estimate_note`` says)."""
    env = record.get("env") or {}
    major = capability_major(env.get("cuda_capability"))
    if case.device != "cuda" or major is None:
        return {}
    return {"cuda_capability": major, "cublas_config": env.get("cublas_workspace_config")}


def checkpointed_input_formula(case: Case) -> int:
    """Universal: checkpointed layers × batch × seq × hidden × bytes of the hidden states' dtype."""
    return (len(case.checkpointed_layers) * case.batch_size * case.seq_len * case.model.hidden
            * case.model.bytes_per_element)


def simulation_checks(case: Case, m: dict, tol: Tolerances) -> list:
    """Any model: the measured step against the simulation of the same step (memory, part by part, and the
    moment of the peak), and the quantities that need no model at all (checkpointed inputs, which layers
    were checkpointed and ran again) against their rules; where the simulation counted FLOPs (a SAC point)
    the FLOPs the step ran, and ran again, against its count.  Without a simulation the memory checks skip:
    the record is then unchecked, never passed."""
    sim = m.get("simulation") or {}
    rule = case.checkpointed_layers
    out = [judge(q, m.get(q), sim[q], t) if q in sim else judge(q, None, None, t) for q, t in (
        ("params_bytes", tol.params), ("optimizer_bytes", tol.optimizer),
        ("mem_after_forward_bytes", tol.mem_after_forward),
        ("activations_after_forward_bytes", tol.activations_after_forward),
        ("peak_bytes", tol.peak), ("offloaded_bytes", tol.offloaded))]
    if "peak_phase" in sim:
        same = m.get("peak_phase") == sim["peak_phase"]
        out.append(Check("peak_phase", m.get("peak_phase"), sim["peak_phase"], None, 0.0,
                         "pass" if same else "fail", None))
    out += [judge("checkpointed_input_bytes", m.get("checkpointed_input_bytes"), checkpointed_input_formula(case)),
            same_layers("checkpointed_layers", m.get("checkpointed_layers"), rule),
            same_layers("recomputed_layers", m.get("recomputed_layers"), rule)]
    counted, simulated = m.get("counted_flops"), sim.get("counted_flops")
    if counted and simulated:  # a SAC point's simulation counts what its step runs again (exact)
        out += [judge("hardware_flops", sum(counted[p] for p in ("forward", "backward", "recompute")),
                      sum(simulated[p] for p in ("forward", "backward", "recompute"))),
                judge("recompute_flops", counted["recompute"], simulated["recompute"])]
    return out


COMPILED_UNCHECKED = ("compiled (torch.compile): measured only. No estimate reads what the partitioner chose to "
                      "save at this budget, and only the allocator meter could measure the step (the tracker's "
                      "dispatch mode makes the compiled model run eagerly), so no second meter confirms it")


def compiled_gates(m: dict) -> dict[str, int]:
    """What makes a compiled point's numbers another program's: a recompilation after the first step (a
    timed or the memory step would have compiled again), a memory step that ran no compiled region."""
    regions = m.get("compiled_regions_run")
    return {"compile_recompiles": int(m.get("compile_recompiles") or 0),
            "memory_step_not_compiled": int(regions == 0)}


def annotate_record(case: Case, record: dict, *, by_simulation: bool = False) -> None:
    """Add ``estimate``, ``checks``, ``meters``, ``gates`` and ``verdict`` (pass / fail / unchecked; skip
    when the point did not run) to a record in place; `by_simulation` judges a one-process point against
    its measurement's ``simulation`` even where the analytic estimate describes it."""
    if record["status"] != "ok":
        record["verdict"] = "skip"
        return
    m = record["measurement"]
    if case.world_size > 1:
        est, checks = comm_checks(case, m)
        record["estimate"] = est
    elif case.compiled:  # measured only: every memory check skips, the verdict is at best unchecked
        checks = [Check(q, m.get(q), None, None, None, "skip", COMPILED_UNCHECKED) for q in (
            "peak_bytes", "mem_after_forward_bytes", "activations_after_forward_bytes")]
        record["estimate"], record["estimate_source"] = {}, "none"
        record["estimate_reason"] = COMPILED_UNCHECKED
    elif not case.analytic or by_simulation:
        checks = simulation_checks(case, m, Tolerances.for_device(case.device))
        sim = m.get("simulation")
        record["estimate"] = sim or {}
        record["estimate_source"] = "simulation" if sim else "none"
        if not sim:
            record["estimate_reason"] = m.get("simulation_error", "not simulated")
    else:
        facts = device_facts(case, record)
        est_obj = estimate_case(case, **facts)
        full = est_obj.to_dict()
        record["estimate"] = {k: full[k] for k in ESTIMATE_KEYS if k in full}
        record["estimate_source"] = "analytic"
        if case.device == "cuda" and not facts:
            record["estimate_note"] = ("cuBLAS workspaces not modelled: the record does not state the device's "
                                       "compute capability (env.cuda_capability); each thread that multiplies "
                                       "holds 8,519,680 bytes to 32 MiB the estimate leaves out")
        checks = check(case, m, est_obj)
    if case.world_size == 1:
        checks = [*checks, attention_implementation_check(case, m), *config_checks(m, case.model.dropout),
                  step_time_check(m)]
    if case.offload:  # every rank ran the point's offload as one process does; rank 0 states which
        checks = [*checks, offload_kind_check(case, m)]
    record["checks"] = [c.to_dict() for c in checks]
    record["gates"] = {**gates(m), **(compiled_gates(m) if case.compiled else {})}
    if case.world_size == 1 or (case.setup.sharding == "ddp" and "allocator_growth_bytes" in m):
        meters = meter_checks(case, m) if case.world_size == 1 else ddp_meter_checks(case, m)
        record["meters"] = {"agreement": agreement(meters), "checks": [c.to_dict() for c in meters],
                            "cuda_context_bytes": context_bytes(m)}
        # two meters that disagree beyond their known blind spots make the measurement itself suspect
        record["gates"]["meters_disagree"] = int(record["meters"]["agreement"] == "disagree")
    record["verdict"] = verdict(checks, record["gates"])
    if record.get("estimate_source") == "none" and record["verdict"] == "pass":
        record["verdict"] = "unchecked"  # the rules held, but nothing predicted the memory: never a pass
    blind = blind_spot(case, checks)
    if blind and record["verdict"] == "pass":
        record["verdict"], record["unchecked_reason"] = "unchecked", blind  # a probe that cannot see: never a pass
