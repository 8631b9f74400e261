"""The keys a suite file may hold, their types, and the checker that turns a wrong one into a
:class:`SuiteError` naming the file, the key and the reason (one line for the CLI, exit status 2)."""

from __future__ import annotations

import math

from ..point.setup import PRECISIONS

# A suite's axes may cross to more points than a sweep runs without --yes (cli/sweep.py's MAX_POINTS), but
# not to more than this: each point is a Case in memory before anything runs.
MAX_CROSSED = 1_000_000  # about 630 B a Case: 0.6 GB at most
MAX_LAYERS = 10_000  # the deepest trained models have about 120; a typo's 100,000 would only hang


class SuiteError(Exception):
    """A suite that cannot run: says which file, which key, and why."""

    def __init__(self, path: str, key: str, reason: str):
        self.path, self.key, self.reason = path, key, reason
        super().__init__(f"{path}: {key}: {reason}")


SUITE_KEYS = {"name": str, "description": str, "timeout_s": (int, float), "memory_budget_gib": (int, float),
              "budgets_gib": list, "device": str, "repeats": int}
MODEL_DIMS = ("hidden", "layers", "heads", "kv_heads", "intermediate", "vocab", "max_positions")
MODEL_KEYS = {"preset": str, "family": str, "model_type": str, "config": str, "hub": str, "extra": dict,
              "dtype": str, "precision": str, "attn": str, "label": str, "tie_embeddings": bool, "dropout": str,
              **dict.fromkeys(MODEL_DIMS, int)}
MODEL_SOURCES = ("preset", "config", "hub", "model_type", "family")
# train key -> (the largest value a run can use, why), checked by _Checker.at_most
LIMITS = {"seed": (2**32 - 1, "what numpy's and the Trainer's seeding accept"),
          "threads": (1024, "threads for one process"),
          **dict.fromkeys(("warmup_steps", "steps", "memory_steps", "max_steps"), (100_000, "steps"))}
TRAIN_KEYS = {"optimizer": str, "lr": (int, float), "warmup_steps": int, "steps": int,
              "memory_steps": int, "seed": int, "threads": int, "loop": str, "lora": dict,
              "sharding": str, "time_precision": (int, float), "max_steps": int, "max_time_s": (int, float)}
AXES = {"seed": int, "precision": str, "loop": str, "lora_r": int, "sharding": str, "optimizer": str,
        "batch_size": int, "seq_len": int, "every_n_layers": int, "checkpoint_layers": list, "sac": str,
        "compile_budget": (int, float), "offload": bool, "local_sgd_steps": int, "grad_accum": int, "world_size": int, "sync_impl": str}
# seed: [train.seed]; precision: [model.precision] (or model.dtype); loop, sharding, optimizer: [train.*];
# lora_r: [train.lora].r (0: no adapters, full fine-tuning)
SETUP_AXES = ("precision", "loop", "lora_r", "sharding", "optimizer")
# every_n_layers and checkpoint_layers (layer sets) are one axis, crossed with sac (strategy.py)
STRATEGY_AXES = ("every_n_layers", "checkpoint_layers", "sac", "compile_budget")
AXIS_DEFAULTS = {"every_n_layers": [0], "checkpoint_layers": [], "sac": ["off"], "compile_budget": [], "offload": [False], "local_sgd_steps": [0], "grad_accum": [1],
                 "world_size": [1], "sync_impl": ["accelerate"], "seed": [], **dict.fromkeys(SETUP_AXES, [])}
DATA_KEYS = {"source": str, "path": str, "name": str, "config": str, "split": str, "column": str,
             "eval_every": int, "eval_batches": int}
# [slurm]: how `sweep --launcher slurm` asks for each job; flags of the same name override it.
SLURM_KEYS = {"partition": str, "account": str, "qos": str, "constraint": str, "time_min": (int, float),
              "gpus_per_task": int, "cpus_per_task": int, "mem_gib": (int, float), "jobs": int,
              "array_parallelism": int, "setup": list}
TABLES = {"suite": SUITE_KEYS, "model": MODEL_KEYS, "train": TRAIN_KEYS, "sweep": AXES, "data": DATA_KEYS,
          "slurm": SLURM_KEYS}


def _type_name(t) -> str:
    if isinstance(t, tuple):
        return "number"
    return {int: "integer", str: "string", bool: "boolean", list: "array", float: "number", dict: "a table"}[t]


def _is(value, t) -> bool:
    if isinstance(value, bool) and t is not bool and not (isinstance(t, tuple) and bool in t):
        return False  # TOML booleans are not numbers here
    return isinstance(value, t)


class _Checker:
    def __init__(self, path: str):
        self.path = path

    def fail(self, key: str, reason: str):
        raise SuiteError(self.path, key, reason)

    def table(self, data: dict, name: str) -> dict:
        table = data.get(name, {})
        if not isinstance(table, dict):
            self.fail(name, f"must be a table ([{name}]), got {type(table).__name__}")
        allowed = TABLES[name]
        for key, value in table.items():
            if key not in allowed:
                self.fail(f"{name}.{key}", f"unknown key; allowed: {', '.join(sorted(allowed))}")
            if name != "sweep" and not _is(value, allowed[key]):
                self.fail(f"{name}.{key}", f"must be {_type_name(allowed[key])}, got {value!r}")
        return table

    def positive(self, key: str, value, allow_zero: bool = False):
        if isinstance(value, float) and not math.isfinite(value):
            self.fail(key, f"must be a finite number, got {value!r}")
        if value < 0 or (value == 0 and not allow_zero):
            self.fail(key, f"must be {'>= 0' if allow_zero else '> 0'}, got {value!r}")
        return value

    def at_most(self, key: str, value, limit: int, why: str):
        if value > limit:
            self.fail(key, f"must be at most {limit:,} ({why}), got {value!r}")
        return value

    def axis(self, sweep: dict, key: str) -> list:
        if key not in sweep:
            if key in AXIS_DEFAULTS:
                return list(AXIS_DEFAULTS[key])
            self.fail(f"sweep.{key}", "missing (a list of values to sweep)")
        values = sweep[key]
        values = values if isinstance(values, list) else [values]
        if not values:
            self.fail(f"sweep.{key}", "empty list: give at least one value")
        if key == "checkpoint_layers" and not any(isinstance(v, list) for v in values):
            self.fail(f"sweep.{key}", f"each value is a layer set, a list: write [{values!r}] for the one set "
                      f"{values!r}")
        for v in values:
            if not _is(v, AXES[key]) and not (key == "offload" and isinstance(v, str)):  # a kind: strategy.py
                self.fail(f"sweep.{key}", f"values must be {_type_name(AXES[key])}s, got {v!r}")
        seen: set = set()
        for v in values:  # one pass: a 40,000-value axis is checked as fast as a short one
            hashable = repr(v) if isinstance(v, list) else v
            if hashable in seen:
                self.fail(f"sweep.{key}", f"duplicate value {v!r}")
            seen.add(hashable)
        if AXES[key] is int:
            zero_ok = key in ("every_n_layers", "local_sgd_steps", "seed", "lora_r")
            for v in values:
                self.positive(f"sweep.{key}", v, allow_zero=zero_ok)
                if key == "seed":
                    self.at_most(f"sweep.{key}", v, *LIMITS["seed"])
        return values


def compute_dtype(precision: str) -> str:
    """The dtype a precision computes in: the autocast dtype of a mixed one, else the parameters'."""
    dtype, autocast = PRECISIONS[precision]
    return autocast or dtype
