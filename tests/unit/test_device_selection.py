"""Probes and timers are chosen by device in one place each; CUDA ones only for CUDA devices."""

from __future__ import annotations

import sys

import torch

from ckptbench.measure.memory import CpuMemoryProbe, CudaMemoryProbe, probe_for
from ckptbench.measure.steps import CudaStepProbe, NullStepProbe, step_probe_for
from ckptbench.measure.timing import CpuTimer, CudaTimer, timer_for


def _model():
    model = torch.nn.Linear(4, 4)
    return model, torch.optim.AdamW(model.parameters())


def test_cpu_device_gets_cpu_probes():
    model, opt = _model()
    assert isinstance(probe_for(torch.device("cpu"), model, opt, []), CpuMemoryProbe)
    assert isinstance(step_probe_for(torch.device("cpu")), NullStepProbe)
    assert isinstance(timer_for("cpu"), CpuTimer)
    assert step_probe_for(torch.device("cpu")).result() == {}


def test_cuda_device_gets_cuda_probes_constructed_lazily(monkeypatch):
    # Construction must not need a GPU (nothing is recorded until start/begin), so this runs anywhere.
    monkeypatch.setitem(sys.modules, "pynvml", None)
    model, opt = _model()
    assert isinstance(probe_for(torch.device("cuda:0"), model, opt, []), CudaMemoryProbe)
    assert isinstance(step_probe_for(torch.device("cuda:0")), CudaStepProbe)
    assert isinstance(timer_for("cuda"), CudaTimer)
