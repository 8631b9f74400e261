"""The model the user's own config describes, built apart from :mod:`.models` to check what that builds.

The builder maps each dimension to the one key its model type's config class reads; this passes every
name any config uses for it (``hidden_size``, ``n_embd``, ``d_model`` ...) and lets transformers read the
ones it knows, with the extra keys as they are.  No ckptbench choice is made on the way: no dropout or cache
setting, no dtype or attention, so the model is what ``AutoModelForCausalLM.from_config`` gives for the
config the user wrote, at the depth and sizes the suite asked for.  Built on the meta device: no memory.
"""

from __future__ import annotations

import json

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from ..point.case import ModelSpec
from ..sources.configs import DIM_NAMES, at_depth, error_line


def requested_config(spec: ModelSpec):
    """``AutoConfig.for_model`` of everything the spec asks for, normalised by transformers alone."""
    values = at_depth(spec.config_extra, spec.layers)
    for dim, names in DIM_NAMES.items():
        values.update(dict.fromkeys(names, getattr(spec, dim)))
    values["tie_word_embeddings"] = spec.tie_embeddings
    default = AutoConfig.for_model(spec.family)
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):  # ids a shrunk vocabulary no longer holds
        token = values.get(key, getattr(default, key, None))
        if isinstance(token, int) and token >= spec.vocab:
            values[key] = None
    cfg = AutoConfig.for_model(spec.family, **values)
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if isinstance(getattr(cfg, key, None), int) and getattr(cfg, key) >= spec.vocab:
            setattr(cfg, key, None)
    return cfg


def reference(spec: ModelSpec) -> dict:
    """``requested_config`` (its every key, as transformers serialises it) and ``reference_n_params`` (the
    parameters of ``from_config`` of it on the meta device); ``reference_error`` instead when transformers
    refuses the config or the model."""
    try:
        cfg = requested_config(spec)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(cfg)
    except Exception as exc:
        return {"reference_error": f"{type(exc).__name__}: {error_line(exc)}"[:500]}
    return {"requested_config": json.loads(cfg.to_json_string(use_diff=False)),
            "reference_n_params": sum(p.numel() for p in model.parameters())}
