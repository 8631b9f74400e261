"""Typed, torch-free descriptions of what a sweep point is.

These dataclasses are the boundary between the suite file, the worker, the estimate and the results:
everything downstream receives a :class:`Case` and nothing else, so a Case must carry every setting
that can change a measurement.  Nothing here imports torch, so the estimate and the suite validator
stay importable (and fast) without it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, fields

FAMILIES = ("llama", "qwen2", "gpt2")
DTYPES = {"fp32": 4, "bf16": 2, "fp16": 2}
ATTENTIONS = ("eager", "sdpa")
DEVICES = ("cpu", "cuda")
SYNC_IMPLS = ("accelerate", "torch-averager")


@dataclass(frozen=True)
class ModelSpec:
    """Dimensions of a decoder-only transformer, enough to build it from a config or to estimate it."""

    family: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    dtype: str = "fp32"
    attn: str = "eager"
    max_positions: int = 2048
    tie_embeddings: bool = False
    name: str = ""

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def bytes_per_element(self) -> int:
        return DTYPES[self.dtype]

    @property
    def label(self) -> str:
        return self.name or f"{self.family}-h{self.hidden}-l{self.layers}"


# Shapes of public checkpoints (config.json values) plus tiny ones for CPU runs and tests.
# Only the dimensions matter: weights are random, nothing is downloaded.
PRESETS: dict[str, dict] = {
    "llama-tiny": dict(family="llama", hidden=64, layers=4, heads=4, kv_heads=2, intermediate=128,
                       vocab=256, max_positions=1024),
    "llama-small": dict(family="llama", hidden=256, layers=4, heads=8, kv_heads=4, intermediate=688,
                        vocab=1024, max_positions=2048),
    "llama-1b": dict(family="llama", hidden=2048, layers=16, heads=32, kv_heads=8, intermediate=8192,
                     vocab=128256, max_positions=131072, tie_embeddings=True),
    "llama-8b": dict(family="llama", hidden=4096, layers=32, heads=32, kv_heads=8, intermediate=14336,
                     vocab=128256, max_positions=131072),
    "qwen2-tiny": dict(family="qwen2", hidden=64, layers=4, heads=4, kv_heads=2, intermediate=128,
                       vocab=256, max_positions=1024),
    "qwen2-0.5b": dict(family="qwen2", hidden=896, layers=24, heads=14, kv_heads=2, intermediate=4864,
                       vocab=151936, max_positions=32768, tie_embeddings=True),
    "gpt2-tiny": dict(family="gpt2", hidden=64, layers=4, heads=4, kv_heads=4, intermediate=256,
                      vocab=256, max_positions=1024),
    "gpt2": dict(family="gpt2", hidden=768, layers=12, heads=12, kv_heads=12, intermediate=3072,
                 vocab=50257, max_positions=1024, tie_embeddings=True),
}


def preset(name: str, **overrides) -> ModelSpec:
    """A ModelSpec from a preset name, with any field overridden (dtype, attn, ...)."""
    if name not in PRESETS:
        raise KeyError(f"unknown model preset {name!r}; known: {', '.join(sorted(PRESETS))}")
    values = {**PRESETS[name], "name": name, **overrides}
    return ModelSpec(**values)


def checkpointing_name(every_n_layers: int, offload: bool) -> str:
    """Short name of a checkpointing setting: none, full, every-2, full+offload ..."""
    name = "none" if every_n_layers == 0 else "full" if every_n_layers == 1 else f"every-{every_n_layers}"
    return name + ("+offload" if offload else "")


def checkpointed_layers(layers: int, every_n_layers: int) -> list[int]:
    """What ``every_n_layers`` means in transformers: layer i is checkpointed when i % n == 0; 0 is off.

    The one statement of that rule here: the estimate, the FLOP count and a Case all ask this function.
    """
    if every_n_layers <= 0:
        return []
    return [i for i in range(layers) if i % every_n_layers == 0]


@dataclass(frozen=True)
class TrainSpec:
    """Fixed training settings of a suite: identical for every point so points are comparable."""

    optimizer: str = "adamw"
    lr: float = 1e-4
    warmup_steps: int = 1
    steps: int = 3
    memory_steps: int = 1
    seed: int = 0
    threads: int = 1


@dataclass(frozen=True)
class Case:
    """One sweep point.  Its id is a hash of every field, so a changed setting is a new point."""

    model: ModelSpec
    train: TrainSpec
    batch_size: int
    seq_len: int
    every_n_layers: int = 0
    offload: bool = False
    local_sgd_steps: int = 0
    grad_accum: int = 1
    world_size: int = 1
    device: str = "cpu"
    sync_impl: str = "accelerate"  # local SGD averaging: accelerate's LocalSGD or torch's model averager

    @property
    def id(self) -> str:
        canonical = json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))
        return hashlib.sha1(canonical.encode()).hexdigest()[:12]

    @property
    def strategy(self) -> str:
        """Short human name of the setting: none, full, every-2, full+offload, none+ddp2, full+K4 ..."""
        name = checkpointing_name(self.every_n_layers, self.offload)
        if self.world_size > 1:
            name += f"+ddp{self.world_size}" if self.local_sgd_steps == 0 else f"+K{self.local_sgd_steps}"
            name += "-avg" if self.local_sgd_steps and self.sync_impl == "torch-averager" else ""
        return name

    @property
    def checkpointed_layers(self) -> list[int]:
        """The layers this point's setting asks transformers to checkpoint (:func:`checkpointed_layers`)."""
        return checkpointed_layers(self.model.layers, self.every_n_layers)

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.seq_len * self.grad_accum * self.world_size

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> Case:
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        values["model"] = ModelSpec(**data["model"])
        values["train"] = TrainSpec(**data["train"])
        return cls(**values)


@dataclass(frozen=True)
class Suite:
    """A parsed suite file: where it came from, the harness policy, and the expanded points."""

    name: str
    path: str
    cases: tuple[Case, ...]
    timeout_s: float = 300.0
    memory_budget_bytes: int | None = None
    budgets_gib: tuple[float, ...] = ()
    repeats: int = 1  # each Case runs this many times, in fresh workers, interleaved across Cases
    text: str = ""
