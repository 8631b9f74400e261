"""Calibration of a CUDA machine, once per run: pinned host↔device copy bandwidth and a bf16 matmul rate.

The bandwidth bounds what offloaded checkpointing can cost (:mod:`ckptbench.theory.memory.offload`); the matmul
rate is the practical ceiling MFU* is taken against.  Only this module needs CUDA.
"""

from __future__ import annotations

import statistics

MIB = 2**20
DEFAULT_SIZE_BYTES = 256 * MIB
DEFAULT_REPS = 5


def copy_bandwidth(size_bytes: int = DEFAULT_SIZE_BYTES, reps: int = DEFAULT_REPS, device: str = "cuda") -> dict:
    """Pinned host↔device copy bandwidth: one warm-up copy each way, then `reps` timed with CUDA events.

    Pinned buffers because that is what ``save_on_cpu(pin_memory=True)`` copies into; the median of the
    reps is reported.  Raises RuntimeError without CUDA (callers check first).
    """
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("host-device bandwidth needs a CUDA device")
    n = size_bytes // 2
    host = torch.empty(n, dtype=torch.bfloat16, pin_memory=True)
    host.fill_(1)
    dev = torch.empty(n, dtype=torch.bfloat16, device=device)
    nbytes = n * 2

    def timed(copy) -> list[float]:
        copy()  # warm-up
        torch.cuda.synchronize()
        pairs = []
        for _ in range(reps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            copy()
            end.record()
            pairs.append((start, end))
        torch.cuda.synchronize()
        return [s.elapsed_time(e) / 1000.0 for s, e in pairs]

    h2d = timed(lambda: dev.copy_(host, non_blocking=True))
    d2h = timed(lambda: host.copy_(dev, non_blocking=True))
    return {
        "size_bytes": nbytes,
        "reps": reps,
        "pinned": True,
        "h2d_times_s": h2d,
        "d2h_times_s": d2h,
        "h2d_bytes_per_s": nbytes / statistics.median(h2d),
        "d2h_bytes_per_s": nbytes / statistics.median(d2h),
    }


def matmul_peak(n: int = 8192, reps: int = 10, warmup: int = 3) -> dict:
    """Achieved bf16 matmul FLOP/s on random n×n operands (the practical ceiling MFU* is taken against)."""
    import torch

    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(warmup):
        a @ b
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(reps):
        a @ b
    end.record()
    torch.cuda.synchronize()
    seconds = start.elapsed_time(end) / 1000.0
    return {"matmul_n": n, "matmul_reps": reps, "matmul_flops_per_s": 2 * n**3 * reps / seconds}


def calibrate(size_mib: int = 256, reps: int = 5) -> dict:
    """Bandwidth and matmul peak on cuda:0, or ``{"available": False, ...}`` without CUDA."""
    import torch

    if not torch.cuda.is_available():
        return {"available": False, "reason": "no CUDA device"}
    out = {"available": True, "device_name": torch.cuda.get_device_name(0), "torch": torch.__version__}
    out.update(copy_bandwidth(size_mib * 2**20, reps))
    out.update(matmul_peak())
    return out


def _collective_worker(rank: int, world: int, port: int, backend: str, size_bytes: int, reps: int,
                       out: str) -> None:
    import json
    import statistics
    import time

    import torch
    import torch.distributed as dist

    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")

        def timed(numel: int) -> float:
            t = torch.ones(numel, dtype=torch.float32, device=device)
            for _ in range(2):  # the ring is built on the first calls
                dist.all_reduce(t)
            times = []
            for _ in range(reps):
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                dist.barrier()
                start = time.perf_counter()
                dist.all_reduce(t)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                times.append(time.perf_counter() - start)
            return statistics.median(times)

        small, large = timed(1), timed(max(1, size_bytes // 4))
        if rank == 0:
            ring = 2 * (world - 1) / world
            with open(out, "w", encoding="utf-8") as fh:
                json.dump({"collective_backend": backend, "collective_world": world,
                           "collective_payload_bytes": max(1, size_bytes // 4) * 4, "collective_reps": reps,
                           "collective_small_s": small, "collective_large_s": large,
                           "collective_latency_s": small / (2 * (world - 1)),
                           "collective_bus_bytes_per_s": ring * max(1, size_bytes // 4) * 4 / max(large - small, 1e-9)},
                          fh)
    finally:
        dist.destroy_process_group()


def collective_rate(world: int = 2, size_bytes: int = 64 * 2**20, reps: int = 5, backend: str | None = None) -> dict:
    """A ring all-reduce's bus bandwidth and per-hop latency between `world` processes of this machine:
    NCCL across its GPUs where there are `world` of them, else gloo over loopback.  The median of `reps`
    all-reduces of one float (the latency: its time over 2(n−1) hops) and of `size_bytes` (the bus
    bandwidth: 2(n−1)/n of the payload over the time beyond the small one's)."""
    import os
    import socket
    import tempfile

    import torch
    import torch.multiprocessing as mp

    if backend is None:
        backend = "nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= world else "gloo"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    fd, out = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        mp.start_processes(_collective_worker, args=(world, port, backend, size_bytes, reps, out), nprocs=world,
                           start_method="spawn")
        import json

        with open(out, encoding="utf-8") as fh:
            return json.load(fh)
    finally:
        os.unlink(out)
