"""How fast this machine is right now: a fixed fp32 matmul, timed at a sweep's start and at its end.

``compare`` divides one run's step times by the other's only by what it *measured* of the machine: the
ratio of this kernel's times in the two runs (asv-style).  The kernel is fixed (size, count, dtype), runs
with the threads the sweep's points use, and reports every repetition, so ``compare`` can tell a
machine that really is slower from the kernel's own noise.  Run as
``python -m ckptbench.measure.speed cpu 1`` it prints one JSON object; the sweep runs it in a process
forked from its fork server (torch already imported), or in a child interpreter, never in its parent.
"""

from __future__ import annotations

import json
import sys
import time

# device -> (matrix size n, matmuls per repetition): a repetition lasts some tens of milliseconds on
# the machines the suites run on, long enough that the timer's resolution does not count
KERNELS = {"cpu": (512, 8), "cuda": (4096, 8)}
REPS = 7
SEED = 0


def kernel_name(device: str) -> str:
    n, count = KERNELS[device]
    return f"fp32 matmul {n}x{n}, {count} per repetition"


def time_kernel(device: str, threads: int, reps: int = REPS) -> dict:
    """Seconds per repetition of the fixed kernel, one warm-up repetition first, with what it ran on."""
    import torch

    torch.set_num_threads(threads)
    n, count = KERNELS[device]
    if device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 really, whatever a user's default is
    gen = torch.Generator().manual_seed(SEED)
    a = torch.randn(n, n, generator=gen).to(device)
    b = torch.randn(n, n, generator=gen).to(device)

    def repetition() -> float:
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(count):
            a @ b
        if device == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    repetition()  # library load, kernel choice, caches
    times = [repetition() for _ in range(reps)]
    out = {"kernel": kernel_name(device), "device": device, "dtype": "fp32", "threads": threads,
           "times_s": times, "torch": str(torch.__version__)}  # a plain str: a TorchVersion unpickled imports torch
    if device == "cuda":
        out["device_name"] = torch.cuda.get_device_name(0)
    return out


if __name__ == "__main__":
    print(json.dumps(time_kernel(sys.argv[1], int(sys.argv[2]))))
