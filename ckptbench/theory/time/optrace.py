"""The operators one training step of a Case runs, traced on fake tensors: what the datasheet roofline prices.

The same machinery as the memory simulation (:mod:`..memory.simulate`): the real transformers model built on
``meta`` and materialised inside ``FakeTensorMode``, the loop's optimizer with its state made as the
warm-up steps make it, transformers' own checkpointing switched on (non-reentrant, so the recomputation
and its early stop are whatever torch does), and the loop's step around the model (:class:`..memory.loop_step.LoopStep`;
the manual loop divides its loss by the accumulation steps, as :func:`ckptbench.train.step.forward_loss`
does).  :class:`~ckptbench.measure.optrace.OpRecorder` files every dispatched op by signature and phase.
Nothing is allocated, so any size traces in about a second.  On a CPU the trace is the real step's, op
for op (``tests/unit/test_op_trace.py`` records both).

Offload: the step runs its checkpointing without ``save_on_cpu`` (as the simulation does; it cannot pin on
a CPU-only build), and for a CUDA Case each checkpointed layer's input is filed as one device→host copy
when the layer's forward ends and one host→device copy for its recomputation.  On a CPU nothing moves
(``save_on_cpu`` of a host tensor is the tensor itself), so a CPU trace has no copies.
"""

from __future__ import annotations

import contextlib
import functools

import torch

from ...measure.optrace import OpRecorder
from ...point.case import Case
from ...train.adapters import with_adapters
from ...train.checkpointing import decoder_layers, enable_checkpointing
from ...train.models import build_model
from ...train.precision import AUTOCAST_DTYPES
from ..memory.loop_step import LoopStep
from ..memory.simulate import _grouped_mm_as_the_cpu_kernel, init_adamw_state, init_optimizer_state


@contextlib.contextmanager
def _packed_sequence_detection_replayed(recorder: OpRecorder):
    """transformers' packed-sequence probe reads the position ids' values, which fake tensors do not have
    (:func:`..memory.simulate._no_packed_sequence_detection`): answer it as the real step does (no packing, our
    position ids are ``arange(s)``) and, when the step is over, run the real probe on real position ids of
    the same layout under the recorder, so its ops are in the trace as they are in the real step."""
    from transformers import masking_utils

    original = masking_utils.find_packed_sequence_indices
    seen: list[tuple[tuple, tuple]] = []
    masking_utils.find_packed_sequence_indices = lambda ids: seen.append((tuple(ids.shape), tuple(ids.stride())))
    try:
        yield
    finally:
        masking_utils.find_packed_sequence_indices = original
    real = [torch.arange(shape[-1]).expand(shape) if stride[0] == 0 else torch.arange(shape[-1]).repeat(shape[0], 1)
            for shape, stride in seen]
    with recorder:
        recorder.phase = "forward"
        for ids in real:
            original(ids)


def _offload_copies(layers: list, checkpointed: list[int], recorder: OpRecorder) -> list:
    """Hooks that file each checkpointed layer's input as copied to the host when its forward ends, and back
    to the device for the recomputation (transformers' hooks run outside the checkpoint, so the copy back is
    filed under ``recompute`` when the forward's is made)."""
    inputs: dict[int, torch.Tensor] = {}

    def pre(i):
        def hook(module, args, kwargs):
            if recorder.phase == "forward":
                inputs[i] = args[0] if args else kwargs["hidden_states"]
        return hook

    def post(i):
        def hook(module, args, kwargs, output):
            if recorder.phase == "forward":
                hidden = inputs.pop(i)
                recorder.copy("d2h", hidden)
                recorder.copy("h2d", hidden, phase="recompute")
        return hook

    return ([layers[i].register_forward_pre_hook(pre(i), with_kwargs=True) for i in checkpointed]
            + [layers[i].register_forward_hook(post(i), with_kwargs=True) for i in checkpointed])


def trace_case(case: Case) -> list[dict]:
    """One optimizer step of `case` (every micro-batch of it) on fake tensors: the recorder's entries."""
    return record_case(case).trace()


def record_case(case: Case, sequence: bool = False) -> OpRecorder:
    """The recorder that traced one step of `case` (with every call's key in order, when `sequence`)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    spec, setup = case.model, case.setup
    with torch.device("meta"):
        model = with_adapters(build_model(spec, device="meta"), setup.lora)
    # the point's layer set and SAC policy, as the train side switches them on (offload is filed below)
    enable_checkpointing(model, case.every_n_layers, offload=False, recompute=case.recompute)
    layers = decoder_layers(model)
    checkpointed = [i for i, layer in enumerate(layers) if layer.gradient_checkpointing]
    recorder = OpRecorder(sequence)
    moves = case.offload and case.device == "cuda"
    handles = _offload_copies(layers, checkpointed, recorder) if moves else []
    autocast = setup.autocast
    cast = (functools.partial(torch.autocast, "cpu", dtype=AUTOCAST_DTYPES[autocast]) if autocast
            else contextlib.nullcontext)
    try:
        with (_packed_sequence_detection_replayed(recorder), FakeTensorMode(allow_non_fake_inputs=True),
              _grouped_mm_as_the_cpu_kernel()):
            model.to_empty(device="cpu")
            model.tie_weights()  # to_empty unties a tied head, as in the simulation
            around = LoopStep(setup, case.device)
            optimizer = around.optimizer(model, case.train.lr)
            # the state the warm-up steps made: AdamW's made directly (cheaper), any other by one step of its own
            (init_adamw_state if isinstance(optimizer, torch.optim.AdamW) else init_optimizer_state)(optimizer)
            inputs, _ = around.inputs(torch.randint(0, spec.vocab, (case.batch_size, case.seq_len)))
            scaler = torch.amp.GradScaler("cpu") if autocast == "fp16" else None
            if scaler is not None:
                scaler.scale(torch.zeros(()))  # its state exists from the warm-up steps
            with recorder:
                for _ in range(case.grad_accum):
                    recorder.phase = "forward"
                    with cast():
                        loss = around.loss(model(**inputs).loss)
                        if setup.loop == "manual":
                            loss = loss / case.grad_accum  # forward_loss's division, inside autocast
                    recorder.phase = "backward"
                    around.backward(loss, scaler)
                held = around.before_optimizer(model, loss, scaler, optimizer)
                recorder.phase = "optimizer"
                if scaler is not None:  # scaler.step without its .item() check, as the simulation runs it
                    scaler.unscale_(optimizer)
                    optimizer.step()
                    scaler.update()
                else:
                    optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                del held, loss
    finally:
        for h in handles:
            h.remove()
    return recorder
