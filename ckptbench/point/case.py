"""Typed, torch-free descriptions of what a sweep point is.

These dataclasses are the boundary between the suite file, the worker, the estimate and the results:
everything downstream receives a :class:`Case` and nothing else, so a Case must carry every setting
that can change a measurement.  Nothing here imports torch, so the estimate and the suite validator
stay importable (and fast) without it.
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import asdict, dataclass, field, fields, replace

from .setup import Setup, precision_name
from .strategy import Recompute, checkpointed_layers, checkpointing_name
from .training import TrainSpec

FAMILIES = ("llama", "qwen2", "gpt2")  # the model types with an analytic estimate; any other runs, simulated
# Config keys that change no tensor the estimate counts (no parameter, no saved activation): a config of an
# analytic family that sets only these (and its dimensions) is still estimated analytically.  Dropout keys
# are here because the analytic estimate is only asked when dropout is off (see DROPOUT_DEFAULTS).
SHAPE_NEUTRAL_KEYS = frozenset({
    "rope_theta", "rope_scaling", "rope_parameters", "rms_norm_eps", "layer_norm_epsilon", "initializer_range",
    "bos_token_id", "eos_token_id", "pad_token_id", "torch_dtype", "dtype", "architectures", "transformers_version",
    "pretraining_tp", "attention_dropout", "resid_pdrop", "embd_pdrop", "attn_pdrop", "use_cache", "model_type",
    "tie_word_embeddings", "use_sliding_window", "sliding_window", "max_window_layers", "layer_types", "bos_token",
    "eos_token",
})
# Keys that change parameters or saved activations, neutral only at the value the analytic estimate models
# (the config class's default; tests/unit/test_model_configs.py asks transformers): a llama with biases or
# a gelu MLP is another model, estimated by its simulation.
ANALYTIC_DEFAULTS: dict[str, dict] = {
    "llama": {"hidden_act": "silu", "attention_bias": False, "mlp_bias": False},
    "qwen2": {"hidden_act": "silu"},
    "gpt2": {"activation_function": "gelu_new"},
}
# The dropout probabilities each analytic family's config class publishes (tests/unit/test_model_configs.py
# asks transformers).  A model keeps them with ``dropout = "published"``; ``"off"`` (the default, what every
# run did before there was a choice) sets every dropout key to 0.  The analytic estimate models no dropout
# mask, so a model that runs with dropout is estimated by its simulation, which saves the masks the real
# step saves.
DROPOUT_DEFAULTS: dict[str, dict] = {
    "llama": {"attention_dropout": 0.0},
    "qwen2": {"attention_dropout": 0.0},
    "gpt2": {"attn_pdrop": 0.1, "embd_pdrop": 0.1, "resid_pdrop": 0.1, "summary_first_dropout": 0.1},
}
DROPOUTS = ("off", "published")
DTYPES = {"fp32": 4, "bf16": 2, "fp16": 2}
ATTENTIONS = ("eager", "sdpa")
DEVICES = ("cpu", "cuda")
SYNC_IMPLS = ("accelerate", "torch-averager")
DATA_SOURCES = ("random", "stdlib", "file", "dataset")
BYTE_VOCAB = 256  # text sources are byte-level: token id = byte value, no special tokens


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
    # any other config.json keys of the model type (sorted JSON, so the spec stays hashable): rope, sliding
    # windows, experts, head_dim ...; passed to AutoConfig.for_model as they are
    config: str = ""
    # "off": every dropout key of the config set to 0 (runs repeat, the analytic estimate applies);
    # "published": the config's own probabilities, as the user's config or the model type's defaults give them
    dropout: str = "off"

    @property
    def config_extra(self) -> dict:
        return json.loads(self.config) if self.config else {}

    @property
    def analytic(self) -> bool:
        """Whether the analytic estimate describes this model (else the simulation is its estimate)."""
        if self.family not in FAMILIES or any(self.published_dropout.values()):
            return False
        extra = self.config_extra
        if extra.get("head_dim") not in (None, self.hidden // self.heads):  # llama and qwen2 read it
            return False
        modelled = ANALYTIC_DEFAULTS[self.family]
        return all(key in SHAPE_NEUTRAL_KEYS or (key in modelled and value == modelled[key])
                   for key, value in extra.items() if key != "head_dim")

    @property
    def published_dropout(self) -> dict[str, float]:
        """The dropout probabilities an analytic family's model runs with: the config's (its extra keys over
        the class defaults) when dropout is "published", none when it is "off".  Other families: {}."""
        if self.dropout == "off" or self.family not in DROPOUT_DEFAULTS:
            return {}
        extra = self.config_extra
        return {key: extra.get(key, value) for key, value in DROPOUT_DEFAULTS[self.family].items()}

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
    # Families without an analytic estimate (the simulation of the same step is theirs): family is the
    # config's model_type, and `config` holds the config.json keys beyond the dimensions.
    "llama-70b": dict(family="llama", hidden=8192, layers=80, heads=64, kv_heads=8, intermediate=28672,
                      vocab=128256, max_positions=131072),
    "smollm2-135m": dict(family="llama", hidden=576, layers=30, heads=9, kv_heads=3, intermediate=1536,
                         vocab=49152, max_positions=8192, tie_embeddings=True),
    "smollm2-1.7b": dict(family="llama", hidden=2048, layers=24, heads=32, kv_heads=32, intermediate=8192,
                         vocab=49152, max_positions=8192, tie_embeddings=True),
    "qwen2.5-0.5b": dict(family="qwen2", hidden=896, layers=24, heads=14, kv_heads=2, intermediate=4864,
                         vocab=151936, max_positions=32768, tie_embeddings=True),  # Qwen2-0.5B's shape too
    "qwen2.5-7b": dict(family="qwen2", hidden=3584, layers=28, heads=28, kv_heads=4, intermediate=18944,
                       vocab=152064, max_positions=32768),
    "mistral-7b": dict(family="mistral", hidden=4096, layers=32, heads=32, kv_heads=8, intermediate=14336,
                       vocab=32000, max_positions=32768, config={"sliding_window": 4096}),
    "mixtral-8x7b": dict(family="mixtral", hidden=4096, layers=32, heads=32, kv_heads=8, intermediate=14336,
                         vocab=32000, max_positions=32768,
                         config={"num_local_experts": 8, "num_experts_per_tok": 2, "rope_theta": 1e6}),
    "qwen3-8b": dict(family="qwen3", hidden=4096, layers=36, heads=32, kv_heads=8, intermediate=12288,
                     vocab=151936, max_positions=40960, config={"head_dim": 128}),
    "gemma2-2b": dict(family="gemma2", hidden=2304, layers=26, heads=8, kv_heads=4, intermediate=9216,
                      vocab=256000, max_positions=8192, tie_embeddings=True,
                      config={"head_dim": 256, "query_pre_attn_scalar": 256, "sliding_window": 4096}),
    "gemma2-9b": dict(family="gemma2", hidden=3584, layers=42, heads=16, kv_heads=8, intermediate=14336,
                      vocab=256000, max_positions=8192, tie_embeddings=True,
                      config={"head_dim": 256, "query_pre_attn_scalar": 256, "sliding_window": 4096}),
    "gemma3-1b": dict(family="gemma3_text", hidden=1152, layers=26, heads=4, kv_heads=1, intermediate=6912,
                      vocab=262144, max_positions=32768, tie_embeddings=True,
                      config={"head_dim": 256, "sliding_window": 512}),
    "phi3-mini": dict(family="phi3", hidden=3072, layers=32, heads=32, kv_heads=32, intermediate=8192,
                      vocab=32064, max_positions=4096),
    "phi4-mini": dict(family="phi3", hidden=3072, layers=32, heads=24, kv_heads=8, intermediate=8192,
                      vocab=200064, max_positions=131072, tie_embeddings=True, config={"partial_rotary_factor": 0.75}),
    "olmo2-1b": dict(family="olmo2", hidden=2048, layers=16, heads=16, kv_heads=16, intermediate=8192,
                     vocab=100352, max_positions=4096),
    "pythia-160m": dict(family="gpt_neox", hidden=768, layers=12, heads=12, kv_heads=12, intermediate=3072,
                        vocab=50304, max_positions=2048, config={"rotary_pct": 0.25, "use_parallel_residual": True}),
}


def preset(name: str, **overrides) -> ModelSpec:
    """A ModelSpec from a preset name, with any field overridden (dtype, attn, ...)."""
    if name not in PRESETS:
        raise KeyError(f"unknown model preset {name!r}; known: {', '.join(sorted(PRESETS))}")
    values = {**PRESETS[name], "name": name, **overrides}
    if isinstance(values.get("config"), dict):
        values["config"] = canonical_config(values["config"])
    return ModelSpec(**values)


def canonical_config(extra: dict) -> str:
    """The extra config keys as the sorted JSON a ModelSpec holds ("" when there are none)."""
    return json.dumps(extra, sort_keys=True, separators=(",", ":")) if extra else ""


# (autocast, families) the analytic estimate has mixed-precision terms for, under the manual loop on a CPU
# (tests/unit/test_mixed_estimate.py holds them to the simulated step byte for byte)
ANALYTIC_MIXED = {"bf16": ("llama", "qwen2")}
# the optimizers whose state and step temporaries the analytic estimate derives (theory/memory/params.py
# optimizer_step_bytes); Adafactor and 8-bit AdamW are estimated by the simulation of their step
ANALYTIC_OPTIMIZERS = ("adamw", "adamw-loop", "adamw-foreach", "sgd")


def analytic_point(model: ModelSpec, setup: Setup, device: str = "cpu") -> bool:
    """Whether the analytic estimate describes a model trained so: a model it describes
    (:attr:`ModelSpec.analytic`) under the manual loop, with an optimizer of
    :data:`ANALYTIC_OPTIMIZERS` (whose state and step temporaries it derives; Adafactor's and 8-bit
    AdamW's are estimated by their simulation), in a pure precision, or in bf16-mixed for the families of
    :data:`ANALYTIC_MIXED` on a CPU."""
    return not not_analytic_because(model, setup, device)


def not_analytic_because(model: ModelSpec, setup: Setup, device: str = "cpu") -> str:
    """Why the analytic estimate does not describe this point ("" when it does: :func:`analytic_point`)."""
    if not model.analytic:
        return (f"model_type {model.family!r} has no analytic estimate" if model.family not in FAMILIES else
                "its config sets keys the analytic estimate does not model (or dropout is on)")
    if setup.loop != "manual":
        return f"the analytic estimate is of the manual loop, this is the {setup.loop} loop"
    if setup.lora:
        return "LoRA points are estimated by the simulation of the peft-wrapped step"
    if setup.optimizer not in ANALYTIC_OPTIMIZERS:
        return f"the analytic estimate has no terms for {setup.optimizer}'s state and step"
    if setup.sharding != "ddp":
        return "a sharded point's per-rank figures come from theory/comm/fsdp.py"
    if setup.autocast and not (device == "cpu" and model.dtype == "fp32"
                               and model.family in ANALYTIC_MIXED.get(setup.autocast, ())):
        return (f"the analytic estimate covers {setup.autocast}-mixed for "
                f"{', '.join(ANALYTIC_MIXED.get(setup.autocast, ())) or 'no family'} on a CPU only")
    return ""


def analytic_sharded_point(model: ModelSpec, setup: Setup, device: str = "cpu") -> bool:
    """Whether the per-rank FSDP2 estimate (:func:`ckptbench.theory.comm.fsdp.fsdp_memory_estimate`) describes a
    model trained so: the analytic estimate of its compute precision describes it unsharded.  bf16-mixed
    under FSDP2 (``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`` over fp32 weights) computes
    over bf16 parameters without autocast, so its compute is a pure-bf16 model's, on any device.  The
    per-rank composition counts AdamW's state (two moments of each shard), so the optimizer is an AdamW."""
    if not setup.optimizer.startswith("adamw") or setup.optimizer == "adamw-8bit":
        return False
    if setup.autocast:
        if setup.autocast != "bf16" or model.dtype != "fp32":
            return False
        model, setup = replace(model, dtype="bf16"), replace(setup, autocast="")
    return analytic_point(model, replace(setup, sharding="ddp"), device)


@dataclass(frozen=True)
class DataSpec:
    """What the ranks train on, and how the held-out loss is taken.

    ``random`` (the default) is seeded uniform token ids: right for memory and speed, where only shapes
    matter, but nothing can be learnt from it.  The text sources (``stdlib``: the Python standard
    library's ``.py`` files; ``file``: a text file; ``dataset``: a Hugging Face ``datasets`` cache entry)
    are byte-level, one token per byte, so any model with ``vocab >= 256`` trains on them without a
    tokenizer; :mod:`ckptbench.sources.corpus` reads and splits them, and each rank trains on its own shard.
    """

    source: str = "random"
    path: str = ""  # file: the text file, as an absolute path
    name: str = ""  # dataset: its name in the datasets cache ("org/name")
    config: str = ""  # dataset: the configuration ("" = the one cached)
    split: str = "train"  # dataset: the split read
    column: str = "text"  # dataset: the column holding the text
    eval_every: int = 0  # text sources: optimizer steps between held-out evaluations (0 = at the end only)
    eval_batches: int = 4  # text sources: held-out batches per evaluation, shared out over the ranks


@functools.cache
def _field_names(cls) -> frozenset[str]:
    return frozenset(f.name for f in fields(cls))


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
    data: DataSpec = DataSpec()
    setup: Setup = Setup()
    recompute: Recompute = Recompute()  # a layer set instead of every_n_layers, a SAC policy, the offload kind

    @property
    def id(self) -> str:
        fields_ = asdict(self)
        fields_["setup"] = self.setup.id_fields()
        fields_["train"] = self.train.id_fields()  # the timing only when not its default
        if self.setup == Setup():
            del fields_["setup"]  # pure-dtype points of the manual loop keep the ids they had before
        # the optimizer was a fixed TrainSpec field ("adamw") before it became a choice in the setup
        fields_["train"]["optimizer"] = "adamw"
        if not fields_["model"]["config"]:
            del fields_["model"]["config"]  # points of the three built-in families keep their ids
        if fields_["model"]["dropout"] == "off":
            del fields_["model"]["dropout"]  # dropout was always off before it was a choice
        if self.data == DataSpec():
            del fields_["data"]  # points on random tokens keep the ids they had before data had a choice
        if self.recompute == Recompute():
            del fields_["recompute"]  # every_n_layers alone: the ids points had before layer sets and SAC
        else:
            fields_["recompute"] = self.recompute.to_dict()  # defaults left out: the ids points had before each field
        canonical = json.dumps(fields_, sort_keys=True, separators=(",", ":"))
        return hashlib.sha1(canonical.encode()).hexdigest()[:12]

    @property
    def strategy(self) -> str:
        """Short human name of the setting: none, full, every-2, full+offload, none+ddp2, full+K4 ..."""
        name = checkpointing_name(self.every_n_layers, self.offload, self.recompute)
        if self.world_size > 1:
            shard = self.setup.sharding
            name += f"+{shard}{self.world_size}" if self.local_sgd_steps == 0 else f"+K{self.local_sgd_steps}"
            name += "-avg" if self.local_sgd_steps and self.sync_impl == "torch-averager" else ""
        return name + (f"+{self.setup.label}" if self.setup.label else "")

    @property
    def precision(self) -> str:
        """fp32 | bf16 | fp16 (pure) | bf16-mixed | fp16-mixed (autocast over fp32 master weights)."""
        return precision_name(self.model.dtype, self.setup.autocast)

    @property
    def compute_dtype(self) -> str:
        """The dtype the matmuls run in: the autocast dtype of a mixed precision, else the parameters'."""
        return self.setup.autocast or self.model.dtype

    @property
    def analytic(self) -> bool:
        """Whether the analytic estimate describes this point (:func:`analytic_point`; a SAC policy's kept
        operators are not modelled).  Every other point is predicted by the simulation of its step."""
        return analytic_point(self.model, self.setup, self.device) and not self.recompute.sac and not self.compiled

    @property
    def compiled(self) -> bool:
        """Whether the point runs the model through ``torch.compile`` (a compile budget is set)."""
        return self.recompute.compile_budget is not None

    @property
    def checkpointed_layers(self) -> list[int]:
        """The layers this point's setting checkpoints: its layer set, else transformers' ``every_n_layers``
        rule (:func:`checkpointed_layers`)."""
        return list(self.recompute.layers) or checkpointed_layers(self.model.layers, self.every_n_layers)

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.seq_len * self.grad_accum * self.world_size

    def to_dict(self) -> dict:
        out = asdict(self)
        out["recompute"] = self.recompute.to_dict()
        return out

    @classmethod
    def from_dict(cls, data: dict) -> Case:
        known = _field_names(cls)
        values = {k: v for k, v in data.items() if k in known}
        values["model"] = ModelSpec(**data["model"])
        values["train"] = TrainSpec.from_dict(data["train"])
        values["data"] = DataSpec(**data["data"]) if data.get("data") else DataSpec()
        values["setup"] = Setup.from_dict(data["setup"]) if data.get("setup") else Setup()
        values["recompute"] = Recompute.from_dict(data["recompute"]) if data.get("recompute") else Recompute()
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
    attn_note: str = ""  # when the suite names no attention: the one transformers' default gives, and why
    slurm: dict = field(default_factory=dict)  # the [slurm] table: how --launcher slurm asks for each job
