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

from ...measure.bus import bus_bytes
from ...point.case import DTYPES, Case, ModelSpec


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


def local_elements(shape: tuple[int, ...], world: int, rank: int) -> int:
    """Elements of `rank`'s unpadded chunk of a parameter (``torch.chunk`` on dim 0: the last ranks get
    fewer rows, or none).  What ``zeros_like`` of a sharded parameter makes: AdamW's state is this size."""
    rows = ceil_div(shape[0], world)
    rows = max(0, min(rows, shape[0] - rank * rows))
    for d in shape[1:]:
        rows *= d
    return rows


def rank_state_bytes(spec: ModelSpec, world: int, rank: int) -> int:
    """Bytes of `rank`'s unpadded chunks of every parameter (AdamW moments; a padded shard's storage is
    larger on the ranks whose chunks are short)."""
    shapes = unit_shapes(spec)
    per_unit = {name: sum(local_elements(s, world, rank) for s in unit) for name, unit in shapes.items()}
    return (spec.layers * per_unit["layer"] + per_unit["root"]) * DTYPES[spec.dtype]


def unit_shard_bytes(spec: ModelSpec, world: int, dtype: str = "") -> dict[str, int]:
    """Bytes of one rank's padded shard of a layer unit and of the root unit, in the model's dtype or in
    `dtype` (the bf16 copy a mixed-precision all-gather sends)."""
    b = DTYPES[dtype or spec.dtype]
    return {name: sum(shard_elements(s, world) for s in shapes) * b for name, shapes in unit_shapes(spec).items()}


def param_dtype(spec: ModelSpec, autocast: str = "") -> str:
    """The dtype FSDP2 gathers and computes in: the model's, or under bf16-mixed
    (``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``) bf16; the shards, their gradients,
    the reduce-scatter and AdamW's state stay in the model's (fp32)."""
    return autocast or spec.dtype


def fsdp_comm_estimate(spec: ModelSpec, world: int, iterations: int, autocast: str = "") -> dict:
    """All-gather and reduce-scatter traffic of one rank over `iterations` micro-batches (see the module).
    Under bf16-mixed (`autocast` "bf16") the all-gather sends the bf16 copy of the shard (half the bytes)
    and the reduce-scatter runs in fp32 (``reduce_dtype``): the bf16 gradients are cast into its input."""
    if world < 2:
        raise ValueError("sharded data parallel needs world_size >= 2")
    shard = unit_shard_bytes(spec, world)
    gathered = unit_shard_bytes(spec, world, param_dtype(spec, autocast))
    gather_step = 2 * spec.layers * gathered["layer"] + gathered["root"]
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
                              (t.warmup_steps + t.memory_steps + t.steps) * case.grad_accum, case.setup.autocast)


# Relative tolerance of the per-rank peak in a record's checks.  The composition equals the exact tracker
# on CPU to the byte (fsdp_memory_estimate) on most ranks of most runs; on a loaded machine one rank now and
# then holds more, by 3,072 B (gpt2-tiny none, world 2), 51,120 B (llama-tiny bf16-mixed, world 3, rank 2)
# and 52,752 B (llama-tiny fp32, world 3, rank 2), never reproduced on a run alone (docs/fsdp.md).  Not
# attributed; it comes and goes with timing, so it is bounded, not modelled: by the largest buffer whose
# release waits on gloo's thread finishing a reduce-scatter, one unsharded layer's padded gradient in the
# reduce dtype (:func:`in_flight_allowance`).  The check allows that much above the prediction, no less.
PEAK_TOLERANCE = 0.001


def in_flight_allowance(case: Case) -> int:
    """Bytes a rank's peak may exceed the composition by: one unsharded layer's padded gradient in fp32
    (the reduce dtype of every precision built here), whose reduce-scatter buffers gloo's thread releases."""
    return case.world_size * unit_shard_bytes(case.model, case.world_size, "fp32")["layer"]


def largest_local_elements(spec: ModelSpec, world: int, rank: int) -> int:
    """Elements of the largest chunk `rank` holds (AdamW's CPU temporaries are sized by it)."""
    return max(local_elements(s, world, rank) for shapes in unit_shapes(spec).values() for s in shapes)


def rank_moments(case: Case, rank: int = 0) -> list[tuple[str, int, int]]:
    """(phase, bytes, gathered) of every moment of one rank's step under FSDP2, in step order: the single-process
    walk (:func:`ckptbench.theory.memory.estimate.estimate`) of the rank's micro-batch with FSDP2's buffers
    added and the gradients of the units already reduce-scattered counted as shards.

    What FSDP2 holds beside the single-process step (traced allocation by allocation on llama-tiny,
    world 2 and 3, gloo; U = one unsharded layer = N padded layer shards, U_r the same for the root).
    A unit's flat all-gather output is freed only when the next all-gather is issued (FSDP2 keeps the
    last one as its ``all_gather_state``), and backward prefetches the next layer's:

    * the root unsharded (U_r) from forward to the root's post-backward;
    * at the loss (the forward moment), the last layer's flat all-gather output (U);
    * in the head's backward, the last layer's flat output again (U), prefetched by the root's
      pre-backward; at that layer's pre-backward its parameters are copied out of it (2U for a moment);
    * in layer i's backward: layer i unsharded (U), the prefetched flat output of layer i-1 (U, not for
      layer 0) and the reduce-scatter input of layer i+1 (U, ``chunk_cat``'s output, which FSDP2 keeps
      until the next unit's reduce-scatter: ``reduce_scatter_max_input_buffers = 1``; not for the last
      layer); this layer's gradients are full size, those of the layers above are shards;
    * at layer i+1's post-backward (named backward-layer-i: it follows the gradient into layer i): its
      parameters resharded, the previous reduce-scatter input dropped, the new one (U) made and the
      gradients freed into it, the reduce-scatter output (a shard) made, and gloo's copy of the input (U)
      while the collective runs: 3U with layer i's flat output; after layer 0 (backward-embedding), 2U;
      autograd still holds the layer's input-norm weight gradient (h elements) until the hook returns;
    * in the embedding's backward the root is still gathered and layer 0's reduce-scatter input alive;
      at the root's post-backward the root is resharded, its input (U_r), output (a root shard) and
      gloo's copy (U_r) live together, with the LM head's gradient (untied: still referenced until the
      collective ends);
    * the optimizer step: the shards' gradients and AdamW's two temporaries of the rank's largest chunk.

    ``gathered`` is the unsharded parameters at the moment (the tracker's ``params`` beyond the shards):
    the root, and a layer once its pre-backward has copied it out of its flat output.

    bf16-mixed (``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``): the walk is a pure-bf16
    model's (FSDP2 computes over bf16 unsharded parameters, no autocast); U, U_r, the flat all-gather
    outputs and the current layer's gradients are bf16, while the shards, their gradients, the
    reduce-scatter input and output and gloo's copy are fp32 (FSDP2 casts the bf16 gradients into the fp32
    reduce-scatter input as it copies them in).  The bf16 copy of a shard an all-gather sends lives only
    inside the gather (below the peak).  Exact on llama-, qwen2- and gpt2-tiny at world 2 and llama-tiny
    at world 3 (docs/fsdp.md).

    Not modelled (below the peak on every measured point, docs/fsdp.md): moments inside a layer's forward
    (its unsharded parameters and flat output, 2U, beside that layer's transient buffers), the input ids
    and loss scalars still alive in the optimizer step, and (GPT-2) part of the optimizer step.
    """
    from dataclasses import replace

    from ..memory.estimate import estimate_case
    from ..memory.params import param_count

    spec, n = case.model, case.world_size
    shard = unit_shard_bytes(spec, n)
    counts = param_count(spec)
    b = spec.bytes_per_element
    shards = spec.layers * shard["layer"] + shard["root"]
    static = shards + counts.buffers_bytes + 2 * rank_state_bytes(spec, n, rank) + 4 * counts.n_tensors
    s, last = shard["layer"], spec.layers - 1
    # unsharded parameters and flat all-gather outputs are in the compute dtype (p), the reduce-scatter
    # input and gloo's copy of it in the model's (fp32 under bf16-mixed: reduce_dtype)
    compute = param_dtype(spec, case.setup.autocast)
    p = DTYPES[compute]
    u, ur = n * shard["layer"] * p // b, n * shard["root"] * p // b
    ug, urg = n * shard["layer"], n * shard["root"]
    layer_grads = counts.per_layer * p  # this layer's unsharded gradients, in the compute dtype
    # the single-process step of the compute dtype: bf16-mixed under FSDP2 computes over bf16 parameters
    # without autocast, as a pure-bf16 model does
    single_model = replace(spec, dtype=compute)
    single = estimate_case(replace(case, model=single_model, world_size=1, local_sgd_steps=0,
                                   setup=replace(case.setup, sharding="ddp", autocast="")))
    accum = case.grad_accum > 1
    g0 = single.grads_bytes if accum else 0  # the single step's full gradients before the last micro-batch
    # at a layer's post-backward autograd still holds its input norm's weight gradient (the op that
    # made it is the layer's first; it is freed once the hook returns)
    linger = spec.hidden * p
    out: list[tuple[str, int]] = []
    embedding_acts = 0
    for phase, kind, acts, grads in single.moments:
        i = int(phase.rsplit("-", 1)[1]) if phase.startswith("backward-layer-") else None
        done = 0  # layers whose gradients are shards by now
        gathered = ur  # unsharded parameters (the root; a layer's once copied out of its flat output)
        if kind == "forward":
            extra = ur + u
        elif kind == "head":
            extra = ur + u
        elif kind == "boundary" and i == last:
            phase, extra, gathered = "backward-head", ur + 2 * u, ur + u
        elif kind == "boundary" and i is not None:
            extra, done = ur + u + 2 * ug + linger, last - i
        elif kind == "boundary":
            extra, done = ur + 2 * ug + linger, spec.layers
        elif kind == "layer":
            extra, done = ur + u + (u if i > 0 else 0) + (ug if i < last else 0), last - i
            gathered = ur + u
        elif kind == "embedding":
            extra, done = ur + ug, spec.layers
            embedding_acts = acts - spec.vocab * spec.hidden * p - p * case.batch_size * case.seq_len * spec.hidden
        else:
            continue  # the optimizer: below
        sharded = grads - g0 - (0 if accum else done * (layer_grads - s)) + (shards if accum else 0)
        out.append((phase, static + extra + acts + sharded, gathered))
    head_grad = 0 if spec.tie_embeddings else spec.vocab * spec.hidden * p
    out.append(("backward-embedding", static + 2 * urg + shards + head_grad + embedding_acts, 0))
    out.append(("optimizer", static + shards + 2 * largest_local_elements(spec, n, rank) * b, 0))
    return out


def fsdp_memory_estimate(case: Case, rank: int = 0) -> dict:
    """`rank`'s memory in a step of `case` under FSDP2: exact static parts, and the peak over the step's
    moments (:func:`rank_moments`).

    Exact on CPU (counts of known tensors; the peak and the phase it falls in equal the tracker's on
    llama-, qwen2- and gpt2-tiny, none / every-2 / full, world 2, and llama-tiny at world 3, every rank):

    * ``params_bytes``: the rank's padded shards of every unit plus the model's buffers (not sharded);
    * ``optimizer_bytes``: AdamW's two moments of the rank's chunks (unpadded: ``zeros_like`` of a sharded
      parameter is its local chunk, so with padding the last ranks hold less) plus one fp32 step scalar
      per parameter;
    * ``peak_params_bytes``: the params at the peak's moment: the shards plus the unsharded root (FSDP2
      keeps it gathered from forward into backward), plus one unsharded layer where the peak falls inside a
      layer (not at the loss or in the head's backward: the last layer's gathered flat output is no
      parameter until its pre-backward copies it out).  Unsharded parameters are in the compute dtype
      (bf16 under bf16-mixed), the shards in the model's.
    """
    from ..memory.params import param_count

    spec, n = case.model, case.world_size
    shard = unit_shard_bytes(spec, n)
    counts = param_count(spec)
    shards = spec.layers * shard["layer"] + shard["root"]
    params = shards + counts.buffers_bytes
    optimizer = 2 * rank_state_bytes(spec, n, rank) + 4 * counts.n_tensors
    p, b = DTYPES[param_dtype(spec, case.setup.autocast)], DTYPES[spec.dtype]
    unsharded_root, unsharded_layer = n * shard["root"] * p // b, n * shard["layer"] * p // b
    moments = rank_moments(case, rank)
    phases: dict[str, int] = {}
    peak_phase, peak, peak_gathered = "", -1, 0
    for phase, total, gathered in moments:
        phases[phase] = max(phases.get(phase, 0), total)
        if total > peak:  # the first moment to reach the maximum names it, as the tracker does
            peak_phase, peak, peak_gathered = phase, total, gathered
    return {
        "source": "analytic-fsdp",
        "params_bytes": params,
        "optimizer_bytes": optimizer,
        "peak_params_bytes": params + peak_gathered,
        "unsharded_root_bytes": unsharded_root,
        "unsharded_layer_bytes": unsharded_layer,
        "peak_bytes": peak,
        "peak_phase": peak_phase,
        "phases": phases,
    }


def fsdp_predictions(case: Case) -> tuple[dict, list[tuple[str, str, object, float]]]:
    """(estimate, [(quantity, measurement key, predicted, tolerance)]) for an fsdp point; the checks judge
    them (:func:`ckptbench.theory.verdicts.checks.comm_checks`).  Per-rank memory keys are rank 0's."""
    from ...point.case import analytic_sharded_point

    comm = fsdp_case_comm(case)
    rows = [
        ("allgather_payload_bytes", "allgather_payload_bytes", comm["allgather_payload_bytes"], 0.0),
        ("allgather_count", "allgather_count", comm["allgather_count"], 0.0),
        ("reduce_scatter_payload_bytes", "reduce_scatter_payload_bytes", comm["reduce_scatter_payload_bytes"], 0.0),
        ("reduce_scatter_count", "reduce_scatter_count", comm["reduce_scatter_count"], 0.0),
    ]
    if not analytic_sharded_point(case.model, case.setup, case.device):  # e.g. another optimizer's state
        return comm, rows + [("peak_bytes", "peak_bytes", None, 0.0)]  # memory unchecked, and said so
    mem = fsdp_memory_estimate(case)
    rows += [
        ("rank_params_bytes", "rank_params_bytes", mem["params_bytes"], 0.0),
        ("rank_optimizer_bytes", "rank_optimizer_bytes", mem["optimizer_bytes"], 0.0),
        # the parameters at the peak's moment; where a held reduce-scatter buffer moves the peak (below),
        # the moment it moves to may hold one unsharded layer more or less (seen once in CI, bf16-mixed none:
        # +73,984 B, the last layer gathered)
        ("peak_breakdown.params", "peak_params_bytes", mem["peak_params_bytes"],
         mem["unsharded_layer_bytes"] / mem["peak_params_bytes"]),
        # above the prediction by up to one in-flight reduce-scatter buffer, never below (a relative
        # tolerance is symmetric: the upper bound decides it here, and the e2e tests hold the lower one)
        ("peak_bytes", "peak_bytes", mem["peak_bytes"],
         max(PEAK_TOLERANCE, in_flight_allowance(case) / mem["peak_bytes"])),
    ]
    return {**comm, **mem}, rows
