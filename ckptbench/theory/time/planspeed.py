"""A plan's step time on its ranks: the timer's compute, the collectives and the part compute does not hide.

The timer (:mod:`.achieved` for a card that is not here, the caller's for this machine) gives a step's
compute and, where it can, its split by layer and phase; the collectives of data-parallel ranks are timed
on the ring's link (:mod:`..comm.network`) and overlapped with that compute as FSDP2 and DDP overlap them
(:mod:`..comm.overlap`).  `a` is a :class:`..policy.plan.Assumptions`; `predict` a plan predictor (its parameter bytes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ...point.case import DTYPES, Case
from ..comm.fsdp import param_dtype, unit_shapes, unit_shard_bytes
from ..comm.network import Link, allgather_s, allreduce_s, link_named, reduce_scatter_s
from ..comm.overlap import LayerCompute, ddp_buckets, ddp_exposed, fsdp_exposed, split_by_flops
from ..memory.estimate import estimate_case


def ring_link(a) -> Link:
    """The link a collective's ring is as fast as: a measured one; else, for a world that spans hosts, the
    slower of the network between hosts (per GPU) and the link inside them; else the named link."""
    if a.measured_link is not None:
        return a.measured_link
    net = link_named(a.network)
    if a.world <= a.ranks_per_host:
        return net
    inside = link_named(a.intra)
    if inside.bus_Bps < net.bus_Bps:
        return Link(net.name, inside.bandwidth_Bps, net.latency_s, net.note, inside.efficiency, True)
    return net


def _ddp_param_bytes(case: Case) -> list[int]:
    """Gradient bytes of each trainable tensor in registration order (embedding, layers, the rest)."""
    b = DTYPES[case.model.dtype]
    if case.setup.lora:  # DDP buckets the adapters' gradients only; the estimate's gradient bytes count every
        return [estimate_case(case).grads_bytes]  # weight: the comm of a LoRA plan is over-, never under-stated
    shapes = unit_shapes(case.model)
    lead = 2 if case.model.family == "gpt2" else 1
    root = [math.prod(x) * b for x in shapes["root"]]
    layer = [math.prod(x) * b for x in shapes["layer"]]
    return root[:lead] + layer * case.model.layers + root[lead:]


@dataclass(frozen=True)
class Comm:
    """A step's collectives on the link (end to end) and the part compute does not hide."""

    total_s: float
    exposed_s: float


def comm_time(case: Case, a, predict, compute: LayerCompute) -> Comm:
    """The collectives of one optimizer step, and how much of them the step waits for (:mod:`..comm.overlap`):
    FSDP2's all-gathers and reduce-scatters per micro-batch around `compute`'s layers, DDP's bucketed
    all-reduce during the last micro-batch's backward, local SGD's parameter averaging every K steps (all
    of it waited for, 1/K a step)."""
    if a.world < 2:
        return Comm(0.0, 0.0)
    link, n, ga = ring_link(a), a.world, case.grad_accum
    if a.sharding == "fsdp":
        gathered = unit_shard_bytes(case.model, n, param_dtype(case.model, case.setup.autocast))
        shard = unit_shard_bytes(case.model, n)
        ag, ag_root = allgather_s(gathered["layer"], n, link), allgather_s(gathered["root"], n, link)
        rs, rs_root = reduce_scatter_s(n * shard["layer"], n, link), reduce_scatter_s(n * shard["root"], n, link)
        per = 2 * case.model.layers * ag + ag_root + case.model.layers * rs + rs_root
        micro = LayerCompute(compute.layers, compute.fwd / ga, compute.bwd / ga, compute.recompute / ga,
                             compute.checkpointed, compute.head_fwd / ga, compute.head_bwd / ga)
        return Comm(ga * per, ga * fsdp_exposed(micro, ag, rs, ag_root, rs_root))
    if a.local_sgd_steps:
        seconds = allreduce_s(predict.params_bytes(case), n, link) / a.local_sgd_steps
        return Comm(seconds, seconds)
    buckets = [allreduce_s(b, n, link) for b in ddp_buckets(_ddp_param_bytes(case))]
    return Comm(sum(buckets), ddp_exposed(compute.backward / ga, buckets))


def default_timer(a):
    """The step times a plan gets when its caller gives none: a card's expected times from the achieved
    fractions of the measured card (:class:`.achieved.AchievedTimer`; a CPU plan is timed by the caller,
    with the rates measured here: :class:`ckptbench.run.baselines.MeasuredTimer`)."""
    if a.device != "cuda":
        return None
    from .achieved import AchievedTimer
    from .achieved_fit import H200

    return AchievedTimer(a.device_name, H200, a.link_bytes_per_s)


@dataclass
class StepTime:
    """A step's predicted time: its compute, its collectives and what of them is exposed, the interval."""

    step_s: float
    compute_s: float
    comm_s: float
    exposed_s: float
    low_s: float | None = None
    high_s: float | None = None


def step_time(case: Case, a, predict, timer=None) -> StepTime | None:
    """`timer`'s time of the step (the traced ops priced, recompute and offload copies included) plus the
    collectives compute does not hide; the timer's interval (measured / predicted ratios of its fit) is
    carried to the compute, the collectives' rates are assumptions without one."""
    timer = timer or default_timer(a)
    seconds = timer(case) if timer is not None else None
    if seconds is None:
        return None
    split = getattr(timer, "compute", None)
    compute = split(case) if split else split_by_flops(seconds, case.model.layers, tuple(case.checkpointed_layers))
    comm = comm_time(case, a, predict, compute)
    interval = getattr(timer, "interval", None)
    step = seconds + comm.exposed_s
    if interval is None:
        return StepTime(step, seconds, comm.total_s, comm.exposed_s)
    return StepTime(step, seconds, comm.total_s, comm.exposed_s, seconds * interval[0] + comm.exposed_s,
                    seconds * interval[1] + comm.exposed_s)


