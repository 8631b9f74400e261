"""A model from the user's own config: a config.json file or directory, a hub name, or a model_type.

A suite's ``[model]`` may say ``config = "path"``, ``hub = "org/name"`` or ``model_type = "mistral"`` (plus
dimensions); any of them takes dimension overrides on top (``layers = 2``) and free config keys under
``extra``.  The dimensions are read under every name transformers' configs use for them (``hidden_size``,
``n_embd``, ``d_model`` ...); every other key goes to ``AutoConfig.for_model`` as it is, so the model that
runs is the user's architecture, shrunk where they asked.  Only ``config.json`` is ever fetched for a hub
name, never weights.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import asdict, dataclass

from .spec import FAMILIES, canonical_config

# ModelSpec field -> config.json names, first found wins
DIM_NAMES = {
    "hidden": ("hidden_size", "n_embd", "d_model"),
    "layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "heads": ("num_attention_heads", "n_head", "num_heads"),
    "kv_heads": ("num_key_value_heads", "num_kv_heads"),
    "intermediate": ("intermediate_size", "n_inner", "ffn_hidden_size"),
    "vocab": ("vocab_size",),
    "max_positions": ("max_position_embeddings", "n_positions", "seq_length"),
}
# Keys that describe the file, not the model.
DROPPED = ("architectures", "transformers_version", "torch_dtype", "dtype", "_name_or_path", "auto_map",
           "quantization_config", "model_type", "tie_word_embeddings", "use_cache")


# The model types with an analytic estimate are built as LlamaForCausalLM, Qwen2ForCausalLM and
# GPT2LMHeadModel, which all declare sdpa support (tests/unit/test_suite.py asks transformers); any other
# model type's class is asked in a child interpreter (its modeling module imports torch).
SDPA_FAMILIES = FAMILIES
ASK_TIMEOUT_S = 120


class ConfigError(ValueError):
    """A config that cannot describe a model here; the message names the source and the reason."""


def read_config_file(path: str) -> dict:
    """config.json as a dict (`path` is the file or a directory holding it)."""
    if os.path.isdir(path):
        path = os.path.join(path, "config.json")
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path} is not JSON: {exc}") from None
    if not isinstance(data, dict) or "model_type" not in data:
        raise ConfigError(f"{path} has no model_type: not a transformers config.json")
    return data


def hub_config(name: str) -> dict:
    """The config.json of hub model `name` from the Hugging Face cache, fetched (that file only) if
    missing and the hub can be reached; a clear error naming the model otherwise."""
    from huggingface_hub import hf_hub_download, try_to_load_from_cache

    cached = try_to_load_from_cache(name, "config.json")
    if isinstance(cached, str):
        return read_config_file(cached)
    if os.environ.get("HF_HUB_OFFLINE") not in (None, "", "0"):
        raise ConfigError(f"hub model {name!r}: its config.json is not in the Hugging Face cache and "
                          f"HF_HUB_OFFLINE is set; on a machine with network run `hf download {name} "
                          "config.json` (or point model.config at a copy of the file)")
    try:
        return read_config_file(hf_hub_download(name, "config.json"))
    except Exception as exc:  # no network, a private or unknown repository
        raise ConfigError(f"hub model {name!r}: config.json is not cached and could not be fetched "
                          f"({type(exc).__name__}); run `hf download {name} config.json` where the hub "
                          "is reachable, or point model.config at a copy of the file") from None


def _class_default_tie(model_type: str) -> bool:
    """Whether `model_type`'s config class ties the LM head when config.json does not say."""
    from transformers import CONFIG_MAPPING

    try:
        return bool(CONFIG_MAPPING[model_type]().tie_word_embeddings)
    except KeyError:
        raise ConfigError(f"transformers knows no model_type {model_type!r}") from None


def spec_values(config: dict) -> dict:
    """ModelSpec fields from a config dict: family (model_type), dimensions, tying, and the rest as extra."""
    model_type = config["model_type"]
    values: dict = {"family": model_type}
    used = set(DROPPED)
    for field, names in DIM_NAMES.items():
        for name in names:
            if config.get(name) is not None:
                values[field] = int(config[name])
                used.add(name)
                break
    used.update(n for names in DIM_NAMES.values() for n in names)
    if "hidden" not in values or "layers" not in values or "heads" not in values or "vocab" not in values:
        raise ConfigError(f"model_type {model_type!r}: the config gives no hidden size, layer count, head "
                          "count or vocabulary size under a name ckptbench reads")
    values.setdefault("kv_heads", 1 if config.get("multi_query") else values["heads"])
    values.setdefault("intermediate", 4 * values["hidden"])
    values.setdefault("max_positions", 2048)
    tie = config.get("tie_word_embeddings")
    values["tie_embeddings"] = bool(tie) if tie is not None else _class_default_tie(model_type)
    extra = {k: v for k, v in config.items() if k not in used}
    values["config"] = canonical_config(extra)
    return values



def default_attention(model_type: str, device: str, dtype: str, supports_sdpa: bool) -> tuple[str, str]:
    """(attention, why): what a point that names no attention runs.

    ``AutoModelForCausalLM.from_config`` without ``attn_implementation`` builds sdpa when the model's class
    supports it and eager otherwise (transformers 5: ``get_correct_attn_implementation``), on any device.
    One exception here: fp32 on CUDA, where torch's fused sdpa kernels do not all take fp32 with
    grouped-query attention and its math fallback keeps the s² probabilities the estimate does not
    model; there the default is eager, and the reason says so.
    """
    if device == "cuda" and dtype == "fp32":
        return "eager", ("eager: transformers would pick sdpa, but in fp32 on CUDA torch may run its math kernel, "
                         "which the estimate does not model (name attn to choose; sdpa needs dtype bf16 or fp16)")
    if supports_sdpa:
        return "sdpa", f"sdpa: transformers' default for {model_type} (the suite names no attention)"
    return "eager", f"eager: transformers' default for {model_type}, whose class has no sdpa path"


@dataclass(frozen=True)
class ModelClass:
    """What transformers says about a model type's causal-LM class."""

    known: bool  # AutoModelForCausalLM can build it
    supports_sdpa: bool  # the class declares sdpa support (what from_config then picks by default)


def model_class(model_type: str) -> ModelClass:
    """Asked of transformers in a child interpreter: the classes' modules import torch, and a sweep's parent
    never does.  The analytic families are answered here (their classes are imported by every worker and
    checked by tests/unit/test_suite.py)."""
    if model_type in SDPA_FAMILIES:
        return ModelClass(known=True, supports_sdpa=True)
    try:
        proc = subprocess.run([sys.executable, "-m", "ckptbench.configs", "model-class", model_type],
                              capture_output=True, text=True, timeout=ASK_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ConfigError(f"could not ask transformers about model_type {model_type!r}: {exc}") from None
    try:
        return ModelClass(**json.loads(proc.stdout))
    except (json.JSONDecodeError, TypeError):
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise ConfigError(f"could not ask transformers about model_type {model_type!r}: {last}") from None


def model_class_here(model_type: str) -> ModelClass:
    """The child's answer, from transformers' own mapping and the class's ``_supports_sdpa``."""
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    name = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type)
    if name is None:
        return ModelClass(known=False, supports_sdpa=False)
    return ModelClass(known=True, supports_sdpa=bool(getattr(getattr(transformers, name), "_supports_sdpa", False)))


if __name__ == "__main__" and sys.argv[1:2] == ["model-class"]:
    print(json.dumps(asdict(model_class_here(sys.argv[2]))))
