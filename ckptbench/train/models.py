"""Build real Hugging Face causal LMs from a :class:`ModelSpec` (random weights, nothing downloaded),
and the seeded token batches they train on."""

from __future__ import annotations

import functools

import torch
from transformers import AutoModelForCausalLM, PretrainedConfig

from ..point.case import ModelSpec
from ..sources.configs import DIM_ALIASES, at_depth, config_keys, error_line

TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def config_values(spec: ModelSpec) -> dict:
    """The config.json keys `spec` stands for: its extra keys as given (per-layer lists at its depth), each
    dimension under the key its model type's config class reads it from, and its tying.

    The same for every model type, the analytic ones included: a ``[model] extra`` or a user's config.json
    key reaches transformers whatever the family (``hidden_act``, ``mlp_bias``, ``head_dim``, ``n_inner`` ...).
    """
    keys = config_keys(spec.family)
    extra = at_depth(spec.config_extra, spec.layers)
    clash = sorted(set(extra) & DIM_ALIASES)
    if clash:  # the suite refuses them; a ModelSpec made by hand must not say a dimension twice either
        raise ValueError(f"config key {clash[0]!r} is a dimension: give it as the ModelSpec field")
    dims = {key: getattr(spec, dim) for dim, key in keys.items() if key is not None}
    return {**extra, **dims, "tie_word_embeddings": spec.tie_embeddings}


TOKEN_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id")


@functools.cache
def class_defaults(model_type: str) -> PretrainedConfig:
    """`model_type`'s config with nothing set: its class's defaults."""
    from transformers import AutoConfig

    return AutoConfig.for_model(model_type)


def hf_config(spec: ModelSpec) -> PretrainedConfig:
    """``AutoConfig.for_model`` of :func:`config_values`, made runnable as the spec shrinks it.

    Token ids beyond a smaller vocabulary are dropped (an embedding whose padding index is out of range will
    not build), no KV cache; every dropout key is set to 0 when the spec's ``dropout`` is "off", kept as the
    config gives it when "published".
    """
    from huggingface_hub.errors import StrictDataclassError
    from transformers import AutoConfig

    values = {**config_values(spec), "use_cache": False}
    try:
        for key in TOKEN_KEYS:  # the class's own ids too (gpt2's 50256), before its validation warns of them
            token = values.get(key, getattr(class_defaults(spec.family), key, None))
            if isinstance(token, int) and token >= spec.vocab:
                values[key] = None
        cfg = AutoConfig.for_model(spec.family, **values)
    except StrictDataclassError as exc:  # a config class's own validation, e.g. layer_types against the depth
        raise ValueError(f"transformers refuses this {spec.family} config: {error_line(exc)}") from None
    except ValueError as exc:  # an unknown model_type
        raise ValueError(f"transformers cannot build model_type {spec.family!r}: {exc}") from None
    for key in TOKEN_KEYS:  # and any a config class derives
        token = getattr(cfg, key, None)
        if isinstance(token, int) and token >= spec.vocab:
            setattr(cfg, key, None)
    if spec.dropout == "off":
        for key in dropout_values(cfg):
            setattr(cfg, key, 0.0)
    return cfg


def is_dropout_key(key: str) -> bool:
    return "dropout" in key or key.endswith("pdrop")


def dropout_values(cfg: PretrainedConfig) -> dict[str, float]:
    """Every dropout probability of `cfg` (its float keys named ``*dropout*`` or ``*pdrop``)."""
    return {key: value for key, value in cfg.to_dict().items()
            if isinstance(value, float) and is_dropout_key(key)}


def build_model(spec: ModelSpec, device: str | torch.device = "cpu") -> torch.nn.Module:
    """`AutoModelForCausalLM.from_config` in the spec's dtype and attention implementation, train mode.

    Built under the target device's context so the random initialisation runs there: a 1B model
    initialised on the host with one thread takes seconds per sweep point, on the GPU a fraction of one.
    """
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(
            hf_config(spec), attn_implementation=spec.attn, dtype=TORCH_DTYPES[spec.dtype]
        )
    return model.to(device).train()


def synthetic_batch(vocab: int, batch_size: int, seq_len: int, seed: int, device="cpu") -> torch.Tensor:
    """Token ids from a seeded generator: same data for every strategy at a given point."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (batch_size, seq_len), generator=gen).to(device)
