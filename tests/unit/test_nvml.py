"""NVML is an extra: absent or failing, every figure it gives is None and nothing raises."""

from __future__ import annotations

import sys
import types

import torch

from ckptbench.measure import nvml
from ckptbench.measure.nvml import nvml_used_bytes
from ckptbench.measure.steps import CudaStepProbe


def test_package_really_absent(monkeypatch):
    # None in sys.modules is what a missing package looks like to `import pynvml`: ImportError.
    monkeypatch.setitem(sys.modules, "pynvml", None)
    assert nvml.NvmlDevice.open(0) is None
    assert nvml_used_bytes(0) is None


def _fake_pynvml(init_error=None, energy_error=None):
    class NVMLError(Exception):
        pass

    class NVMLError_LibraryNotFound(NVMLError):  # noqa: N801 - pynvml's own class name
        pass

    class NVMLError_NotSupported(NVMLError):  # noqa: N801
        pass

    calls = []
    mod = types.ModuleType("pynvml")
    mod.NVMLError_LibraryNotFound = NVMLError_LibraryNotFound
    mod.NVMLError_NotSupported = NVMLError_NotSupported

    def nvmlInit():  # noqa: N802 - pynvml's names
        if init_error:
            raise {"library": NVMLError_LibraryNotFound}[init_error]("NVML Shared Library Not Found")
        calls.append("init")

    def energy(handle):
        if energy_error:
            raise NVMLError_NotSupported("Not Supported")
        return 123_456

    mod.nvmlInit = nvmlInit
    mod.nvmlShutdown = lambda: calls.append("shutdown")
    mod.nvmlDeviceGetHandleByIndex = lambda i: ("idx", i)
    mod.nvmlDeviceGetHandleByUUID = lambda u: ("uuid", u)
    mod.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(used=7 * 2**30, total=80 * 2**30)
    mod.nvmlDeviceGetTotalEnergyConsumption = energy
    mod.calls = calls
    return mod


def test_library_not_found(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(init_error="library"))
    assert nvml.NvmlDevice.open(0) is None
    assert nvml_used_bytes(0) is None


def test_energy_not_supported_keeps_memory(monkeypatch):
    fake = _fake_pynvml(energy_error=True)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    dev = nvml.NvmlDevice.open(0)
    assert dev is not None
    assert dev.used_bytes() == 7 * 2**30
    assert dev.energy_mj() is None
    dev.close()
    assert fake.calls == ["init", "shutdown"]


def test_working_nvml(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml())
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    dev = nvml.NvmlDevice.open(0)
    assert dev._handle == ("idx", 3)
    assert dev.energy_mj() == 123_456
    assert nvml_used_bytes(0) == 7 * 2**30


def test_nvml_target_follows_cuda_visible_devices():
    assert nvml.nvml_target(0, visible="") == 0
    assert nvml.nvml_target(1, visible="2,3") == 3
    assert nvml.nvml_target(0, visible="GPU-1234-abcd") == "GPU-1234-abcd"
    assert nvml.nvml_target(2, visible="0") == 2  # out of range: leave the index alone


def test_cuda_step_probe_without_nvml_reports_not_available(monkeypatch):
    # Constructing the probe touches no CUDA when the index is given; with NVML absent the energy and
    # device-level memory are None, not an error.
    monkeypatch.setitem(sys.modules, "pynvml", None)
    probe = CudaStepProbe(torch.device("cuda:0"))
    out = probe.result()
    assert out["nvml_available"] is False
    assert out["energy_per_step_j"] is None and out["nvml_used_bytes_after_steps"] is None
    assert out["cuda_step_max_allocated_bytes"] == []
