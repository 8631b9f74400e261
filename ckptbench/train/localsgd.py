"""The data-parallel training loop of a local-SGD Case: one rank's view, run under torchrun.

The loop is the one accelerate documents, on purpose, so that what we measure is what users run::

    with LocalSGD(accelerator=accelerator, model=model, local_sgd_steps=K, enabled=K > 0) as local_sgd:
        for batch in batches:
            with accelerator.accumulate(model):
                loss = model(...).loss; accelerator.backward(loss)
                optimizer.step(); scheduler.step(); optimizer.zero_grad()
            local_sgd.step()

``K == 0`` is plain DDP (a gradient all-reduce per optimizer step).  ``sync_impl="torch-averager"``
replaces accelerate's averaging with torch's ``PeriodicModelAverager`` on the same schedule, so the two
differ only in how an averaging is done (one all-reduce per parameter tensor plus a barrier, versus one
flattened all-reduce).

Meters: collectives are counted by :class:`ckptbench.measure.comm.C10dInterposer`, which costs nothing on
compute ops, so every iteration is counted and timed.  Parameter divergence needs an extra all-reduce;
it runs right before each averaging with the recorder paused, outside the timed region.  Memory uses
dispatch modes, which slow the step, so it is measured only on ``train.memory_steps`` optimizer steps, the
third onwards where the run has them (:mod:`.rank_memory`: the exact probe over the whole step, and the
forward's activations), flagged ``metered`` and left out of timing summaries.  Times are read by
:func:`ckptbench.measure.timing.boundary_clock`, which on CUDA synchronises first, so a step, an
averaging and tokens/s are the device's work, not the host's enqueue.

Data and quality: batches come from :mod:`.data` (random ids, or byte-level text with a shard per rank);
on text, the held-out loss of the ranks' parameter average (:mod:`.evaluate`) is taken before training,
every ``data.eval_every`` optimizer steps and after the closing averaging, with the recorder paused and
outside every timed region: the record's ``eval_curve`` (step, tokens seen by all ranks, loss).
"""

from __future__ import annotations

import warnings
from contextlib import nullcontext

import torch
import torch.distributed as dist

from ..measure.comm import C10dInterposer, CollectiveRecorder, collective_totals
from ..measure.storage import LiveStorageTracker, track_training_state
from ..measure.timing import boundary_clock
from ..point.case import SYNC_IMPLS, Case
from .checkpointing import enable_checkpointing
from .data import eval_steps, rank_data
from .evaluate import averaged_held_out_loss
from .loops import ACCELERATE_PRECISION
from .models import build_model
from .optimizers import build_optimizer, describe_optimizer
from .rank_memory import RankMemoryStep, memory_step_index


class ForwardActivations:
    """Bytes a forward pass leaves alive for backward, counted by the harness's live-storage tracker.

    Parameters and buffers are registered first, so views of weights (``weight.t()`` in a linear) stay
    parameters; everything the forward allocates and still holds at its end (saved activations, logits,
    loss) is the result.  It slows the ops it sees, so only the metered iterations use it.
    """

    def __init__(self, model: torch.nn.Module):
        self.tracker = LiveStorageTracker()
        track_training_state(self.tracker, model)
        self.bytes = 0

    def __enter__(self):
        self.tracker.__enter__()
        return self

    def __exit__(self, *exc):
        self.bytes = self.tracker.by_category["activations"]  # now: after backward they are gone
        self.tracker.__exit__(*exc)
        return False

    def result(self) -> int:
        return self.bytes


class TorchAveragerSync:
    """accelerate's ``LocalSGD`` interface, averaging with torch's ``PeriodicModelAverager``.

    ``warmup_steps=K-1`` makes the averager fire after the K-th, 2K-th ... call, exactly where
    ``LocalSGD.step()`` does, and ``__exit__`` averages once more as ``LocalSGD.__exit__`` does, so the
    schedules match call for call.  Like ``LocalSGD``, the model stays under DDP's ``no_sync``.
    """

    def __init__(self, model, local_sgd_steps: int):
        from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager

        self.model = model
        self.local_sgd_steps = local_sgd_steps
        self.num_steps = 0
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # period 1 warns that DDP alone would do; we measure it anyway
            self.averager = PeriodicModelAverager(period=local_sgd_steps, warmup_steps=local_sgd_steps - 1)

    def __enter__(self):
        self._no_sync = self.model.no_sync()
        self._no_sync.__enter__()
        return self

    def step(self):
        """Average when the averager's schedule says so.

        Not ``averager.average_parameters(model.parameters())``: that filters out parameters whose
        ``.grad`` is None, and in accelerate's loop ``optimizer.zero_grad()`` (set_to_none) has just run,
        so it would average nothing (``torch.cat`` of an empty list).  We keep the averager's own
        schedule fields and call the same ``utils.average_parameters`` it calls.
        """
        from torch.distributed.algorithms.model_averaging.utils import average_parameters

        a = self.averager
        if a.step >= a.warmup_steps and (a.step - a.warmup_steps) % a.period == 0:
            average_parameters(iter(list(self.model.parameters())), a.process_group)
        a.step += 1
        self.num_steps += 1

    def __exit__(self, *exc):
        from torch.distributed.algorithms.model_averaging.utils import average_parameters

        average_parameters(iter(self.model.parameters()), dist.group.WORLD)
        self._no_sync.__exit__(*exc)
        return False


def param_divergence(model: torch.nn.Module, world_size: int) -> tuple[float, float]:
    """(‖p − mean over ranks‖₂, that norm / ‖mean‖₂) over all parameters, one flat all-reduce."""
    with torch.no_grad():
        flat = torch.cat([p.detach().reshape(-1).float() for p in model.parameters()])
        mean = flat.clone()
        dist.all_reduce(mean)
        mean /= world_size
        dev = (flat - mean).norm().item()
        return dev, dev / max(mean.norm().item(), 1e-30)


def _ddp_tail_wait(events: list[dict]) -> float:
    """Seconds backward waited for DDP's buckets: last completion minus last issue.

    The reducer issues a bucket as soon as its last gradient is ready; buckets follow reverse forward
    order, so the last one issues when backward has nothing left to compute, and ``backward()`` returns
    only when every bucket completed.  Earlier buckets overlap with compute and cost no wait.
    """
    reduces = [e for e in events if e["op"] == "allreduce" and e["phase"] == "backward"]
    if not reduces:
        return 0.0
    done = max((e["t_done"] if e["t_done"] is not None else e["t_return"]) for e in reduces)
    return max(0.0, done - max(e["t_issue"] for e in reduces))


def averagings_seen(events: list[dict]) -> int:
    """Parameter averagings as the collectives show them: loop steps whose sync phase all-reduced, plus
    the averaging on leaving the LocalSGD context.  Counted from c10d, not from the loop's own schedule
    (``_will_sync``), so it can disagree with the formula."""
    steps = {e["step"] for e in events if e["op"] == "allreduce" and e["phase"] == "sync"}
    on_exit = any(e["op"] == "allreduce" and e["step"] == "exit" for e in events)
    return len(steps) + int(on_exit)


def _will_sync(sync, k: int) -> bool:
    return k > 0 and (sync.num_steps + 1) % k == 0


def train_rank(case: Case, sync_impl: str = "accelerate", forward_meter=ForwardActivations) -> dict:
    """Run `case` on this rank (inside torchrun) and return this rank's measurements.

    ``case.train.warmup_steps + case.train.steps`` optimizer steps are run, each of ``case.grad_accum``
    micro-batches; one record per micro-batch ("iteration"), because that is what ``LocalSGD`` counts.
    """
    from accelerate import Accelerator
    from accelerate.local_sgd import LocalSGD

    if sync_impl not in SYNC_IMPLS:
        raise ValueError(f"sync_impl must be one of {SYNC_IMPLS}, got {sync_impl!r}")
    k = case.local_sgd_steps
    accelerator = Accelerator(gradient_accumulation_steps=case.grad_accum, cpu=case.device == "cpu",
                              mixed_precision=ACCELERATE_PRECISION[case.setup.autocast])
    world = accelerator.num_processes
    # LocalSGD silently does nothing without a real process group: refuse to measure that.
    assert dist.is_initialized() and world == case.world_size > 1, (
        f"needs a torchrun group of case.world_size={case.world_size} > 1 ranks, got {world}")
    rank = accelerator.process_index
    train = case.train

    torch.manual_seed(train.seed)  # identical initial weights on every rank (DDP also broadcasts them)
    model = build_model(case.model, accelerator.device)
    enable_checkpointing(model, case.every_n_layers, case.offload, case.recompute)
    params = list(model.parameters())
    param_bytes = sum(p.numel() * p.element_size() for p in params)
    grad_bytes = sum(p.numel() * p.element_size() for p in params if p.requires_grad)
    optimizer = build_optimizer(case.setup, model, train.lr)
    # Constant LR: TrainSpec.warmup_steps are timing burn-in steps, not an LR schedule.
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)

    opt_steps = train.warmup_steps + train.steps
    iterations = opt_steps * case.grad_accum
    # Each rank sees its own data (that is what makes ranks diverge); made up front, untimed.
    data = rank_data(case, rank, world, iterations, accelerator.device)
    batches = data.batches
    evaluations = eval_steps(opt_steps, case.data.eval_every) if data.random_eval is None else []
    eval_curve: list[dict] = []
    clock = boundary_clock(accelerator.device)

    def evaluate(step: int) -> None:  # the held-out loss of the ranks' average, outside every timed region
        with recorder.paused():
            loss = averaged_held_out_loss(accelerator.unwrap_model(model), data.held_out, data.held_out_total, world)
        eval_curve.append({"step": step, "tokens": step * case.tokens_per_step, "loss": loss})

    recorder = CollectiveRecorder(world)
    records: list[dict] = []
    forward_bytes: list[int] = []
    memory: list[dict] = []
    first_metered = memory_step_index(opt_steps, train.memory_steps) * case.grad_accum
    metered_iterations = range(first_metered, first_metered + train.memory_steps * case.grad_accum)
    step_memory = None
    with C10dInterposer(recorder):
        model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
        if sync_impl == "accelerate":
            sync = LocalSGD(accelerator=accelerator, model=model, local_sgd_steps=k, enabled=k > 0)
        elif k > 0:
            sync = TorchAveragerSync(model, k)
        else:
            sync = LocalSGD(accelerator=accelerator, model=model, local_sgd_steps=k, enabled=False)
        dist.barrier()  # counted under "setup": start the timed loop together
        recorder.set_step(0)
        if evaluations:
            evaluate(0)
        with sync:
            for it in range(iterations):
                recorder.set_step(it)
                metered = it in metered_iterations
                meter = forward_meter(model) if metered and forward_meter is not None else nullcontext()
                micro = it % case.grad_accum
                if metered and micro == 0:  # the exact probe over this whole optimizer step
                    step_memory = RankMemoryStep(accelerator.device, model, accelerator.unwrap_model(model),
                                                 optimizer, list(batches[it:it + case.grad_accum]))
                t0 = clock.now()
                with accelerator.accumulate(model):
                    if step_memory is not None:
                        step_memory.forward()
                    with meter:
                        loss = model(input_ids=batches[it], labels=batches[it]).loss
                    if step_memory is not None:
                        step_memory.backward(micro == case.grad_accum - 1)
                    with recorder.phase("backward"):
                        accelerator.backward(loss)
                    if step_memory is not None and micro == case.grad_accum - 1:
                        step_memory.optimizer()
                    optimizer.step()
                    scheduler.step()
                    optimizer.zero_grad()
                t1 = clock.now()
                if step_memory is not None and micro == case.grad_accum - 1:
                    memory.append(step_memory.stop())
                    step_memory = None
                divergence = (None, None)
                syncing = _will_sync(sync, k)
                if syncing:
                    with recorder.paused():
                        divergence = param_divergence(model, world)
                t2 = clock.now()
                with recorder.phase("sync"):
                    sync.step()
                t3 = clock.now()
                events = [e for e in recorder.events if e["step"] == it]
                sync_s = (t3 - t2) if syncing else _ddp_tail_wait(events)
                if metered and forward_meter is not None:
                    forward_bytes.append(meter.result())
                records.append({
                    "iteration": it,
                    "optimizer_step": bool(accelerator.sync_gradients),
                    "warmup": it < train.warmup_steps * case.grad_accum,
                    "metered": metered,
                    "loss": loss.item(),
                    "step_s": (t1 - t0) + (t3 - t2),
                    "synced": syncing,
                    "sync_s": sync_s,
                    "divergence": divergence[0],
                    "divergence_rel": divergence[1],
                    **recorder.totals(it),
                    "ops": recorder.summary(it),
                })
                done = (it + 1) // case.grad_accum if (it + 1) % case.grad_accum == 0 else None
                if done in evaluations[1:-1]:
                    evaluate(done)
            recorder.set_step("exit")
            exit_div = (None, None)
            if k > 0:
                with recorder.paused():
                    exit_div = param_divergence(model, world)
            t_exit = clock.now()
        exit_s = clock.now() - t_exit
        recorder.set_step("eval")
        with recorder.paused():
            final_div = param_divergence(model, world)
        if evaluations:  # after the closing averaging: the model the run ends with
            evaluate(opt_steps)
            eval_loss = eval_curve[-1]["loss"]
        else:
            with torch.no_grad():
                eval_loss = accelerator.unwrap_model(model)(input_ids=data.random_eval,
                                                            labels=data.random_eval).loss.item()

    loop_keys = list(range(iterations)) + ["exit"]
    total_ops: dict[str, dict] = {}
    for key in loop_keys:
        for op, row in recorder.summary(key).items():
            acc = total_ops.setdefault(op, {"count": 0, "payload_bytes": 0, "bus_bytes": 0.0, "comm_s": 0.0})
            for field in acc:
                acc[field] += row[field]
    sync_records = [r["sync_s"] for r in records if r["synced"]]
    if k > 0:
        sync_records.append(exit_s)
    return {
        "rank": rank,
        "world_size": world,
        "backend": dist.get_backend(),
        "sync_impl": sync_impl if k > 0 else "ddp",
        "param_bytes": param_bytes,
        "grad_bytes": grad_bytes,
        "n_param_tensors": len(params),
        "optimizer": describe_optimizer(optimizer),
        "optimizer_steps": opt_steps,
        "iterations": iterations,
        "steps": records,
        "setup": {**recorder.totals("setup"), "ops": recorder.summary("setup")},
        "exit": {**recorder.totals("exit"), "ops": recorder.summary("exit"), "sync_s": exit_s,
                 "divergence": exit_div[0], "divergence_rel": exit_div[1]},
        "total": collective_totals(total_ops),
        "syncs": len(sync_records),
        "syncs_observed": averagings_seen(recorder.events),
        "sync_s": sync_records,
        "final_loss": records[-1]["loss"],
        "eval_loss": eval_loss,
        "eval_curve": eval_curve,
        "data": data.corpus,
        "timer": clock.kind,
        "final_divergence": final_div[0],
        "forward_live_bytes": forward_bytes,
        "memory": memory,  # each metered optimizer step's exact probe (memory_step_index)
        "comm_meter": "c10d-autograd-kernel",
        "memory_meter": getattr(forward_meter, "__name__", str(forward_meter)),
    }

