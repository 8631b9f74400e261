"""Device memory a CUDA training step holds outside its tensors: cuBLAS's workspaces (bytes).

torch gives every (cuBLAS handle, CUDA stream) pair that runs a cuBLAS kernel a workspace, allocated
through its caching allocator on the pair's first matmul and kept until the process ends (torch's "CUDA
semantics" notes, "cuBLAS workspaces"; ``aten/src/ATen/cuda/CublasHandlePool.cpp``).  The allocator
counts it as allocated like any tensor, so ``torch.cuda.memory_allocated`` after the forward, and the
step's peak, include it.  No separate cuBLASLt workspace showed in the H200 run below (current torch
hands cuBLASLt the same workspace by default).

Size of one workspace (``parseChosenWorkspaceSize``):
  - ``CUBLAS_WORKSPACE_CONFIG=:SIZE:COUNT[:SIZE:COUNT...]`` when set: the sum of SIZE KiB × COUNT;
  - else by the device's compute capability: 32 MiB (``:4096:8``) where its major is 9 to 12 (Hopper,
    Blackwell), ``:4096:2:16:8`` = 2 × 4096 + 8 × 16 KiB = 8,519,680 bytes below (Volta, Turing, Ampere,
    Ada).

How many: handles are per thread, and a training step multiplies on two threads, one stream: the forward
on the thread that calls the model, the backward (recomputation included) on autograd's worker thread for
the device.  After a warm-up step both workspaces exist before the memory step starts; with none, only
the forward's exists until the backward's first matmul.  Measured on an H200 (capability 9.0, torch
2.11): the allocator's requested bytes at the start of every memory step were the parameters, AdamW
state and the batch's ids plus exactly 67,108,864 bytes = 2 × 32 MiB, at all 42 points of
``results/h200-20261204-gpu-small``.

Pure: no torch import.  The estimate adds these bytes only when its caller names the device's compute
capability (a record's ``env.cuda_capability``); without it the estimate is the tensors' alone, as the
simulation counts them.
"""

from __future__ import annotations

import re

KIB = 1024
HOPPER_AND_LATER = frozenset({9, 10, 11, 12})  # compute capability majors torch gives 32 MiB by default
LARGE_DEFAULT_BYTES = 4096 * KIB * 8  # ":4096:8", 33,554,432
SMALL_DEFAULT_BYTES = (4096 * 2 + 16 * 8) * KIB  # ":4096:2:16:8", 8,519,680
STEP_THREADS = 2  # the forward's thread and autograd's device thread: one cuBLAS handle each, one stream
_CONFIG_PAIR = re.compile(r":([0-9]+):([0-9]+)")


def cublas_workspace_bytes(capability_major: int, config: str | None = None) -> int:
    """Bytes of one cuBLAS workspace torch allocates on a device of this compute capability (its major
    number), or as ``CUBLAS_WORKSPACE_CONFIG`` (`config`) sets it; a config without one ``:SIZE:COUNT``
    pair is ignored, as torch ignores it (with a warning) and uses its default."""
    pairs = _CONFIG_PAIR.findall(config or "")
    if pairs:
        return sum(int(size) * KIB * int(count) for size, count in pairs)
    return LARGE_DEFAULT_BYTES if capability_major in HOPPER_AND_LATER else SMALL_DEFAULT_BYTES


def capability_major(capability) -> int | None:
    """The major number of a recorded compute capability ("9.0", [9, 0], 9), or None when there is none
    or it is not one."""
    if isinstance(capability, bool):
        return None
    if isinstance(capability, int):
        return capability
    if isinstance(capability, (list, tuple)) and capability and isinstance(capability[0], int) \
            and not isinstance(capability[0], bool):
        return capability[0]
    if isinstance(capability, str):
        head = capability.split(".")[0].strip()
        return int(head) if head.isdigit() else None
    return None


def step_workspaces(warmed_up: bool) -> tuple[int, int]:
    """(workspaces alive during the forward and after it, workspaces alive from the backward on) of a
    step: both from the start after a warm-up step; else the forward's first, the backward's added by its
    first matmul (counted from the backward's first moment: at most one workspace early there)."""
    return (STEP_THREADS if warmed_up else 1), STEP_THREADS
