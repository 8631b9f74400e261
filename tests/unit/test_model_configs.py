"""The model that runs is the one the user's config describes: every key reaches transformers, under the name
its config class reads, at the depth the suite asks for; and a record says so by checking it.

Configs here are made by transformers' own config classes and saved as transformers saves them, so the zoo
covers what config.json files really hold (``layer_types``, biases, rope scaling, dropout, each family's
own names for its sizes).  Everything is built on the meta device at tiny sizes: no memory, no weights.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest
import torch
from transformers import CONFIG_MAPPING, AutoConfig, AutoModelForCausalLM

from ckptbench.point.case import ANALYTIC_DEFAULTS, FAMILIES, ModelSpec, canonical_config, preset
from ckptbench.sources.configs import ANALYTIC_DIM_KEYS, config_keys, model_class_here, spec_values
from ckptbench.suite import parse as suite_mod
from ckptbench.suite.keys import SuiteError
from ckptbench.suite.parse import parse_suite
from ckptbench.theory.memory.params import param_count
from ckptbench.theory.verdicts.checks import config_checks
from ckptbench.train.buildcheck import build_problem_here
from ckptbench.train.models import build_model
from ckptbench.train.reference import reference

SWEEP = "[sweep]\nbatch_size = [1]\nseq_len = [8]\n"
TOKENS = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
T = dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, intermediate_size=96,
         vocab_size=128, max_position_embeddings=128)
GPT = dict(n_embd=64, n_layer=4, n_head=4, n_inner=96, vocab_size=128, n_positions=128)
# model_type -> its config class's arguments: each family's own names, and the keys that change the model
ZOO = {
    "llama": dict(T, hidden_act="gelu", mlp_bias=True, attention_bias=True, head_dim=32, rms_norm_eps=1e-5,
                  rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 5e5}),
    "qwen2": dict(T, layer_types=["full_attention", "sliding_attention"] * 2, use_sliding_window=True,
                  sliding_window=16, head_dim=8, attention_dropout=0.1),
    "qwen3": dict(T, layer_types=["full_attention"] * 4, head_dim=8),
    "gemma2": dict(T, head_dim=8, query_pre_attn_scalar=8, sliding_window=16),
    "gemma3_text": dict(T, head_dim=8, sliding_window=16),
    "smollm3": dict(T, no_rope_layers=[1, 1, 1, 0]),
    "qwen2_moe": dict(T, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                      shared_expert_intermediate_size=48, mlp_only_layers=[1, 3]),
    "mixtral": dict(T, num_local_experts=4, num_experts_per_tok=2),
    "mistral": dict(T, sliding_window=16),
    "phi3": dict(T, partial_rotary_factor=0.5),
    "gpt2": dict(GPT, activation_function="relu", resid_pdrop=0.2),
    "falcon": dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=8, num_kv_heads=2, ffn_hidden_size=96,
                   new_decoder_architecture=True, vocab_size=128, bias=True),
    "gptj": dict(GPT, rotary_dim=8),
    "codegen": dict(GPT, rotary_dim=8, n_ctx=128),
    "gpt_bigcode": dict(GPT, multi_query=True),
    "mpt": dict(d_model=64, n_layers=4, n_heads=4, expansion_ratio=3, vocab_size=128, max_seq_len=128),
    "gpt_neox": dict(T, rotary_pct=0.25, use_parallel_residual=False, attention_bias=False),
    "starcoder2": dict(T, use_bias=False),
    "stablelm": dict(T, use_qkv_bias=True),
}


def _count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _meta(spec: ModelSpec) -> torch.nn.Module:
    with torch.device("meta"):
        return build_model(spec, "meta")


def _from_config(cfg) -> int:
    with torch.device("meta"):
        return _count(AutoModelForCausalLM.from_config(cfg))


@pytest.fixture
def in_process(monkeypatch):
    """The suite asks transformers in a child interpreter; here the same questions are answered in this one."""
    monkeypatch.setattr(suite_mod, "model_class", model_class_here)
    monkeypatch.setattr(suite_mod, "build_problem", lambda spec, requested: build_problem_here(spec, list(requested)))


def _saved(tmp_path, model_type: str, **values) -> str:
    path = tmp_path / model_type
    CONFIG_MAPPING[model_type](**{**TOKENS, **values}).save_pretrained(path)
    return str(path)


@pytest.mark.parametrize("model_type", list(ZOO))
def test_a_saved_config_read_at_a_smaller_depth_builds_what_from_config_builds(tmp_path, in_process, model_type):
    path = _saved(tmp_path, model_type, **ZOO[model_type])
    spec = parse_suite(f'[model]\nconfig = "{path}"\nlayers = 2\n{SWEEP}', "zoo.toml").cases[0].model
    assert spec.family == model_type and spec.layers == 2
    model = _meta(spec)

    # transformers alone: the saved file, its depth key and its per-layer lists at 2 layers
    saved = json.loads((tmp_path / model_type / "config.json").read_text())
    depth = next(k for k in ("num_hidden_layers", "n_layer", "n_layers") if k in saved)
    at_two = {depth: 2, **{k: saved[k][:2] for k in ("layer_types", "no_rope_layers") if saved.get(k)}}
    if saved.get("mlp_only_layers"):
        at_two["mlp_only_layers"] = [i for i in saved["mlp_only_layers"] if i < 2]
    assert _count(model) == _from_config(AutoConfig.from_pretrained(path, **at_two))

    # and the record's checks agree: every requested key on the built config, the count from the reference
    m = {"n_params": _count(model), "resolved_config": json.loads(model.config.to_json_string(use_diff=False)),
         **reference(spec)}
    assert [(c.quantity, c.verdict) for c in config_checks(m)] == [("config", "pass"), ("params_from_config", "pass")]


def test_the_extra_keys_of_the_analytic_families_reach_the_model():
    cases = [
        ("llama", {"hidden_act": "gelu", "mlp_bias": True, "attention_bias": True, "head_dim": 32,
                   "rms_norm_eps": 1e-5, "rope_theta": 5e5, "rope_scaling": {"rope_type": "linear", "factor": 2.0}}),
        ("qwen2", {"head_dim": 32, "hidden_act": "gelu"}),
        ("gpt2", {"activation_function": "relu", "layer_norm_epsilon": 1e-3}),
    ]
    for family, extra in cases:
        spec = preset(f"{family}-tiny", config=canonical_config(extra))
        model = _meta(spec)
        built = model.config
        for key, value in extra.items():
            if key in ("rope_theta", "rope_scaling"):  # transformers 5 keeps both in rope_parameters
                continue
            assert getattr(built, key) == value, (family, key)
        if family == "llama":
            assert built.rope_parameters["rope_theta"] == 5e5 and built.rope_parameters["factor"] == 2.0
            assert model.model.layers[0].mlp.up_proj.bias is not None
            assert model.model.layers[0].self_attn.q_proj.bias is not None
        if family in ("llama", "qwen2"):
            assert model.model.layers[0].self_attn.q_proj.out_features == spec.heads * 32
        own = {"llama": {"hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
                         "intermediate_size": 128},
               "qwen2": {"hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
                         "intermediate_size": 128},
               "gpt2": {"n_embd": 64, "n_layer": 4, "n_head": 4, "n_inner": 256}}[family]
        cfg = CONFIG_MAPPING[family](**own, vocab_size=256, tie_word_embeddings=spec.tie_embeddings, **extra)
        assert _count(model) == _from_config(cfg), family


def test_gpt2_width_goes_to_n_inner_and_a_width_unlike_4h_is_built():
    spec = preset("gpt2-tiny", intermediate=100)  # not 4 x hidden: transformers' default would hide a lost key
    model = _meta(spec)
    assert model.config.n_inner == 100 and model.transformer.h[0].mlp.c_fc.nf == 100
    assert _count(model) == param_count(spec).total


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
def test_the_modelled_defaults_and_keys_are_transformers_own(family):
    defaults = CONFIG_MAPPING[family]()
    for key, value in ANALYTIC_DEFAULTS[family].items():
        assert getattr(defaults, key) == value, key
    assert ANALYTIC_DIM_KEYS[family] == config_keys(family)


def test_each_family_gets_its_sizes_under_its_own_names():
    assert config_keys("falcon")["kv_heads"] == "num_kv_heads"
    assert config_keys("falcon")["intermediate"] == "ffn_hidden_size"
    for model_type in ("gptj", "codegen", "gpt_bigcode", "gpt2"):
        assert config_keys(model_type)["intermediate"] == "n_inner"
    assert config_keys("mpt")["max_positions"] == "max_seq_len" and config_keys("mpt")["intermediate"] is None


def test_a_config_without_some_sizes_gets_its_classs_values():
    # falcon-7b's config.json has no num_kv_heads (one per query head, unless multi_query) and no ffn_hidden_size
    values = spec_values({"model_type": "falcon", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 8,
                          "vocab_size": 128, "new_decoder_architecture": True})
    assert (values["kv_heads"], values["intermediate"]) == (8, 256)
    mpt = spec_values({"model_type": "mpt", "d_model": 64, "n_layers": 2, "n_heads": 4, "vocab_size": 128,
                       "expansion_ratio": 3, "max_seq_len": 256})
    assert (mpt["hidden"], mpt["layers"], mpt["heads"], mpt["intermediate"], mpt["max_positions"]) == (64, 2, 4, 192, 256)


def test_layer_types_are_cut_to_the_depth_and_never_extended(tmp_path, in_process):
    path = _saved(tmp_path, "qwen2", **{**T, "layer_types": ["full_attention", "sliding_attention"] * 2,
                                        "use_sliding_window": True, "sliding_window": 16})
    spec = parse_suite(f'[model]\nconfig = "{path}"\nlayers = 2\n{SWEEP}', "x.toml").cases[0].model
    assert spec.config_extra["layer_types"] == ["full_attention", "sliding_attention"]
    assert _meta(spec).config.layer_types == ["full_attention", "sliding_attention"]
    with pytest.raises(SuiteError) as err:
        parse_suite(f'[model]\nconfig = "{path}"\nlayers = 6\n{SWEEP}', "x.toml")
    assert err.value.key == "model.layers" and "layer_types lists 4 layers" in err.value.reason


@pytest.mark.parametrize("model,key,reason", [
    ('preset = "gpt2-tiny"\nextra = {hidden_act = "gelu"}', "model.extra.hidden_act", "no config key 'hidden_act'"),
    ('preset = "gpt2-tiny"\nextra = {n_inner = 512}', "model.extra.n_inner", "set model.intermediate"),
    ('preset = "llama-tiny"\nextra = {tie_word_embeddings = true}', "model.extra.tie_word_embeddings",
     "set model.tie_embeddings"),
    ('preset = "gpt2-tiny"\nkv_heads = 2', "model.kv_heads", "no config key for the key/value head count"),
    ('model_type = "mpt"\nhidden = 64\nlayers = 2\nheads = 4\nvocab = 128\nintermediate = 100', "model.intermediate",
     "no config key for the MLP width"),
    ('model_type = "qwen2"\nhidden = 64\nlayers = 2\nheads = 4\nintermediate = 96\nvocab = 128\n'
     'extra = {layer_types = ["full_attention", "no_such_attention"]}', "model.extra.layer_types", "layer_types"),
])
def test_a_key_that_would_not_reach_the_model_is_refused_with_its_name(in_process, model, key, reason):
    with pytest.raises(SuiteError) as err:
        parse_suite(f"[model]\n{model}\n{SWEEP}", "x.toml")
    assert err.value.key == key and reason in err.value.reason, err.value


def test_mpt_by_model_type_needs_no_width(in_process):
    spec = parse_suite(f'[model]\nmodel_type = "mpt"\nhidden = 64\nlayers = 2\nheads = 4\nvocab = 128\n{SWEEP}',
                       "x.toml").cases[0].model
    assert _count(_meta(spec)) == _from_config(CONFIG_MAPPING["mpt"](d_model=64, n_layers=2, n_heads=4, vocab_size=128,
                                                                     max_seq_len=2048, tie_word_embeddings=False))


def test_dry_run_refuses_in_one_line_what_the_build_would_refuse(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text('[model]\nmodel_type = "qwen2"\nhidden = 64\nlayers = 2\nheads = 4\nintermediate = 96\n'
                    'vocab = 128\nextra = {layer_types = ["full_attention", "no_such_attention"]}\n' + SWEEP)
    proc = subprocess.run([sys.executable, "-m", "ckptbench", "sweep", "--suite", str(path), "--dry-run"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith(f"error: {path}: model.extra.layer_types: transformers cannot build this qwen2 model"), line


def test_an_extra_value_the_build_refuses_is_named_when_the_message_names_no_key():
    spec = parse_suite('[model]\npreset = "llama-tiny"\n' + SWEEP, "x.toml").cases[0].model
    bad = dataclasses.replace(spec, config=canonical_config({"rope_theta": "abc", "rms_norm_eps": 1e-5}))
    key, reason = build_problem_here(bad, ["rms_norm_eps", "rope_theta"])
    assert key == "extra.rope_theta" and "rope_theta" not in reason and reason.startswith("transformers cannot build")
    assert build_problem_here(dataclasses.replace(spec, config=canonical_config({"rms_norm_eps": 1e-5})),
                              ["rms_norm_eps"]) is None


def _record_of(spec: ModelSpec, model) -> dict:
    return {"n_params": _count(model), "resolved_config": json.loads(model.config.to_json_string(use_diff=False)),
            **reference(spec)}


def test_a_built_model_that_lost_a_requested_key_fails_its_checks_naming_it(monkeypatch):
    from ckptbench.train import models

    spec = preset("llama-tiny", config=canonical_config({"hidden_act": "gelu", "mlp_bias": True}))
    good = _record_of(spec, _meta(spec))
    assert {c.quantity: c.verdict for c in config_checks(good)} == {"config": "pass", "params_from_config": "pass"}

    # a builder that drops the extra keys, as it did for the analytic families
    def lossy(s):
        return {k: v for k, v in original(s).items() if k not in s.config_extra}

    original = models.config_values
    monkeypatch.setattr(models, "config_values", lossy)
    bad = {c.quantity: c for c in config_checks(_record_of(spec, _meta(spec)))}
    assert bad["config"].verdict == "fail" and bad["config"].difference == ["hidden_act", "mlp_bias"]
    assert bad["params_from_config"].verdict == "fail"


def test_config_differences_ignore_what_the_builder_sets_and_names_nested_keys():
    from ckptbench.theory.verdicts.checks import config_differences

    requested = {"hidden_size": 64, "n_embd": 64, "attention_dropout": 0.1, "use_cache": True, "dtype": None,
                 "rope_parameters": {"rope_theta": 5e5, "rope_type": "default"}}
    built = {"hidden_size": 64, "attention_dropout": 0.0, "use_cache": False, "dtype": "float32",
             "rope_parameters": {"rope_theta": 1e4, "rope_type": "default"}}
    assert config_differences(requested, built) == ["rope_parameters.rope_theta"]
    assert config_checks({"n_params": 5, "reference_error": "ValueError: no"})[0].verdict == "fail"
    assert {c.verdict for c in config_checks({"n_params": 5})} == {"skip"}  # a record from before the check


@pytest.mark.parametrize("value", [64.9, 64.0, "64", True, float("nan")])
def test_a_size_that_is_not_a_whole_number_is_refused_not_truncated(tmp_path, value):
    config = {"model_type": "gpt2", "n_embd": value, "n_layer": 2, "n_head": 4, "vocab_size": 128}
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "s.toml").write_text('[model]\nconfig = "config.json"\n[sweep]\nbatch_size = [1]\nseq_len = [8]\n')
    with pytest.raises(SuiteError) as err:
        suite_mod.load_suite(str(tmp_path / "s.toml"))
    assert str(err.value) == f"{tmp_path / 's.toml'}: model.config: n_embd must be a whole number, got {value!r}"
