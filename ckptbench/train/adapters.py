"""LoRA adapters through ``peft``, the way its users add them to a transformers model.

The model from :func:`~.models.build_model` is wrapped with ``peft.get_peft_model(model, LoraConfig(...))``:
the base frozen, rank-``r`` adapters on the target modules (peft's own defaults for the model type when
the suite names none).  Checkpointing is switched on *after* wrapping, through the ``PeftModel`` (which
hands ``activation_checkpointing_enable`` to the transformers model inside): the order of the PEFT docs'
Trainer recipe, where ``Trainer(activation_checkpointing=True)`` calls it on the PeftModel it was given.
transformers' ``activation_checkpointing_enable`` then calls ``enable_input_require_grads`` on the base
model itself (a forward hook making the embedding's output require grad, so gradients flow through the
frozen blocks into the adapters of checkpointed layers).  peft's ``PeftModel`` calls the same method when
the base already had checkpointing on; wrapping first leaves that to transformers, and without
checkpointing nothing makes the embedding's output require grad, as for any peft user.

Only the adapters require grad, so only they get gradients; the loops hand the optimizer only the
parameters that require grad (what ``Trainer`` does), so only they get optimizer state.
"""

from __future__ import annotations

import warnings

import torch

from ..point.setup import Lora


def with_adapters(model: torch.nn.Module, lora: Lora | None) -> torch.nn.Module:
    """`model` wrapped with LoRA adapters by ``peft.get_peft_model``, or `model` itself when `lora` is None.

    peft creates each adapter on its base layer's device (``meta`` in the simulation) and, for a bf16 or
    fp16 base, in fp32 (its ``autocast_adapter_dtype`` default).  A target naming no module of the model is
    peft's ``ValueError``."""
    if lora is None:
        return model
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                        target_modules=list(lora.targets) or None, task_type="CAUSAL_LM")
    with warnings.catch_warnings():  # peft asks transformers' deprecated alias; the warning is not the user's
        warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
        return get_peft_model(model, config)


def trainable_parameters(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The parameters an optimizer is given: those that require grad (all of them without adapters)."""
    return [p for p in model.parameters() if p.requires_grad]


def adapter_parameters(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The parameters peft added (named with its tuner's prefix, ``lora_``); none for a plain model."""
    prefix = getattr(getattr(model, "base_model", None), "prefix", None)
    if not prefix or not hasattr(model, "peft_config"):
        return []
    return [p for name, p in model.named_parameters() if prefix in name]


def adapter_facts(model: torch.nn.Module) -> dict:
    """What the record says about the adapters, read from the model that trained: ``trainable_params``
    (elements that require grad), ``adapter_params`` (elements peft added) and, with adapters, the target
    modules as peft resolved them (``lora_targets``) and how many modules it wrapped (``lora_modules``)."""
    out = {"trainable_params": sum(p.numel() for p in trainable_parameters(model)),
           "adapter_params": sum(p.numel() for p in adapter_parameters(model))}
    config = getattr(model, "peft_config", {}).get("default")
    if config is not None:
        targets = config.target_modules
        out["lora_targets"] = sorted(targets) if isinstance(targets, (set, list, tuple)) else targets
        out["lora_modules"] = len(getattr(model.base_model, "targeted_module_names", []))
    return out


def base_parameter_count(model: torch.nn.Module) -> int:
    """Elements of the model's own parameters, the adapters left out: what its config gives."""
    return sum(p.numel() for p in model.parameters()) - sum(p.numel() for p in adapter_parameters(model))
