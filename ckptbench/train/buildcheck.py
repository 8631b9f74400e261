"""The child side of the suite's build check (``python -m ckptbench.train.buildcheck build-check JSON``):
whether transformers would build a spec's model with every key it was asked for.  Run in a child
interpreter by :func:`ckptbench.sources.configs.build_problem`, so the suite parser never imports torch."""

from __future__ import annotations

import dataclasses
import json
import sys

from ..point.case import ModelSpec, canonical_config
from ..sources.configs import error_line
from .models import build_model


def ignored_keys(model_type: str, keys) -> list[str]:
    """Which of `keys` transformers would keep on the config and never read: not a field or alias of the
    config class (or of every config), not consumed by its rope handling, and named nowhere in the modules
    of the config and of the causal-LM class (qwen2 reads ``head_dim`` from the config without declaring it)."""
    import inspect
    import re

    import transformers
    from transformers import CONFIG_MAPPING, PretrainedConfig, modeling_rope_utils
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    cls = CONFIG_MAPPING[model_type]
    known = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
    known |= set(getattr(cls, "attribute_map", {})) | {f.name for f in dataclasses.fields(PretrainedConfig)}
    model = getattr(transformers, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type])
    sources = "\n".join(inspect.getsource(m) for m in (sys.modules[cls.__module__], sys.modules[model.__module__],
                                                          modeling_rope_utils))
    return [k for k in keys if k not in known and not re.search(rf"\b{re.escape(k)}\b", sources)]


def build_problem_here(spec: ModelSpec, requested: list[str]) -> tuple[str, str] | None:
    """The child's answer to :func:`build_problem`."""
    import torch

    ignored = ignored_keys(spec.family, requested)
    if ignored:
        return f"extra.{ignored[0]}", (f"model_type {spec.family!r} has no config key {ignored[0]!r}: transformers "
                                       "would keep it and build the model without it")
    try:
        with torch.device("meta"):
            build_model(spec, "meta")
    except Exception as exc:
        named = [k for k in requested if k in str(exc)] or culprits(spec, requested)
        return f"extra.{named[0]}" if named else "", (
            f"transformers cannot build this {spec.family} model: {type(exc).__name__}: {error_line(exc)}"[:400])
    return None


def culprits(spec: ModelSpec, requested: list[str]) -> list[str]:
    """The [model] extra keys without which the model builds, one left out at a time: the key to name when
    transformers' message names none (a string where a number goes fails deep in the model's code)."""
    import torch

    extra = json.loads(spec.config or "{}")
    found = []
    for key in requested:
        if key not in extra:
            continue
        rest = {k: v for k, v in extra.items() if k != key}
        try:
            with torch.device("meta"):
                build_model(dataclasses.replace(spec, config=canonical_config(rest)), "meta")
        except Exception:  # noqa: BLE001  (still refused without it: not this key)
            continue
        found.append(key)
    return found


if __name__ == "__main__" and sys.argv[1:2] == ["build-check"]:
    request = json.loads(sys.argv[2])
    problem = build_problem_here(ModelSpec(**request["spec"]), request["requested"])
    print(json.dumps({"key": problem[0], "reason": problem[1]} if problem else {}))
