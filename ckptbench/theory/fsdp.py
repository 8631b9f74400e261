"""What FSDP2 (``fully_shard`` per decoder layer and on the root) moves and keeps per rank: pure, no torch.

Units: each decoder layer is one FSDP unit; the root unit holds every parameter outside the layers
(embedding, final norm, an untied LM head, GPT-2's position embedding).  FSDP2 shards each parameter on
dim 0 in ``torch.chunk`` fashion and pads every rank's shard to ``ceil(dim0 / N)`` rows, so a parameter of
shape ``(d0, *rest)`` costs ``ceil(d0 / N) * prod(rest)`` elements per rank.

Collectives per micro-batch (payload = bytes a rank hands in, the convention of :mod:`.comm`), as measured
at c10d on gloo (``tests/e2e/test_fsdp.py``):

* all-gather (``_allgather_base``): one per unit per gather, payload = the unit's padded shard.  Each
  decoder layer is gathered twice (forward, and again in backward: ``reshard_after_forward=True``), the
  root once (FSDP2 does not reshard the root after forward).  A checkpointed layer recomputes its forward
  *inside* its backward gather, so checkpointing adds no gather: the count is the same for none, every-n
  and full.
* reduce-scatter (``_reduce_scatter_base``): one per unit, payload = N × the unit's padded shard (the
  padded unsharded gradient).
"""

from __future__ import annotations

from ..measure.bus import bus_bytes
from ..spec import DTYPES, Case, ModelSpec


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def unit_shapes(spec: ModelSpec) -> dict[str, list[tuple[int, ...]]]:
    """Parameter shapes of one decoder layer (``layer``) and of the root unit (``root``), as transformers
    builds them (Linear weights are (out, in); GPT-2's Conv1D weights are (in, out))."""
    h, i, v = spec.hidden, spec.intermediate, spec.vocab
    kv = spec.kv_heads * spec.head_dim
    head = [] if spec.tie_embeddings else [(v, h)]
    if spec.family in ("llama", "qwen2"):
        layer = [(h, h), (kv, h), (kv, h), (h, h), (i, h), (i, h), (h, i), (h,), (h,)]
        if spec.family == "qwen2":
            layer += [(h,), (kv,), (kv,)]  # q/k/v biases
        return {"layer": layer, "root": [(v, h), (h,), *head]}
    if spec.family == "gpt2":
        layer = [(h, 3 * h), (3 * h,), (h, h), (h,), (h, i), (i,), (i, h), (h,), (h,), (h,), (h,), (h,)]
        return {"layer": layer, "root": [(v, h), (spec.max_positions, h), (h,), (h,), *head]}
    raise NotImplementedError(f"no FSDP unit layout for model_type {spec.family!r}")


def shard_elements(shape: tuple[int, ...], world: int) -> int:
    """Elements of one rank's padded shard of a parameter: ``ceil(dim0 / N) * prod(rest)``."""
    rows = ceil_div(shape[0], world)
    for d in shape[1:]:
        rows *= d
    return rows


def unit_shard_bytes(spec: ModelSpec, world: int) -> dict[str, int]:
    """Bytes of one rank's padded shard of a layer unit and of the root unit."""
    b = DTYPES[spec.dtype]
    return {name: sum(shard_elements(s, world) for s in shapes) * b for name, shapes in unit_shapes(spec).items()}


def fsdp_comm_estimate(spec: ModelSpec, world: int, iterations: int) -> dict:
    """All-gather and reduce-scatter traffic of one rank over `iterations` micro-batches (see the module)."""
    if world < 2:
        raise ValueError("sharded data parallel needs world_size >= 2")
    shard = unit_shard_bytes(spec, world)
    gather_step = 2 * spec.layers * shard["layer"] + shard["root"]
    scatter_step = world * (spec.layers * shard["layer"] + shard["root"])
    ag, rs = gather_step * iterations, scatter_step * iterations
    return {
        "layer_shard_bytes": shard["layer"],
        "root_shard_bytes": shard["root"],
        "allgather_payload_bytes": ag,
        "allgather_count": (2 * spec.layers + 1) * iterations,
        "reduce_scatter_payload_bytes": rs,
        "reduce_scatter_count": (spec.layers + 1) * iterations,
        "allgather_bus_bytes": bus_bytes("allgather", ag, world),
        "reduce_scatter_bus_bytes": bus_bytes("reduce_scatter", rs, world),
    }


def fsdp_case_comm(case: Case) -> dict:
    """:func:`fsdp_comm_estimate` for every micro-batch a Case's run trains (warm-up, memory, timed)."""
    t = case.train
    return fsdp_comm_estimate(case.model, case.world_size,
                              (t.warmup_steps + t.memory_steps + t.steps) * case.grad_accum)


# Relative tolerance of the per-rank peak: the composition below models the moments of a step as the
# single-process estimate does and adds FSDP2's buffers, but not where inside a layer's backward its
# reduce-scatter buffers come and go (docs/fsdp.md: within 3.3 % on llama-tiny, world 2)
PEAK_TOLERANCE = 0.05


def fsdp_memory_estimate(case: Case) -> dict:
    """One rank's memory in a step of `case` under FSDP2: exact static parts, and a peak composed per moment.

    Exact (counts of known tensors, CPU):

    * ``params_bytes``: the rank's padded shards of every unit plus the model's buffers (not sharded);
    * ``optimizer_bytes``: AdamW's two moments of the shards plus one fp32 step scalar per parameter;
    * ``peak_params_bytes``: the params at a moment inside a layer: the shards plus the unsharded root
      (FSDP2 keeps it gathered from forward into backward) plus one unsharded layer.

    Peak, for each moment φ of the single-process estimate of the rank's micro-batch
    (:func:`ckptbench.theory.estimate.estimate`): ``peak_params_bytes + optimizer_bytes + activations(φ)
    + grads(φ) / N`` (the gradients of the units already reduce-scattered are shards), and in a layer's
    backward two more unsharded layers: that layer's own full-size gradients, and the padded full-size
    gradient the unit finished before it hands to its reduce-scatter (``chunk_cat``'s output, held until
    the collective completes).  Not modelled: where inside a layer's backward those buffers come and go
    (the estimate's partial gradients of the current layer are divided by N here, though they are not
    sharded yet), and the all-gather's flat output buffer (freed once copied into the parameters), hence
    :data:`PEAK_TOLERANCE`.
    """
    from dataclasses import replace

    from .estimate import estimate_case
    from .params import param_count

    spec, n = case.model, case.world_size
    shard = unit_shard_bytes(spec, n)
    counts = param_count(spec)
    shards = spec.layers * shard["layer"] + shard["root"]
    params = shards + counts.buffers_bytes
    optimizer = 2 * shards + 4 * counts.n_tensors
    unsharded_root, unsharded_layer = n * shard["root"], n * shard["layer"]
    in_flight = params + unsharded_root + unsharded_layer
    single = estimate_case(replace(case, world_size=1, local_sgd_steps=0, setup=replace(case.setup, sharding="ddp")))
    phases = {}
    for name, at in single.phases.items():
        if name == "optimizer":
            continue  # no unsharded parameter then; the backward moments are larger on every point here
        layer_grads = 2 * unsharded_layer if name.startswith("backward-layer") else 0
        phases[name] = in_flight + optimizer + at["activations"] + at["grads"] // n + layer_grads
    peak_phase = max(phases, key=phases.get)
    return {
        "source": "analytic-fsdp",
        "params_bytes": params,
        "optimizer_bytes": optimizer,
        "peak_params_bytes": in_flight,
        "unsharded_root_bytes": unsharded_root,
        "unsharded_layer_bytes": unsharded_layer,
        "peak_bytes": phases[peak_phase],
        "peak_phase": peak_phase,
        "phases": phases,
        "single_process_peak_bytes": single.peak_bytes,
    }


def fsdp_predictions(case: Case) -> tuple[dict, list[tuple[str, str, object, float]]]:
    """(estimate, [(quantity, measurement key, predicted, tolerance)]) for an fsdp point; the checks judge
    them (:func:`ckptbench.theory.checks.comm_checks`).  Per-rank memory keys are rank 0's."""
    comm = fsdp_case_comm(case)
    mem = fsdp_memory_estimate(case)
    rows = [
        ("allgather_payload_bytes", "allgather_payload_bytes", comm["allgather_payload_bytes"], 0.0),
        ("allgather_count", "allgather_count", comm["allgather_count"], 0.0),
        ("reduce_scatter_payload_bytes", "reduce_scatter_payload_bytes", comm["reduce_scatter_payload_bytes"], 0.0),
        ("reduce_scatter_count", "reduce_scatter_count", comm["reduce_scatter_count"], 0.0),
        ("rank_params_bytes", "rank_params_bytes", mem["params_bytes"], 0.0),
        ("rank_optimizer_bytes", "rank_optimizer_bytes", mem["optimizer_bytes"], 0.0),
        ("peak_breakdown.params", "peak_params_bytes", mem["peak_params_bytes"], 0.0),
        ("peak_bytes", "peak_bytes", mem["peak_bytes"], PEAK_TOLERANCE),
    ]
    return {**comm, **mem}, rows
