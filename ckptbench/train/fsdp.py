"""The sharded data-parallel loop of an fsdp Case (``[train] sharding = "fsdp"``): one rank's view, under torchrun.

FSDP2 as its documentation and torchtitan use it: checkpointing switched on through transformers first,
then ``fully_shard`` on every decoder layer (the ``GradientCheckpointingLayer`` blocks) and on the root,
the optimizer built over the sharded (DTensor) parameters, and the plain step loop::

    for layer in decoder_layers(model): fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters())
    for batch in batches:
        model(input_ids=batch, labels=batch).loss.backward(); optimizer.step(); optimizer.zero_grad()

The plain loop, not ``Accelerator``: accelerate's FSDP2 path wraps by its own auto-wrap policy and
casts through its plugin, so what it shards would be accelerate's choice rather than the per-layer
``fully_shard`` asked for here.  Local SGD does not apply (the suite makes fsdp points only with
``local_sgd_steps == 0``).  With ``grad_accum > 1`` every micro-batch reduce-scatters its gradients
(FSDP2's default: ``set_requires_gradient_sync`` is left on).

What FSDP2 does on a CPU with gloo, as measured here (torch 2.13, llama-tiny, world 2): every unit's
parameters are all-gathered with one ``_allgather_base`` per unit per gather and its gradients
reduce-scattered with one ``_reduce_scatter_base``; each decoder layer is gathered twice a step
(forward, and again in backward, since it is resharded after forward), the root once (FSDP2 keeps the
root unsharded from forward into backward).  A checkpointed layer's recomputation runs inside its
backward gather: it costs no extra all-gather (9 gathers a step with and without checkpointing).

Meters: collectives at c10d (:class:`ckptbench.measure.comm.C10dInterposer`) on every iteration; the
exact live-storage probe (:class:`ckptbench.measure.memory.CpuMemoryProbe`, whose tracker follows
DTensors to their local shards and counts FSDP2's in-place storage resizes) on the first
``train.memory_steps`` optimizer steps after the warm-up only (as the single-process worker schedules
them: FSDP2's lazy initialisation and the optimizer's first state are then behind), left out of timing.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..measure.comm import C10dInterposer, CollectiveRecorder, collective_totals
from ..measure.memory import probe_for
from ..measure.saved import LayerProbe
from ..measure.storage import StorageSerials
from ..measure.timing import boundary_clock
from ..point.case import Case
from .checkpointing import decoder_layers, enable_checkpointing
from .data import rank_data
from .models import build_model
from .optimizers import build_optimizer, describe_optimizer


def mixed_precision_policy(autocast: str):
    """FSDP2's ``MixedPrecisionPolicy`` for a mixed precision (``autocast`` names the compute dtype), or None
    for a pure one: bf16 unsharded parameters (the forward and backward compute in bf16, no torch.autocast),
    gradients reduce-scattered in fp32 into the fp32 sharded master weights' gradients."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if not autocast:
        return None
    if autocast != "bf16":
        raise ValueError(f"FSDP2 mixed precision is built for bf16 only, not {autocast!r}")
    return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)


def shard_model(model: torch.nn.Module, device: torch.device, autocast: str = "") -> dict:
    """``fully_shard`` on each decoder layer, then on the root (with the mixed-precision policy of
    `autocast` on every unit); returns the per-rank layout it made."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    policy = mixed_precision_policy(autocast)
    kwargs = {"mp_policy": policy} if policy is not None else {}
    layers = decoder_layers(model)
    for layer in layers:
        fully_shard(layer, mesh=mesh, **kwargs)
    fully_shard(model, mesh=mesh, **kwargs)
    return {"units": len(layers) + 1, "layers": len(layers)}


def local_bytes(tensors) -> int:
    """Bytes of this rank's shards: the storages of the local tensors, each once (FSDP2 pads every shard
    to ceil(dim0 / N) rows)."""
    seen: dict[int, int] = {}
    for t in tensors:
        local = t.to_local() if hasattr(t, "to_local") else t
        seen[local.untyped_storage()._cdata] = local.untyped_storage().nbytes()
    return sum(seen.values())


def train_rank_fsdp(case: Case) -> dict:
    """Run `case` on this rank with FSDP2 and return this rank's measurements (the shape
    :func:`ckptbench.train.localsgd.train_rank` returns, plus the per-rank memory of the memory step).
    Offload runs as the torch build allows (``run.rank`` enters
    :func:`.checkpointing.offload_as_this_build_allows` for every rank)."""
    import os

    if case.device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    if not dist.is_initialized():  # torchrun's environment; gloo on CPU, NCCL on CUDA
        dist.init_process_group("nccl" if case.device == "cuda" else "gloo")
    assert dist.is_initialized() and dist.get_world_size() == case.world_size > 1, (
        f"needs a torchrun group of case.world_size={case.world_size} > 1 ranks")
    if case.setup.autocast and case.model.dtype != "fp32":
        raise ValueError("FSDP2 mixed precision keeps fp32 sharded master weights: the model must be fp32")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cpu") if case.device == "cpu" else torch.device("cuda", torch.cuda.current_device())
    train = case.train
    torch.manual_seed(train.seed)  # identical initial weights on every rank before sharding
    model = build_model(case.model, device)
    enable_checkpointing(model, case.every_n_layers, case.offload, case.recompute)
    full_param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    n_param_tensors = len(list(model.parameters()))
    layout = shard_model(model, device, case.setup.autocast)
    local_param_bytes = local_bytes(model.parameters())  # the shards, before any step gathers them
    optimizer = build_optimizer(case.setup, model, train.lr)

    # the worker's schedule: warm-up steps (FSDP2's lazy initialisation, the optimizer's state), then the
    # memory steps under the probe, then the timed steps
    opt_steps = train.warmup_steps + train.memory_steps + train.steps
    iterations = opt_steps * case.grad_accum
    data = rank_data(case, rank, world, iterations, device)
    batches = data.batches
    clock = boundary_clock(device)
    recorder = CollectiveRecorder(world)
    records: list[dict] = []
    memory: list[dict] = []
    with C10dInterposer(recorder):
        dist.barrier()
        for step in range(opt_steps):
            metered = train.warmup_steps <= step < train.warmup_steps + train.memory_steps
            micro = list(range(step * case.grad_accum, (step + 1) * case.grad_accum))
            probe = probe_for(device, model, optimizer, [batches[i] for i in micro]) if metered else None
            tracker = getattr(probe, "tracker", None)  # the CPU probe's exact tracker (CUDA: the allocator)
            if tracker is not None:
                tracker.resize_category = "params"  # FSDP2's unsharded parameters, regrown by resize
            # names the moment of the peak as the single-process step does: backward-layer-i, ...
            layer_probe = LayerProbe(StorageSerials(), decoder_layers(model), probe.set_phase) if probe else None
            if probe is not None:
                layer_probe.__enter__()
                probe.start()
            t0 = clock.now()
            losses = []
            for it in micro:
                recorder.set_step(it)
                if probe is not None:
                    probe.set_phase("forward")
                    layer_probe.in_backward = False
                loss = model(input_ids=batches[it], labels=batches[it]).loss
                if probe is not None:
                    if it == micro[-1]:
                        probe.mark_after_forward()
                    probe.set_phase("backward-head")
                    layer_probe.in_backward = True
                with recorder.phase("backward"):
                    (loss / case.grad_accum if case.grad_accum > 1 else loss).backward()
                losses.append(loss.detach())
            if tracker is not None:
                for p in model.parameters():  # FSDP2 assigns sharded gradients; no accumulate hook fires
                    if p.grad is not None:
                        tracker.recategorize(p.grad, "grads")
            if probe is not None:
                probe.set_phase("optimizer")
            optimizer.step()
            optimizer.zero_grad()
            t1 = clock.now()
            if probe is not None:
                probe.stop()
                layer_probe.__exit__(None, None, None)
                memory.append(probe.result().to_dict())
            for it, loss in zip(micro, losses):
                records.append({
                    "iteration": it, "optimizer_step": it == micro[-1], "warmup": step < train.warmup_steps,
                    "metered": metered, "loss": loss.item(), "step_s": (t1 - t0) / len(micro),
                    "synced": False, "sync_s": 0.0, "divergence": None, "divergence_rel": None,
                    **recorder.totals(it), "ops": recorder.summary(it),
                })
        recorder.set_step("eval")
        with torch.no_grad():
            if data.random_eval is not None:
                eval_loss = model(input_ids=data.random_eval, labels=data.random_eval).loss.item()
            else:  # text: the mean held-out loss over every rank's share (the model is one sharded copy)
                held = torch.zeros(())
                for batch in data.held_out:
                    held += model(input_ids=batch, labels=batch).loss.float().cpu()
                with recorder.paused():
                    dist.all_reduce(held)
                eval_loss = held.item() / data.held_out_total

    total_ops: dict[str, dict] = {}
    for key in range(iterations):
        for op, row in recorder.summary(key).items():
            acc = total_ops.setdefault(op, {"count": 0, "payload_bytes": 0, "bus_bytes": 0.0, "comm_s": 0.0})
            for field in acc:
                acc[field] += row[field]
    return {
        "rank": rank,
        "world_size": world,
        "backend": dist.get_backend(),
        "sync_impl": "fsdp2",
        "sharding": "fsdp",
        "units": layout["units"],
        "param_bytes": full_param_bytes,
        "grad_bytes": full_param_bytes,
        "local_param_bytes": local_param_bytes,
        "local_optimizer_bytes": local_bytes(v for s in optimizer.state.values() for v in s.values()
                                             if isinstance(v, torch.Tensor)),
        "n_param_tensors": n_param_tensors,
        "optimizer": describe_optimizer(optimizer),
        "optimizer_steps": opt_steps,
        "iterations": iterations,
        "steps": records,
        "setup": {**recorder.totals("setup"), "ops": recorder.summary("setup")},
        "exit": {"collectives": 0, "payload_bytes": 0, "bus_bytes": 0.0, "comm_s": 0.0, "ops": {},
                 "sync_s": 0.0, "divergence": None, "divergence_rel": None},
        "total": collective_totals(total_ops),
        "syncs": 0,
        "syncs_observed": 0,
        "sync_s": [],
        "final_loss": records[-1]["loss"],
        "eval_loss": eval_loss,
        "eval_curve": [],
        "data": data.corpus,
        "timer": clock.kind,
        "final_divergence": 0.0,  # sharded: one copy of the parameters, nothing to diverge
        "forward_live_bytes": [m["activations_after_forward_bytes"] for m in memory],
        "memory": memory,
        "comm_meter": "c10d-autograd-kernel",
        "memory_meter": "CpuMemoryProbe" if device.type == "cpu" else "CudaMemoryProbe",
    }
