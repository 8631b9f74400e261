"""Dropout is a stated choice of the Case: "off" (every probability 0, what every run did before there was a
choice, so old ids hold) or "published" (the config's own), and the record and the report say what ran."""

from __future__ import annotations

import json

import pytest
from transformers import AutoConfig

from ckptbench.point.case import DROPOUT_DEFAULTS, Case, ModelSpec, canonical_config, preset
from ckptbench.point.training import TrainSpec
from ckptbench.report.columns import dropout_label
from ckptbench.suite.keys import SuiteError
from ckptbench.suite.parse import parse_suite
from ckptbench.theory.verdicts.checks import config_checks
from ckptbench.train.models import dropout_values, hf_config
from ckptbench.train.reference import reference

# a StarCoder2-like tiny model with its published dropouts (config.json: 0.1 each)
STARCODER2 = {"attention_dropout": 0.1, "residual_dropout": 0.1, "embedding_dropout": 0.1}


def starcoder2(dropout: str) -> ModelSpec:
    return ModelSpec(family="starcoder2", hidden=64, layers=2, heads=4, kv_heads=2, intermediate=128, vocab=256,
                     max_positions=256, attn="sdpa", config=canonical_config(STARCODER2), dropout=dropout)


def test_published_keeps_the_configs_dropout_and_off_zeroes_it():
    assert dropout_values(hf_config(starcoder2("published"))) == STARCODER2
    assert set(dropout_values(hf_config(starcoder2("off"))).values()) == {0.0}
    # gpt2's class publishes 0.1: kept when asked for, zeroed by default (as before it was a choice)
    assert dropout_values(hf_config(preset("gpt2-tiny", dropout="published")))["resid_pdrop"] == 0.1
    assert dropout_values(hf_config(preset("gpt2-tiny")))["resid_pdrop"] == 0.0


@pytest.mark.parametrize("family", sorted(DROPOUT_DEFAULTS))
def test_the_published_dropouts_are_the_config_classes(family):
    assert dropout_values(AutoConfig.for_model(family)) == DROPOUT_DEFAULTS[family]


def test_only_a_model_that_runs_with_dropout_leaves_the_analytic_estimate():
    assert preset("gpt2-tiny").analytic and not preset("gpt2-tiny", dropout="published").analytic
    assert preset("llama-tiny", dropout="published").analytic  # llama publishes attention_dropout 0.0
    with_dropout = canonical_config({"attention_dropout": 0.1})
    assert not preset("qwen2-tiny", config=with_dropout, dropout="published").analytic
    assert preset("qwen2-tiny", config=with_dropout).analytic  # zeroed: the estimate describes it


def test_off_keeps_every_old_id_and_published_is_another_point():
    case = Case(model=preset("gpt2-tiny"), train=TrainSpec(), batch_size=1, seq_len=8)
    assert case.model.dropout == "off"
    published = Case(model=preset("gpt2-tiny", dropout="published"), train=TrainSpec(), batch_size=1, seq_len=8)
    assert published.id != case.id
    old = case.to_dict()
    del old["model"]["dropout"]  # a record written before the field existed
    assert Case.from_dict(old).id == case.id and Case.from_dict(published.to_dict()) == published


def test_the_suite_key_reaches_the_case_and_a_bad_value_names_it():
    text = '[model]\npreset = "gpt2-tiny"\ndropout = "{}"\n[sweep]\nbatch_size = [1]\nseq_len = [8]\n'
    assert parse_suite(text.format("published"), "s.toml").cases[0].model.dropout == "published"
    assert parse_suite(text.replace('dropout = "{}"\n', ""), "s.toml").cases[0].model.dropout == "off"
    with pytest.raises(SuiteError) as err:
        parse_suite(text.format("sometimes"), "s.toml")
    assert err.value.key == "model.dropout" and "published" in err.value.reason


def _record(spec: ModelSpec, built_spec: ModelSpec) -> dict:
    cfg = hf_config(built_spec)
    return {"n_params": reference(spec)["reference_n_params"], **reference(spec),
            "resolved_config": json.loads(cfg.to_json_string(use_diff=False))}


def test_a_published_dropout_the_builder_zeroed_fails_the_config_check():
    spec = starcoder2("published")
    ok = {c.quantity: c for c in config_checks(_record(spec, spec), spec.dropout)}
    assert ok["config"].verdict == "pass"
    lost = {c.quantity: c for c in config_checks(_record(spec, starcoder2("off")), spec.dropout)}
    assert lost["config"].verdict == "fail" and lost["config"].difference == sorted(STARCODER2)
    # zeroing is the Case's stated choice when it says off
    off = starcoder2("off")
    assert {c.verdict for c in config_checks(_record(off, off), off.dropout)} == {"pass"}


def test_the_report_says_what_dropout_ran():
    assert dropout_label({"resid_pdrop": 0.0, "attn_pdrop": 0.0}, "off") == "dropout off"
    assert dropout_label({"attention_dropout": 0.1, "residual_dropout": 0.05}, "published") == "dropout 0.1"
    assert dropout_label(None, "") == "dropout off"  # a record from before the choice: zeroed then
