"""The ``[train]`` table and the setup axes of a suite: precision × loop × LoRA rank × sharding × optimizer
become the :class:`~ckptbench.point.setup.Setup` of each point, every wrong value a :class:`SuiteError`
naming its key."""

from __future__ import annotations

import itertools
from dataclasses import fields, replace

from ..point.setup import LOOPS, LORA_QUANTIZE, OPTIMIZERS, PRECISIONS, SHARDINGS, Lora, Setup
from ..point.training import Timing, TrainSpec
from .keys import LIMITS, _Checker, _is, compute_dtype

LORA_KEYS = {"r": int, "alpha": (int, float), "dropout": (int, float), "targets": list, "quantize": str}


def train_spec(ck: _Checker, table: dict, timeout_s: float = 300.0) -> TrainSpec:
    """The ``[train]`` settings every point shares; its setup keys are read by :func:`setups`."""
    for key in ("warmup_steps", "steps", "memory_steps", "threads", "max_steps", "max_time_s", "lr", "seed"):
        if key in table:
            ck.positive(f"train.{key}", table[key], allow_zero=key == "seed")
            if key in LIMITS:
                ck.at_most(f"train.{key}", table[key], *LIMITS[key])
    known = {f.name for f in fields(TrainSpec)}
    train = TrainSpec(**{k: v for k, v in table.items() if k in known})
    return replace(train, timing=_timing(ck, table, train.steps, timeout_s))


def _timing(ck: _Checker, table: dict, steps: int, timeout_s: float) -> Timing:
    """``time_precision``, ``max_steps`` and ``max_time_s``: how long the timed steps go on."""
    precision = table.get("time_precision", Timing.precision)
    ck.positive("train.time_precision", precision)
    if precision >= 1:
        ck.fail("train.time_precision", f"must be below 1 (a relative half-width: 0.02 is ±2 %), got {precision!r}")
    if table.get("max_steps", steps) < steps:
        ck.fail("train.max_steps", f"must be >= train.steps ({steps}), the fewest timed steps; got {table['max_steps']!r}")
    max_time = table.get("max_time_s", Timing.max_time_s)
    if "max_time_s" in table and max_time >= timeout_s:
        ck.fail("train.max_time_s", f"must be below suite.timeout_s ({timeout_s:g}), or every point that reaches "
                f"it times out; got {max_time!r}")
    return Timing(precision=float(precision), max_steps=table.get("max_steps", Timing.max_steps),
                  max_time_s=float(max_time))


def _lora(ck: _Checker, table: dict) -> Lora:
    """``[train] lora = { r = 8, alpha = 16, dropout = 0.0, targets = [...], quantize = "nf4" }``."""
    for key, value in table.items():
        if key not in LORA_KEYS:
            ck.fail(f"train.lora.{key}", f"unknown key; allowed: {', '.join(LORA_KEYS)}")
        if not _is(value, LORA_KEYS[key]):
            kind = {"targets": "a list", "quantize": "a string", "r": "an integer"}.get(key, "a number")
            ck.fail(f"train.lora.{key}", f"must be {kind}, got {value!r}")
    if "r" in table:
        ck.positive("train.lora.r", table["r"])
    if "alpha" in table:
        ck.positive("train.lora.alpha", table["alpha"])
    if not 0 <= table.get("dropout", 0.0) < 1:
        ck.fail("train.lora.dropout", f"must be in [0, 1), got {table['dropout']!r}")
    targets = table.get("targets", [])
    if not all(isinstance(t, str) and t for t in targets):
        ck.fail("train.lora.targets", f"must be module names (strings), got {targets!r}")
    if len(set(targets)) != len(targets):
        ck.fail("train.lora.targets", f"names a module twice: {targets!r}")
    if table.get("quantize", "") not in LORA_QUANTIZE:
        ck.fail("train.lora.quantize", f"unknown quantization {table['quantize']!r}; known: \"\" (none), nf4")
    alpha = table.get("alpha", 16)
    return Lora(r=table.get("r", 8), alpha=int(alpha) if float(alpha).is_integer() else alpha,
                dropout=float(table.get("dropout", 0.0)), targets=tuple(targets), quantize=table.get("quantize", ""))


def _choices(ck: _Checker, axes: dict, table: dict, key: str, known: tuple, default: str) -> list:
    values = axes[key] or [table.get(key, default)]
    for v in values:
        if v not in known:
            where = f"sweep.{key}" if axes[key] else f"train.{key}"
            ck.fail(where, f"unknown {key} {v!r}; known: {', '.join(known)}")
    return values


def setups(ck: _Checker, axes: dict, table: dict, device: str, attn: str) -> list[tuple[str, Setup]]:
    """(parameter dtype, Setup) for each precision × loop × LoRA rank × sharding × optimizer, checked
    against what the libraries run.  ``axes`` holds the sweep's lists (empty: the ``[train]`` value)."""
    if "lora" in table and not isinstance(table["lora"], dict):
        ck.fail("train.lora", f"must be a table ({{ r = 8, alpha = 16 }}), got {table['lora']!r}")
    lora = _lora(ck, table["lora"]) if "lora" in table else None
    ranks = axes["lora_r"] or [lora.r if lora else 0]
    loops = _choices(ck, axes, table, "loop", LOOPS, "manual")
    shardings = _choices(ck, axes, table, "sharding", SHARDINGS, "ddp")
    optimizers = _choices(ck, axes, table, "optimizer", OPTIMIZERS, "adamw")
    out = []
    for p in axes["precision"]:
        dtype, autocast = PRECISIONS[p]
        if device == "cuda" and attn == "sdpa" and compute_dtype(p) == "fp32":
            # torch's fused CUDA kernels (flash, memory-efficient, cuDNN) that the estimate models do not all
            # take fp32 with grouped-query attention; its math fallback keeps the a·s² probabilities
            ck.fail("model.attn", "sdpa in fp32 on CUDA may fall back to the math kernel, which keeps the "
                    "s² probabilities the estimate does not model; use precision bf16-mixed (or bf16, fp16), "
                    "or attn eager")
        for loop, r, shard, opt in itertools.product(loops, ranks, shardings, optimizers):
            adapters = None if r == 0 else replace(lora or Lora(), r=r)
            out.append((dtype, Setup(autocast=autocast, loop=loop, lora=adapters, sharding=shard, optimizer=opt)))
    return out
