"""Simulated training step: the real model and optimizer run on fake tensors, memory is counted exactly.

``--simulate`` answers "what would this step allocate?" for models that do not fit (or have no GPU) by
running the actual transformers forward, backward and optimizer step (the point's ``Setup.optimizer``) under
``torch._subclasses.fake_tensor.FakeTensorMode``: every operator runs its shape/dtype logic but no data
is allocated, so an 8B model at 2k tokens costs seconds on a laptop CPU.  What it measures is what the
same code would keep on a real CPU run: the same saved tensors, the same checkpoint recomputation, the
same optimizer temporaries.  It does not model the CUDA caching allocator (rounding, fragmentation),
cuBLAS workspaces or kernels that save different tensors on CUDA (e.g. flash attention's layout).

The model is constructed on ``meta`` (no memory) and materialised with ``to_empty(device="cpu")`` inside
the fake mode.  Never use a fake ``cuda`` device on a CPU-only build: the process aborts.

Offload cannot run on a CPU-only build (transformers asks ``save_on_cpu`` for pinned memory, which needs
an accelerator), so the simulation runs the checkpointed step without it and, for a CUDA device, moves
each checkpointed input to the host column while offload would keep it there (from the end of its
layer's forward to the start of its layer's backward).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import asdict, dataclass, field

import torch

from ...measure.flops import FlopCounter
from ...measure.saved import LayerProbe
from ...measure.storage import LiveStorageTracker, StorageSerials, storage_key, track_training_state
from ...point.case import ModelSpec
from ...point.setup import Setup
from ...point.strategy import Recompute
from ...train.adapters import with_adapters
from ...train.checkpointing import decoder_layers, enable_checkpointing
from ...train.models import build_model
from ...train.precision import AUTOCAST_DTYPES
from .loop_step import LoopStep


@contextlib.contextmanager
def _no_packed_sequence_detection():
    """Answer transformers' packed-sequence probe as a real run does for our inputs: no packing.

    ``find_packed_sequence_indices`` reads the position ids' values; on fake tensors it cannot, assumes
    packing, and builds a (b, 1, s, s) mask, which sends sdpa off its mask-free ``is_causal`` path (a
    different kernel with different saved tensors, and with checkpointing a mask held until backward).
    Our position ids are ``arange(s)``, for which the real probe returns None.
    """
    from transformers import masking_utils

    original = masking_utils.find_packed_sequence_indices
    masking_utils.find_packed_sequence_indices = lambda position_ids: None
    try:
        yield
    finally:
        masking_utils.find_packed_sequence_indices = original


@contextlib.contextmanager
def _grouped_mm_as_the_cpu_kernel():
    """Give torch's grouped matmul on fake tensors the output the CPU kernel a real step runs gives.

    Mixture-of-experts layers (mixtral, qwen3_moe, ...) multiply their experts with it.  Its meta kernel
    carries the CUDA kernel's checks (bf16 inputs only) and pads the output's rows to 16 bytes on CUDA
    builds only; the CPU kernel takes fp32 and fp16 as well, returns the inputs' dtype and always pads.
    """
    from torch import _meta_registrations as meta

    original = getattr(meta, "_meta_grouped_mm_common", None)
    if original is None or not hasattr(meta, "_create_grouped_mm_output_tensor"):
        yield
        return

    def common(mat_a, mat_b, scale_a, scale_b, offs=None, bias=None, scale_result=None, out_dtype=None,
               use_fast_accum=False):
        if scale_a is not None or scale_b is not None:  # the scaled fp8 form: as torch says
            return original(mat_a, mat_b, scale_a, scale_b, offs, bias, scale_result, out_dtype, use_fast_accum)
        torch._check(mat_a.dtype == mat_b.dtype,
                     lambda: f"grouped_mm of {mat_a.dtype} and {mat_b.dtype}: the CPU kernel needs one dtype")
        shape = meta._create_grouped_mm_output_tensor(mat_a, mat_b, offs, out_dtype).shape
        dtype = out_dtype or mat_a.dtype
        align = 16 // dtype.itemsize
        row = -(-shape[-1] // align) * align
        stride = (shape[1] * row, row, 1) if len(shape) == 3 else (row, 1)
        return torch.empty_strided(shape, stride, dtype=dtype, device=mat_a.device)

    meta._meta_grouped_mm_common = common
    try:
        yield
    finally:
        meta._meta_grouped_mm_common = original


class _NoCount(contextlib.nullcontext):
    """Stands where the FLOP counter would, when FLOPs are not asked for: takes a phase, counts nothing."""

    phase = ""


@dataclass
class SimResult:
    """One simulated step; keys follow the harness's measurement dict so ``estimate.check`` accepts it."""

    params_bytes: int
    optimizer_bytes: int
    mem_after_forward_bytes: int
    activations_after_forward_bytes: int
    peak_bytes: int
    peak_breakdown: dict
    peak_phase: str
    checkpointed_input_bytes: int
    offloaded_bytes: int
    recomputed_layers: list
    host_bytes: int = 0
    wall_s: float = 0.0
    extra: dict = field(default_factory=dict)
    counted_flops: dict | None = None  # per phase, when asked: forward, backward, recompute
    # moment (forward-layer-i, forward-head, backward-layer-i, ...) -> device total after each allocation,
    # when asked: what :mod:`.extrapolate` fits to carry a few-layer step to the full depth
    moment_traces: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


def init_adamw_state(optimizer: torch.optim.AdamW) -> None:
    """Create AdamW's state as its first ``step`` would (fp32 step scalar, two moments like the param).

    The harness measures a step after warm-up, when the state already exists; creating it up front lets
    the simulation run one step that looks like that one instead of two.
    """
    for group in optimizer.param_groups:
        for p in group["params"]:
            if not p.requires_grad:  # a frozen parameter gets no gradient, so its first step makes no state
                continue
            optimizer.state[p] = {
                "step": torch.tensor(0.0, dtype=torch.float32),
                "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format),
            }


def init_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    """Create any optimizer's state as the real run's warm-up steps do: one step of the optimizer itself,
    on zero gradients, before the measured step (so a simulated step looks like a post-warm-up one).

    Running the optimizer's own step, not a copy of what it creates, gives each its state exactly: AdamW's
    step scalar and two moments, SGD's momentum buffer, Adafactor's factored ``exp_avg_sq_row`` /
    ``exp_avg_sq_col`` (``exp_avg_sq`` for 1-D parameters) and the ``RMS`` scalar it keeps.  Only the
    parameters the optimizer holds get a gradient, so frozen ones get no state, as in the real run.
    """
    params = [p for group in optimizer.param_groups for p in group["params"]]
    for p in params:
        p.grad = torch.zeros_like(p)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def simulate(spec: ModelSpec, batch: int, seq: int, every_n_layers: int = 0, offload: bool = False,
             lr: float = 1e-4, device: str = "cpu", count_flops: bool = False, trace: bool = False,
             setup: Setup | None = None, recompute: Recompute | None = None, grad_accum: int = 1,
             padded: int | None = None) -> SimResult:
    """One optimizer step of the real model on fake CPU tensors, with exact live bytes: `grad_accum`
    forwards and backwards (the later ones start with every gradient of the first, which they accumulate
    into; the loop keeps what it keeps of each micro-batch's loss, :class:`LoopStep`), then the optimizer.
    The after-forward moment is the first micro-batch's, as the memory step marks it.

    Offload is emulated phase by phase for a CUDA device: a checkpointed layer's input leaves the device
    total when the layer's forward ends and comes back when backward reaches the layer, so the peak is
    the device's at whichever moment it happens.  Streamed offload (``recompute.offload == "streamed"``)
    also brings the checkpointed layer below's input back when backward reaches a layer above it (the
    prefetch of :mod:`ckptbench.train.streamed`).  On a CPU the host is the device: nothing moves.
    """
    from torch._subclasses.fake_tensor import FakeTensorMode

    t0 = time.perf_counter()
    with torch.device("meta"):
        model = build_model(spec, device="meta")
        # LoRA: peft wraps the meta model as the worker wraps the real one (adapters made on meta too)
        model = with_adapters(model, setup.lora if setup else None)
    # a layer set and a SAC policy switched on by the train side's own function, as in the measured step
    enable_checkpointing(model, every_n_layers, False, recompute)
    layers = decoder_layers(model)
    ckpt_idx = [i for i, layer in enumerate(layers) if layer.gradient_checkpointing]
    moves = offload and device == "cuda"
    prefetch = moves and bool(ckpt_idx) and recompute is not None and recompute.offload == "streamed"

    # layer -> (storage key, bytes) of its input: keys, not tensors, so the simulation itself keeps
    # nothing alive that the real step would have freed
    ckpt_inputs: dict[int, tuple[int | None, int]] = {}
    in_forward = [False]

    def keep_input(i):
        def hook(module, args, kwargs):
            if in_forward[0]:
                hidden = args[0] if args else kwargs["hidden_states"]
                ckpt_inputs[i] = (storage_key(hidden), hidden.untyped_storage().nbytes())
        return hook

    def leave_device(i):
        def hook(module, args, kwargs, output):
            if in_forward[0] and moves:
                tr.to_host(ckpt_inputs[i][0])
        return hook

    def on_phase(phase: str) -> None:
        tr.phase = tr.moment = phase
        flops.phase = "backward"
        layer = int(phase.rsplit("-", 1)[1]) if phase.startswith("backward-layer-") else None
        if moves and layer in ckpt_inputs:
            tr.to_device(ckpt_inputs[layer][0])
        if prefetch and layer is not None and ckpt_idx[0] < layer <= ckpt_idx[-1]:
            below = max(i for i in ckpt_idx if i < layer)  # streamed offload's prefetch of the next group
            tr.to_device(ckpt_inputs[below][0])

    def moment(name):
        def hook(*_):
            if in_forward[0]:
                tr.moment = name
        return hook

    handles = [layer.register_forward_pre_hook(moment(f"forward-layer-{i}")) for i, layer in enumerate(layers)]
    handles.append(model.get_output_embeddings().register_forward_pre_hook(moment("forward-head")))
    handles += [layers[i].register_forward_pre_hook(keep_input(i), with_kwargs=True) for i in ckpt_idx]
    handles += [layers[i].register_forward_hook(leave_device(i), with_kwargs=True) for i in ckpt_idx]

    with (FakeTensorMode(allow_non_fake_inputs=True), _no_packed_sequence_detection(),
          _grouped_mm_as_the_cpu_kernel()):
        model.to_empty(device="cpu")
        # to_empty gives each module's parameter its own storage, which unties a tied LM head from the
        # embedding (two V·h tensors where the real model has one): tie them again as transformers does
        model.tie_weights()
        around = LoopStep(setup, device, grad_accum)
        optimizer = around.optimizer(model, lr)
        init_optimizer_state(optimizer)
        ids = torch.randint(0, spec.vocab, (batch, seq))
        inputs, batch_tensors = around.inputs(ids, padded)

        tr = LiveStorageTracker()
        tr.trace = trace
        track_training_state(tr, model, optimizer)
        for t in batch_tensors:
            tr.track(t, "activations")
        params_bytes = tr.by_category["params"]
        optimizer_bytes = tr.by_category["optimizer"]
        grad_hooks = [p.register_post_accumulate_grad_hook(lambda p: tr.track(p.grad, "grads"))
                      for p in model.parameters() if p.requires_grad]
        tr.phase = tr.moment = "forward"
        tr.reset_peak()
        flops = FlopCounter() if count_flops else _NoCount()
        autocast = setup.autocast if setup else ""
        scaler = torch.amp.GradScaler("cpu") if autocast == "fp16" else None
        if scaler is not None:  # its scale and growth tracker exist from the warm-up steps, before the measured one
            scaler.scale(torch.zeros(()))
        cast = (torch.autocast("cpu", dtype=AUTOCAST_DTYPES[autocast]) if autocast else contextlib.nullcontext())
        with LayerProbe(StorageSerials(), layers, on_phase=on_phase) as probe, tr, flops:
            kept = []  # what the loop holds of the micro-batches before the last
            for micro in range(grad_accum):
                tr.phase = tr.moment = "forward"
                flops.phase = "forward"
                probe.in_backward = False
                in_forward[0] = True
                with cast:
                    loss = around.loss(model(**inputs).loss)
                in_forward[0] = False
                if micro == 0:
                    after_forward = tr.total
                    ckpt_bytes = sum(nbytes for _, nbytes in ckpt_inputs.values())
                tr.phase = tr.moment = "backward-head"
                flops.phase = "backward"
                probe.in_backward = True
                around.backward(loss, scaler)
                if micro < grad_accum - 1:
                    kept += around.between_micro_batches(loss)
                    del loss
            held = around.before_optimizer(model, loss, scaler, optimizer)
            del loss
            tr.phase = tr.moment = flops.phase = "optimizer"
            if scaler is not None:  # scaler.step(optimizer), whose check of found_inf (.item()) fake tensors
                scaler.unscale_(optimizer)  # cannot run: the unscale it starts with, then the step it takes
                optimizer.step()  # when nothing overflowed
                scaler.update()
            else:
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            del held, kept
        for h in grad_hooks + handles:
            h.remove()
    offloaded = ckpt_bytes if offload else 0
    return SimResult(
        params_bytes=params_bytes,
        optimizer_bytes=optimizer_bytes,
        mem_after_forward_bytes=after_forward,
        activations_after_forward_bytes=after_forward - params_bytes - optimizer_bytes,
        peak_bytes=tr.peak,
        peak_breakdown=dict(tr.peak_breakdown),
        peak_phase=tr.peak_phase,
        checkpointed_input_bytes=ckpt_bytes,
        offloaded_bytes=offloaded,
        recomputed_layers=ckpt_idx,
        host_bytes=offloaded if moves else 0,
        wall_s=time.perf_counter() - t0,
        moment_traces=dict(tr.moment_traces),
        counted_flops=dict(flops.flops) if count_flops else None,
    )
