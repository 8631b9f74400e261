"""Probes of the clean steps (warm-up and timed): per-step allocator peaks and window energy on CUDA,
nothing on CPU (the exact CPU tracker is too slow to run on steps that are timed); and the steps' losses,
kept where they do not raise those peaks (:class:`StepLosses`)."""

from __future__ import annotations

import time

import torch

from .memory import cuda_index
from .nvml import NvmlDevice


class StepLosses:
    """Each clean step's loss, read once the steps are over (reading one would wait for the device).

    On CUDA each loss is copied into one device buffer made after the first step, not kept as a tensor of
    its own: a kept 0-d tensor holds a 512-byte block, so every timed step's allocator peak would be 512
    bytes above the step before it (47 steps of Llama-1B on an H200: 23,552 bytes apart)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.kept: list = []  # losses kept as they came (a CPU tensor, a number, or the buffer once full)
        self.buffer: torch.Tensor | None = None
        self.n = 0

    def append(self, loss) -> None:
        on_device = isinstance(loss, torch.Tensor) and loss.is_cuda and loss.numel() == 1
        if on_device and self.n < self.size:
            if self.buffer is None:
                self.buffer = torch.empty(self.size, dtype=torch.float32, device=loss.device)
            self.buffer[self.n] = loss.detach().reshape(())
            self.n += 1
        else:
            self.kept.append(loss)

    def values(self) -> list[float]:
        head = self.buffer[:self.n].tolist() if self.buffer is not None else []
        return head + [float(x) for x in self.kept]


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
        self.nvml = NvmlDevice.open(cuda_index(device))
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



def step_probe_for(device: torch.device):
    """The probe of the clean (warm-up and timed) steps: chosen here, beside :func:`probe_for`."""
    if device.type == "cuda":
        return CudaStepProbe(device)
    return NullStepProbe()
