"""A CPU matmul's operands other than its first matrix, taken from beyond the caches for its timing.

Timed back to back on one set of tensors, all of a matmul's operands sit in the core's caches.  In the step
only its first matrix was just written (by the op before it: the activation, or the gradient flowing back);
the weight of a linear layer, its bias and the saved activation a weight's gradient reads were last touched
a layer or a whole step before, and on this project's CPUs a small step's optimizer pass over parameters,
gradients and moments alone is as large as the last-level cache.  :func:`cold_operand_calls` makes the
calls a trial takes in turn: the first matrix as made, every other operand at the next place of one pool
twice the last-level cache (:func:`cold_pool_bytes`), call after call and entry after entry, so that a place
is read again only after the whole pool has been.
"""

from __future__ import annotations

import functools
import os
import re

import torch

COLD_POOL_DEFAULT = 64 * 2**20  # the pool where the kernel lists no cache size
_POOLS: dict = {}  # dtype -> the pool, made once a process and kept
_CURSOR: dict = {}  # dtype -> where the last calls' operands ended


def last_level_cache_bytes(base: str = "/sys/devices/system/cpu/cpu0/cache") -> int | None:
    """The largest CPU cache the kernel lists for cpu0 (`base`), or None where it lists none; a size that
    does not read as one (``32768K``) is passed over."""
    sizes = []
    try:
        names = [n for n in os.listdir(base) if n.startswith("index")]
    except OSError:
        return None
    for name in names:
        try:
            with open(os.path.join(base, name, "size")) as fh:
                text = fh.read(64).strip()
        except (OSError, UnicodeDecodeError):
            continue
        m = re.fullmatch(r"(\d{1,9})([KMG]?)", text)
        if m:
            sizes.append(int(m[1]) * {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}[m[2]])
    return max(sizes) if sizes and max(sizes) > 0 else None


def cold_pool_bytes() -> int:
    """Twice the last-level cache (:data:`COLD_POOL_DEFAULT` where the kernel lists none): an operand comes
    back to a call only after as much other data has been read as the cache holds twice over."""
    cache = last_level_cache_bytes()
    return 2 * cache if cache else COLD_POOL_DEFAULT


def _pool(dtype: torch.dtype) -> torch.Tensor:
    """One buffer of :func:`cold_pool_bytes` per dtype, floats in [0.5, 1.5) as the op rates' tensors."""
    pool = _POOLS.get(dtype)
    if pool is None:
        pool = _POOLS[dtype] = torch.rand(cold_pool_bytes() // dtype.itemsize, dtype=dtype).add_(0.5)
    return pool


def span_elements(shape, stride) -> int:
    """Elements from a tensor's first to its last, as laid out by its strides (0 for an empty one)."""
    return 1 + sum((n - 1) * s for n, s in zip(shape, stride)) if all(shape) else 0


def cold_operand_calls(func, args: tuple, kwargs: dict, calls: int) -> list | None:
    """`calls` calls of `func` (as many as the pool holds sets of operands, where that is fewer), each with
    `args`' first tensor of two dimensions or more as given and its other tensors at the next places of the
    pool, laid out as given.  None where there is nothing to move (no other float tensor, tensors of two
    dtypes, or too large for two sets to fit the pool: those come from memory however they are timed)."""
    tensors = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
    first = next((i for i in tensors if args[i].dim() >= 2), None)
    cold = [i for i in tensors if i != first]
    dtypes = {args[i].dtype for i in cold}
    if not cold or len(dtypes) != 1 or not args[cold[0]].dtype.is_floating_point:
        return None
    pool = _pool(args[cold[0]].dtype)
    spans = [span_elements(args[i].shape, args[i].stride()) for i in cold]
    per_call = max(sum(spans), 1)
    if pool.numel() // per_call < 2:
        return None
    sets = min(pool.numel() // per_call, max(calls, 1))
    offset = _CURSOR.get(pool.dtype, 0)
    if offset + sets * per_call > pool.numel():
        offset = 0
    _CURSOR[pool.dtype] = offset + sets * per_call
    moved = {}
    for i, span in zip(cold, spans):
        moved[i] = pool.as_strided((sets, *args[i].shape), (per_call, *args[i].stride()), offset).unbind(0)
        offset += span
    return [functools.partial(func, *(moved[i][j] if i in moved else a for i, a in enumerate(args)), **kwargs)
            for j in range(sets)]
