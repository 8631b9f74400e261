"""The analytic memory estimate of one training step, walked phase by phase to find its peak.

Pure functions over a :class:`~ckptbench.point.case.ModelSpec` (no torch import), so the CLI, the suite
validator and the report can ask "what should this point cost?" without building anything.  The parts
come from :mod:`.params` (parameters, gradients, optimizer state) and :mod:`.activations` (what each
layer and the head keep for backward).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from ...point.case import Case, ModelSpec
from ...point.strategy import checkpointed_layers
from .activations import (
    head_activation_terms,
    layer_activation_terms,
    mixed_forward_only_bytes,
    not_saved_head_terms,
)
from .backward import layer_moments
from .params import optimizer_state_bytes, optimizer_step_bytes, param_count
from .units import FP32, HALF, INT64
from .workspaces import cublas_workspace_bytes, step_workspaces

# head terms every layer uses and layer 0's backward releases (:func:`.activations.head_activation_terms`)
SHARED_HEAD_TERMS = ("rope_cos_sin", "position_ids", "causal_mask")


@dataclass(frozen=True)
class Estimate:
    """Predicted bytes of one training step; field names match the harness's measurement keys."""

    model: str
    family: str
    dtype: str
    attn: str
    batch: int
    seq: int
    every_n_layers: int
    offload: bool
    grad_accum: int
    n_params: int
    params_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    checkpointed_layers: tuple[int, ...]
    layer_full_bytes: int
    checkpointed_input_bytes: int
    offloaded_bytes: int
    activations_after_forward_bytes: int
    saved_bytes: int
    mem_after_forward_bytes: int
    peak_bytes: int
    peak_phase: str  # forward | backward-head | backward-layer-<i> | backward-embedding | optimizer
    peak_breakdown: dict = field(default_factory=dict)
    host_bytes: int = 0
    layer_terms: dict = field(default_factory=dict)
    head_terms: dict = field(default_factory=dict)
    phases: dict = field(default_factory=dict)  # phase -> {params, grads, optimizer, activations, total}
    autocast: str = ""  # "bf16": bf16-mixed, autocast over the fp32 weights `dtype` names
    offload_kind: str = ""  # "streamed": streamed offload's estimate (else transformers' offload, or none)
    # CUDA, where the caller named the device's compute capability: the cuBLAS workspaces alive from the
    # backward on (after a warm-up step, through the forward too), counted in the activations as the
    # allocator counts them (:mod:`.workspaces`); 0 when not modelled
    cublas_workspace_bytes: int = 0
    # every moment the walk visits, in step order: (phase, kind, activations, grads); kind is forward,
    # head, boundary (a layer's backward about to start: what is kept below it plus the gradient flowing
    # in), layer, embedding or optimizer.  What :mod:`..comm.fsdp` composes a rank's step from (not in to_dict)
    moments: tuple = ()

    @property
    def recomputed_layers(self) -> list[int]:
        return list(self.checkpointed_layers)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["checkpointed_layers"] = list(self.checkpointed_layers)
        d["recomputed_layers"] = self.recomputed_layers
        d.pop("moments")
        return d


def gradient_bytes(spec: ModelSpec, autocast: str = "") -> int:
    """Bytes per gradient element: the parameters' dtype.  Under autocast that is the fp32 master weights',
    whatever the compute dtype: each bf16 weight gradient goes back through its weight's cast (an fp32
    copy) before it is accumulated into ``.grad``."""
    return spec.bytes_per_element


def estimate(spec: ModelSpec, batch: int, seq: int, every_n_layers: int = 0, offload: bool = False,
             grad_accum: int = 1, device: str = "cpu", autocast: str = "", optimizer: str = "adamw",
             layers: tuple[int, ...] = (), streamed: bool = False, cuda_capability: int | None = None,
             cublas_config: str | None = None, warmed_up: bool = True) -> Estimate:
    """Memory of one training step (pure dtype, no master weights), device side and host side.

    After forward: params + optimizer state + activations (grads are None: zeroed with set_to_none).
    Peak: the largest moment of the step, phase by phase in the order they happen (each phase's
    activations and gradients at its largest moment are kept in ``phases``; a measurement names the
    phase its own peak fell in, and its parts are judged against that phase's) —
      ``forward`` the loss is being computed: logits (B·N·V), their fp32 copy in 16-bit models and the
      padded labels are transient on top of what is kept;
      ``backward-head`` nll and log-softmax backward hold two fp32 N·V gradients beside everything kept,
      then the LM head's backward holds its h·V weight gradient;
      ``backward-layer-<i>`` layer by layer from the last: what the layers below still keep, this
      layer's saved tensors (recomputed first if checkpointed; with offload its input comes back to the
      device), and the moments of its own backward (:mod:`.backward`: the MLP's gradients, eager
      attention's a·s² gradients), with exactly the parameter gradients accumulated by then;
      ``optimizer`` params + grads + state + the batch's ids + the optimizer's temporaries
      (:func:`.params.optimizer_step_bytes`): AdamW's two copies of the largest tensor with the
      per-parameter loop (``adamw-loop``; ``adamw`` on a CPU), one copy of all the parameters with the
      foreach kernels (``adamw-foreach``; ``adamw`` on CUDA), none for SGD with momentum.
    With grad_accum > 1 the later micro-steps start with a full set of grads, so every phase carries it.

    ``layers`` (a layer set, :class:`~ckptbench.point.strategy.Recompute`) names the checkpointed layers instead
    of ``every_n_layers``: the walk asks only which layers are checkpointed, never how they were chosen.

    ``streamed`` (``+offload-streamed``, :mod:`ckptbench.train.streamed`) on CUDA: the forward holds what
    transformers' offload holds (a layer's input stays on the device until its copy is done, and it was
    alive through the layer's call anyway); in backward, from the last checkpointed layer down to the one
    above the first, the next checkpointed layer's input is prefetched: one more checkpointed input in each
    of those layers' moments.  Unverified on hardware until the GPU suite measures it.  On a CPU nothing
    moves and the estimate is transformers' offload's.

    ``cuda_capability`` (the major number of the device's compute capability) on CUDA: every moment also
    holds the cuBLAS workspaces the caching allocator counts as allocated (:mod:`.workspaces`: one per
    thread that multiplies, 32 MiB each on capability 9-12, 8,519,680 bytes below, or as
    ``cublas_config``, the run's ``CUBLAS_WORKSPACE_CONFIG``, sets them): two after a warm-up step
    (``warmed_up``), else one through the forward and two from the backward on.  They are part of
    ``activations_after_forward_bytes`` (the allocator's bytes after the forward beyond the parameters and
    optimizer state), not of ``saved_bytes``.  None: the tensors alone, as the simulation counts them.

    ``autocast="bf16"`` (bf16-mixed, Llama and Qwen2 on a CPU): the forward and loss run under
    ``torch.autocast`` over fp32 weights.  Params, grads and AdamW state stay fp32; what the layers and the
    head keep is :func:`.activations.mixed_layer_activation_terms` (bf16 casts of each linear's input and
    weight beside the fp32 residual stream and norms); the forward's peak also holds the cast cache's
    weight copies no op saved and the fp32 final-norm output; the head's backward makes the logits',
    the head input's and its weight's gradients in bf16; the layers' moments are the ``bf16-mixed`` rows
    of :mod:`.backward`, which include a checkpointed layer re-casting its weights in its recomputation.
    """
    pc = param_count(spec)
    B = spec.bytes_per_element
    N = batch * seq
    h, V = spec.hidden, spec.vocab
    params = pc.total * B + pc.buffers_bytes
    G = gradient_bytes(spec, autocast)
    grads = pc.total * G
    # AdamW: exp_avg and exp_avg_sq in the param dtype, plus a fp32 `step` scalar tensor per parameter;
    # SGD: a momentum buffer in the param dtype
    state = optimizer_state_bytes(pc, B, optimizer)
    ckpt = list(layers) or checkpointed_layers(spec.layers, every_n_layers)
    ckpt_set = set(ckpt)  # asked once per layer below: a list would make the walk quadratic in depth
    any_ck = bool(ckpt)
    all_ck = len(ckpt) == spec.layers
    lt = layer_activation_terms(spec, batch, seq, device, autocast)
    ht = head_activation_terms(spec, batch, seq, any_ck, all_ck, device, autocast)
    layer_full = sum(lt.values())
    ckpt_input = B * N * h
    n_ck = len(ckpt)
    checkpointed_input = n_ck * ckpt_input
    acts = (spec.layers - n_ck) * layer_full + checkpointed_input + sum(ht.values())
    not_saved = sum(v for k, v in ht.items() if k in not_saved_head_terms(spec, all_ck))
    saved = acts - not_saved
    offloaded = checkpointed_input if offload else 0
    # On a CPU the host *is* the device: offloaded tensors stay in the same memory (save_on_cpu's
    # `tensor.cpu()` returns the tensor itself), so only a CUDA device is relieved of them.
    moved = offloaded if device == "cuda" else 0
    # the cuBLAS workspaces (CUDA, capability known): alive through the forward, and from the backward on
    cuda_known = device == "cuda" and cuda_capability is not None
    one = cublas_workspace_bytes(cuda_capability, cublas_config) if cuda_known else 0
    ws_forward, ws_backward = (one * n for n in step_workspaces(warmed_up))
    dev_acts = acts - moved + ws_forward
    static = params + state
    after_forward = static + dev_acts

    # --- peak, phase by phase (device side) ---
    g0 = grads if grad_accum > 1 else 0
    phases: dict[str, tuple[int, int]] = {}  # phase -> (activations, grads) at its largest moment
    moments: list[tuple[str, str, int, int]] = []

    def put(name: str, acts_now: int, grads_now: int, kind: str) -> None:
        moments.append((name, kind, acts_now, grads_now))
        if name not in phases or acts_now + grads_now > sum(phases[name]):
            phases[name] = (acts_now, grads_now)

    C = HALF if autocast else B  # the logits' and linears' dtype
    logits_tmp = C * N * V + (FP32 * N * V if C != FP32 else 0) + INT64 * batch * (seq + 1)
    if autocast:
        # the cast cache's weight copies no op saved, alive until autocast ends with the loss; the fp32
        # final-norm output the model's forward holds (the LM head saved its bf16 cast, not it); at batch
        # 1 the padded labels are the tensor nll keeps (``labels``), no extra copy
        logits_tmp += mixed_forward_only_bytes(spec, n_ck) + FP32 * N * h
        logits_tmp -= INT64 * batch * (seq + 1) if batch == 1 else 0
    put("forward", dev_acts + logits_tmp, g0, "forward")
    acts_after_forward = dev_acts
    dev_acts += ws_backward - ws_forward  # the backward's thread has its workspace from its first matmul on
    # the loss's backward: nll and log-softmax hold two fp32 N·V gradients beside everything kept
    put("backward-head", dev_acts + 2 * FP32 * N * V - ht["labels"], g0, "head")
    # the LM head's backward: the gradient into the final norm's output (B·N·h) and the head's weight
    # gradient (B·h·V, an activation until it is accumulated) replace the fp32 log-softmax gradient; a
    # 16-bit model's logits gradient (B·N·V) is freed with its fp32 copy's
    # (in the compute dtype under autocast: the logits' gradient, the head's input and weight gradients
    # are bf16, cast to fp32 afterwards)
    put("backward-head", dev_acts + C * N * h + C * h * V - INT64 * N - (FP32 - C) * N * V, g0, "head")
    # after the head: log-softmax, labels and final norm are gone (and the head's bf16 weight copy under
    # autocast); lm_head (or the tied embedding) and the final norm have their grads
    a = dev_acts - ht["log_softmax"] - ht["labels"] - ht["final_norm"] - ht.get("lm_head_weight", 0)
    head_grad = V * h * G
    if spec.tie_embeddings:
        # a tied weight's first gradient waits in autograd's input buffer, an activation, until the
        # embedding's backward adds the second one
        a += head_grad
        g = g0 + (pc.final_norm * G if grad_accum == 1 else 0)
    else:
        g = g0 + ((V * h + pc.final_norm) * G if grad_accum == 1 else 0)
    layer_params = pc.per_layer * G
    layer_forms = {ck: layer_moments(spec, batch, seq, ck, autocast) for ck in (False, True)}
    for idx in reversed(range(spec.layers)):
        checkpointed = idx in ckpt_set
        kept = ckpt_input if checkpointed else layer_full
        start = a
        if checkpointed and moved:
            kept = 0  # it lives on the host; the unpack brings it back for the recompute
            start += ckpt_input
        if streamed and moved and ckpt[0] < idx <= ckpt[-1]:
            start += ckpt_input  # the checkpointed layer below's input, prefetched (streamed offload)
        grad_in, deltas = layer_forms[checkpointed]
        moments.append((f"backward-layer-{idx}", "boundary", start + grad_in, g))
        for delta, layer_grads in deltas:
            put(f"backward-layer-{idx}", start + grad_in + delta, g + (layer_grads if grad_accum == 1 else 0),
                "layer")
        a -= kept
        g += layer_params if grad_accum == 1 else 0
    # the embedding's backward.  Layer 0's backward has released what the layers shared (RoPE's cos/sin,
    # the checkpoint closures' mask and position ids; GPT-2's position ids go with its learned positions,
    # whose backward runs first and accumulates their gradient).  The lookup's dense V·h gradient is made
    # while the gradient flowing in (B·N·h) is alive; a tied weight then adds it to the waiting head
    # gradient, a third V·h tensor, once the gradient flowing in is freed
    a -= sum(ht.get(name, 0) for name in SHARED_HEAD_TERMS)
    moments.append(("backward-embedding", "boundary", a + B * N * h, g))
    g_emb = g + (pc.position * G if grad_accum == 1 else 0)
    put("backward-embedding", a + V * h * G + B * N * h, g_emb, "embedding")
    if spec.tie_embeddings:
        put("backward-embedding", a + 2 * V * h * G, g_emb, "embedding")
    # the loop still holds the batch's ids while the optimizer steps
    put("optimizer", optimizer_step_bytes(pc, B, optimizer, device) + INT64 * N + ws_backward, grads, "optimizer")
    parts = {name: {"params": params, "grads": gr, "optimizer": state, "activations": ac,
                    "total": static + ac + gr} for name, (ac, gr) in phases.items()}
    peak_phase = max(parts, key=lambda k: parts[k]["total"])
    return Estimate(
        model=spec.label, family=spec.family, dtype=spec.dtype, attn=spec.attn, batch=batch, seq=seq,
        every_n_layers=every_n_layers, offload=offload, grad_accum=grad_accum, n_params=pc.total,
        params_bytes=params, grads_bytes=grads, optimizer_bytes=state, checkpointed_layers=tuple(ckpt),
        layer_full_bytes=layer_full, checkpointed_input_bytes=checkpointed_input, offloaded_bytes=offloaded,
        activations_after_forward_bytes=acts_after_forward, saved_bytes=saved, mem_after_forward_bytes=after_forward,
        peak_bytes=parts[peak_phase]["total"], peak_phase=peak_phase,
        peak_breakdown={k: v for k, v in parts[peak_phase].items() if k != "total"},
        host_bytes=offloaded, layer_terms=lt, head_terms=ht, phases=parts, autocast=autocast,
        offload_kind="streamed" if streamed and offload else "", cublas_workspace_bytes=ws_backward,
        moments=tuple(moments),
    )


def estimate_case(case: Case, cuda_capability: int | None = None, cublas_config: str | None = None) -> Estimate:
    """The estimate for a sweep point; on CUDA with the device's compute capability (its major number) and
    the run's ``CUBLAS_WORKSPACE_CONFIG``, the cuBLAS workspaces too (:func:`estimate`)."""
    return estimate(case.model, case.batch_size, case.seq_len, case.every_n_layers, case.offload,
                    case.grad_accum, case.device, case.setup.autocast, case.setup.optimizer, case.recompute.layers,
                    streamed=case.offload and case.recompute.offload == "streamed", cuda_capability=cuda_capability,
                    cublas_config=cublas_config, warmed_up=case.train.warmup_steps >= 1)


def korthikanti_layer_bytes(batch: int, seq: int, hidden: int, heads: int) -> int:
    """Korthikanti et al. 2022 eq. 1, one GPT layer in 16-bit with dropout: s·b·h·(34 + 5·a·s/h) bytes."""
    return seq * batch * hidden * 34 + 5 * heads * seq * seq * batch
