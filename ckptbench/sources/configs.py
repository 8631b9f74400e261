"""A model from the user's own config: a config.json file or directory, a hub name, or a model_type.

A suite's ``[model]`` may say ``config = "path"``, ``hub = "org/name"`` or ``model_type = "mistral"`` (plus
dimensions); any of them takes dimension overrides on top (``layers = 2``) and free config keys under
``extra``.  The dimensions are read under every name transformers' configs use for them (``hidden_size``,
``n_embd``, ``d_model`` ...), and written back under the one the model type's config class reads (falcon's
``num_kv_heads`` and ``ffn_hidden_size``, gpt2's ``n_inner``); every other key goes to
``AutoConfig.for_model`` as it is, with per-layer lists (``layer_types`` ...) cut to the depth asked for, so
the model that runs is the user's architecture, shrunk where they asked.  What transformers would refuse
or ignore (a key no config class reads, a size no key holds) is refused when the suite is read.  Only
``config.json`` is ever fetched for a hub name, never weights.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import subprocess
import sys
from dataclasses import asdict, dataclass

from ..base.regularfile import open_regular
from ..point.case import FAMILIES, ModelSpec, canonical_config
from .answers import remembered

# ModelSpec field -> config.json names, first found wins.  A model type's config class reads each dimension
# under one of them (:func:`config_keys`); the others are aliases it does not know.
DIM_NAMES = {
    "hidden": ("hidden_size", "n_embd", "d_model", "n_embed"),
    "layers": ("num_hidden_layers", "n_layer", "num_layers", "n_layers"),
    "heads": ("num_attention_heads", "n_head", "num_heads", "n_heads"),
    "kv_heads": ("num_key_value_heads", "num_kv_heads"),
    "intermediate": ("intermediate_size", "n_inner", "ffn_hidden_size"),
    "vocab": ("vocab_size",),
    "max_positions": ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length"),
}
DIM_ALIASES = frozenset(name for names in DIM_NAMES.values() for name in names)
DIM_WORDS = {"hidden": "hidden size", "layers": "layer count", "heads": "attention head count",
             "kv_heads": "key/value head count", "intermediate": "MLP width", "vocab": "vocabulary size",
             "max_positions": "position count"}
# Keys that describe the file, not the model.
DROPPED = ("architectures", "transformers_version", "torch_dtype", "dtype", "_name_or_path", "auto_map",
           "quantization_config", "model_type", "tie_word_embeddings", "use_cache")
# Keys a suite's [model] extra cannot set: a [model] field of ckptbench says them (None: the builder does).
RESERVED = {"tie_word_embeddings": "tie_embeddings", "torch_dtype": "dtype", "dtype": "dtype",
            "model_type": "model_type", "use_cache": None}
# Lists with one entry per decoder layer, and lists of decoder-layer indices (configs saved by transformers 5)
PER_LAYER_KEYS = ("layer_types", "mlp_layer_types", "no_rope_layers")
LAYER_INDEX_KEYS = ("mlp_only_layers", "moe_layers")


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
        with open_regular(path, "r", encoding="utf-8") as fh:
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
    from huggingface_hub.utils import HFValidationError

    try:
        cached = try_to_load_from_cache(name, "config.json")
    except HFValidationError:  # not a repository name the hub allows: nothing to look for
        raise ConfigError(f"hub model {name!r} is not a valid repository name (org/name: letters, digits, "
                          "'-', '_' and '.', at most 96 characters)") from None
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


def _class_values(model_type: str, config: dict) -> dict:
    """What `model_type`'s config class makes of `config`: tying, and each dimension config.json may leave out
    (a llama without intermediate_size has the class's, a falcon without num_kv_heads one per query head)."""
    from transformers import CONFIG_MAPPING, AutoConfig

    try:
        CONFIG_MAPPING[model_type]
    except KeyError:
        raise ConfigError(f"transformers knows no model_type {model_type!r}") from None
    try:
        cfg = AutoConfig.for_model(model_type, **{k: v for k, v in config.items() if k != "model_type"})
    except Exception as exc:  # a strict config class's validation
        raise ConfigError(f"transformers refuses this {model_type} config: {error_line(exc)}") from None
    out = {"tie_embeddings": bool(cfg.tie_word_embeddings)}
    for field, names in DIM_NAMES.items():
        found = (getattr(cfg, name, None) for name in names)
        out[field] = next((int(v) for v in found if isinstance(v, int) and not isinstance(v, bool)), None)
    return out


def error_line(exc: BaseException) -> str:
    """The line of an exception that says what is wrong (huggingface_hub's validation errors wrap it)."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    return lines[-1] if lines else type(exc).__name__


def spec_values(config: dict) -> dict:
    """ModelSpec fields from a config dict: family (model_type), dimensions, tying, and the rest as extra.

    A dimension the file leaves out is what its config class makes of the file, so the model built from the
    fields is the one transformers builds from the file."""
    model_type = config["model_type"]
    values: dict = {"family": model_type}
    for field, names in DIM_NAMES.items():
        for name in names:
            if config.get(name) is not None:
                size = config[name]
                if not isinstance(size, int) or isinstance(size, bool):  # 64.9 must not become 64
                    raise ConfigError(f"{name} must be a whole number, got {size!r}")
                values[field] = size
                break
    if "hidden" not in values or "layers" not in values or "heads" not in values or "vocab" not in values:
        raise ConfigError(f"model_type {model_type!r}: the config gives no hidden size, layer count, head "
                          "count or vocabulary size under a name ckptbench reads")
    resolved = _class_values(model_type, config)
    values.setdefault("kv_heads", resolved["kv_heads"] or values["heads"])
    if "intermediate" not in values:  # a width no key holds: what the model makes (4 x hidden, or MPT's ratio)
        ratio = config.get("expansion_ratio")
        values["intermediate"] = resolved["intermediate"] or int((ratio or 4) * values["hidden"])
    values.setdefault("max_positions", resolved["max_positions"] or 2048)
    tie = config.get("tie_word_embeddings")
    values["tie_embeddings"] = bool(tie) if tie is not None else resolved["tie_embeddings"]
    extra = {k: v for k, v in config.items() if k not in DROPPED and k not in DIM_ALIASES}
    values["config"] = canonical_config(extra)
    return values


def at_depth(extra: dict, layers: int) -> dict:
    """`extra` for a model of `layers` decoder layers: per-layer lists keep their first `layers` entries, lists
    of layer indices the indices below it.  A per-layer list shorter than that cannot be extended (its pattern
    is the model's own): ConfigError naming it."""
    out = dict(extra)
    for key in PER_LAYER_KEYS:
        value = out.get(key)
        if isinstance(value, list):
            if len(value) < layers:
                raise ConfigError(f"{key} lists {len(value)} layers, fewer than the {layers} asked for: a per-layer "
                                  "list is cut to a smaller depth, never extended")
            out[key] = value[:layers]
    for key in LAYER_INDEX_KEYS:
        value = out.get(key)
        if isinstance(value, list):
            out[key] = [i for i in value if not isinstance(i, int) or i < layers]
    return out


def extra_problem(extra: dict) -> tuple[str, str] | None:
    """(key, reason) for a key a suite's [model] extra cannot set: a dimension or a [model] field says it."""
    for key in extra:
        field = next((f for f, names in DIM_NAMES.items() if key in names), None)
        if field is not None:
            return key, f"is the model's {DIM_WORDS[field]}: set model.{field} instead"
        if key in RESERVED:
            return key, (f"set model.{RESERVED[key]} instead" if RESERVED[key] else
                         "ckptbench sets it (no KV cache while training)")
    return None


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
    # ModelSpec dimension -> the config key the model type's config class reads it from (None: no key does)
    dim_keys: dict = dataclasses.field(default_factory=dict)


# The analytic families' keys, answered without a child (tests/unit/test_model_configs.py asks transformers)
_STANDARD_KEYS = {field: names[0] for field, names in DIM_NAMES.items()}
ANALYTIC_DIM_KEYS = {
    "llama": _STANDARD_KEYS,
    "qwen2": _STANDARD_KEYS,
    "gpt2": {**_STANDARD_KEYS, "kv_heads": None, "intermediate": "n_inner"},
}


@functools.cache
def model_class(model_type: str) -> ModelClass:
    """Asked of transformers in a child interpreter: the classes' modules import torch, and a sweep's parent
    never does.  The analytic families are answered here (their classes are imported by every worker and
    checked by tests/unit/test_suite.py)."""
    if model_type in SDPA_FAMILIES:
        return ModelClass(known=True, supports_sdpa=True, dim_keys=ANALYTIC_DIM_KEYS[model_type])
    answer = _ask(["model-class", model_type], f"model_type {model_type!r}")
    keys = answer.get("dim_keys", {})
    if not (isinstance(answer.get("known"), bool) and isinstance(answer.get("supports_sdpa"), bool)
            and isinstance(keys, dict) and all(isinstance(v, (str, type(None))) for v in keys.values())):
        raise ConfigError(f"could not ask transformers about model_type {model_type!r}: not a model-class answer")
    return ModelClass(known=answer["known"], supports_sdpa=answer["supports_sdpa"], dim_keys=keys)


def _ask(args: list[str], what: str, module: str = "ckptbench.sources.configs") -> dict:
    """The JSON answer of ``python -m MODULE ARGS`` (a child interpreter, so torch stays out), kept on disk
    for the next command with the same transformers, torch and code (:mod:`.answers`)."""
    failed: list[str] = []

    def ask() -> dict | None:
        try:
            proc = subprocess.run([sys.executable, "-m", module, *args],
                                  capture_output=True, text=True, timeout=ASK_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as exc:
            failed.append(str(exc))
            return None
        try:
            answer = json.loads(proc.stdout)
        except json.JSONDecodeError:
            answer = None
        if not isinstance(answer, dict):
            failed.append((proc.stderr.strip().splitlines() or ["no output"])[-1])
            return None
        return answer

    answer = remembered([module, *args], ask)
    if answer is None:
        raise ConfigError(f"could not ask transformers about {what}: {failed[0] if failed else 'no answer'}")
    return answer


@functools.cache
def config_keys(model_type: str) -> dict:
    """ModelSpec dimension -> the first of its names (:data:`DIM_NAMES`) that `model_type`'s config class
    declares (a field or an ``attribute_map`` alias), or None where it declares none (gpt2 has no key/value
    head count; MPT's MLP width is ``expansion_ratio`` times the hidden size)."""
    import inspect

    from transformers import CONFIG_MAPPING

    try:
        cls = CONFIG_MAPPING[model_type]
    except KeyError:
        raise ConfigError(f"transformers knows no model_type {model_type!r}") from None
    declared = ({f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls)
                else set(inspect.signature(cls.__init__).parameters))
    declared |= set(getattr(cls, "attribute_map", {}))
    return {field: next((n for n in names if n in declared), None) for field, names in DIM_NAMES.items()}


def model_class_here(model_type: str) -> ModelClass:
    """The child's answer, from transformers' own mapping and the class's ``_supports_sdpa``."""
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    name = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type)
    if name is None:
        return ModelClass(known=False, supports_sdpa=False)
    return ModelClass(known=True, supports_sdpa=bool(getattr(getattr(transformers, name), "_supports_sdpa", False)),
                      dim_keys=config_keys(model_type))


def build_problem(spec: ModelSpec, requested: tuple[str, ...] = ()) -> tuple[str, str] | None:
    """(key, reason) when transformers would not build `spec` as asked, else None; asked in a child
    interpreter, which builds the model on the meta device exactly as a worker will.  `requested` are the
    keys a suite's [model] extra set: one the config class neither declares nor its model reads would be
    kept and ignored by transformers, so it is named here instead.  The key is ``extra.NAME`` for such a key
    (or one the refusal names), "" when the refusal is the config's as a whole."""
    answer = _build_answer(json.dumps({"spec": asdict(spec), "requested": list(requested)}, sort_keys=True),
                           spec.family)
    return (str(answer.get("key", "")), str(answer["reason"])) if answer.get("reason") else None


@functools.cache  # a command reads its suite more than once (the sweep, then its report): asked once
def _build_answer(question: str, family: str) -> dict:
    return _ask(["build-check", question], f"model_type {family!r}", module="ckptbench.train.buildcheck")


if __name__ == "__main__" and sys.argv[1:2] == ["model-class"]:
    print(json.dumps(asdict(model_class_here(sys.argv[2]))))
