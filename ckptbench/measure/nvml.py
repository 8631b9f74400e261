"""NVML, when it is there: device-level used memory and the energy counter, else "not available" (None).

NVML sees what torch's allocator cannot (the CUDA context, other processes) and counts energy.  It is an
extra: a missing ``pynvml`` package, a missing driver library (``NVMLError_LibraryNotFound``) or a query
the device does not support must never fail a measurement, so every call here returns None instead of
raising.

NVML numbers devices in PCI order and ignores ``CUDA_VISIBLE_DEVICES``; :func:`nvml_target` maps a
CUDA index to what NVML needs.
"""

from __future__ import annotations

import os


def nvml_target(cuda_index: int, visible: str | None = None) -> int | str:
    """NVML index (int) or UUID (str) of the device torch calls ``cuda:<cuda_index>``.

    With ``CUDA_VISIBLE_DEVICES=2,3`` torch's cuda:0 is NVML's device 2; with UUIDs in the variable the
    UUID itself is the handle key.  Without the variable the indices agree (assuming the default
    ``CUDA_DEVICE_ORDER``, which on one-GPU machines cannot differ).
    """
    visible = os.environ.get("CUDA_VISIBLE_DEVICES") if visible is None else visible
    if visible:
        entries = [e.strip() for e in visible.split(",") if e.strip()]
        if cuda_index < len(entries):
            entry = entries[cuda_index]
            return int(entry) if entry.isdigit() else entry
    return cuda_index


class NvmlDevice:
    """One NVML handle for the life of a measurement; every query returns None rather than raise."""

    def __init__(self, pynvml, handle) -> None:
        self._nvml = pynvml
        self._handle = handle

    @classmethod
    def open(cls, cuda_index: int = 0) -> NvmlDevice | None:
        """The device's handle, or None when NVML cannot be used here (no package, no library, no device)."""
        try:
            import pynvml

            pynvml.nvmlInit()
        except Exception:  # ImportError, NVMLError_LibraryNotFound, NVMLError_DriverNotLoaded, ...
            return None
        try:
            target = nvml_target(cuda_index)
            if isinstance(target, str):
                handle = pynvml.nvmlDeviceGetHandleByUUID(target)
            else:
                handle = pynvml.nvmlDeviceGetHandleByIndex(target)
        except Exception:
            _shutdown(pynvml)
            return None
        return cls(pynvml, handle)

    def used_bytes(self) -> int | None:
        """Device memory in use by anyone (context and other processes included)."""
        try:
            return int(self._nvml.nvmlDeviceGetMemoryInfo(self._handle).used)
        except Exception:
            return None

    def process_used_bytes(self, pid: int) -> int | None:
        """Device memory the driver counts for process `pid` (its CUDA context included), or None."""
        try:
            for proc in self._nvml.nvmlDeviceGetComputeRunningProcesses(self._handle):
                if proc.pid == pid and proc.usedGpuMemory is not None:
                    return int(proc.usedGpuMemory)
        except Exception:
            return None
        return None

    def total_bytes(self) -> int | None:
        """The device's memory, as NVML reports it (what the sweep sizes CUDA points against)."""
        try:
            return int(self._nvml.nvmlDeviceGetMemoryInfo(self._handle).total)
        except Exception:
            return None

    def energy_mj(self) -> int | None:
        """Energy counter in millijoules since the driver was loaded (Volta and newer), else None."""
        try:
            return int(self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle))
        except Exception:  # NVMLError_NotSupported on older devices
            return None

    def driver_version(self) -> str | None:
        try:
            version = self._nvml.nvmlSystemGetDriverVersion()
            return version.decode() if isinstance(version, bytes) else str(version)
        except Exception:
            return None

    def close(self) -> None:
        _shutdown(self._nvml)


WHY_NOT = {"NVMLError_LibraryNotFound": "no NVIDIA driver library (libnvidia-ml.so) on this machine",
           "NVMLError_DriverNotLoaded": "the NVIDIA kernel driver is not loaded"}


def nvml_inventory() -> dict:
    """What NVML says about this machine without touching CUDA: the driver, the CUDA version it supports,
    and every GPU with its memory; or why NVML could not be asked (the sweep's parent and ``ckptbench env``
    ask this, so it must not import torch).

    ``nvml`` is ``"driver X"`` or ``"not available (why)"``; ``nvml_devices`` lists ``"name (N GiB)"``.
    """
    try:
        import pynvml
    except ImportError:
        return {"nvml": "not available (the nvidia-ml-py package is not installed)", "driver": None,
                "driver_cuda": None, "nvml_devices": []}
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound: no NVIDIA driver on this machine
        why = WHY_NOT.get(type(exc).__name__, str(exc))
        return {"nvml": f"not available ({type(exc).__name__}: {why})", "driver": None, "driver_cuda": None,
                "nvml_devices": []}
    try:
        devices = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = _text(pynvml.nvmlDeviceGetName(handle))
            devices.append(f"{name} ({pynvml.nvmlDeviceGetMemoryInfo(handle).total / 2**30:.1f} GiB)")
        try:
            cuda = pynvml.nvmlSystemGetCudaDriverVersion()  # e.g. 12080 for 12.8
            driver_cuda = f"{cuda // 1000}.{cuda % 1000 // 10}"
        except Exception:
            driver_cuda = None
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        return {"nvml": f"driver {driver}", "driver": driver, "driver_cuda": driver_cuda, "nvml_devices": devices}
    except Exception as exc:
        return {"nvml": f"not available ({type(exc).__name__}: {exc})", "driver": None, "driver_cuda": None,
                "nvml_devices": []}
    finally:
        _shutdown(pynvml)


def nvml_used_bytes(index: int) -> int | None:
    """Device-level used memory from NVML, or None when NVML is absent or fails (never raises)."""
    return _ask(index, NvmlDevice.used_bytes)


def nvml_total_bytes(index: int) -> int | None:
    """Device memory from NVML without touching CUDA (the sweep's parent asks), or None."""
    return _ask(index, NvmlDevice.total_bytes)


def nvml_process_used_bytes(index: int, pid: int) -> int | None:
    """What the driver counts on the device for process `pid` (context included), or None."""
    return _ask(index, lambda dev: dev.process_used_bytes(pid))


def _ask(index: int, query) -> int | None:
    """One query on a handle opened and closed around it."""
    dev = NvmlDevice.open(index)
    if dev is None:
        return None
    try:
        return query(dev)
    finally:
        dev.close()


def _text(value) -> str:
    """Older pynvml releases return bytes."""
    return value.decode() if isinstance(value, bytes) else str(value)


def _shutdown(pynvml) -> None:
    try:
        pynvml.nvmlShutdown()
    except Exception:
        pass
