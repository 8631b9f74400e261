"""Memory probes: exact live-tensor accounting on CPU, the caching allocator's counters on CUDA.

Both probes share one shape (``start`` / ``mark_after_forward`` / ``stop`` / ``result``) and are chosen by
device in :func:`probe_for`, so the step loop never branches on the device itself.

The CPU probe is a ``TorchDispatchMode`` that sees every tensor an operator returns, keeps one entry per
live *storage* (views and in-place results share their base's storage, so nothing is counted twice) and
drops it when the storage is freed (a ``weakref.finalize`` on the storage's Python object, which torch
keeps alive exactly as long as the C++ storage).  Because it slows every operator it only runs on the
dedicated memory steps; the timed steps run without it.
"""

from __future__ import annotations

import time
import weakref
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from .nvml import NvmlDevice

CATEGORIES = ("params", "grads", "optimizer", "activations")


def storage_key(t: torch.Tensor) -> int | None:
    """Identity of the storage a tensor lives in (None for empty or meta tensors).

    The storage object's C pointer, not ``data_ptr``: it is unique among live storages and exists for
    fake tensors too (whose ``data_ptr`` is always 0), so the same tracker serves ``--simulate``.
    """
    if t.device.type == "meta" or t.is_sparse:
        return None
    st = t.untyped_storage()
    if st.nbytes() == 0:
        return None
    return st._cdata


class StorageSerials:
    """A unique number per live allocation.

    Addresses are reused as soon as memory is freed (the forward frees and reallocates all the time),
    so an address alone would merge two different tensors.  A serial is handed out the first time an
    address is seen and retired by a finalizer when that storage is freed, so the next allocation at
    the same address gets a new serial.
    """

    def __init__(self) -> None:
        self._live: dict[int, int] = {}
        self._next = 0

    def __call__(self, t: torch.Tensor) -> int | None:
        key = storage_key(t)
        if key is None:
            return None
        serial = self._live.get(key)
        if serial is None:
            serial = self._live[key] = self._next
            self._next += 1
            weakref.finalize(t.untyped_storage(), self._live.pop, key, None)
        return serial


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


class LiveStorageTracker(TorchDispatchMode):
    """Exact live bytes per category, and the peak with its breakdown at the moment it was reached.

    Tensors that existed before the mode was entered (parameters, optimizer state, the input batch) are
    registered explicitly with :meth:`track`; everything an operator returns inside the mode is
    registered as ``activations`` until :meth:`recategorize` moves it (a gradient, once accumulated).
    """

    def __init__(self) -> None:
        super().__init__()
        self._live: dict[int, list] = {}  # storage key -> [nbytes, category]
        self.by_category = dict.fromkeys(CATEGORIES, 0)
        self.total = 0
        self.peak = 0
        self.peak_breakdown = dict(self.by_category)

    # -- registration -------------------------------------------------------------------------------
    def track(self, tensor: torch.Tensor, category: str) -> None:
        key = storage_key(tensor)
        if key is None:
            return
        entry = self._live.get(key)
        if entry is not None:
            self._move(entry, category)
            return
        st = tensor.untyped_storage()
        nbytes = st.nbytes()
        self._live[key] = [nbytes, category]
        weakref.finalize(st, self._free, key)
        self.by_category[category] += nbytes
        self.total += nbytes
        if self.total > self.peak:
            self.peak = self.total
            self.peak_breakdown = dict(self.by_category)

    def recategorize(self, tensor: torch.Tensor, category: str) -> None:
        self.track(tensor, category)

    def _move(self, entry: list, category: str) -> None:
        if entry[1] != category:
            self.by_category[entry[1]] -= entry[0]
            self.by_category[category] += entry[0]
            entry[1] = category

    def _free(self, key: int) -> None:
        entry = self._live.pop(key, None)
        if entry is not None:
            self.by_category[entry[1]] -= entry[0]
            self.total -= entry[0]

    def reset_peak(self) -> None:
        self.peak = self.total
        self.peak_breakdown = dict(self.by_category)

    # -- dispatch -----------------------------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and storage_key(t) not in self._live:
                self.track(t, "activations")
        return out


class CpuMemoryProbe:
    """Exact live-tensor peak on CPU (see :class:`LiveStorageTracker`)."""

    kind = "cpu-live-storages"

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, inputs: list[torch.Tensor]):
        self.model = model
        self.optimizer = optimizer
        self.inputs = inputs
        self.tracker = LiveStorageTracker()
        self._hooks: list = []
        self.after_forward: dict | None = None

    def start(self) -> None:
        tr = self.tracker
        for p in self.model.parameters():
            tr.track(p, "params")
        for b in self.model.buffers():
            tr.track(b, "params")
        for state in self.optimizer.state.values():
            for v in state.values():
                if isinstance(v, torch.Tensor):
                    tr.track(v, "optimizer")
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
        tr.__enter__()

    def _on_grad(self, p: torch.Tensor) -> None:
        if p.grad is not None:
            self.tracker.recategorize(p.grad, "grads")

    def mark_after_forward(self) -> None:
        tr = self.tracker
        self.after_forward = {"total": tr.total, **tr.by_category}

    def stop(self) -> None:
        self.tracker.__exit__(None, None, None)
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
        )


class CudaMemoryProbe:
    """The caching allocator's own counters; NVML for what the whole device shows as used.

    ``max_memory_allocated`` is what tensors needed; ``max_memory_reserved`` is what the allocator held
    (fragmentation included); NVML adds the CUDA context and anything outside torch.
    """

    kind = "cuda-allocator"

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, inputs: list[torch.Tensor]):
        self.model = model
        self.optimizer = optimizer
        self.device = next(model.parameters()).device
        self.after_forward: int | None = None

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

    def mark_after_forward(self) -> None:
        torch.cuda.synchronize(self.device)
        self.after_forward = torch.cuda.memory_allocated(self.device)

    def stop(self) -> None:
        torch.cuda.synchronize(self.device)
        self.peak = torch.cuda.max_memory_allocated(self.device)
        self.reserved = torch.cuda.max_memory_reserved(self.device)
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
            # The allocator does not know what a block is for: grads are sized from the parameters,
            # activations are the rest of the peak.
            peak_breakdown={
                "params": self.params_bytes,
                "grads": self.grads_bytes,
                "optimizer": self.optimizer_bytes,
                "activations": self.peak - static - self.grads_bytes,
            },
            extra={
                "cuda_max_allocated_bytes": self.peak,
                "cuda_max_reserved_bytes": self.reserved,
                "nvml_used_bytes": nvml_used_bytes(_index(self.device)),
                # offloaded activations live here, not in the device allocator (None: torch too old)
                "cuda_host_pinned_peak_bytes": self.host_pinned_peak,
            },
        )


def nvml_used_bytes(index: int) -> int | None:
    """Device-level used memory from NVML, or None when NVML is absent or fails (never raises)."""
    dev = NvmlDevice.open(index)
    if dev is None:
        return None
    try:
        return dev.used_bytes()
    finally:
        dev.close()


def _index(device: torch.device) -> int:
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


class NullStepProbe:
    """CPU steps outside the memory steps carry no probe: the exact CPU tracker is too slow for them."""

    kind = None

    def begin(self, phase: str) -> None:
        pass

    def before_step(self) -> None:
        pass

    def after_step(self) -> None:
        pass

    def end(self) -> None:
        pass

    def result(self) -> dict:
        return {}


class CudaStepProbe:
    """Per-step allocator peaks and the energy of a window of clean steps.

    ``reset_peak_memory_stats`` / ``max_memory_allocated`` / ``max_memory_reserved`` are host-side
    counters of the caching allocator (stream-ordered, exact without a synchronise), so reading them
    around every step adds no stall.  Energy is NVML's counter read once at each edge of the window:
    :meth:`begin` and :meth:`end` synchronise (outside the timed steps) so the window holds exactly its
    own kernels; nothing synchronises inside it.  The counter is coarse (tens of ms), which is why energy
    is reported per window and divided by its steps, not read per step.
    """

    kind = "cuda-allocator-per-step"

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.nvml = NvmlDevice.open(_index(device))
        self.phases: dict[str, dict] = {}
        self._phase = ""
        self._e0: int | None = None
        self._t0 = 0.0

    def begin(self, phase: str) -> None:
        torch.cuda.synchronize(self.device)
        self._phase = phase
        self.phases[phase] = {"max_allocated": [], "max_reserved": [], "energy_mj": None, "wall_s": None}
        self._e0 = self.nvml.energy_mj() if self.nvml else None
        self._t0 = time.perf_counter()

    def before_step(self) -> None:
        torch.cuda.reset_peak_memory_stats(self.device)

    def after_step(self) -> None:
        ph = self.phases[self._phase]
        ph["max_allocated"].append(torch.cuda.max_memory_allocated(self.device))
        ph["max_reserved"].append(torch.cuda.max_memory_reserved(self.device))

    def end(self) -> None:
        torch.cuda.synchronize(self.device)
        ph = self.phases[self._phase]
        ph["wall_s"] = time.perf_counter() - self._t0
        e1 = self.nvml.energy_mj() if self.nvml else None
        if self._e0 is not None and e1 is not None:
            ph["energy_mj"] = e1 - self._e0

    def result(self) -> dict:
        warm = self.phases.get("warmup", {})
        timed = self.phases.get("timed", {})
        steps = len(timed.get("max_allocated", []))
        energy = timed.get("energy_mj")
        wall = timed.get("wall_s")
        out = {
            "step_probe": self.kind,
            "cuda_first_step_max_allocated_bytes": (warm.get("max_allocated") or [None])[0],
            "cuda_first_step_max_reserved_bytes": (warm.get("max_reserved") or [None])[0],
            "cuda_step_max_allocated_bytes": timed.get("max_allocated", []),
            "cuda_step_max_reserved_bytes": timed.get("max_reserved", []),
            "nvml_available": self.nvml is not None,
            "nvml_used_bytes_after_steps": self.nvml.used_bytes() if self.nvml else None,
            "energy_timed_window_j": energy / 1000.0 if energy is not None else None,
            "energy_per_step_j": energy / 1000.0 / steps if (energy is not None and steps) else None,
            "power_avg_w": energy / 1000.0 / wall if (energy is not None and wall) else None,
        }
        if self.nvml is not None:
            self.nvml.close()
            self.nvml = None
        return out


def probe_for(device: torch.device, model, optimizer, inputs):
    """The memory probe for a device: the only place that chooses between CPU and CUDA accounting."""
    if device.type == "cuda":
        return CudaMemoryProbe(model, optimizer, inputs)
    return CpuMemoryProbe(model, optimizer, inputs)


def step_probe_for(device: torch.device):
    """The probe of the clean (warm-up and timed) steps: chosen here, beside :func:`probe_for`."""
    if device.type == "cuda":
        return CudaStepProbe(device)
    return NullStepProbe()
