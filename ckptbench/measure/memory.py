"""Memory probes of the memory steps: exact live-tensor accounting on CPU, the allocator's counters on CUDA.

Both probes share one shape (``start`` / ``mark_after_forward`` / ``stop`` / ``result``) and are chosen by
device in :func:`probe_for`, so the step loop never branches on the device itself.  The CPU probe is the
live-storage tracker of :mod:`.storage`; because it slows every operator it only runs on the dedicated
memory steps, and the timed steps run without it.
"""

from __future__ import annotations

import gc
import os
from dataclasses import dataclass, field

import torch

from .allocator import AllocatorMeter
from .nvml import nvml_process_used_bytes, nvml_used_bytes
from .storage import LiveStorageTracker, track_training_state
from .timeline import CudaHistory, Timeline


@dataclass
class MemoryResult:
    """What one probe saw over the memory steps (bytes)."""

    params_bytes: int = 0
    optimizer_bytes: int = 0
    mem_after_forward_bytes: int = 0
    activations_after_forward_bytes: int = 0
    peak_bytes: int = 0
    peak_breakdown: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        out = {
            "params_bytes": self.params_bytes,
            "optimizer_bytes": self.optimizer_bytes,
            "mem_after_forward_bytes": self.mem_after_forward_bytes,
            "activations_after_forward_bytes": self.activations_after_forward_bytes,
            "peak_bytes": self.peak_bytes,
            "peak_breakdown": dict(self.peak_breakdown),
        }
        out.update(self.extra)
        return out


class CpuMemoryProbe:
    """Exact live-tensor peak on CPU (see :class:`LiveStorageTracker`); with `timeline`, the tracker's total
    after every change too, marked by phase and layer (:mod:`.timeline`)."""

    kind = "cpu-live-storages"

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, inputs: list[torch.Tensor],
                 timeline: bool = False):
        self.model = model
        self.optimizer = optimizer
        self.inputs = inputs
        self.tracker = LiveStorageTracker()
        self.allocator = AllocatorMeter()  # the second meter: c10's allocator events, through the profiler
        self._hooks: list = []
        self.after_forward: dict | None = None
        self.want_timeline = timeline
        self.timeline: Timeline | None = None
        self._collecting = False  # the garbage collector was on before the step (and is off during it)

    def start(self) -> None:
        # garbage of earlier steps (reference cycles) freed by a collection in the middle of this step would
        # be a free that the tracker never saw allocated and the allocator meter did: collected now, and no
        # collection until the step ends (when one comes depends on every thread's allocations: under a test
        # runner's threads a trainer step's meters once differed by 100 bytes)
        gc.collect()
        self._collecting = gc.isenabled()
        gc.disable()
        tr = self.tracker
        track_training_state(tr, self.model, self.optimizer)
        for p in self.model.parameters():
            if p.grad is not None:
                tr.track(p.grad, "grads")
        for t in self.inputs:
            tr.track(t, "activations")
        self.params_bytes = tr.by_category["params"]
        self.optimizer_bytes = tr.by_category["optimizer"]
        for p in self.model.parameters():
            if p.requires_grad:
                self._hooks.append(p.register_post_accumulate_grad_hook(self._on_grad))
        tr.reset_peak()
        if self.want_timeline:
            self.timeline = Timeline(tr.total)
            tr.samples = self.timeline.values
        self.tracked_start = tr.total + tr.host
        self.allocator.start(frozenset(tr.held_addresses))
        tr.__enter__()

    def set_phase(self, phase: str) -> None:
        """Name what the step does from now on; the peak remembers the name it was reached under."""
        self.tracker.phase = phase
        self.mark(phase)

    def mark(self, label: str) -> None:
        """A mark on the timeline (a phase, a layer entered or recomputed); nothing without a timeline."""
        if self.timeline is not None:
            self.timeline.mark(label)

    def _on_grad(self, p: torch.Tensor) -> None:
        if p.grad is not None:
            self.tracker.recategorize(p.grad, "grads")

    def mark_after_forward(self) -> None:
        tr = self.tracker
        self.after_forward = {"total": tr.total, **tr.by_category}

    def stop(self) -> None:
        self.tracker.__exit__(None, None, None)
        self.tracker.samples = None  # later frees (the step's garbage) are not the step's
        self.allocator.stop()
        if self._collecting:
            gc.enable()
            self._collecting = False
        for h in self._hooks:
            h.remove()
        self._hooks.clear()

    def result(self) -> MemoryResult:
        tr = self.tracker
        af = self.after_forward or {"total": 0, "activations": 0}
        return MemoryResult(
            params_bytes=self.params_bytes,
            optimizer_bytes=self.optimizer_bytes,
            mem_after_forward_bytes=af["total"],
            activations_after_forward_bytes=af["total"] - self.params_bytes - self.optimizer_bytes,
            peak_bytes=tr.peak,
            peak_breakdown=dict(tr.peak_breakdown),
            extra={"peak_phase": tr.peak_phase, "tracked_start_bytes": self.tracked_start,
                   "tracked_resident_peak_bytes": tr.resident_peak, **self.allocator.result(),
                   **({"timeline": self.timeline.result(self.kind, "bytes")} if self.timeline else {})},
        )


class CudaMemoryProbe:
    """The caching allocator's own counters; NVML for what the whole device shows as used.

    ``max_memory_allocated`` is what tensors needed; ``max_memory_reserved`` is what the allocator held
    (fragmentation included); NVML adds the CUDA context and anything outside torch.
    """

    kind = "cuda-allocator"

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, inputs: list[torch.Tensor],
                 timeline: bool = False):
        self.model = model
        self.optimizer = optimizer
        self.device = next(model.parameters()).device
        self.after_forward: int | None = None
        self.history = CudaHistory(self.device) if timeline else None

    def start(self) -> None:
        torch.cuda.synchronize(self.device)
        self.params_bytes = sum(p.untyped_storage().nbytes() for p in self.model.parameters())
        self.optimizer_bytes = sum(
            v.untyped_storage().nbytes()
            for s in self.optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)
        )
        self.base = torch.cuda.memory_allocated(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        _reset_host_peak()
        if self.history is not None:
            self.history.start()

    def set_phase(self, phase: str) -> None:
        """The allocator's peak has no time stamp: naming its phase would need a synchronise per phase.
        The timeline's mark needs none: the allocator is called from the host, in program order."""
        self.mark(phase)

    def mark(self, label: str) -> None:
        if self.history is not None:
            self.history.mark(label)

    def mark_after_forward(self) -> None:
        torch.cuda.synchronize(self.device)
        self.after_forward = torch.cuda.memory_allocated(self.device)

    def stop(self) -> None:
        torch.cuda.synchronize(self.device)
        self.peak = torch.cuda.max_memory_allocated(self.device)
        self.reserved = torch.cuda.max_memory_reserved(self.device)
        self.reserved_now = torch.cuda.memory_reserved(self.device)
        self.requested_peak = torch.cuda.memory_stats(self.device).get("requested_bytes.all.peak")
        if self.history is not None:
            self.history.stop()
        self.nvml_process = nvml_process_used_bytes(cuda_index(self.device), os.getpid())
        self.host_pinned_peak = _host_pinned_peak()
        self.grads_bytes = sum(
            p.grad.untyped_storage().nbytes() for p in self.model.parameters() if p.grad is not None
        )

    def result(self) -> MemoryResult:
        af = self.after_forward or 0
        static = self.params_bytes + self.optimizer_bytes
        return MemoryResult(
            params_bytes=self.params_bytes,
            optimizer_bytes=self.optimizer_bytes,
            mem_after_forward_bytes=af,
            activations_after_forward_bytes=af - static,
            peak_bytes=self.peak,
            # The allocator does not know what a block is for, nor when its peak was: only the parts that
            # exist before the step are known at the peak.  Gradients are sized when the probe stops
            # (every parameter has one then), which says nothing about how many were live at the peak.
            peak_breakdown={"params": self.params_bytes, "optimizer": self.optimizer_bytes},
            extra={
                "cuda_grads_bytes_at_stop": self.grads_bytes,
                "cuda_max_allocated_bytes": self.peak,
                "cuda_max_reserved_bytes": self.reserved,
                "nvml_used_bytes": nvml_used_bytes(cuda_index(self.device)),
                # the second and third meters: what this process holds on the device as the driver
                # counts it (allocator's reserved blocks + CUDA context + library workspaces)
                "cuda_reserved_at_stop_bytes": self.reserved_now,
                "nvml_process_used_bytes": self.nvml_process,
                # offloaded activations live here, not in the device allocator (None: torch too old)
                "cuda_host_pinned_peak_bytes": self.host_pinned_peak,
                # the peak of the bytes asked for (blocks before rounding): the timeline's maximum
                "cuda_max_requested_bytes": self.requested_peak,
                **self._timeline(),
            },
        )

    def _timeline(self) -> dict:
        if self.history is None:
            return {}
        timeline, why = self.history.result(cuda_index(self.device))
        return {"timeline": timeline} if timeline is not None else {"timeline_note": why}


def cuda_index(device: torch.device) -> int:
    """torch's index of a CUDA device (the current one when the device names none)."""
    return device.index if device.index is not None else torch.cuda.current_device()


def _reset_host_peak() -> None:
    reset = getattr(torch.cuda, "reset_peak_host_memory_stats", None)
    if reset is not None:
        try:
            reset()
        except RuntimeError:
            pass


def _host_pinned_peak() -> int | None:
    """Peak bytes of pinned host blocks in use (torch's host allocator stats; None where torch lacks them)."""
    stats_fn = getattr(torch.cuda, "host_memory_stats", None)
    if stats_fn is None:
        return None
    try:
        value = stats_fn().get("active_bytes.peak")
    except RuntimeError:
        return None
    return None if value is None else int(value)



def probe_for(device: torch.device, model, optimizer, inputs, timeline: bool = False):
    """The memory probe for a device: the only place that chooses between CPU and CUDA accounting."""
    if device.type == "cuda":
        return CudaMemoryProbe(model, optimizer, inputs, timeline)
    return CpuMemoryProbe(model, optimizer, inputs, timeline)

