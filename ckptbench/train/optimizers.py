"""The optimizers a point can train with (``Setup.optimizer``), each built as its users build it.

One table says what each name is: the class and the settings it is constructed with.  The manual loop, the
Accelerate loop, local SGD and the simulation (:mod:`ckptbench.theory.memory.loop_step`) call
:func:`build_optimizer`; the Trainer loop asks ``TrainingArguments`` for the same optimizer the way Trainer
users do (:func:`trainer_choice`), and ``tests/unit/test_optimizers.py`` holds the two to the same class
and settings through Trainer's own ``get_optimizer_cls_and_kwargs``.

- ``adamw``: ``torch.optim.AdamW`` with torch's own choice of implementation (``foreach=None``: the
  multi-tensor ``_foreach_*`` kernels when every parameter is on CUDA, the per-parameter loop on a CPU);
- ``adamw-foreach`` / ``adamw-loop``: the same with ``foreach=True`` / ``False`` stated.  Trainer's
  ``optim`` cannot say either (``adamw_torch`` passes no ``optim_args`` through), so the Trainer loop hands
  them over through its documented ``optimizer_cls_and_kwargs`` argument, with which Trainer still builds
  its own parameter groups;
- ``sgd``: ``torch.optim.SGD`` with momentum 0.9 (Trainer: ``optim="sgd", optim_args="momentum=0.9"``);
- ``adafactor``: ``transformers.optimization.Adafactor`` with what Trainer's ``optim="adafactor"`` passes:
  the learning rate, ``scale_parameter=False, relative_step=False``;
- ``adamw-8bit``: bitsandbytes' ``AdamW8bit`` (Trainer: ``optim="adamw_bnb_8bit"``), where bitsandbytes is
  importable; elsewhere the point is refused with the reason (:func:`optimizer_refusal`);
- ``adamw-fused``: ``AdamW(fused=True)``, one fused kernel per parameter group and dtype (Trainer:
  ``optim="adamw_torch_fused"``, ``TrainingArguments``' default in transformers 5).
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Iterable

import torch

from ..point.setup import OPTIMIZERS, Setup

# name -> (module, class, constructor settings beside the parameters and the learning rate)
OPTIMIZER_CLASSES: dict[str, tuple[str, str, dict]] = {
    "adamw": ("torch.optim", "AdamW", {}),
    "adamw-foreach": ("torch.optim", "AdamW", {"foreach": True}),
    "adamw-loop": ("torch.optim", "AdamW", {"foreach": False}),
    "sgd": ("torch.optim", "SGD", {"momentum": 0.9}),
    "adafactor": ("transformers.optimization", "Adafactor", {"scale_parameter": False, "relative_step": False}),
    "adamw-8bit": ("bitsandbytes.optim", "AdamW8bit", {}),
    "adamw-fused": ("torch.optim", "AdamW", {"fused": True}),
}
assert tuple(OPTIMIZER_CLASSES) == OPTIMIZERS

# name -> (TrainingArguments.optim, TrainingArguments.optim_args); None: not expressible there
TRAINER_OPTIM: dict[str, tuple[str, str | None] | None] = {
    "adamw": ("adamw_torch", None),
    "adamw-foreach": None,
    "adamw-loop": None,
    "sgd": ("sgd", "momentum=0.9"),
    "adafactor": ("adafactor", None),
    "adamw-8bit": ("adamw_bnb_8bit", None),
    "adamw-fused": ("adamw_torch_fused", None),
}


def optimizer_name(setup_or_name: Setup | str) -> str:
    name = setup_or_name.optimizer if isinstance(setup_or_name, Setup) else setup_or_name
    if name not in OPTIMIZER_CLASSES:
        raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {name!r}")
    return name


def optimizer_class(setup_or_name: Setup | str) -> tuple[type, dict]:
    """(the optimizer's class, the settings it is built with beside the parameters and ``lr``)."""
    module, cls, settings = OPTIMIZER_CLASSES[optimizer_name(setup_or_name)]
    return getattr(importlib.import_module(module), cls), dict(settings)


def trainable(params) -> list:
    """What to optimise: a model's parameters that require gradients, or the parameters (or parameter
    groups) given."""
    if isinstance(params, torch.nn.Module):
        return [p for p in params.parameters() if p.requires_grad]
    return list(params) if isinstance(params, Iterable) else params


def build_optimizer(setup_or_name: Setup | str, params, lr: float) -> torch.optim.Optimizer:
    """The point's optimizer over `params` (a model: its parameters that require gradients; or parameters,
    or parameter groups) at learning rate `lr`."""
    cls, settings = optimizer_class(setup_or_name)
    return cls(trainable(params), lr=lr, **settings)


def optimizer_refusal(setup: Setup) -> str | None:
    """Why this machine cannot train with the setup's optimizer as asked, or None."""
    if optimizer_name(setup) == "adamw-8bit" and importlib.util.find_spec("bitsandbytes") is None:
        return ("optimizer 'adamw-8bit' is bitsandbytes' AdamW8bit, and bitsandbytes is not installed here "
                "(it is not a dependency of ckptbench: install it where its kernels run)")
    return None


def trainer_choice(setup: Setup, lr: float) -> tuple[dict, tuple[type, dict] | None]:
    """How a Trainer user asks for this optimizer: (``TrainingArguments`` keywords, the
    ``Trainer(optimizer_cls_and_kwargs=...)`` pair or None).  AdamW's implementation choice is not
    expressible through ``optim``: those two pass the class and its settings to Trainer instead."""
    choice = TRAINER_OPTIM[optimizer_name(setup)]
    if choice is None:
        cls, settings = optimizer_class(setup)
        return {"optim": "adamw_torch"}, (cls, {"lr": lr, **settings})
    optim, optim_args = choice
    return {"optim": optim, **({"optim_args": optim_args} if optim_args else {})}, None


def _plain(value):
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    return repr(value)


def describe_optimizer(optimizer: torch.optim.Optimizer) -> dict:
    """What the record says of the optimizer that ran: its class, its settings as it holds them, its
    parameter groups, and for torch's Adam family the implementation torch picks (``foreach=None`` is
    decided per step by ``torch.optim.optimizer._default_to_fused_or_foreach``, asked here the same way)."""
    inner = getattr(optimizer, "optimizer", optimizer)  # accelerate's AcceleratedOptimizer wraps it
    cls = type(inner)
    out = {"class": f"{cls.__module__}.{cls.__qualname__}",
           "settings": {k: _plain(v) for k, v in sorted(inner.defaults.items())},
           "param_groups": len(inner.param_groups),
           "params": sum(len(g["params"]) for g in inner.param_groups)}
    if inner.defaults.get("fused"):
        out["implementation"] = "fused"
    elif "foreach" in inner.defaults:
        foreach = inner.defaults["foreach"]
        if foreach is None:
            from torch.optim.optimizer import _default_to_fused_or_foreach

            params = [p for g in inner.param_groups for p in g["params"]]
            foreach = _default_to_fused_or_foreach(params, differentiable=False, use_fused=False)[1]
        out["implementation"] = "foreach" if foreach else "loop"
    return out
