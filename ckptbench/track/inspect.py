"""What a user's own run is, read from the objects it trains: the :class:`~ckptbench.point.case.Case` a sweep
would run for it, and what could not be told.

Read, never asked: the model's config and class (through peft's and Accelerate's wrappers), its dtype, its
attention implementation, dropout; whether checkpointing is on and how (each decoder block's flag, the
checkpoint function transformers installed: ``use_reentrant``, offload through ``save_on_cpu``, a
``context_fn``); peft's LoRA adapters; the optimizer's class and settings and its learning rate; batch and
sequence from the batch itself; the world size from ``torch.distributed``; the autocast a loop declares
(Trainer's ``bf16``/``fp16``, Accelerate's ``mixed_precision``).  Where a setting has no place in a Case
(an optimizer ckptbench does not know, reentrant checkpointing, a LoRA config beyond r/alpha/dropout/targets),
the Case gets the nearest value and :attr:`Seen.unknown` says what differs.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, replace

import torch

from ..measure.quiet import transformers_quiet
from ..point.case import PRESETS, Case, ModelSpec, canonical_config, preset
from ..point.setup import Lora, Setup
from ..point.strategy import Recompute, checkpointed_layers
from ..point.training import TrainSpec
from ..sources.configs import DIM_ALIASES, DROPPED, spec_values
from ..train.checkpointing import decoder_layers
from ..train.models import hf_config

DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
IGNORED_KEYS = {"_attn_implementation", "_attn_implementation_autoset", "output_attentions",
                "output_hidden_states", "return_dict", "_name_or_path", "pad_token_id", "bos_token_id",
                "eos_token_id"}


@dataclass
class Seen:
    """The Case of a user's run and what the objects said beyond it."""

    case: Case
    use_reentrant: bool | None = None  # None: checkpointing off
    checkpoint_kwargs: dict = field(default_factory=dict)
    frozen_embeddings: bool = False
    inputs_require_grad_hook: bool = False  # transformers' enable_input_require_grads is on
    unknown: list[str] = field(default_factory=list)  # one line per setting the Case could not say

    def facts(self) -> dict:
        """What the record's ``track`` section holds of them."""
        return {"use_reentrant": self.use_reentrant,
                "checkpoint_kwargs": {k: repr(v) if not isinstance(v, (bool, int, float, str)) else v
                                      for k, v in self.checkpoint_kwargs.items()},
                "frozen_embeddings": self.frozen_embeddings,
                "inputs_require_grad_hook": self.inputs_require_grad_hook, "unknown": list(self.unknown)}


def unwrapped(model: torch.nn.Module) -> torch.nn.Module:
    """The model inside DDP's (and Accelerate's DDP) wrapper: a transformers model, or peft's around one."""
    while isinstance(getattr(model, "module", None), torch.nn.Module):
        model = model.module
    return model


def base_model(model: torch.nn.Module) -> torch.nn.Module:
    """The transformers model inside DDP's wrapper and peft's ``PeftModel``."""
    model = unwrapped(model)
    get = getattr(model, "get_base_model", None)
    return get() if callable(get) else model


def causal_lm_refusal(model: torch.nn.Module) -> str:
    """Why the tracker cannot measure `model` ("" when it can): its estimate and simulation build the
    causal LM of the model's config, so anything else (a sequence classifier, an encoder, a module of the
    user's own) would be checked against another model's figures."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    inner = getattr(model, "_orig_mod", model)  # torch.compile's wrapper
    base = base_model(inner)
    name = type(base).__name__
    if name in set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values()):
        return ""
    kind = "a transformers model but not a causal LM" if hasattr(base, "config") else "not a transformers model"
    return (f"{name} is {kind}: ckptbench measures causal LMs (AutoModelForCausalLM's classes), whose "
            "estimate it can build from the config")


def model_spec(model: torch.nn.Module) -> ModelSpec:
    """The ModelSpec that builds `model`'s config: its dimensions, and only those other keys whose value
    differs from what the dimensions alone build (so a preset's model reads back as that preset)."""
    base = base_model(model)
    cfg = base.config
    user = cfg.to_dict()
    values = spec_values({k: v for k, v in user.items() if k not in IGNORED_KEYS})
    dtype = DTYPE_NAMES.get(next(base.parameters()).dtype, "fp32")
    attn = cfg._attn_implementation or "eager"
    dropout = "published" if any(isinstance(v, float) and v > 0 and ("dropout" in k or k.endswith("pdrop"))
                                 for k, v in user.items()) else "off"
    values.update(dtype=dtype, attn=attn, dropout=dropout, config="")
    bare = ModelSpec(**values)
    built = hf_config(bare).to_dict()
    extra = {k: v for k, v in user.items() if k not in DROPPED and k not in DIM_ALIASES and k not in IGNORED_KEYS
             and not k.startswith("_") and built.get(k, object()) != v}
    spec = ModelSpec(**{**values, "config": canonical_config(extra)})
    for name in PRESETS:  # a preset's shape is named as the sweep names it, so its Case id is the sweep's
        if preset(name, dtype=dtype, attn=attn, dropout=dropout) == replace(spec, name=name):
            return replace(spec, name=name)
    return spec


def checkpoint_setting(model: torch.nn.Module) -> tuple[list[int], bool, dict]:
    """(checkpointed block indices, offloaded, the kwargs transformers hands torch's checkpoint)."""
    layers = decoder_layers(model)
    on = [i for i, block in enumerate(layers) if getattr(block, "gradient_checkpointing", False)]
    if not on:
        return [], False, {}
    func = getattr(layers[on[0]], "_gradient_checkpointing_func", None)
    kwargs = dict(func.keywords) if isinstance(func, functools.partial) else {}
    inner = func.func if isinstance(func, functools.partial) else func
    offload = "save_on_cpu" in getattr(getattr(inner, "__code__", None), "co_names", ())
    return on, offload, kwargs


OPTIMIZER_NAMES = {("torch.optim", "AdamW", None): "adamw", ("torch.optim", "AdamW", True): "adamw-foreach",
                   ("torch.optim", "AdamW", False): "adamw-loop", ("torch.optim", "SGD", None): "sgd",
                   ("transformers.optimization", "Adafactor", None): "adafactor"}


def optimizer_setting(optimizer) -> tuple[str, float, str]:
    """(ckptbench's name of the optimizer, its learning rate, "" or why the name is only the nearest)."""
    inner = getattr(optimizer, "optimizer", optimizer)
    cls = type(inner)
    module = cls.__module__.rsplit(".", 1)[0] if cls.__module__.startswith("torch.optim") else cls.__module__
    module = "torch.optim" if module.startswith("torch.optim") else module
    foreach = inner.defaults.get("foreach") if cls.__name__ == "AdamW" else None
    fused = cls.__name__ == "AdamW" and bool(inner.defaults.get("fused"))
    name = "adamw-fused" if fused and module == "torch.optim" else OPTIMIZER_NAMES.get((module, cls.__name__, foreach))
    lr = float(inner.param_groups[0]["lr"]) if inner.param_groups else 0.0
    if cls.__name__ == "SGD" and inner.defaults.get("momentum") != 0.9:
        return "sgd", lr, f"SGD with momentum {inner.defaults.get('momentum')} (the Case says 0.9)"
    if name is None:
        return "adamw", lr, f"optimizer {cls.__module__}.{cls.__qualname__} is not one ckptbench names"
    return name, lr, ""


def lora_setting(model: torch.nn.Module) -> tuple[Lora | None, str]:
    config = getattr(model, "peft_config", {}).get("default") if hasattr(model, "peft_config") else None
    if config is None:
        return None, ""
    if type(config).__name__ != "LoraConfig":
        return None, f"peft adapter {type(config).__name__} is not LoRA: the Case says full fine-tuning"
    targets = config.target_modules
    return Lora(r=config.r, alpha=config.lora_alpha, dropout=config.lora_dropout,
                targets=tuple(sorted(targets)) if isinstance(targets, (set, list, tuple)) else ()), ""


def batch_shape(batch) -> tuple[int, int]:
    """(batch size, sequence length) of a batch: a token tensor, or a mapping or sequence holding one."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]), int(batch.shape[-1])
    if isinstance(batch, dict) or hasattr(batch, "keys"):
        tensor = batch.get("input_ids", next((v for v in batch.values() if isinstance(v, torch.Tensor)), None))
        return batch_shape(tensor)
    if isinstance(batch, (list, tuple)) and batch:
        return batch_shape(batch[0])
    raise TypeError(f"cannot read a batch size and sequence length from a {type(batch).__name__}")


def padding_tokens(batch) -> int | None:
    """Tokens a batch's ``attention_mask`` marks as padding (None without a mask)."""
    mask = batch.get("attention_mask") if isinstance(batch, dict) or hasattr(batch, "keys") else None
    return int((mask == 0).sum()) if isinstance(mask, torch.Tensor) else None


def world_size() -> int:
    dist = torch.distributed
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


@transformers_quiet()  # the config it reads back is built again: its lines are not the run's
def seen_run(model: torch.nn.Module, optimizer, batch, *, loop: str, autocast: str = "", grad_accum: int = 1,
             train: TrainSpec | None = None) -> Seen:
    """The Case of a user's run (see the module's text)."""
    unknown: list[str] = []
    spec = model_spec(model)
    layers, offload, kwargs = checkpoint_setting(model)
    n_layers = len(decoder_layers(model))
    every = next((n for n in range(1, n_layers + 1) if checkpointed_layers(n_layers, n) == layers), 0) if layers else 0
    recompute = Recompute() if every or not layers else Recompute(layers=tuple(layers))
    reentrant = kwargs.get("use_reentrant", True) if layers else None  # torch's own default is reentrant
    if reentrant:
        unknown.append("reentrant checkpointing (use_reentrant=True): the sweep runs non-reentrant, so the "
                       "estimate is of the non-reentrant step")
    if "context_fn" in kwargs:
        unknown.append("a checkpoint context_fn (selective checkpointing) the Case cannot name: measured as plain")
    name, lr, why = optimizer_setting(optimizer)
    if why:
        unknown.append(why)
    lora, why = lora_setting(model)
    if why:
        unknown.append(why)
    size, seq = batch_shape(batch)
    device = next(model.parameters()).device.type
    train = train or TrainSpec()
    case = Case(model=spec, train=replace(train, lr=lr, threads=torch.get_num_threads()), batch_size=size,
                seq_len=seq, every_n_layers=every, offload=offload, grad_accum=grad_accum, world_size=world_size(),
                device=device, setup=Setup(autocast=autocast, loop=loop, lora=lora, optimizer=name),
                recompute=recompute)
    base = base_model(model)
    embeddings = base.get_input_embeddings() if hasattr(base, "get_input_embeddings") else None
    frozen = embeddings is not None and not any(p.requires_grad for p in embeddings.parameters())
    hooked = getattr(base, "_require_grads_hook", None) is not None
    return Seen(case=case, use_reentrant=reentrant, checkpoint_kwargs=kwargs, frozen_embeddings=frozen,
                inputs_require_grad_hook=hooked, unknown=unknown)
