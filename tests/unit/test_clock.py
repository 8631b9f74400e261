"""The local-SGD loop's clock reads the time only after the device finished its queued work."""

import time

import torch

from ckptbench.measure.timing import BoundaryClock, boundary_clock


def test_each_reading_waits_for_the_device_first():
    waited = []

    def wait():
        waited.append(time.perf_counter())

    clock = BoundaryClock(wait, "test")
    t0 = clock.now()
    t1 = clock.now()
    assert len(waited) == 2
    assert waited[0] <= t0 <= waited[1] <= t1  # each time is read after its wait returned


def test_cuda_clock_synchronises_and_cpu_clock_does_not():
    assert boundary_clock(torch.device("cpu")).kind == "perf_counter"
    assert boundary_clock(torch.device("cpu"))._wait is None
    cuda = boundary_clock(torch.device("cuda", 0))  # built without touching CUDA
    assert cuda.kind == "cuda-synchronize" and cuda._wait is not None
