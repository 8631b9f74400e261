"""The model that runs is the one the user's config describes, and the analytic estimate claims only the
models it describes: a key that changes a parameter or a saved activation leaves it to the simulation."""

from __future__ import annotations

import pytest
import torch
from transformers import CONFIG_MAPPING

from ckptbench.spec import ANALYTIC_DEFAULTS, FAMILIES, ModelSpec, canonical_config, preset
from ckptbench.theory.params import param_count
from ckptbench.train.models import build_model


def _count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _meta(spec: ModelSpec) -> torch.nn.Module:
    with torch.device("meta"):
        return build_model(spec, "meta")


@pytest.mark.parametrize("extra,analytic", [
    ({"attention_bias": False, "mlp_bias": False, "hidden_act": "silu", "head_dim": 16}, True),  # the defaults
    ({"attention_bias": True}, False),
    ({"mlp_bias": True}, False),
    ({"hidden_act": "gelu"}, False),
    ({"head_dim": 32}, False),
    ({"rope_theta": 5e5, "rms_norm_eps": 1e-5, "initializer_range": 0.01, "bos_token_id": 0}, True),
])
def test_llama_is_analytic_only_where_the_estimate_describes_it(extra, analytic):
    spec = preset("llama-tiny", config=canonical_config(extra))
    assert spec.analytic is analytic
    if analytic:  # the analytic count is then the built model's, biases and head width included
        assert param_count(spec).total == _count(_meta(spec))


def test_qwen2_and_gpt2_need_their_modelled_head_width_and_activation():
    assert not preset("qwen2-tiny", config=canonical_config({"head_dim": 32})).analytic
    assert preset("qwen2-tiny", config=canonical_config({"head_dim": 16})).analytic
    assert not preset("qwen2-tiny", config=canonical_config({"hidden_act": "gelu"})).analytic
    assert not preset("gpt2-tiny", config=canonical_config({"activation_function": "relu"})).analytic
    assert preset("gpt2-tiny", config=canonical_config({"activation_function": "gelu_new"})).analytic


@pytest.mark.parametrize("family", FAMILIES)
def test_the_modelled_defaults_are_transformers_own(family):
    defaults = CONFIG_MAPPING[family]()
    for key, value in ANALYTIC_DEFAULTS[family].items():
        assert getattr(defaults, key) == value, key
