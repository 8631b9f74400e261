"""How fast this machine multiplies matrices and fills new tensors: what a sweep's duration is projected from.

Measured, not looked up: a CPU's matmul rate depends on its vector units, the BLAS torch was built with
and the thread count a suite sets, and no table knows them.  Each probe runs for about a tenth of a second.
:func:`measure_rates` runs in a process forked from the sweep's fork server; without one, as
``python -m ckptbench.measure.rates '[["cpu", "fp32", 1]]'``, which prints one JSON object (the sweep's
parent never imports torch).
"""

from __future__ import annotations

import json
import sys
import time

DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
# the side of the square matmuls timed, by device: 1024 on a CPU (what the CPU reference run's steps are
# priced against).  A GPU needs a product that fills it: a 1024-sided one is 2 GFLOP, 64 output tiles of
# 128^2 for the H200's 132 SMs, and measured 116 TFLOP/s there in bf16 against 795 at 8192 (the size
# `ckptbench calibrate` times), while the training steps of the Llama-1B shape ran at 0.09-0.62 of the latter
MATMUL_N = {"cpu": 1024, "cuda": 8192}


def _sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def matmul_rate(device: str, dtype: str, threads: int, n: int | None = None, seconds: float = 0.1) -> float:
    """Achieved FLOP/s of n×n matmuls (:data:`MATMUL_N` for the device unless `n` is given) in `dtype` with
    `threads` CPU threads (repeated for ~`seconds`)."""
    import torch

    torch.set_num_threads(threads)
    n = n or MATMUL_N.get(device, 1024)
    dt = getattr(torch, DTYPES[dtype])
    a = torch.randn(n, n, device=device, dtype=dt)
    b = torch.randn(n, n, device=device, dtype=dt)
    a @ b  # first call: library load, kernel choice
    _sync(device)
    reps, elapsed = 1, 0.0
    while True:
        t0 = time.perf_counter()
        for _ in range(reps):
            a @ b
        _sync(device)
        elapsed = time.perf_counter() - t0
        if elapsed >= seconds:
            return 2 * n**3 * reps / elapsed
        reps *= 2


def init_rate(elements: int = 2**24) -> float:
    """Elements per second that ``normal_`` fills: building a model from its config is mostly this."""
    import torch

    x = torch.empty(elements)
    t0 = time.perf_counter()
    x.normal_()
    return elements / (time.perf_counter() - t0)


def measure_rates(keys: list[tuple[str, str, int]]) -> dict:
    """{"matmul": [[device, dtype, threads, FLOP/s or None], ...], "init_elements_per_s": ...}"""
    import torch

    out = []
    for device, dtype, threads in keys:
        if device == "cuda" and not torch.cuda.is_available():
            out.append([device, dtype, threads, None])
        else:
            out.append([device, dtype, threads, matmul_rate(device, dtype, threads)])
    torch.set_num_threads(1)
    return {"matmul": out, "init_elements_per_s": init_rate(), "torch": torch.__version__}


if __name__ == "__main__":
    print(json.dumps(measure_rates([tuple(k) for k in json.loads(sys.argv[1])])))
