"""One sweep point, measured in the process that runs it.

The step loop is the familiar one: warm-up steps (clean, they also create the optimizer state), memory
steps (the probes that slow operators run only here), then timed steps (clean again).  The record says
which steps were which.  :func:`child_main` is the entry point of a worker process forked from the fork
server (see ``sweep.py``): it redirects the process's output to the point's log file and writes exactly
one result file, atomically, whatever happens short of the process being killed.
"""

from __future__ import annotations

import os
import time
import traceback
from contextlib import contextmanager

import torch

from .faults import Fault
from .files import write_json_atomic
from .flops import figures as flop_figures
from .memory import StorageSerials, probe_for, step_probe_for
from .models import build_model, decoder_layers, enable_checkpointing, synthetic_batch
from .nvml import NvmlDevice
from .saved import LayerProbe, SavedTensorCounter
from .spec import Case
from .timing import StepStats, timer_for


def pinned_memory_error() -> str | None:
    """None when this torch build can allocate pinned host memory, else the error it gives."""
    try:
        torch.empty(1, pin_memory=True)
        return None
    except RuntimeError as exc:
        return str(exc).splitlines()[0]


@contextmanager
def offload_without_pinning():
    """Let transformers' offload run on a torch build that has no pinned allocator.

    transformers wraps each checkpointed layer in ``save_on_cpu(pin_memory=True)``, which raises on a
    CPU-only build.  We swap the name transformers calls for the same class with pinning off, so the
    library's own offload path still runs, and the record states ``offload_pinned: false``.
    """
    import transformers.modeling_utils as mu

    original = mu.save_on_cpu

    class unpinned_save_on_cpu(original):  # noqa: N801 - stands in for torch's class name
        def __init__(self, pin_memory: bool = False, device_type: str = "cuda") -> None:
            super().__init__(pin_memory=False, device_type=device_type)

    unpinned_save_on_cpu.__qualname__ = "save_on_cpu_unpinned"
    mu.save_on_cpu = unpinned_save_on_cpu
    try:
        yield
    finally:
        mu.save_on_cpu = original


def _forward_loss(model, batch, grad_accum: int) -> torch.Tensor:
    return model(input_ids=batch, labels=batch).loss / grad_accum


def _train_step(model, optimizer, batch, grad_accum: int) -> torch.Tensor:
    """One optimizer step; the loss stays a tensor so the step never waits for the device (no .item())."""
    total = None
    for _ in range(grad_accum):
        loss = _forward_loss(model, batch, grad_accum)
        loss.backward()
        total = loss.detach() if total is None else total + loss.detach()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return total


def _memory_step(case: Case, model, optimizer, batch, layers: list) -> dict:
    """One step under the memory probe, the saved-tensor counter and the layer probe."""
    probe = probe_for(batch.device, model, optimizer, [batch])
    serials = StorageSerials()
    param_keys = {serials(p) for p in model.parameters()}
    counter = SavedTensorCounter(serials, param_keys)
    layer_probe = LayerProbe(serials, layers)
    with layer_probe:
        probe.start()
        try:
            for micro in range(case.grad_accum):
                with counter if micro == 0 else _nullcontext():
                    loss = _forward_loss(model, batch, case.grad_accum)
                if micro == 0:
                    probe.mark_after_forward()
                layer_probe.in_backward = True
                loss.backward()
                layer_probe.in_backward = False
                del loss
            optimizer.step()
        finally:
            probe.stop()  # before zero_grad: the CUDA probe reads the gradients it sizes
        optimizer.zero_grad(set_to_none=True)
    out = probe.result().to_dict()
    out["memory_probe"] = probe.kind
    out.update(counter.summary(layer_probe.keys_of(case.checkpointed_layers)))
    out["recomputed_layers"] = sorted(layer_probe.recomputed)
    return out


@contextmanager
def _nullcontext():
    yield


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
    if fault is not None and fault.kind != "slow":
        inject(fault)

    offload_pinned = None
    offload_note = ""
    pin_error = pinned_memory_error() if case.offload else None
    if case.offload:
        offload_pinned = pin_error is None
        if pin_error:
            offload_note = (f"this torch build has no pinned allocator ({pin_error}); transformers' offload "
                            "ran with pin_memory=False")
    ctx = offload_without_pinning() if (case.offload and pin_error) else _nullcontext()

    with ctx:
        model = build_model(case.model, device)
        checkpointing_api = enable_checkpointing(model, case.every_n_layers, case.offload)
        layers = decoder_layers(model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=case.train.lr)
        batch = synthetic_batch(case.model.vocab, case.batch_size, case.seq_len, case.train.seed, device)
        t_ready = time.time()

        losses = []
        steps = step_probe_for(device)  # CUDA: per-step allocator peaks, window energy; CPU: nothing
        steps.begin("warmup")
        for _ in range(case.train.warmup_steps):
            steps.before_step()
            losses.append(_train_step(model, optimizer, batch, case.grad_accum))
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
            losses.append(_train_step(model, optimizer, batch, case.grad_accum))
            if fault is not None and fault.kind == "slow":
                time.sleep(fault.seconds)
            timer.stop()
            steps.after_step()
        stats = StepStats.of(timer.times())  # the window's one synchronise (CUDA)
        steps.end()
        losses = [float(x) for x in losses]

    return {
        **mem,
        **steps.result(),
        **flop_figures(case, stats.median_s, _device_name(device)),
        "checkpointing_api": checkpointing_api,
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
        "threads": torch.get_num_threads(),
    }


def _device_name(device: torch.device) -> str | None:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else None


def device_environment(device_type: str) -> dict:
    """What only the worker can see cheaply: torch's view of the device."""
    env = {"torch": torch.__version__, "cuda_runtime": torch.version.cuda}
    if device_type == "cuda" and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        env.update(device_name=props.name, device_memory_bytes=props.total_memory)
        nvml = NvmlDevice.open(0)
        env["driver"] = nvml.driver_version() if nvml else None
        if nvml:
            nvml.close()
    return env


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


def is_oom_error(exc: BaseException) -> bool:
    """Out-of-memory raised outside the caching allocator (cuBLAS/cuDNN workspaces, a kernel's own
    cudaMalloc) arrives as a plain RuntimeError or AcceleratorError; its message says so."""
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and ("out of memory" in text or "cublas_status_alloc_failed" in text)


def child_main(case_dict: dict, result_path: str, log_path: str, t_submit: float,
               fault: Fault | None = None) -> None:
    """Entry point of a worker process: one Case, one result file, output to the point's log."""
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
    write_json_atomic(result_path, result)
