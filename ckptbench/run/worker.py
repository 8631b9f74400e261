"""One sweep point, measured in the process that runs it.

The step loop is the familiar one: warm-up steps (clean, they also create the optimizer state), memory
steps (the probes that slow operators run only here), then timed steps (clean again).  The record says
which steps were which.  :func:`child_main` is the entry point of a worker process forked from the fork
server (see :mod:`.forkserver`): it redirects the process's output to the point's log file and writes exactly
one result file, atomically, whatever happens short of the process being killed.
"""

from __future__ import annotations

import json
import os
import time
import traceback
from contextlib import nullcontext

import torch

from ..measure.flops import FlopCounter
from ..measure.memory import probe_for
from ..measure.saved import LayerProbe, SavedTensorCounter
from ..measure.steps import step_probe_for
from ..measure.storage import StorageSerials
from ..measure.timing import StepStats, timer_for
from ..spec import Case
from ..store.files import write_json_atomic
from ..theory.flops import figures as flop_figures
from ..train.checkpointing import (
    decoder_layers,
    enable_checkpointing,
    offload_without_pinning,
    pinned_memory_error,
)
from ..train.environment import torch_environment
from ..train.models import build_model, synthetic_batch
from ..train.reference import reference
from ..train.step import forward_loss, train_step
from .faults import Fault
from .lifeline import die_with_parent, let_the_fork_server_go, self_timeout


def _memory_step(case: Case, model, optimizer, batch, layers: list) -> dict:
    """One step under the memory probe, the saved-tensor counter and the layer probe."""
    probe = probe_for(batch.device, model, optimizer, [batch])
    serials = StorageSerials()
    param_keys = {serials(p) for p in model.parameters()}
    layer_probe = LayerProbe(serials, layers, on_phase=probe.set_phase)
    counter = SavedTensorCounter(serials, param_keys, layer_of=lambda: layer_probe.current)
    flops = FlopCounter()
    with layer_probe:
        probe.start()
        try:
            with flops:
                for micro in range(case.grad_accum):
                    probe.set_phase("forward")
                    flops.phase = "forward"
                    with counter if micro == 0 else nullcontext():
                        loss = forward_loss(model, batch, case.grad_accum)
                    if micro == 0:
                        probe.mark_after_forward()
                    probe.set_phase("backward-head")
                    flops.phase = "backward"
                    layer_probe.in_backward = True
                    loss.backward()
                    layer_probe.in_backward = False
                    del loss
                probe.set_phase("optimizer")
                flops.phase = "optimizer"
                optimizer.step()
        finally:
            probe.stop()  # before zero_grad: the CUDA probe reads the gradients it sizes
        optimizer.zero_grad(set_to_none=True)
    out = probe.result().to_dict()
    out["memory_probe"] = probe.kind
    # what torch's checkpoint really packed, layer by layer: never what the setting says it should
    checkpointed = sorted(counter.checkpoint_layers)
    out.update(counter.summary(layer_probe.keys_of(checkpointed)))
    out["checkpointed_layers"] = checkpointed
    out["recomputed_layers"] = sorted(layer_probe.recomputed)
    out.update(flops.result())
    return out


class Unsupported(Exception):
    """The point cannot run on this machine at all (not a failure of the setting): recorded as such."""


def measure(case: Case, t_submit: float | None = None, fault: Fault | None = None) -> dict:
    """Build the model for `case`, train warm-up + memory + timed steps, return the measurement."""
    t_enter = time.time()
    torch.set_num_threads(case.train.threads)
    torch.manual_seed(case.train.seed)
    device = torch.device(case.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise Unsupported(f"device 'cuda' requested, but this torch ({torch.__version__}) sees no CUDA device")
    if fault is not None and fault.kind not in ("slow", "slower"):
        inject(fault)

    offload_pinned = None
    offload_note = ""
    pin_error = pinned_memory_error() if case.offload else None
    if case.offload:
        offload_pinned = pin_error is None
        if pin_error:
            offload_note = (f"this torch build has no pinned allocator ({pin_error}); transformers' offload "
                            "ran with pin_memory=False")
    ctx = offload_without_pinning() if (case.offload and pin_error) else nullcontext()

    with ctx:
        try:
            model = build_model(case.model, device)
        except (AssertionError, NotImplementedError, ValueError) as exc:  # a config this model type refuses
            raise Unsupported(f"transformers could not build a causal LM of model_type {case.model.family!r}: "
                              f"{type(exc).__name__}: {exc}"[:500]) from None
        layers = decoder_layers(model)
        if case.every_n_layers > 0 and not layers:
            raise Unsupported(f"{type(model).__name__} has no GradientCheckpointingLayer blocks: transformers "
                              "cannot checkpoint it layer by layer")
        try:
            checkpointing_api = enable_checkpointing(model, case.every_n_layers, case.offload)
        except ValueError as exc:  # "... does not support gradient checkpointing"
            raise Unsupported(f"{type(model).__name__}: {exc}") from None
        optimizer = torch.optim.AdamW(model.parameters(), lr=case.train.lr)
        batch = synthetic_batch(case.model.vocab, case.batch_size, case.seq_len, case.train.seed, device)
        t_ready = time.time()

        losses = []
        steps = step_probe_for(device)  # CUDA: per-step allocator peaks, window energy; CPU: nothing
        steps.begin("warmup")
        for _ in range(case.train.warmup_steps):
            steps.before_step()
            losses.append(train_step(model, optimizer, batch, case.grad_accum))
            steps.after_step()
        steps.end()
        mem: dict = {}
        for _ in range(case.train.memory_steps):
            mem = _memory_step(case, model, optimizer, batch, layers)
        timer = timer_for(device.type)
        steps.begin("timed")
        for _ in range(case.train.steps):
            steps.before_step()
            timer.start()
            t_step = time.perf_counter()
            losses.append(train_step(model, optimizer, batch, case.grad_accum))
            if fault is not None and fault.kind == "slow":
                time.sleep(fault.seconds)
            if fault is not None and fault.kind == "slower":  # this step, `fraction` longer (CPU: no sync needed)
                time.sleep(fault.fraction * (time.perf_counter() - t_step))
            timer.stop()
            steps.after_step()
        stats = StepStats.of(timer.times())  # the window's one synchronise (CUDA)
        steps.end()
        losses = [float(x) for x in losses]

    return {
        **mem,
        **steps.result(),
        **(flop_figures(case, stats.median_s, _device_name(device)) if case.model.analytic else
           {"flops_convention": f"no FLOP formula for model_type {case.model.family!r}: counted FLOPs only"}),
        **({} if case.model.analytic else simulated_estimate(case)),
        "checkpointing_api": checkpointing_api,
        "attn_implementation": model.config._attn_implementation,  # what transformers built, not what was asked
        "step_times_s": list(stats.times_s),
        "step_time_median_s": stats.median_s,
        "step_time_p90_s": stats.p90_s,
        "step_time_mean_s": stats.mean_s,
        "step_time_cv": stats.cv,
        "tokens_per_s": case.tokens_per_step / stats.median_s if stats.median_s > 0 else None,
        "timer": timer.kind,
        "losses": losses,
        "steps": {"warmup": case.train.warmup_steps, "memory": case.train.memory_steps,
                  "timed": case.train.steps, "memory_steps_timed": False},
        "spawn_s": (t_enter - t_submit) if t_submit else None,
        "setup_s": (t_ready - t_submit) if t_submit else None,
        "model_build_s": t_ready - t_enter,
        "offload_pinned": offload_pinned,
        "offload_note": offload_note,
        "n_params": sum(p.numel() for p in model.parameters()),
        # every key the model was built with, defaults included, through transformers' own serialiser
        "resolved_config": json.loads(model.config.to_json_string(use_diff=False)),
        # the config the Case asks for and its parameter count, built apart from the builder (meta device)
        **reference(case.model),
        "threads": torch.get_num_threads(),
    }


def simulated_estimate(case: Case) -> dict:
    """For a model the analytic estimate does not describe: the FakeTensor simulation of the same step,
    run here after the measured steps (it needs torch, the sweep's parent has none).  Its figures are the
    estimate the record is checked against; a model it cannot simulate says why instead."""
    from ..theory.simulate import simulate
    from ..theory.simulated import simulate_case

    line = simulate_case(case, simulate)  # data-dependent routing, an op FakeTensor cannot run: a reason
    if line["status"] != "ok":
        return {"simulation": None, "simulation_error": line["reason"]}
    return {"simulation": line["simulated"]}


def _device_name(device: torch.device) -> str | None:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else None


def device_environment(device_type: str) -> dict:
    """The torch half of the record's ``env`` (the sweep adds the host half): what ``ckptbench env`` shows,
    seen by the process that ran the point.  A CPU point leaves CUDA uninitialised."""
    return torch_environment(touch_cuda=device_type == "cuda")


def inject(fault: Fault) -> None:
    if fault.kind == "raise":
        raise RuntimeError("injected fault: worker raised")
    if fault.kind == "segfault":
        import ctypes

        ctypes.string_at(0)
    if fault.kind == "hang":
        while True:
            time.sleep(3600)
    if fault.kind == "exit":
        os._exit(3)
    if fault.kind in ("hog", "hog-kill"):
        _hog(fault.nbytes, fault.kind == "hog-kill")


def _hog(nbytes: int, then_kill: bool) -> None:
    """Hold `nbytes` resident (the fork server's pages included), long enough for the sweep to see it."""
    import signal

    from .hostmem import resident_bytes

    rss = resident_bytes(os.getpid())
    held = b"\x01" * max(0, nbytes - (rss[0] if rss else 0))  # written, so every page is resident
    deadline = time.monotonic() + (2.0 if then_kill else 3600.0)
    while time.monotonic() < deadline:
        time.sleep(0.05)
    if then_kill:
        os.kill(os.getpid(), signal.SIGKILL)
    del held


def is_oom_error(exc: BaseException) -> bool:
    """Out-of-memory raised outside the caching allocator (cuBLAS/cuDNN workspaces, a kernel's own
    cudaMalloc) arrives as a plain RuntimeError or AcceleratorError, and the CPU allocator's as
    ``DefaultCPUAllocator: can't allocate memory``; their messages say so."""
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and any(
        sign in text for sign in ("out of memory", "cublas_status_alloc_failed", "can't allocate memory"))


def child_main(case_dict: dict, result_path: str, log_path: str, t_submit: float,
               fault: Fault | None = None, timeout_s: float | None = None, where: dict | None = None) -> None:
    """Entry point of a worker process: one Case, one result file, output to the point's log.

    It dies with the fork server (which dies with the sweep) and, failing all else, after its own timeout.
    `where` is its slot: the cores it pins itself to before torch starts a thread, and the variables
    (``CUDA_VISIBLE_DEVICES``) set before CUDA is first touched; the cores it then has are reported.
    """
    die_with_parent()
    let_the_fork_server_go()
    self_timeout(timeout_s)
    if where:
        os.environ.update(where["env"])
        if where["cores"]:
            os.sched_setaffinity(0, where["cores"])
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    case = Case.from_dict(case_dict)
    result: dict = {"status": "ok", "reason": ""}
    try:
        result["measurement"] = measure(case, t_submit, fault)
    except Unsupported as exc:
        result = {"status": "unsupported", "reason": str(exc)}
    except torch.OutOfMemoryError as exc:  # torch.cuda.OutOfMemoryError is this class
        traceback.print_exc()
        result = {"status": "oom", "reason": str(exc).splitlines()[0][:500]}
    except Exception as exc:
        traceback.print_exc()
        status = "oom" if is_oom_error(exc) else "crash"
        result = {"status": status, "reason": f"{type(exc).__name__}: {exc}"[:500]}
    result["device_env"] = device_environment(case.device)
    result["cores_seen"] = sorted(os.sched_getaffinity(0))
    write_json_atomic(result_path, result)
